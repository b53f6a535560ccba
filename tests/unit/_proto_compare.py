"""Compare Sluice's generated protobuf descriptors with Envoy's upstream ones (xds-protos).

Run as a script; tests/unit/test_protos.py does so in a subprocess. Both sets of descriptors
register the same .proto file names (``envoy/service/ratelimit/v3/rls.proto`` ...) in
protobuf's default descriptor pool, so they must never be imported into one process:

* ``python _proto_compare.py dump`` imports every generated ``*_pb2`` module under
  server/sluice/_proto and writes their FileDescriptorProtos, as a serialized
  FileDescriptorSet, to stdout;
* ``python _proto_compare.py`` (compare) runs ``dump`` in a child process, imports the
  upstream modules of the same file names from xds-protos, and prints a JSON report:
  ``{"differences": [...], "messages": N, "enums": N, "services": N, "files": [...]}``.

What is compared, for every file we generate (matched to the upstream file of the same path):

* the proto package and syntax;
* every message we define, nested ones included, exists upstream under the same full name and
  matches it exactly: for every field (both directions) name, number, type, label, type_name,
  oneof membership (by oneof name) and proto3_optional; the sets of oneofs, nested messages
  and nested enums are equal;
* every enum we define, nested ones included, has exactly upstream's value names and numbers;
* every service we define has exactly upstream's methods (name, input/output type, streaming);
* for the files in ``COMPLETE_FILES`` additionally every upstream message, enum and service
  exists in ours. Other files (e.g. base.proto) may define a subset of upstream's messages.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVER_DIR = REPO_ROOT / "server"
GENERATED_DIR = SERVER_DIR / "sluice" / "_proto"
GENERATED_PACKAGE = "sluice._proto"

# Files that must be complete copies of upstream, not subsets.
COMPLETE_FILES = (
    "envoy/service/ratelimit/v3/rls.proto",
    "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
)


def dump() -> None:
    """Write our generated files' descriptors to stdout as a FileDescriptorSet."""
    sys.path.insert(0, str(SERVER_DIR))
    from google.protobuf import descriptor_pb2

    file_set = descriptor_pb2.FileDescriptorSet()
    for path in sorted(GENERATED_DIR.rglob("*_pb2.py")):
        rel = path.relative_to(GENERATED_DIR).with_suffix("")
        module = importlib.import_module(".".join((GENERATED_PACKAGE, *rel.parts)))
        file_set.file.add().ParseFromString(module.DESCRIPTOR.serialized_pb)
    if "envoy" in sys.modules:  # our tree must not pull in a top-level `envoy` (xds-protos)
        sys.exit("generated code imported the top-level `envoy` package")
    sys.stdout.buffer.write(file_set.SerializeToString())


def _load_ours():
    from google.protobuf import descriptor_pb2

    proc = subprocess.run(
        [sys.executable, __file__, "dump"], capture_output=True, check=False, timeout=120
    )
    if proc.returncode != 0:
        sys.exit(f"dumping generated descriptors failed:\n{proc.stderr.decode(errors='replace')}")
    return list(descriptor_pb2.FileDescriptorSet.FromString(proc.stdout).file)


def _load_upstream(file_name: str):
    from google.protobuf import descriptor_pb2

    module_name = file_name.removesuffix(".proto").replace("/", ".") + "_pb2"
    module = importlib.import_module(module_name)  # raises if xds-protos lacks the file
    return descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)


def _walk(fdp):
    """(messages, enums) of a FileDescriptorProto, keyed by full name, nested ones included."""
    messages, enums = {}, {}

    def visit(prefix, message_types, enum_types):
        for enum in enum_types:
            enums[f"{prefix}.{enum.name}"] = enum
        for msg in message_types:
            full = f"{prefix}.{msg.name}"
            messages[full] = msg
            visit(full, msg.nested_type, msg.enum_type)

    visit(fdp.package, fdp.message_type, fdp.enum_type)
    return messages, enums


_LABELS = {1: "optional", 2: "required", 3: "repeated"}
_TYPES = {  # FieldDescriptorProto.Type, for readable differences
    1: "double",
    2: "float",
    3: "int64",
    4: "uint64",
    5: "int32",
    6: "fixed64",
    7: "fixed32",
    8: "bool",
    9: "string",
    10: "group",
    11: "message",
    12: "bytes",
    13: "uint32",
    14: "enum",
    15: "sfixed32",
    16: "sfixed64",
    17: "sint32",
    18: "sint64",
}


def _field_signature(msg, field):
    oneof = msg.oneof_decl[field.oneof_index].name if field.HasField("oneof_index") else None
    return {
        "number": field.number,
        "type": _TYPES.get(field.type, field.type),
        "label": _LABELS.get(field.label, field.label),
        "type_name": field.type_name,
        "oneof": oneof,
        "proto3_optional": field.proto3_optional,
    }


