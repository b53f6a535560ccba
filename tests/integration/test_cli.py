"""The `sluice` command line against real config databases (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.policies.yaml_format import load_path, load_text
from tests.support.processes import run_sluice

EXAMPLE = Path(__file__).parents[2] / "examples" / "ratelimit.yaml"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db' / 'sluice.db'}"
    return request.getfixturevalue("postgres_url")


def test_check_accepts_the_example() -> None:
    result = run_sluice(["check", str(EXAMPLE)])
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{EXAMPLE}: OK, 1 domain(s): edge\n"


def test_check_refuses_with_file_line_and_reason(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: eon}\n")
    result = run_sluice(["check", str(bad)])
    assert result.returncode == 1
    assert result.stderr.splitlines() == [f"{bad}:4: invalid rate limit unit 'eon'"]


def test_check_strict_fails_on_what_upstream_serves_but_sluice_warns_about(
    tmp_path: Path,
) -> None:
    lax = tmp_path / "lax.yaml"
    lax.write_text("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n")
    warning = (
        f"warning: {lax}:4: rate_limit has no 'requests_per_unit': read as 0, as upstream "
        f"reads it, so nothing is admitted"
    )
    result = run_sluice(["check", str(lax)])
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{lax}: OK, 1 domain(s): d\n"
    assert result.stderr.splitlines() == [warning]
    strict = run_sluice(["check", "--strict", str(lax)])
    assert strict.returncode == 1
    assert strict.stdout == ""
    assert strict.stderr.splitlines() == [warning, f"{lax}: 1 warning(s) (--strict)"]


def test_check_merges_a_domain_split_over_files_when_asked(tmp_path: Path) -> None:
    for name, key in (("a.yaml", "a"), ("b.yaml", "b")):
        (tmp_path / name).write_text(
            f"domain: d\ndescriptors:\n  - key: {key}\n"
            f"    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        )
    refused = run_sluice(["check", str(tmp_path)])
    assert refused.returncode == 1
    assert f"{tmp_path / 'b.yaml'}:1: duplicate domain 'd'" in refused.stderr
    merged = run_sluice(["check", "--merge-domain-config", str(tmp_path)])
    assert merged.returncode == 0, merged.stderr
    assert merged.stdout == f"{tmp_path}: OK, 1 domain(s): d\n"


@pytest.mark.slow
def test_import_then_export_gives_the_same_policies(database_url: str, tmp_path: Path) -> None:
    imported = run_sluice(["import", str(EXAMPLE), "--database-url", database_url])
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout == "edge: version 1\n"
    again = run_sluice(["import", str(EXAMPLE), "--database-url", database_url])
    assert again.stdout == "edge: unchanged\n"

    exported = run_sluice(["export", "--database-url", database_url])
    assert exported.returncode == 0, exported.stderr
    assert load_text(exported.stdout, "export") == load_path(EXAMPLE)

    (tmp_path / "exported.yaml").write_text(exported.stdout)
    reimported = run_sluice(
        ["import", str(tmp_path / "exported.yaml"), "--database-url", database_url]
    )
    assert reimported.stdout == "edge: unchanged\n"


@pytest.mark.slow
def test_a_bad_file_changes_nothing(database_url: str, tmp_path: Path) -> None:
    assert run_sluice(["import", str(EXAMPLE), "--database-url", database_url]).returncode == 0
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "a.yaml").write_text("domain: other\n")
    (policies / "b.yaml").write_text("domain: edge\ndescriptors:\n  - value: x\n")
    result = run_sluice(["import", str(policies), "--database-url", database_url])
    assert result.returncode == 1
    assert result.stderr == f"{policies / 'b.yaml'}:3: descriptor has empty key\n"
    exported = run_sluice(["export", "--database-url", database_url])
    assert load_text(exported.stdout, "export") == load_path(EXAMPLE)


@pytest.mark.slow
def test_export_one_domain_and_a_missing_one(database_url: str, tmp_path: Path) -> None:
    (tmp_path / "two.yaml").write_text("domain: a\n---\ndomain: b\n")
    assert run_sluice(
        ["import", str(tmp_path / "two.yaml"), "--database-url", database_url]
    ).stdout == ("a: version 1\nb: version 1\n")
    only_b = run_sluice(["export", "--domain", "b", "--database-url", database_url])
    assert [p.domain for p in load_text(only_b.stdout)] == ["b"]
    missing = run_sluice(["export", "--domain", "zzz", "--database-url", database_url])
    assert (missing.returncode, missing.stderr) == (1, "sluice: no such domain: zzz\n")


def test_unreachable_database_exits_3_without_leaking_the_password() -> None:
    url = "postgresql://sluice:hunter2@127.0.0.1:1/sluice"
    result = run_sluice(["export", "--database-url", url])
    assert result.returncode == 3
    assert "config database" in result.stderr
    assert "hunter2" not in result.stderr


def test_settings_come_from_flags_then_environment_and_hide_secrets() -> None:
    url = "postgresql://sluice:hunter2@db:5432/sluice"
    result = run_sluice(
        ["settings", "--grpc-port", "9001"],
        env={
            "SLUICE_GRPC_PORT": "9999",
            "SLUICE_HTTP_PORT": "9002",
            "SLUICE_DATABASE_URL": url,
            "PATH": "/usr/bin:/bin",
        },
    )
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["grpc_port"] == {"value": 9001, "source": "--grpc-port"}
    assert shown["http_port"] == {"value": 9002, "source": "SLUICE_HTTP_PORT"}
    assert shown["host"] == {"value": "0.0.0.0", "source": "default"}
    assert "hunter2" not in result.stdout and "sluice:***@db:5432" in result.stdout


def test_settings_show_the_local_cache_following_upstream_where_redis_is_upstreams() -> None:
    upstream = {"REDIS_URL": "127.0.0.1:6379", "PATH": "/usr/bin:/bin"}
    shown = json.loads(run_sluice(["settings"], env=upstream).stdout)
    assert shown["local_cache"] == {
        "value": False,
        "source": "upstream default (LOCAL_CACHE_SIZE_IN_BYTES unset: upstream's local cache "
        "is off)",
    }
    sluice = {"SLUICE_REDIS_URL": "redis://127.0.0.1:6379/0", "PATH": "/usr/bin:/bin"}
    shown = json.loads(run_sluice(["settings"], env=sluice).stdout)
    assert shown["local_cache"] == {"value": True, "source": "default"}


def test_a_bad_setting_names_its_source() -> None:
    result = run_sluice(["settings"], env={"SLUICE_GRPC_PORT": "eighty", "PATH": "/usr/bin:/bin"})
    assert (result.returncode, result.stderr) == (
        1,
        "sluice: SLUICE_GRPC_PORT: 'eighty' is not a valid int\n",
    )


@pytest.mark.slow
def test_history_diff_and_rollback(database_url: str, tmp_path: Path) -> None:
    first = tmp_path / "v1.yaml"
    first.write_text(
        "domain: h\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
    )
    second = tmp_path / "v2.yaml"
    second.write_text(first.read_text().replace("requests_per_unit: 1}", "requests_per_unit: 2}"))
    db = ["--database-url", database_url]
    run_sluice(["import", str(first), *db, "--author", "ann", "--comment", "start"])
    run_sluice(["import", str(second), *db, "--author", "ben", "--comment", "raise"])

    rolled = run_sluice(["rollback", "--domain", "h", "--to", "1", *db, "--author", "cy"])
    assert rolled.stdout == "h: version 3 restores version 1\n", rolled.stderr
    lines = run_sluice(["history", "--domain", "h", *db]).stdout.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["3", "2", "1"]
    assert [line.split("\t")[2:] for line in lines] == [
        ["cy", "restores v1", "rollback to version 1"],
        ["ben", "raise"],
        ["ann", "start"],
    ]
    diff = run_sluice(["diff", "--domain", "h", "2", "3", *db]).stdout
    assert "-    requests_per_unit: 2\n+    requests_per_unit: 1\n" in diff
    exported = run_sluice(["export", *db]).stdout
    assert load_text(exported) == load_path(first)
    again = run_sluice(["rollback", "--domain", "h", "--to", "1", *db])
    assert again.stdout == "h: version 1's rules are already live; nothing to do\n"
    missing = run_sluice(["rollback", "--domain", "h", "--to", "9", *db])
    assert (missing.returncode, missing.stderr) == (1, "sluice: domain 'h' has no version 9\n")
