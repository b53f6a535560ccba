"""docker-compose.yml cannot be run here (no Docker engine), so it is checked statically:
consistent with the Dockerfile, the settings and the tested Envoy example."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import yaml

from sluice.cli import _parser
from sluice.settings import Settings, env_name

ROOT = Path(__file__).parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def test_the_whole_deployment_is_there() -> None:
    assert {"redis", "postgres", "sluice", "admin", "envoy", "upstream"} <= set(SERVICES)
    assert SERVICES["sluice"]["deploy"]["replicas"] == 2


def test_sluice_services_build_the_dockerfile_and_run_its_entrypoint() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["sluice"]' in dockerfile
    exposed = {
        int(p) for line in re.findall(r"^EXPOSE (.*)$", dockerfile, re.M) for p in line.split()
    }
    for name in ("sluice-init", "sluice", "admin"):
        service = SERVICES[name]
        assert service["command"][0] in ("serve", "import", "admin")
    # The servers build the default (last, server) target; the admin app its own target.
    for name in ("sluice-init", "sluice"):
        assert SERVICES[name]["build"] == "."
    assert SERVICES["admin"]["build"] == {"context": ".", "target": "admin"}
    assert re.search(r"^FROM \S+ AS admin$", dockerfile, re.M)
    images = {SERVICES[name]["image"] for name in ("sluice-init", "sluice", "admin")}
    assert len(images) == 2  # one tag per target, or each build would overwrite the other
    assert {int(p) for p in SERVICES["sluice"]["expose"]} <= exposed
    assert {int(p.split(":")[1]) for p in SERVICES["admin"]["ports"]} <= exposed
    assert Settings().grpc_port in exposed and Settings().http_port in exposed


def test_every_sluice_variable_is_a_real_setting() -> None:
    known = {env_name(f.name) for f in fields(Settings)}
    for name in ("sluice-init", "sluice", "admin"):
        used = {k for k in SERVICES[name]["environment"] if k.startswith("SLUICE_")}
        assert used and used <= known, used - known


def test_dependencies_name_services_that_exist() -> None:
    for name, service in SERVICES.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in SERVICES, (name, dependency)


def test_the_imported_policy_is_shipped_in_the_image() -> None:
    command = SERVICES["sluice-init"]["command"]
    shipped = command[1].replace("/usr/share/sluice/examples", str(ROOT / "examples"))
    assert Path(shipped).is_file()


def test_envoy_config_is_the_tested_example_with_service_names() -> None:
    mounted = SERVICES["envoy"]["volumes"][0].split(":")[0]
    compose_config = (ROOT / mounted).read_text()
    tested = (ROOT / "examples" / "envoy" / "envoy.yaml").read_text()
    normalised = (
        compose_config.replace("type: STRICT_DNS", "type: STATIC")
        .replace("address: upstream, port_value: 8000", "address: 127.0.0.1, port_value: 8000")
        .replace("address: sluice, port_value: 8081", "address: 127.0.0.1, port_value: 8081")
    )
    body = "\n".join(
        line
        for line in normalised.splitlines()
        if not line.startswith("# Generated")
        and not line.startswith("# service names")
        and not line.startswith("# tests/unit/test_compose.py")
    )
    assert body == tested.rstrip("\n")
    assert yaml.safe_load(compose_config)  # parses


def test_one_off_commands_name_a_subcommand_not_the_entry_point_again() -> None:
    [subparsers] = [a for a in _parser()._actions if hasattr(a, "choices") and a.choices]
    text = (ROOT / "docker-compose.yml").read_text().replace("\\\n#", " ")
    runs = re.findall(r"docker compose run (?:--?[a-zA-Z-]+ )*([a-z-]+) +([a-z-]+)", text)
    assert runs
    for service, command in runs:
        assert service in SERVICES
        assert command in subparsers.choices, f"{service} runs `sluice {command}`"