def _compare_message(name, ours, up, diffs):
    our_fields = {f.name: _field_signature(ours, f) for f in ours.field}
    up_fields = {f.name: _field_signature(up, f) for f in up.field}
    for field in sorted(up_fields.keys() - our_fields.keys()):
        diffs.append(f"message {name}: missing field {field} {up_fields[field]}")
    for field in sorted(our_fields.keys() - up_fields.keys()):
        diffs.append(f"message {name}: field {field} does not exist upstream")
    for field in sorted(our_fields.keys() & up_fields.keys()):
        for attr, our_value in our_fields[field].items():
            up_value = up_fields[field][attr]
            if our_value != up_value:
                diffs.append(
                    f"message {name}: field {field}: {attr} is {our_value!r}, upstream {up_value!r}"
                )
    for what, ours_names, up_names in (
        ("oneofs", {o.name for o in ours.oneof_decl}, {o.name for o in up.oneof_decl}),
        ("nested messages", {m.name for m in ours.nested_type}, {m.name for m in up.nested_type}),
        ("nested enums", {e.name for e in ours.enum_type}, {e.name for e in up.enum_type}),
    ):
        if ours_names != up_names:
            diffs.append(
                f"message {name}: {what} are {sorted(ours_names)}, upstream {sorted(up_names)}"
            )


def _compare_enum(name, ours, up, diffs):
    our_values = {v.name: v.number for v in ours.value}
    up_values = {v.name: v.number for v in up.value}
    if our_values != up_values:
        diffs.append(f"enum {name}: values are {our_values}, upstream {up_values}")


def _method_signature(method):
    return (
        method.input_type,
        method.output_type,
        method.client_streaming,
        method.server_streaming,
    )


def compare() -> dict:
    ours_files = _load_ours()
    diffs: list[str] = []
    counts = {"messages": 0, "enums": 0, "services": 0}
    seen = set()
    for ours in ours_files:
        seen.add(ours.name)
        if not ours.name.startswith("envoy/"):
            continue  # Sluice's own API (sluice/lease/v1/lease.proto): nothing upstream to match
        try:
            up = _load_upstream(ours.name)
        except ImportError as exc:
            diffs.append(f"file {ours.name}: not found in xds-protos ({exc})")
            continue
        for attr in ("package", "syntax"):
            if getattr(ours, attr) != getattr(up, attr):
                diffs.append(
                    f"file {ours.name}: {attr} is {getattr(ours, attr)!r}, "
                    f"upstream {getattr(up, attr)!r}"
                )
        complete = ours.name in COMPLETE_FILES
        our_msgs, our_enums = _walk(ours)
        up_msgs, up_enums = _walk(up)

        for name, msg in our_msgs.items():
            if name not in up_msgs:
                diffs.append(f"message {name}: not defined upstream in {ours.name}")
                continue
            _compare_message(name, msg, up_msgs[name], diffs)
            counts["messages"] += 1
        for name, enum in our_enums.items():
            if name not in up_enums:
                diffs.append(f"enum {name}: not defined upstream in {ours.name}")
                continue
            _compare_enum(name, enum, up_enums[name], diffs)
            counts["enums"] += 1

        our_services = {s.name: s for s in ours.service}
        up_services = {s.name: s for s in up.service}
        for name, service in our_services.items():
            if name not in up_services:
                diffs.append(f"service {ours.package}.{name}: not defined upstream")
                continue
            our_methods = {m.name: _method_signature(m) for m in service.method}
            up_methods = {m.name: _method_signature(m) for m in up_services[name].method}
            if our_methods != up_methods:
                diffs.append(
                    f"service {ours.package}.{name}: methods are {our_methods}, "
                    f"upstream {up_methods}"
                )
            counts["services"] += 1

        if complete:
            for name in sorted(up_msgs.keys() - our_msgs.keys()):
                diffs.append(f"message {name}: defined upstream in {ours.name}, missing in ours")
            for name in sorted(up_enums.keys() - our_enums.keys()):
                diffs.append(f"enum {name}: defined upstream in {ours.name}, missing in ours")
            for name in sorted(up_services.keys() - our_services.keys()):
                diffs.append(f"service {up.package}.{name}: defined upstream, missing in ours")

    for name in COMPLETE_FILES:
        if name not in seen:
            diffs.append(f"file {name}: not generated")
    if "sluice" in sys.modules:  # our generated code must stay out of this process
        diffs.append("internal: the comparing process imported sluice")
    return {"differences": diffs, **counts, "files": sorted(seen)}


if __name__ == "__main__":
    if sys.argv[1:] == ["dump"]:
        dump()
    else:
        print(json.dumps(compare(), indent=2))
