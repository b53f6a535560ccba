"""PolicyStore against real databases: a SQLite file and a fresh PostgreSQL database."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from sluice.db import engine as engine_module
from sluice.db import schema_head
from sluice.errors import ConfigDatabaseError, StaleVersionError
from sluice.policies import store as store_module
from sluice.policies.store import PolicyStore

DOC_A1 = "domain: a\ndescriptors: []\n"
DOC_A2 = "domain: a\ndescriptors:\n  - key: k\n"
DOC_B1 = "domain: b\ndescriptors: []\n"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        # A directory that does not exist yet: the store must create it.
        return f"sqlite:///{tmp_path / 'state' / 'sluice.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def open_store(db_url: str) -> Iterator[Callable[[], PolicyStore]]:
    """Opens upgraded stores on the test database and closes them all afterwards."""
    opened: list[PolicyStore] = []

    def open_() -> PolicyStore:
        store = PolicyStore(db_url)
        opened.append(store)
        store.upgrade()
        return store

    yield open_
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: Callable[[], PolicyStore]) -> PolicyStore:
    return open_store()


def publish(store: PolicyStore, documents: dict[str, str | None], **kwargs: object) -> dict:
    return store.publish(documents, author="alice", comment="test", **kwargs)  # type: ignore[arg-type]


def test_publish_then_current_round_trips(store: PolicyStore) -> None:
    before = datetime.now(UTC)
    assert store.current() == {}

    changed = store.publish({"b": DOC_B1, "a": DOC_A1}, author="alice", comment="first rules")
    assert changed == {"a": 1, "b": 1}

    current = store.current()
    assert list(current) == ["a", "b"]
    a = current["a"]
    assert (a.domain, a.version, a.document, a.author, a.comment, a.deleted) == (
        "a",
        1,
        DOC_A1,
        "alice",
        "first rules",
        False,
    )
    assert current["b"].document == DOC_B1
    assert a.created_at.tzinfo is not None and a.created_at.utcoffset().total_seconds() == 0
    assert before <= a.created_at <= datetime.now(UTC)
    assert current["b"].created_at == a.created_at


def test_unchanged_document_creates_no_version(store: PolicyStore) -> None:
    publish(store, {"a": DOC_A1, "b": DOC_B1})

    assert publish(store, {"a": DOC_A1, "b": DOC_B1}) == {}
    assert publish(store, {"a": DOC_A2, "b": DOC_B1}) == {"a": 2}
    assert [p.version for p in store.history("b")] == [1]
    assert [p.version for p in store.history("a")] == [2, 1]


def test_deletion_is_a_version_and_leaves_current(store: PolicyStore) -> None:
    publish(store, {"a": DOC_A1, "b": DOC_B1})

    assert store.publish({"a": None}, author="bob", comment="retire a") == {"a": 2}
    assert list(store.current()) == ["b"]

    newest, oldest = store.history("a")
    assert (newest.version, newest.deleted, newest.document, newest.author) == (2, True, "", "bob")
    assert (oldest.version, oldest.deleted, oldest.document) == (1, False, DOC_A1)

    # Deleting what is already gone, or never existed, writes nothing.
    token = store.change_token()
    assert publish(store, {"a": None, "never": None}) == {}
    assert store.history("never") == []
    assert store.change_token() == token

    # Re-creating continues the numbering, so history stays one sequence.
    assert publish(store, {"a": DOC_A1}) == {"a": 3}
    assert store.current()["a"].version == 3


def test_versions_increment_per_domain(store: PolicyStore) -> None:
    assert publish(store, {"a": DOC_A1, "b": DOC_B1}) == {"a": 1, "b": 1}
    assert publish(store, {"a": DOC_A2}) == {"a": 2}
    assert publish(store, {"a": DOC_A1}) == {"a": 3}
    assert publish(store, {"c": DOC_A1}) == {"c": 1}

    versions = {domain: policy.version for domain, policy in store.current().items()}
    assert versions == {"a": 3, "b": 1, "c": 1}


def test_stale_expected_version_is_refused_and_nothing_written(store: PolicyStore) -> None:
    publish(store, {"a": DOC_A1})
    publish(store, {"a": DOC_A2})
    token = store.change_token()

    with pytest.raises(StaleVersionError) as caught:
        publish(store, {"a": DOC_A1, "b": DOC_B1}, expected_versions={"a": 1, "b": 0})

    assert (caught.value.domain, caught.value.expected, caught.value.actual) == ("a", 1, 2)
    assert "'a'" in str(caught.value) and "1" in str(caught.value) and "2" in str(caught.value)
    assert store.change_token() == token
    assert store.history("b") == []
    assert store.current()["a"].document == DOC_A2


def test_expected_versions_of_matching_and_unpublished_domains(store: PolicyStore) -> None:
    publish(store, {"a": DOC_A1})

    # 0 means "must not exist yet"; a domain only named in expected_versions is a precondition.
    assert publish(store, {"b": DOC_B1}, expected_versions={"a": 1, "b": 0}) == {"b": 1}
    with pytest.raises(StaleVersionError) as caught:
        publish(store, {"b": DOC_A1}, expected_versions={"a": 0})
    assert (caught.value.domain, caught.value.expected, caught.value.actual) == ("a", 0, 1)


def test_upgrade_is_idempotent(db_url: str, store: PolicyStore) -> None:
    publish(store, {"a": DOC_A1})

    store.upgrade()
    with PolicyStore(db_url) as other:
        other.upgrade()
        assert other.current()["a"].document == DOC_A1

    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).all() == [
                (schema_head(),)
            ]
    finally:
        engine.dispose()


def test_a_new_sqlite_file_waits_for_a_writer_before_switching_to_wal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Switching a new file to WAL while another connection writes to it failed at once with
    # "database is locked" (SQLite does not call the busy handler there), so replicas starting
    # together on a new file failed one time in ten. Now it waits like any other lock wait.
    monkeypatch.setattr(engine_module, "_SQLITE_BUSY_TIMEOUT_MS", 300)
    path = tmp_path / "new.db"
    writer = sqlite3.connect(path, isolation_level=None)
    store = PolicyStore(f"sqlite:///{path}")
    try:
        writer.execute("BEGIN IMMEDIATE")
        writer.execute("CREATE TABLE other (x)")
        started = time.monotonic()
        with pytest.raises(ConfigDatabaseError, match="database is locked"):
            store.upgrade()
        assert time.monotonic() - started >= 0.3  # the whole busy timeout, not at once
        writer.execute("COMMIT")
        store.upgrade()
        assert store.current() == {}
    finally:
        store.close()
        writer.close()
    with contextlib.closing(sqlite3.connect(path)) as reader:  # the file's mode, not a cache
        assert reader.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_concurrent_upgrades_on_a_fresh_database(db_url: str) -> None:
    stores = [PolicyStore(db_url) for _ in range(4)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(stores))

    def upgrade(store: PolicyStore) -> None:
        barrier.wait()
        try:
            store.upgrade()
        except BaseException as exc:  # collected and asserted on below
            errors.append(exc)

    threads = [threading.Thread(target=upgrade, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == []
        assert stores[0].current() == {}
    finally:
        for store in stores:
            store.close()


def test_change_token_moves_on_publish_only(store: PolicyStore) -> None:
    assert store.change_token() == 0

    publish(store, {"a": DOC_A1})
    first = store.change_token()
    assert first > 0

    publish(store, {"a": DOC_A1})
    assert store.change_token() == first

    publish(store, {"a": DOC_A2, "b": DOC_B1})
    assert store.change_token() > first


def test_stores_sharing_a_sqlite_file_see_each_other(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    with PolicyStore(url) as one, PolicyStore(url) as two:
        one.upgrade()
        two.upgrade()
        # Prime both pools, so the second read goes through an already-open connection.
        assert one.current() == two.current() == {}

        publish(one, {"a": DOC_A1})
        assert two.current()["a"].document == DOC_A1
        assert two.change_token() == one.change_token()

        assert publish(two, {"a": DOC_A2}, expected_versions={"a": 1}) == {"a": 2}
        assert one.current()["a"].version == 2

        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                assert conn.execute(text("PRAGMA journal_mode")).scalar_one() == "wal"
        finally:
            engine.dispose()


def test_concurrent_publishers_never_duplicate_versions(
    open_store: Callable[[], PolicyStore],
) -> None:
    stores = [open_store() for _ in range(4)]
    per_store = 5
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(stores))

    def run(index: int, store: PolicyStore) -> None:
        barrier.wait()
        try:
            for n in range(per_store):
                publish(store, {"a": f"writer {index} change {n}\n"})
        except BaseException as exc:  # collected and asserted on below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=pair) for pair in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    versions = [p.version for p in stores[0].history("a")]
    assert versions == list(range(len(stores) * per_store, 0, -1))


def test_concurrent_conditional_publishes_let_exactly_one_win(
    open_store: Callable[[], PolicyStore],
) -> None:
    stores = [open_store() for _ in range(4)]
    outcomes: list[object] = []
    barrier = threading.Barrier(len(stores))

    def run(index: int, store: PolicyStore) -> None:
        barrier.wait()
        try:
            outcomes.append(publish(store, {"a": f"writer {index}\n"}, expected_versions={"a": 0}))
        except StaleVersionError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=run, args=pair) for pair in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert outcomes.count({"a": 1}) == 1
    assert sum(isinstance(o, StaleVersionError) for o in outcomes) == len(stores) - 1
    assert [p.version for p in stores[0].history("a")] == [1]


def test_unique_clash_becomes_stale_version_error(
    store: PolicyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Simulates a writer that slipped past the lock: the publish reads an outdated latest
    # version, so its insert collides with the unique (domain, version) constraint.
    publish(store, {"a": DOC_A1})
    real_latest = store_module._latest
    calls = 0

    def outdated_once(conn, domains):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return {} if calls == 1 else real_latest(conn, domains)

    monkeypatch.setattr(store_module, "_latest", outdated_once)
    with pytest.raises(StaleVersionError) as caught:
        publish(store, {"a": DOC_A2})

    assert (caught.value.domain, caught.value.expected, caught.value.actual) == ("a", 0, 1)
    monkeypatch.undo()
    assert [p.version for p in store.history("a")] == [1]


def test_store_before_upgrade_reports_a_database_error(db_url: str) -> None:
    with PolicyStore(db_url) as store, pytest.raises(ConfigDatabaseError):
        store.current()


def test_unreachable_postgresql_is_a_config_database_error_without_password() -> None:
    url = "postgresql://sluice:hunter2-secret@127.0.0.1:1/sluice"
    with PolicyStore(url) as store:
        for operation in (store.upgrade, store.current, store.change_token):
            with pytest.raises(ConfigDatabaseError) as caught:
                operation()
            message = str(caught.value)
            assert "hunter2-secret" not in message
            assert "sluice:***@127.0.0.1:1/sluice" in message
            assert caught.value.__cause__ is not None


def test_unsupported_or_malformed_url_is_a_config_database_error() -> None:
    with pytest.raises(ConfigDatabaseError) as caught:
        PolicyStore("mysql://root:topsecret@db/sluice")
    assert "topsecret" not in str(caught.value)

    with pytest.raises(ConfigDatabaseError) as caught:
        PolicyStore("not a url :topsecret@")
    assert "topsecret" not in str(caught.value)


def test_upgrading_from_the_first_schema_keeps_every_version(db_url: str) -> None:
    with PolicyStore(db_url) as old:
        old.upgrade("0001")
        engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
        try:
            with engine.begin() as conn:  # rows as the 0001 schema stored them
                conn.execute(
                    text(
                        "INSERT INTO policy_versions (domain, version, document, author, comment,"
                        " created_at) VALUES ('a', 1, :doc, 'old', 'before', :at),"
                        " ('a', 2, NULL, 'old', 'gone', :at)"
                    ),
                    {"doc": DOC_A1, "at": datetime.now(UTC)},
                )
        finally:
            engine.dispose()
        old.upgrade()
        history = old.history("a")
        assert [(p.version, p.deleted, p.author, p.restored_from) for p in history] == [
            (2, True, "old", None),
            (1, False, "old", None),
        ]
        assert history[1].document == DOC_A1
        assert old.publish(
            {"a": DOC_A1}, author="new", comment="restore", restored_from={"a": 1}
        ) == {"a": 3}
        assert old.history("a")[0].restored_from == 1
