"""deploy/kubernetes: every object valid against the Kubernetes schemas (kubernetes-validate,
offline), and what the Deployment asks of ``sluice serve`` is what it accepts: its arguments
go through sluice's own parser and settings (a renamed or removed flag fails here), and the
probes, ports, mounts and shutdown timing agree with the settings they produce."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sluice.cli import _parser
from sluice.policies.yaml_format import load_path
from sluice.settings import Settings, from_arguments

DEPLOY = Path(__file__).parents[2] / "deploy" / "kubernetes"
KUSTOMIZATIONS = [DEPLOY, DEPLOY / "admin"]
# The oldest Kubernetes still commonly run, and the newest the package knows.
VERSIONS = ["1.30.0", "1.37.0"]


def objects(directory: Path) -> list[dict[str, Any]]:
    """Every object the kustomization in ``directory`` lists under ``resources``."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    found = []
    for resource in kustomization["resources"]:
        found += [doc for doc in yaml.safe_load_all((directory / resource).read_text()) if doc]
    return found


def one(kind: str, name: str, directory: Path = DEPLOY) -> dict[str, Any]:
    [found] = [o for o in objects(directory) if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=["server", "admin"])
def test_every_object_is_valid_kubernetes(directory: Path, version: str) -> None:
    listed = objects(directory)
    assert listed
    for item in listed:
        # Raises ValidationError naming the object and the field.
        kubernetes_validate.validate(item, version, strict=True)


def test_the_kustomization_lists_files_that_exist_and_policies_that_load() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    [generator] = kustomization["configMapGenerator"]
    assert generator["name"] == "sluice-policies"
    for name in generator["files"]:
        policies = load_path(str(DEPLOY / name), max_log_limit=Settings().max_sliding_log_limit)
        assert policies, name
    kinds = {o["kind"] for o in objects(DEPLOY)}
    assert kinds == {
        "Secret",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
    }


def exact_flags(command: str, args: list[str]) -> None:
    """Every ``--flag`` in ``args`` is one of ``sluice COMMAND``'s own, spelled out: argparse
    would take a prefix (``--drain-delay`` for ``--drain-delay-s``), so a renamed flag could
    still parse while meaning something else, or only until another flag shares the prefix."""
    [subparsers] = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    known = subparsers.choices[command]._option_string_actions
    flags = [a.split("=", 1)[0] for a in args if a.startswith("--")]
    assert [f for f in flags if f not in known] == []


def served_settings(tmp_path: Path) -> tuple[Settings, dict[str, Any]]:
    """The settings the Deployment's container runs with: its arguments parsed by sluice's
    own parser, the Secret's files written where it mounts them (under ``tmp_path``)."""
    deployment = one("Deployment", "sluice")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    secret = one("Secret", "sluice-credentials")
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "credentials"]
    for key, value in secret["stringData"].items():
        (tmp_path / key).write_text(value)
    args = [a.replace(mount["mountPath"], str(tmp_path)) for a in container["args"]]
    exact_flags("serve", args)
    parsed = _parser().parse_args(args)  # an unknown flag: SystemExit, and the test fails
    assert parsed.command == "serve"
    return from_arguments(parsed, environ={}), container


def test_the_deployment_runs_sluice_serve_with_flags_it_accepts(tmp_path: Path) -> None:
    settings, container = served_settings(tmp_path)
    secret = one("Secret", "sluice-credentials")["stringData"]
    assert settings.backend == "redis"  # two replicas: counters must be shared
    assert settings.redis_url == secret["redis-url"]
    assert settings.database_url == secret["database-url"]
    assert settings.log_format == "json"


def test_probes_and_ports_are_the_ones_sluice_serves(tmp_path: Path) -> None:
    settings, container = served_settings(tmp_path)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        "grpc": settings.grpc_port,
        "http": settings.http_port,
        "management": settings.management_port,
    }
    probes = {
        kind: (container[kind]["httpGet"]["path"], container[kind]["httpGet"]["port"])
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert probes == {
        "startupProbe": ("/healthcheck", "management"),
        "livenessProbe": ("/healthcheck", "management"),
        "readinessProbe": ("/ready", "management"),
    }
    annotations = one("Deployment", "sluice")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(settings.management_port)


def test_shutdown_timing_is_consistent(tmp_path: Path) -> None:
    settings, container = served_settings(tmp_path)
    spec = one("Deployment", "sluice")["spec"]["template"]["spec"]
    assert "lifecycle" not in container  # Sluice waits --drain-delay-s itself: no preStop
    # Kubelet's readiness probe must see the not-ready phase before the drain begins.
    readiness = container["readinessProbe"]
    assert readiness["periodSeconds"] * readiness["failureThreshold"] < settings.drain_delay_s
    budget = settings.drain_delay_s + settings.shutdown_grace_s
    assert budget + 5 <= spec["terminationGracePeriodSeconds"]
    assert settings.grpc_max_connection_age_s > 0


def test_the_config_directory_is_the_policies_configmap(tmp_path: Path) -> None:
    settings, container = served_settings(tmp_path)
    spec = one("Deployment", "sluice")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts[settings.config]]["configMap"]["name"] == "sluice-policies"
    # A read-only root: everything Sluice writes is on a mounted volume.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert str(Path(settings.snapshot_cache).parent) in mounts
    assert settings.database_url.removeprefix("sqlite:///").rsplit("/", 1)[0] in mounts


def test_services_pdb_and_hpa_select_the_servers() -> None:
    deployment = one("Deployment", "sluice")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    port_names = {p["name"] for p in container["ports"]}
    for service in (one("Service", "sluice"), one("Service", "sluice-headless")):
        assert service["spec"]["selector"].items() <= labels.items()
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names
            assert port["appProtocol"]
    grpc_ports = [p for p in one("Service", "sluice")["spec"]["ports"] if p["name"] == "grpc"]
    assert grpc_ports[0]["appProtocol"] == "kubernetes.io/h2c"
    pdb = one("PodDisruptionBudget", "sluice")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"] == 2
    hpa = one("HorizontalPodAutoscaler", "sluice")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "sluice"
    assert hpa["spec"]["minReplicas"] == deployment["spec"]["replicas"]


def test_the_admin_example_runs_a_command_sluice_has() -> None:
    deployment = one("Deployment", "sluice-admin", DEPLOY / "admin")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    exact_flags("admin", container["args"])
    parsed = _parser().parse_args(container["args"])
    assert parsed.command == "admin"
    settings_variables = {f"SLUICE_{name.upper()}_FILE" for name in ("database_url", "admin_users")}
    assert {e["name"] for e in container["env"]} == settings_variables
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
