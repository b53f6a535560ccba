"""Usage telemetry in the config database: additive upserts in, time series and top
offenders out.

Why the config database and not Redis: it is there in every deployment (the embedded one
included), the admin app already reads it, and PostgreSQL aggregates several servers'
figures with one ``INSERT … ON CONFLICT DO UPDATE SET n = n + excluded.n`` per flush. The
write load is one small transaction per server per second, independent of request rate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import Connection, Insert, Table, and_, delete, func, literal, select
from sqlalchemy.dialects import postgresql, sqlite

from sluice.db import Database
from sluice.db.tables import usage_counts, usage_key_bins, usage_keys, usage_offenders
from sluice.usage.key_summary import KeySummary
from sluice.usage.recorder import COUNTER_NAMES

__all__ = ["KeyRecord", "UsagePoint", "UsageStore"]

SECOND, MINUTE = 1, 60
RETENTION_S = {SECOND: 3600, MINUTE: 2 * 86400}


@dataclass(frozen=True)
class UsagePoint:
    bucket_s: int
    allowed: int
    over_limit: int
    shadow_over_limit: int
    near_limit: int
    backend_errors: int
    blocked: int = 0  # later than the others: positional callers predate it


@dataclass(frozen=True)
class KeyRecord:
    """One rule's per-key usage since some instant, at one resolution (see ``usage_keys``).

    ``keys``: (bucket, key, hits) of the keys kept by name; ``bins``: (bucket, bin floor,
    keys, hits) of the others. At resolution 1, hits in that second; at 60, the peak second's.
    """

    keys: list[tuple[int, str, int]]
    bins: list[tuple[int, int, int, int]]


class UsageStore:
    def __init__(self, database: Database) -> None:
        self._db = database
        self._insert = postgresql.insert if database.dialect == "postgresql" else sqlite.insert
        self._greatest = func.greatest if database.dialect == "postgresql" else func.max

    def add(
        self,
        counts: Mapping[tuple[str, int], list[int]],
        offenders: Mapping[tuple[str, int], Mapping[str, int]],
        keys: Mapping[tuple[str, int], KeySummary] | None = None,
    ) -> None:
        """Add counts per (rule, second), offender hits per (rule, minute) and per-key
        summaries per (rule, second), atomically."""
        count_rows = []
        for (rule, second), values in counts.items():
            for resolution in (SECOND, MINUTE):
                row = {
                    "rule": rule,
                    "resolution_s": resolution,
                    "bucket_s": second - second % resolution,
                }
                row.update(zip(COUNTER_NAMES, values, strict=True))
                count_rows.append(row)
        offender_rows = [
            {"rule": rule, "bucket_s": minute, "key": key[:1024], "hits": hits}
            for (rule, minute), keys in offenders.items()
            for key, hits in keys.items()
        ]
        with self._db.translated("write usage"), self._db.engine.begin() as conn:
            for table, rows, columns in (
                (
                    usage_counts,
                    _merge(count_rows, ("rule", "resolution_s", "bucket_s")),
                    COUNTER_NAMES,
                ),
                (usage_offenders, _merge(offender_rows, ("rule", "bucket_s", "key")), ("hits",)),
            ):
                if rows:
                    conn.execute(self._additive_upsert(table, columns), rows)
            if keys:
                self._add_keys(conn, keys)

    def _add_keys(self, conn: Connection, keys: Mapping[tuple[str, int], KeySummary]) -> None:
        """Seconds add up (several servers, or a flush that failed and was retried); then each
        minute keeps the highest of its seconds as they now stand in the store, so a key's
        peak is its hits from all servers together."""
        key_rows: list[dict[str, object]] = []
        bin_rows: list[dict[str, object]] = []
        for (rule, second), summary in keys.items():
            at = {"rule": rule, "resolution_s": SECOND, "bucket_s": second}
            for key, hits in summary.top.items():
                key_rows.append({**at, "key": key[:1024], "hits": hits})
            for floor, (count, hits) in summary.bins.items():
                bin_rows.append({**at, "bin_floor": floor, "key_count": count, "hits": hits})
        rules = sorted({rule for rule, _ in keys})
        seconds = [second for _, second in keys]
        for table, part, rows, columns in (
            (usage_keys, "key", key_rows, ("hits",)),
            (usage_key_bins, "bin_floor", bin_rows, ("key_count", "hits")),
        ):
            if not rows:
                continue
            names = ("rule", "resolution_s", "bucket_s", part)
            conn.execute(self._additive_upsert(table, columns), _merge(rows, names))
            c = table.c
            minute = c.bucket_s - c.bucket_s % MINUTE
            peaks = (
                select(
                    c.rule,
                    literal(MINUTE).label("resolution_s"),
                    minute.label("bucket_s"),
                    c[part],
                    *(func.max(c[name]).label(name) for name in columns),
                )
                .where(
                    c.rule.in_(rules),
                    c.resolution_s == SECOND,
                    c.bucket_s >= min(seconds),
                    c.bucket_s <= max(seconds),
                )
                .group_by(c.rule, minute, c[part])
            )
            statement = self._insert(table).from_select([*names, *columns], peaks)
            conn.execute(
                statement.on_conflict_do_update(
                    index_elements=list(names),
                    set_={n: self._greatest(c[n], statement.excluded[n]) for n in columns},
                )
            )

    def _additive_upsert(self, table: Table, columns: Iterable[str]) -> Insert:
        statement = self._insert(table)
        keys = [c.name for c in table.primary_key.columns]
        return statement.on_conflict_do_update(
            index_elements=keys,
            set_={c: table.c[c] + statement.excluded[c] for c in columns},
        )

    def key_record(self, rule: str, *, since_s: int, resolution_s: int = SECOND) -> KeyRecord:
        """One rule's per-key usage since ``since_s``, oldest first."""
        key_query = (
            select(usage_keys.c.bucket_s, usage_keys.c.key, usage_keys.c.hits)
            .where(
                usage_keys.c.rule == rule,
                usage_keys.c.resolution_s == resolution_s,
                usage_keys.c.bucket_s >= since_s,
            )
            .order_by(usage_keys.c.bucket_s, usage_keys.c.key)
        )
        b = usage_key_bins.c
        bin_query = (
            select(b.bucket_s, b.bin_floor, b.key_count, b.hits)
            .where(b.rule == rule, b.resolution_s == resolution_s, b.bucket_s >= since_s)
            .order_by(b.bucket_s, b.bin_floor)
        )
        with self._db.translated("read usage per key"), self._db.engine.connect() as conn:
            keys = [(int(r[0]), r[1], int(r[2])) for r in conn.execute(key_query)]
            bins = [(int(r[0]), int(r[1]), int(r[2]), int(r[3])) for r in conn.execute(bin_query)]
        return KeyRecord(keys, bins)

    def series(
        self, rule_prefix: str, *, since_s: int, resolution_s: int = SECOND
    ) -> dict[str, list[UsagePoint]]:
        """Per rule (every rule starting with ``rule_prefix``): points since ``since_s``."""
        query = (
            select(usage_counts)
            .where(
                and_(
                    usage_counts.c.rule.startswith(rule_prefix, autoescape=True),
                    usage_counts.c.resolution_s == resolution_s,
                    usage_counts.c.bucket_s >= since_s,
                )
            )
            .order_by(usage_counts.c.rule, usage_counts.c.bucket_s)
        )
        out: dict[str, list[UsagePoint]] = {}
        with self._db.translated("read usage"), self._db.engine.connect() as conn:
            for row in conn.execute(query):
                values = [getattr(row, name) for name in COUNTER_NAMES]
                out.setdefault(row.rule, []).append(UsagePoint(row.bucket_s, *values))
        return out

    def top_offenders(self, rule: str, *, since_s: int, limit: int = 10) -> list[tuple[str, int]]:
        total = func.sum(usage_offenders.c.hits).label("hits")
        query = (
            select(usage_offenders.c.key, total)
            .where(usage_offenders.c.rule == rule, usage_offenders.c.bucket_s >= since_s)
            .group_by(usage_offenders.c.key)
            .order_by(total.desc(), usage_offenders.c.key)
            .limit(limit)
        )
        with self._db.translated("read offenders"), self._db.engine.connect() as conn:
            return [(row.key, int(row.hits)) for row in conn.execute(query)]

    def expire(self, now_s: int) -> None:
        """Drop what has aged out; idempotent, so any server may run it."""
        with self._db.translated("expire usage"), self._db.engine.begin() as conn:
            for resolution, keep_s in RETENTION_S.items():
                conn.execute(
                    delete(usage_counts).where(
                        usage_counts.c.resolution_s == resolution,
                        usage_counts.c.bucket_s < now_s - keep_s,
                    )
                )
            conn.execute(
                delete(usage_offenders).where(
                    usage_offenders.c.bucket_s < now_s - RETENTION_S[MINUTE]
                )
            )
            for table in (usage_keys, usage_key_bins):
                for resolution, keep_s in RETENTION_S.items():
                    conn.execute(
                        delete(table).where(
                            table.c.resolution_s == resolution,
                            table.c.bucket_s < now_s - keep_s,
                        )
                    )


def _merge(rows: list[dict[str, object]], key: tuple[str, ...]) -> list[dict[str, object]]:
    """Sum rows with the same key: one upsert statement must not touch a row twice."""
    merged: dict[tuple[object, ...], dict[str, object]] = {}
    for row in rows:
        k = tuple(row[name] for name in key)
        if k not in merged:
            merged[k] = dict(row)
            continue
        target = merged[k]
        for name, value in row.items():
            if name not in key:
                target[name] = int(target[name]) + int(value)  # type: ignore[call-overload]
    return list(merged.values())
