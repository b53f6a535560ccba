"""The ``sluice`` command: serve, check, import, export, history, diff, rollback, the
per-descriptor commands (override, block/unblock/blocks, allow/unallow/allows, reset: see
sluice/pin_cli.py), migrate-counters, settings, and the commands installed packages add
through the ``sluice.commands`` entry point group (the admin app's ``admin`` and
``admin-user``, see sluice_admin/cli.py).

Exit codes: 0 success, 1 invalid input (a policy or a setting), 2 usage, 3 config database.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.metadata import entry_points

from sluice import __version__, upstream_env
from sluice.errors import ConfigDatabaseError
from sluice.exit_codes import run_reporting_errors
from sluice.logs import configure as configure_logging
from sluice.model import DomainPolicy
from sluice.pin_cli import add_pin_commands
from sluice.policies.service import PolicyService
from sluice.policies.store import PolicyStore
from sluice.policies.watcher import ConfigWatcher
from sluice.policies.yaml_format import dump_policies, load_path
from sluice.settings import Settings, add_arguments, from_arguments, resolve

__all__ = ["main", "run_reporting_errors"]

log = logging.getLogger("sluice")

# Each entry point in this group names a function given the subcommands to add to (argparse's
# subparsers); a parser's ``handler`` default is called with (args, settings) for an exit code.
COMMANDS_GROUP = "sluice.commands"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        settings = from_arguments(args)
    except ValueError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return 1
    configure_logging(level=settings.log_level, log_format=settings.log_format)
    if args.command in ("serve", "settings"):
        unhonoured = upstream_env.warning_line(os.environ)
        if unhonoured is not None:
            log.warning("%s", unhonoured)
    return run_reporting_errors(lambda: args.handler(args, settings))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice", description="Rate-limit decisions over Envoy's RateLimitService API."
    )
    parser.add_argument("--version", action="version", version=f"sluice {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="serve ShouldRateLimit over gRPC and HTTP")
    add_arguments(serve)
    serve.set_defaults(handler=_serve)

    check = sub.add_parser("check", help="validate YAML policies; exit 1 on any error")
    check.add_argument("path", metavar="PATH")
    check.add_argument(
        "--strict",
        action="store_true",
        help="also exit 1 on what upstream serves but Sluice would rather not (warnings)",
    )
    add_arguments(check, only=("merge_domain_config", "max_sliding_log_limit"))
    check.set_defaults(handler=_check)

    imp = sub.add_parser("import", help="validate YAML policies and store them")
    imp.add_argument("path", metavar="PATH")
    imp.add_argument("--author", default=None, help="recorded with the change [default: $USER]")
    imp.add_argument("--comment", default="", help="recorded with the change")
    add_arguments(imp, only=("database_url", "log_level", "merge_domain_config"))
    imp.set_defaults(handler=_import)

    exp = sub.add_parser("export", help="print stored policies as YAML")
    exp.add_argument("--domain", action="append", help="only this domain (repeatable)")
    add_arguments(exp, only=("database_url", "log_level"))
    exp.set_defaults(handler=_export)

    history = sub.add_parser("history", help="list a domain's versions, newest first")
    history.add_argument("--domain", required=True)
    history.add_argument("--diff", action="store_true", help="show each version's diff too")
    add_arguments(history, only=("database_url", "log_level"))
    history.set_defaults(handler=_history)

    diff = sub.add_parser("diff", help="show what changed between two versions of a domain")
    diff.add_argument("--domain", required=True)
    diff.add_argument("from_version", type=int, metavar="V1")
    diff.add_argument("to_version", type=int, metavar="V2")
    add_arguments(diff, only=("database_url", "log_level"))
    diff.set_defaults(handler=_diff)

    rollback = sub.add_parser("rollback", help="restore an earlier version as a new version")
    rollback.add_argument("--domain", required=True)
    rollback.add_argument("--to", type=int, required=True, metavar="V", dest="to_version")
    rollback.add_argument("--author", default=None, help="recorded with the change [$USER]")
    rollback.add_argument("--comment", default="", help="recorded with the change")
    add_arguments(rollback, only=("database_url", "log_level"))
    rollback.set_defaults(handler=_rollback)

    add_pin_commands(sub, _policy_service, _author)

    migrate = sub.add_parser(
        "migrate-counters",
        help="move envoyproxy/ratelimit's fixed-window counters in Redis into Sluice's",
    )
    migrate.add_argument(
        "--upstream-prefix",
        default=None,
        help="upstream's CACHE_KEY_PREFIX [default: $CACHE_KEY_PREFIX, else empty]",
    )
    add_arguments(
        migrate,
        only=(
            "config",
            "database_url",
            "redis_url",
            "redis_tls_ca_file",
            "redis_tls_cert_file",
            "redis_tls_key_file",
            "redis_key_prefix",
            "redis_timeout_ms",
            "max_sliding_log_limit",
            "log_level",
        ),
    )
    migrate.set_defaults(handler=_migrate_counters)

    # Here, between migrate-counters and settings: --help lists commands in the order added.
    _add_installed_commands(sub)

    show = sub.add_parser(
        "settings", help="print the effective settings and their sources, secrets redacted"
    )
    add_arguments(show)
    show.set_defaults(handler=_settings)
    return parser


def _add_installed_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for entry_point in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        try:
            entry_point.load()(sub)
        except Exception as exc:  # a broken add-on must not take serve, check... down with it
            print(f"sluice: commands {entry_point.value} not loaded: {exc}", file=sys.stderr)


def _author(args: argparse.Namespace) -> str:
    if getattr(args, "author", None):
        return str(args.author)
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


@contextmanager
def _policy_service(settings: Settings) -> Iterator[PolicyService]:
    """The policy service over the configured database, its schema brought up to date."""
    with PolicyStore(settings.database_url) as store:
        store.upgrade()
        yield PolicyService(store, max_log_limit=settings.max_sliding_log_limit)


def _check(args: argparse.Namespace, settings: Settings) -> int:
    warnings: list[str] = []
    policies = load_path(
        args.path,
        max_log_limit=settings.max_sliding_log_limit,
        merge_domains=settings.merge_domain_config,
        warnings=warnings,
    )
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.strict and warnings:
        print(f"{args.path}: {len(warnings)} warning(s) (--strict)", file=sys.stderr)
        return 1
    print(f"{args.path}: OK, {len(policies)} domain(s): {', '.join(p.domain for p in policies)}")
    return 0


def _import(args: argparse.Namespace, settings: Settings) -> int:
    # Validate everything before touching the database.
    policies = load_path(
        args.path,
        max_log_limit=settings.max_sliding_log_limit,
        merge_domains=settings.merge_domain_config,
    )
    with _policy_service(settings) as service:
        changed = service.publish(policies, author=_author(args), comment=args.comment)
    for policy in policies:
        version = changed.get(policy.domain)
        state = f"version {version}" if version is not None else "unchanged"
        print(f"{policy.domain}: {state}")
    return 0


def _export(args: argparse.Namespace, settings: Settings) -> int:
    with _policy_service(settings) as service:
        wanted = set(args.domain or ())
        policies = [v.policy for v in service.domains() if not wanted or v.domain in wanted]
    if args.domain:
        missing = sorted(set(args.domain) - {p.domain for p in policies})
        if missing:
            print(f"sluice: no such domain: {', '.join(missing)}", file=sys.stderr)
            return 1
    sys.stdout.write(dump_policies(policies))
    return 0


def _history(args: argparse.Namespace, settings: Settings) -> int:
    with _policy_service(settings) as service:
        versions = service.history(args.domain)
    for v in versions:
        note = "deleted" if v.deleted else f"restores v{v.restored_from}" if v.restored_from else ""
        fields = [str(v.version), v.created_at.isoformat(timespec="seconds"), v.author, note]
        print("\t".join(f for f in [*fields, v.comment] if f))
        if args.diff and v.diff:
            sys.stdout.write(v.diff)
    return 0


def _diff(args: argparse.Namespace, settings: Settings) -> int:
    with _policy_service(settings) as service:
        sys.stdout.write(service.diff(args.domain, args.from_version, args.to_version))
    return 0


def _rollback(args: argparse.Namespace, settings: Settings) -> int:
    with _policy_service(settings) as service:
        version = service.rollback(
            args.domain, args.to_version, author=_author(args), comment=args.comment
        )
    if version is None:
        print(f"{args.domain}: version {args.to_version}'s rules are already live; nothing to do")
    else:
        print(f"{args.domain}: version {version} restores version {args.to_version}")
    return 0


def _migrate_counters(args: argparse.Namespace, settings: Settings) -> int:
    """Upstream's counters of the current windows, added to Sluice's for the same rules:
    the policies are ``--config``'s (upstream's RUNTIME_* directory), else the database's."""
    import time

    from redis.exceptions import RedisError

    from sluice.backends.redis.connect import RedisTls, connect
    from sluice.backends.redis.migrate import migrate_counters
    from sluice.errors import BackendUnavailableError
    from sluice.policies.yaml_format import load_sources
    from sluice.redaction import redact_url

    limit = settings.max_sliding_log_limit
    if settings.config:
        policies = load_path(settings.config, max_log_limit=limit)
    else:
        with PolicyStore(settings.database_url) as store:
            current = store.current()
        sources = ((f"database:{d}@v{s.version}", s.document) for d, s in current.items())
        policies = load_sources(sources, max_log_limit=limit)
    upstream_prefix = args.upstream_prefix
    if upstream_prefix is None:
        upstream_prefix = os.environ.get("CACHE_KEY_PREFIX", "")
    client = connect(
        settings.redis_url,
        pool_size=1,
        timeout_s=max(settings.redis_timeout_ms / 1000, 1.0),  # a one-off: no hurry
        tls=RedisTls(
            settings.redis_tls_ca_file, settings.redis_tls_cert_file, settings.redis_tls_key_file
        ),
    )

    async def run() -> str:
        try:
            report = await migrate_counters(
                client,
                policies,
                upstream_prefix=upstream_prefix,
                sluice_prefix=settings.redis_key_prefix,
                now=time.time(),
            )
        except RedisError as exc:
            # What was moved before stays moved; a rerun moves the rest.
            where = redact_url(settings.redis_url)
            raise BackendUnavailableError(f"Redis at {where}: {exc}") from None
        finally:
            await client.aclose()
        return report.summary()

    print(asyncio.run(run()))
    return 0


