"""The config-file watcher against real config databases: each look is triggered by the test
(``check()``), so nothing sleeps. Add, break, fix and remove a file; a ConfigMap-style
``..data`` swap; two watchers of one directory on one PostgreSQL database publish one version."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.policies.service import PolicyService
from sluice.policies.store import PolicyStore
from sluice.policies.watcher import WATCH_AUTHOR, ConfigWatcher


def policy(domain: str, requests_per_unit: int, key: str = "k") -> str:
    return (
        f"domain: {domain}\ndescriptors:\n  - key: {key}\n"
        f"    rate_limit: {{unit: minute, requests_per_unit: {requests_per_unit}}}\n"
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PolicyStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'sluice.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    with PolicyStore(url) as opened:
        opened.upgrade()
        yield opened


def watcher(store: PolicyStore, path: Path, **kwargs: bool) -> ConfigWatcher:
    return ConfigWatcher(path, PolicyService(store), max_log_limit=100, **kwargs)


def live(store: PolicyStore) -> dict[str, tuple[int, str]]:
    """{domain: (version, requests_per_unit as written)} of what the database serves."""
    out = {}
    for domain, stored in store.current().items():
        rpu = stored.document.split("requests_per_unit: ")[1].split()[0]
        out[domain] = (stored.version, rpu)
    return out


def test_add_break_fix_and_remove_a_file(
    store: PolicyStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "a.yaml").write_text(policy("a", 1))
    files = watcher(store, config)
    assert files.check() == {"a": 1}
    assert files.check() is None  # nothing changed: nothing read into the database

    (config / "b.yaml").write_text(policy("b", 2))  # added
    assert files.check() == {"b": 1}
    assert live(store) == {"a": (1, "1"), "b": (1, "2")}

    caplog.set_level(logging.ERROR, logger="sluice.policies.watcher")
    (config / "b.yaml").write_text(policy("b", 3) + "    rate_limit: {unit: eon}\n")  # broken
    assert files.check() is None
    assert live(store) == {"a": (1, "1"), "b": (1, "2")}  # the last good version serves
    assert files.status.errors == 1
    assert files.status.last_error == (
        f"{config / 'b.yaml'}:5: duplicate key 'rate_limit' in a descriptor"
    )
    assert f"{config / 'b.yaml'}:5: duplicate key 'rate_limit' in a descriptor" in caplog.text
    assert files.check() is None
    assert files.status.errors == 1  # one broken state is reported once, not every look

    (config / "b.yaml").write_text(policy("b", 3))  # fixed
    assert files.check() == {"b": 2}
    assert files.status.last_error == ""
    assert live(store) == {"a": (1, "1"), "b": (2, "3")}

    (config / "a.yaml").unlink()  # removed: its domain goes
    assert files.check() == {"a": 2}
    assert live(store) == {"b": (2, "3")}
    assert store.history("a")[0].deleted
    assert store.history("a")[0].author == WATCH_AUTHOR


def test_a_file_caught_half_written_keeps_its_domain(store: PolicyStore, tmp_path: Path) -> None:
    # An editor's or a script's write truncates the file before filling it: a look in between
    # reads it empty. Upstream refuses an empty file; read as "no domains", it would delete
    # the domain's limits until the next look (seen in a two-server CI run: a deletion
    # version between two edits).
    (tmp_path / "a.yaml").write_text(policy("a", 1))
    files = watcher(store, tmp_path)
    assert files.check() == {"a": 1}
    (tmp_path / "a.yaml").write_text("")
    assert files.check() is None
    assert live(store) == {"a": (1, "1")}
    assert files.status.last_error.endswith(
        "a.yaml:1: config file cannot have empty domain (the file holds no policy)"
    )
    (tmp_path / "a.yaml").write_text(policy("a", 2))
    assert files.check() == {"a": 2}
    assert [v.deleted for v in store.history("a")] == [False, False]


def test_a_domain_published_another_way_is_not_deleted_with_a_file(
    store: PolicyStore, tmp_path: Path
) -> None:
    (tmp_path / "a.yaml").write_text(policy("a", 1))
    service = PolicyService(store)
    [api] = service.validate([("api", policy("api", 5))])
    service.publish([api], author="alice", comment="by hand")
    files = watcher(store, tmp_path)
    assert files.check() == {"a": 1}
    (tmp_path / "a.yaml").unlink()
    assert files.check() == {"a": 2}  # the directory is empty now: its domains go
    assert live(store) == {"api": (1, "5")}


def test_a_configmap_data_swap_is_one_change(store: PolicyStore, tmp_path: Path) -> None:
    # The kubelet's layout: the files under ..<timestamp>, ..data a symlink to it, and each
    # visible name a symlink through ..data. An update writes a new ..<timestamp> and swaps
    # ..data in one rename.
    mount = tmp_path / "config"
    mount.mkdir()
    first = mount / "..2026_11_26_03_00_00.000000001"
    first.mkdir()
    (first / "ratelimit.yaml").write_text(policy("edge", 10))
    (mount / "..data").symlink_to(first.name)
    (mount / "ratelimit.yaml").symlink_to("..data/ratelimit.yaml")
    files = watcher(store, mount)
    assert files.check() == {"edge": 1}

    second = mount / "..2026_11_26_03_05_00.000000002"
    second.mkdir()
    (second / "ratelimit.yaml").write_text(policy("edge", 20))
    (mount / "..data_tmp").symlink_to(second.name)
    os.replace(mount / "..data_tmp", mount / "..data")  # the atomic swap
    for old in first.iterdir():
        old.unlink()
    first.rmdir()
    assert files.check() == {"edge": 2}
    assert live(store) == {"edge": (2, "20")}  # read once through the visible name


def test_a_broken_file_at_start_refuses_to_import(store: PolicyStore, tmp_path: Path) -> None:
    from sluice.errors import ConfigError

    (tmp_path / "a.yaml").write_text("domain: a\ndescriptors: 7\n")
    with pytest.raises(ConfigError) as info:
        watcher(store, tmp_path).import_now()
    assert info.value.problems == [f"{tmp_path / 'a.yaml'}:2: 'descriptors' must be a list"]
    assert live(store) == {}


def test_a_missing_directory_keeps_the_last_good_version(
    store: PolicyStore, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "a.yaml").write_text(policy("a", 1))
    files = watcher(store, config)
    assert files.check() == {"a": 1}
    (config / "a.yaml").unlink()
    config.rmdir()
    assert files.check() is None
    assert files.status.last_error == f"{config}: no such file or directory"
    assert live(store) == {"a": (1, "1")}


def test_merged_domains_follow_their_files(store: PolicyStore, tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(policy("d", 1, key="a"))
    (tmp_path / "b.yaml").write_text(policy("d", 2, key="b"))
    refusing = watcher(store, tmp_path)
    assert refusing.check() is None
    assert "duplicate domain 'd'" in refusing.status.last_error
    merging = watcher(store, tmp_path, merge_domains=True)
    assert merging.check() == {"d": 1}
    [stored] = store.current().values()
    assert "key: a" in stored.document and "key: b" in stored.document


def test_two_watchers_of_one_directory_publish_one_version(
    postgres_url: str, tmp_path: Path
) -> None:
    (tmp_path / "a.yaml").write_text(policy("a", 1))
    with PolicyStore(postgres_url) as one, PolicyStore(postgres_url) as two:
        one.upgrade()
        first, second = watcher(one, tmp_path), watcher(two, tmp_path)
        assert first.check() == {"a": 1}
        assert second.check() == {}  # already live as written: nothing published
        (tmp_path / "a.yaml").write_text(policy("a", 2))
        (tmp_path / "b.yaml").write_text(policy("b", 3))
        assert second.check() == {"a": 2, "b": 1}
        assert first.check() == {}
        assert [v.version for v in one.history("a")] == [2, 1]
        assert [v.version for v in one.history("b")] == [1]


def test_a_watcher_that_lost_the_race_looks_again_and_finds_nothing_to_do(
    postgres_url: str, tmp_path: Path
) -> None:
    # The other replica publishes between this one's read of the live versions and its
    # publish: the expected versions no longer hold, so the publish is refused as stale and
    # the second look finds the change already live.
    (tmp_path / "a.yaml").write_text(policy("a", 1))
    with PolicyStore(postgres_url) as one, PolicyStore(postgres_url) as two:
        one.upgrade()
        other = watcher(two, tmp_path)

        class Racing(PolicyStore):
            raced = False

            def current(self):  # type: ignore[no-untyped-def]
                seen = super().current()
                if not Racing.raced:
                    Racing.raced = True
                    assert other.check() == {"a": 1}  # the other replica wins the race
                return seen

        racing = Racing(one.database)
        assert watcher(racing, tmp_path).check() == {}
        assert Racing.raced
        assert [v.version for v in one.history("a")] == [1]


def test_a_server_publishes_only_what_its_files_changed_since_they_were_imported(
    store: PolicyStore, tmp_path: Path
) -> None:
    # sluice serve imports the files, then each server's watch starts from the versions the
    # files published: an edit made another way meanwhile is not undone by the first look,
    # nor by a change to another file.
    (tmp_path / "a.yaml").write_text(policy("a", 1))
    assert watcher(store, tmp_path).import_now() == {"a": 1}
    server = watcher(store, tmp_path)
    server.follow_database()
    service = PolicyService(store)
    service.publish(service.validate([("api", policy("a", 9))]), author="alice", comment="")
    assert server.check() == {}
    (tmp_path / "b.yaml").write_text(policy("b", 2))
    assert server.check() == {"b": 1}
    assert live(store) == {"a": (2, "9"), "b": (1, "2")}
    (tmp_path / "a.yaml").write_text(policy("a", 3))  # the file changed: it wins
    assert server.check() == {"a": 3}
    assert live(store) == {"a": (3, "3"), "b": (1, "2")}


def test_the_import_at_start_deletes_a_domain_whose_file_went_while_no_one_watched(
    store: PolicyStore, tmp_path: Path
) -> None:
    (tmp_path / "a.yaml").write_text(policy("a", 1))
    (tmp_path / "b.yaml").write_text(policy("b", 2))
    assert watcher(store, tmp_path).import_now() == {"a": 1, "b": 1}
    (tmp_path / "b.yaml").unlink()
    assert watcher(store, tmp_path).import_now() == {"b": 2}  # the next start
    assert live(store) == {"a": (1, "1")}


def test_a_change_the_database_could_not_take_is_published_by_a_later_look(
    store: PolicyStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from sluice.errors import ConfigDatabaseError

    class Outage(PolicyStore):
        down = True

        def current(self):  # type: ignore[no-untyped-def]
            if Outage.down:
                raise ConfigDatabaseError("config database: connection refused")
            return super().current()

    (tmp_path / "a.yaml").write_text(policy("a", 1))
    files = watcher(Outage(store.database), tmp_path)
    caplog.set_level(logging.WARNING, logger="sluice.policies.watcher")
    assert files.check() is None  # logged, not seen: tried again next look
    assert files.check() is None
    assert live(store) == {}
    assert [r.getMessage() for r in caplog.records] == [  # once per outage, not every look
        f"config files {tmp_path}: not published, will retry: config database: connection refused"
    ]
    Outage.down = False
    assert files.check() == {"a": 1}
