"""The policy write API: HTTP+JSON over PolicyService, for automation and the admin app.

Every route needs ``Authorization: Bearer <api token>``; without a configured token the API
answers 403, so an unconfigured server never accepts writes. Changes carry the version they
were based on (``base_version``); a stale one is refused with 409. See docs/api.md.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from sluice.errors import ConfigError, SluiceError, status_of
from sluice.policies.service import DomainView, PolicyService, Version
from sluice.policies.yaml_format import pin_document, rule_document

__all__ = ["add_api_routes", "bearer_guard"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# A domain's overrides, blocks and allows: one route each, the same handlers.
_PINS = "/api/v1/domains/{domain}/{kind:overrides|blocks|allows}"


def add_api_routes(app: web.Application, service: PolicyService, token: str) -> None:
    api = _Api(service)
    guard = bearer_guard(token)
    routes = [
        ("GET", "/api/v1/domains", api.list_domains),
        ("GET", "/api/v1/domains/{domain}", api.get_domain),
        ("PUT", "/api/v1/domains/{domain}", api.put_domain),
        ("DELETE", "/api/v1/domains/{domain}", api.delete_domain),
        ("GET", "/api/v1/domains/{domain}/history", api.history),
        ("GET", "/api/v1/domains/{domain}/diff", api.diff),
        ("POST", "/api/v1/domains/{domain}/rollback", api.rollback),
        ("PUT", "/api/v1/domains/{domain}/rules", api.put_rule),
        ("DELETE", "/api/v1/domains/{domain}/rules", api.delete_rule),
        ("GET", _PINS, api.list_pins),
        ("PUT", _PINS, api.put_pin),
        ("DELETE", _PINS, api.delete_pin),
        ("POST", "/api/v1/domains/{domain}/reset", api.reset),
        ("POST", "/api/v1/validate", api.validate),
    ]
    for method, path, handler in routes:
        app.router.add_route(method, path, guard(handler))


def bearer_guard(token: str) -> Callable[[Handler], Handler]:
    """Wraps a route: the API token required, and SluiceErrors answered with their status
    (sluice/http/runtime.py's routes use it too)."""
    expected = f"Bearer {token}".encode()

    def wrap(handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            if not token:
                return _json({"error": "the write API is disabled: set --api-token"}, 403)
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return _json({"error": "missing or wrong bearer token"}, 401)
            try:
                return await handler(request)
            except SluiceError as exc:
                status = status_of(exc)
                if status is None:
                    raise  # a bug: aiohttp answers 500 and logs it
                return _json(_error_body(exc), status.http)

        return guarded

    return wrap


def _error_body(exc: SluiceError) -> dict[str, Any]:
    if isinstance(exc, ConfigError):
        return {"error": "invalid policy", "problems": exc.problems}
    return {"error": str(exc)}


class _Api:
    def __init__(self, service: PolicyService) -> None:
        self.service = service

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # The store is synchronous (SQLAlchemy); keep it off the event loop that serves
        # ShouldRateLimit.
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def _change(
        self,
        request: web.Request,
        body: dict[str, Any],
        domain: str,
        write: Callable[..., dict[str, int]],
        /,
        *args: Any,
        **kwargs: Any,
    ) -> web.Response:
        """One of the service's writes, as the request's author, with its comment and its
        expected version; the answer names the domain's new version (none if nothing changed)."""
        changed = await self._call(
            write,
            *args,
            author=_author(request, body),
            comment=str(body.get("comment", "")),
            base_version=_base_version(body),
            **kwargs,
        )
        return _json({"domain": domain, "version": changed.get(domain), "changed": bool(changed)})

    async def list_domains(self, request: web.Request) -> web.Response:
        views = await self._call(self.service.domains)
        return _json({"domains": [_summary(v) for v in views]})

    async def get_domain(self, request: web.Request) -> web.Response:
        view = await self._call(self.service.get, request.match_info["domain"])
        body = _summary(view)
        body["document"] = view.document
        body["descriptors"] = [rule_document(r) for r in view.policy.descriptors]
        return _json(body)

    async def put_domain(self, request: web.Request) -> web.Response:
        domain = request.match_info["domain"]
        body = await _body(request)
        document = body.get("document")
        if not isinstance(document, str):
            descriptors = body.get("descriptors", [])
            document = json.dumps({"domain": domain, "descriptors": descriptors})
        return await self._change(
            request,
            body,
            domain,
            self.service.publish_document,
            document,
            domain=domain,
        )

    async def delete_domain(self, request: web.Request) -> web.Response:
        domain = request.match_info["domain"]
        body = await _body(request, required=False)
        version = await self._call(
            self.service.delete,
            domain,
            author=_author(request, body),
            comment=str(body.get("comment", "")),
            base_version=_base_version(body),
        )
        return _json({"domain": domain, "version": version, "deleted": True})

    async def history(self, request: web.Request) -> web.Response:
        versions = await self._call(self.service.history, request.match_info["domain"])
        return _json({"versions": [_version(v) for v in versions]})

    async def diff(self, request: web.Request) -> web.Response:
        try:
            old, new = int(request.query["from"]), int(request.query["to"])
        except (KeyError, ValueError):
            raise ConfigError(["query: 'from' and 'to' must be version numbers"]) from None
        text = await self._call(self.service.diff, request.match_info["domain"], old, new)
        return _json({"diff": text})

    async def rollback(self, request: web.Request) -> web.Response:
        domain = request.match_info["domain"]
        body = await _body(request)
        to_version = body.get("to_version")
        if not isinstance(to_version, int) or isinstance(to_version, bool):
            raise ConfigError(["to_version: must be a version number"])
        version = await self._call(
            self.service.rollback,
            domain,
            to_version,
            author=_author(request, body),
            comment=str(body.get("comment", "")),
            base_version=_base_version(body),
        )
        return _json({"domain": domain, "version": version, "changed": version is not None})

    async def put_rule(self, request: web.Request) -> web.Response:
        domain = request.match_info["domain"]
        body = await _body(request)
        rule_doc = body.get("rule")
        if not isinstance(rule_doc, dict):
            raise ConfigError(["rule: must be a descriptor mapping (key, value, rate_limit, …)"])
        path = _path(body)
        rule = await self._call(self.service.validate_rule, domain, rule_doc)
        return await self._change(
            request,
            body,
            domain,
            self.service.put_rule,
            domain,
            path,
            rule,
        )

    async def delete_rule(self, request: web.Request) -> web.Response:
        domain = request.match_info["domain"]
        body = await _body(request)
        return await self._change(
            request,
            body,
            domain,
            self.service.delete_rule,
            domain,
            _path(body),
        )

    async def list_pins(self, request: web.Request) -> web.Response:
        kind = request.match_info["kind"]
        pins = await self._call(self.service.pins, request.match_info["domain"], kind)
        return _json({kind: [pin_document(p) for p in pins]})

    async def put_pin(self, request: web.Request) -> web.Response:
        domain, kind = request.match_info["domain"], request.match_info["kind"]
        body = await _body(request)
        expires_in = body.get("expires_in")
        if expires_in is not None and not isinstance(expires_in, str):
            raise ConfigError(["expires_in: must be a duration (30s, 10m, 7d) or an ISO 8601 time"])
        return await self._change(
            request,
            body,
            domain,
            self.service.put_pin,
            domain,
            kind,
            _descriptor(body),
            rate_limit=body.get("rate_limit"),
            expires_in=expires_in,
        )

    async def delete_pin(self, request: web.Request) -> web.Response:
        domain, kind = request.match_info["domain"], request.match_info["kind"]
        body = await _body(request)
        return await self._change(
            request,
            body,
            domain,
            self.service.delete_pin,
            domain,
            kind,
            _descriptor(body),
        )

    async def reset(self, request: web.Request) -> web.Response:
        domain = request.match_info["domain"]
        body = await _body(request)
        return await self._change(
            request,
            body,
            domain,
            self.service.reset,
            domain,
            _descriptor(body),
        )

    async def validate(self, request: web.Request) -> web.Response:
        body = await _body(request)
        document = body.get("document")
        if not isinstance(document, str):
            raise ConfigError(["document: must be a YAML string"])
        policies = await self._call(self.service.validate, [("document", document)])
        return _json({"valid": True, "domains": [p.domain for p in policies]})


async def _body(request: web.Request, *, required: bool = True) -> dict[str, Any]:
    raw = await request.read()
    if not raw and not required:
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError([f"body: not valid JSON: {exc}"]) from exc
    if not isinstance(body, dict):
        raise ConfigError(["body: must be a JSON object"])
    return body


def _author(request: web.Request, body: dict[str, Any]) -> str:
    author = body.get("author") or request.headers.get("X-Sluice-Author") or "api"
    return str(author)[:255]


def _base_version(body: dict[str, Any]) -> int | None:
    value = body.get("base_version")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(["base_version: must be a version number (0: the domain is new)"])
    return value


def _descriptor(body: dict[str, Any]) -> str:
    descriptor = body.get("descriptor")
    if not isinstance(descriptor, str):
        raise ConfigError(["descriptor: must be a string KEY=VALUE[,KEY=VALUE…]"])
    return descriptor


def _path(body: dict[str, Any]) -> tuple[tuple[str, str | None], ...]:
    path = body.get("path")
    ok = (
        isinstance(path, list)
        and len(path) > 0
        and all(
            isinstance(p, dict)
            and isinstance(p.get("key"), str)
            and p["key"]
            and isinstance(p.get("value"), str | None)
            for p in path
        )
    )
    if not ok or not isinstance(path, list):  # (the second test only informs the type checker)
        raise ConfigError(
            [
                'path: must be a non-empty list of {"key": ..., "value": ... or null}, '
                "outermost first"
            ]
        )
    return tuple((p["key"], p.get("value") or None) for p in path)


def _summary(view: DomainView) -> dict[str, Any]:
    return {
        "domain": view.domain,
        "version": view.version,
        "author": view.author,
        "comment": view.comment,
        "created_at": view.created_at.isoformat(),
    }


def _version(v: Version) -> dict[str, Any]:
    return {
        "version": v.version,
        "author": v.author,
        "comment": v.comment,
        "created_at": v.created_at.isoformat(),
        "deleted": v.deleted,
        "restored_from": v.restored_from,
        "diff": v.diff,
    }


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")