def _settings(args: argparse.Namespace, settings: Settings) -> int:
    # One JSON object, a setting a line: {"value": ..., "source": ...}.
    sources = resolve(args)[1]
    lines = [
        f"  {json.dumps(name)}: {json.dumps({'value': value, 'source': sources[name]})}"
        for name, value in settings.redacted().items()
    ]
    print("{\n" + ",\n".join(lines) + "\n}")
    return 0


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    workers = settings.worker_count
    if workers > 1:
        from sluice.workers import refusal

        problem = refusal(settings)
        if problem is not None:
            print(f"sluice: {problem}", file=sys.stderr)
            return 2
    limit = settings.max_sliding_log_limit
    policies = None
    if settings.config:
        policies = load_path(
            settings.config, max_log_limit=limit, merge_domains=settings.merge_domain_config
        )
    log.info("settings: %s", json.dumps(settings.redacted()))
    if workers > 1:
        # The import and the upgrade happen here, once, before any worker starts (with
        # either transport: a pyvoy worker is a launcher and its Envoy).
        with PolicyStore(settings.database_url) as store:
            _prepare_store(store, args, settings, policies)
        from sluice.workers import Supervisor

        return Supervisor(settings, workers).run()
    if settings.transport == "pyvoy":
        # Envoy serves the gRPC port; Sluice runs inside it (sluice/pyvoy_launcher.py).
        from sluice.pyvoy_launcher import serve

        with PolicyStore(settings.database_url) as store:
            _prepare_store(store, args, settings, policies)
        return asyncio.run(serve(settings))

    from sluice.app import Sluice  # the server stack is only imported when serving

    sluice = Sluice(settings)
    with PolicyStore(settings.database_url) as store:
        _prepare_store(store, args, settings, policies)
        sluice.attach(store)
        asyncio.run(sluice.run_until_signal())
    return 0


def _prepare_store(
    store: PolicyStore,
    args: argparse.Namespace,
    settings: Settings,
    policies: list[DomainPolicy] | None,
) -> None:
    """Bring the schema up to date and import ``--config``, before serving (as the files'
    own versions, so that the watch in each server can tell the domains they own)."""
    try:
        store.upgrade()
    except ConfigDatabaseError as exc:
        if policies is not None:
            raise  # asked to import: that cannot happen without the database
        # Without --config the local snapshot cache can still serve: attach() decides.
        # An outage, not a bug: one line (the reloader reports it again as it polls).
        log.warning("config database unreachable at start: %s", exc)
    if policies is not None:
        watcher = ConfigWatcher(
            settings.config,
            PolicyService(store, max_log_limit=settings.max_sliding_log_limit),
            merge_domains=settings.merge_domain_config,
            max_log_limit=settings.max_sliding_log_limit,
        )
        changed = watcher.import_now()
        log.info("imported %s: %s", settings.config, changed or "no changes")
