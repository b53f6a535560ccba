"""The per-descriptor commands of ``sluice``: ``override set/list/delete``, ``block``,
``unblock``, ``blocks``, ``allow``, ``unallow``, ``allows`` and ``reset``.

Each writes through PolicyService against the config database, as ``rollback`` does, so
every change is a new version of the domain's policy with author and comment, and every
running server picks it up with its next poll.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TypeAlias

from sluice.model import Pin
from sluice.policies.descriptor_text import format_entries, format_time
from sluice.policies.service import PolicyService
from sluice.settings import Settings, add_arguments

__all__ = ["add_pin_commands"]

ServiceFactory = Callable[[Settings], AbstractContextManager[PolicyService]]
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_pin_commands(
    sub: Subparsers, service: ServiceFactory, author: Callable[[argparse.Namespace], str]
) -> None:
    """Add the commands; ``service`` opens the policy service, ``author`` names who acts."""
    commands = _Commands(service, author)

    override = sub.add_parser("override", help="a limit of its own for one exact descriptor")
    actions = override.add_subparsers(dest="action", metavar="ACTION", required=True)
    put = _writer(actions, "set", "set (or replace) the override of a descriptor", expiring=True)
    put.add_argument("--requests-per-unit", type=int, required=True, metavar="N")
    put.add_argument("--unit", required=True, metavar="U", help="second, minute, hour, day…")
    put.add_argument("--algorithm", default=None, metavar="A", help="[default: fixed_window]")
    put.add_argument("--burst", type=int, default=None, metavar="B")
    put.set_defaults(handler=commands.set_override)
    _lister(actions, "list", "list a domain's overrides").set_defaults(
        handler=commands.lister("overrides")
    )
    _writer(actions, "delete", "remove the override of a descriptor").set_defaults(
        handler=commands.deleter("overrides")
    )

    for kind, verb, unverb, what in (
        ("blocks", "block", "unblock", "refuse every request carrying a descriptor at once"),
        ("allows", "allow", "unallow", "never limit a descriptor"),
    ):
        _writer(sub, verb, what, expiring=True).set_defaults(handler=commands.pinner(kind))
        _writer(sub, unverb, f"undo '{verb}'").set_defaults(handler=commands.deleter(kind))
        _lister(sub, kind, f"list a domain's {kind}").set_defaults(handler=commands.lister(kind))

    _writer(sub, "reset", "start a descriptor's counters afresh on every server").set_defaults(
        handler=commands.reset
    )


def _writer(
    sub: Subparsers, name: str, help_text: str, *, expiring: bool = False
) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help_text)
    parser.add_argument("--domain", required=True)
    parser.add_argument(
        "--descriptor", required=True, metavar="KEY=VALUE[,KEY=VALUE…]", help="exact entries"
    )
    if expiring:
        parser.add_argument(
            "--expires-in",
            default=None,
            metavar="DURATION",
            help="30s, 10m, 2h, 7d, 1w, or an ISO 8601 time [default: never]",
        )
    parser.add_argument("--author", default=None, help="recorded with the change [$USER]")
    parser.add_argument("--comment", default="", help="recorded with the change")
    add_arguments(parser, only=("database_url", "log_level"))
    return parser


def _lister(sub: Subparsers, name: str, help_text: str) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help_text)
    parser.add_argument("--domain", required=True)
    add_arguments(parser, only=("database_url", "log_level"))
    return parser


Handler = Callable[[argparse.Namespace, Settings], int]


class _Commands:
    def __init__(
        self, service: ServiceFactory, author: Callable[[argparse.Namespace], str]
    ) -> None:
        self.service = service
        self.author = author

    def set_override(self, args: argparse.Namespace, settings: Settings) -> int:
        rate_limit: dict[str, object] = {
            "requests_per_unit": args.requests_per_unit,
            "unit": args.unit,
        }
        if args.algorithm is not None:
            rate_limit["algorithm"] = args.algorithm
        if args.burst is not None:
            rate_limit["burst"] = args.burst
        return self._put(args, settings, "overrides", rate_limit)

    def pinner(self, kind: str) -> Handler:
        return lambda args, settings: self._put(args, settings, kind, None)

    def _put(
        self,
        args: argparse.Namespace,
        settings: Settings,
        kind: str,
        rate_limit: dict[str, object] | None,
    ) -> int:
        with self.service(settings) as service:
            changed = service.put_pin(
                args.domain,
                kind,
                args.descriptor,
                rate_limit=rate_limit,
                expires_in=args.expires_in,
                author=self.author(args),
                comment=args.comment,
            )
        return _report(args.domain, changed)

    def deleter(self, kind: str) -> Handler:
        def delete(args: argparse.Namespace, settings: Settings) -> int:
            with self.service(settings) as service:
                changed = service.delete_pin(
                    args.domain,
                    kind,
                    args.descriptor,
                    author=self.author(args),
                    comment=args.comment,
                )
            return _report(args.domain, changed)

        return delete

    def lister(self, kind: str) -> Handler:
        def show(args: argparse.Namespace, settings: Settings) -> int:
            with self.service(settings) as service:
                pins = service.pins(args.domain, kind)
            for pin in pins:
                print("\t".join(_row(pin)))
            return 0

        return show

    def reset(self, args: argparse.Namespace, settings: Settings) -> int:
        with self.service(settings) as service:
            changed = service.reset(
                args.domain, args.descriptor, author=self.author(args), comment=args.comment
            )
        return _report(args.domain, changed)


def _row(pin: Pin) -> list[str]:
    """descriptor, [limit,] expiry: tab-separated, the descriptor as the commands take it."""
    row = [format_entries(pin.entries)]
    if pin.rate_limit is not None:
        limit = pin.rate_limit
        burst = f" burst={limit.burst}" if limit.burst is not None else ""
        row.append(f"{limit.requests_per_unit}/{limit.unit.name.lower()} {limit.algorithm}{burst}")
    expires = pin.expires_at_s
    row.append(f"expires {format_time(expires)}" if expires is not None else "no expiry")
    return row


def _report(domain: str, changed: dict[str, int]) -> int:
    version = changed.get(domain)
    print(f"{domain}: version {version}" if version is not None else f"{domain}: unchanged")
    return 0
