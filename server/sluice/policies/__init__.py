"""Policy documents: storage, versioning and schema migrations of the config database."""
