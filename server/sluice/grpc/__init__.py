"""The gRPC boundary: the only code besides tests that imports generated protobuf modules."""
