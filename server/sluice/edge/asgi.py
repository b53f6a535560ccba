"""``GrpcApp``: gRPC's server side over ASGI (HTTP/2 from the ASGI server, trailers through the
ASGI "http.response.trailers" extension, which pyvoy supports).

Per call:

- ``:path`` ``/package.Service/Method`` picks the handler; unknown: UNIMPLEMENTED.
- ``content-type`` must be ``application/grpc`` or ``application/grpc+proto`` (else HTTP 415,
  as the protocol asks of a server).
- ``grpc-encoding``: identity or gzip (a message flagged compressed is inflated); anything
  else is UNIMPLEMENTED, with ``grpc-accept-encoding`` saying what is.
- A message longer than ``max_receive_message_bytes`` (before or after inflating) is
  RESOURCE_EXHAUSTED, refused from its 5-byte prefix without reading the rest.
- ``grpc-timeout`` (every unit) sets a deadline: a call whose deadline has passed is not
  handed to its handler, and a handler still running at the deadline is cancelled;
  either way DEADLINE_EXCEEDED.
- Request metadata is ``Context.metadata``; a handler adds response metadata with
  ``Context.set_initial_metadata`` and trailers with ``Context.set_trailing_metadata``.
- Errors before any response message are trailers-only responses (one HEADERS frame with
  ``grpc-status``); ``grpc-message`` is percent-encoded.

Handlers: unary-unary ``async def h(request, context) -> response``; unary-stream
``async def h(request, context)`` yielding responses; stream-unary and stream-stream take an
async iterator of requests instead. For the streaming kinds a task reads ``receive()`` as
frames arrive (so a bidirectional handler sees each request message when it comes, and a
client that goes away cancels the handler); unary calls read their one message inline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sluice.edge.status import GrpcError, Status
from sluice.edge.wire import (
    decode_metadata_value,
    decompress,
    encode_metadata_value,
    frame,
    parse_timeout,
    percent_encode,
)

__all__ = ["Context", "GrpcApp", "GrpcError", "Method"]

log = logging.getLogger(__name__)

DEFAULT_MAX_RECEIVE_MESSAGE_BYTES = 4 * 1024 * 1024  # gRPC's own default

UNARY_UNARY = "unary_unary"
UNARY_STREAM = "unary_stream"
STREAM_UNARY = "stream_unary"
STREAM_STREAM = "stream_stream"
_KINDS = (UNARY_UNARY, UNARY_STREAM, STREAM_UNARY, STREAM_STREAM)

_CONTENT_TYPES = frozenset((b"application/grpc", b"application/grpc+proto"))
_ACCEPT_ENCODING = b"identity,gzip"
_GRPC_CONTENT_TYPE = (b"content-type", b"application/grpc")
_OK_TRAILERS = [(b"grpc-status", b"0")]
# The messages of a plain unary response, built once (ASGI servers do not change them).
_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [_GRPC_CONTENT_TYPE, (b"grpc-accept-encoding", _ACCEPT_ENCODING)],
    "trailers": True,
}
_OK_TRAILERS_MESSAGE = {
    "type": "http.response.trailers",
    "headers": _OK_TRAILERS,
    "more_trailers": False,
}
# Not metadata: the transport's own headers.
_RESERVED = frozenset(
    ("content-type", "te", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding", "host")
)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Hook = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Method:
    kind: str
    handler: Callable[..., Any]
    decode: Callable[[bytes], Any]
    encode: Callable[[Any], bytes]


class Context:
    """One call: its method, request metadata and deadline; response metadata to send."""

    __slots__ = (
        "_client",
        "_headers",
        "_initial",
        "_metadata",
        "_started",
        "_trailing",
        "deadline",
        "method",
    )

    def __init__(
        self,
        method: str,
        headers: list[tuple[bytes, bytes]],
        deadline: float | None,
        client: tuple[str, int] | None = None,
    ):
        self.method = method
        self.deadline = deadline  # the event loop's time(), or None
        self._headers = headers
        self._client = client  # the ASGI scope's: the peer's address and port
        self._metadata: list[tuple[str, str | bytes]] | None = None
        self._initial: list[tuple[bytes, bytes]] = []
        self._trailing: list[tuple[bytes, bytes]] = []
        self._started = False  # response headers sent

    @property
    def metadata(self) -> list[tuple[str, str | bytes]]:
        """The request's metadata as (lower-case key, value); ``-bin`` values are bytes."""
        if self._metadata is None:
            self._metadata = [
                (key, decode_metadata_value(key, value))
                for raw, value in self._headers
                if (key := raw.decode("latin-1")) not in _RESERVED and not key.startswith(":")
            ]
        return self._metadata

    def peer(self) -> str:
        """The caller's address as grpc.aio's ``context.peer()`` writes it
        (``ipv4:10.0.0.7:51234``, ``ipv6:[::1]:51234``); ``unknown`` when the server did not
        say."""
        if not self._client:
            return "unknown"
        host, port = self._client
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"

    def time_remaining(self) -> float | None:
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - asyncio.get_running_loop().time())

    def set_initial_metadata(self, pairs: Iterable[tuple[str, str | bytes]]) -> None:
        """Headers sent with the first response message (or in a trailers-only response)."""
        self._initial.extend(_encode_pairs(pairs))

    def set_trailing_metadata(self, pairs: Iterable[tuple[str, str | bytes]]) -> None:
        self._trailing.extend(_encode_pairs(pairs))

    def abort(self, status: Status, message: str = "") -> None:
        raise GrpcError(status, message)


def _encode_pairs(pairs: Iterable[tuple[str, str | bytes]]) -> list[tuple[bytes, bytes]]:
    out = []
    for key, value in pairs:
        key = key.lower()
        if key.startswith(("grpc-", ":")) or key in _RESERVED:
            raise ValueError(f"metadata key {key!r} is reserved by gRPC")
        out.append((key.encode("latin-1"), encode_metadata_value(key, value)))
    return out


class _Disconnected(Exception):
    """The client went away (reset the stream or closed the connection)."""


class _Reader:
    """Length-prefixed messages out of the request body, as ``receive()`` delivers it."""

    __slots__ = ("_buffer", "_gzip", "_max", "_more", "_receive", "shielded")

    def __init__(self, receive: Receive, gzip: bool, max_bytes: int) -> None:
        self._receive = receive
        self._gzip = gzip
        self._max = max_bytes
        self._buffer = b""
        self._more = True
        # Set where a read may be cancelled (the streaming kinds): a cancelled wait must
        # not cancel the server's receive future (pyvoy completes it all the same, and
        # logs an InvalidStateError if it was cancelled).
        self.shielded = False

    async def _fill(self) -> None:
        if self.shielded:
            message = await asyncio.shield(self._receive())
        else:
            message = await self._receive()
        if message["type"] == "http.disconnect":
            self._more = False
            raise _Disconnected
        self._buffer += message.get("body", b"")
        self._more = message.get("more_body", False)

    async def next(self) -> bytes | None:
        """The next message, or None at the end of the request stream."""
        while len(self._buffer) < 5:
            if not self._more:
                if self._buffer:
                    raise GrpcError(Status.INTERNAL, "request ended inside a message prefix")
                return None
            await self._fill()
        buffer = self._buffer
        flag = buffer[0]
        length = int.from_bytes(buffer[1:5], "big")
        if length > self._max:
            raise GrpcError(
                Status.RESOURCE_EXHAUSTED,
                f"Received message larger than max ({length} vs. {self._max})",
            )
        end = 5 + length
        while len(self._buffer) < end:
            if not self._more:
                raise GrpcError(Status.INTERNAL, "request ended inside a message")
            await self._fill()
        data = self._buffer[5:end]
        self._buffer = self._buffer[end:]
        if flag == 0:
            return data
        if flag != 1:
            raise GrpcError(Status.INTERNAL, f"unknown message flags {flag:#x}")
        if not self._gzip:
            raise GrpcError(
                Status.INTERNAL, "a compressed message without a grpc-encoding to inflate it with"
            )
        return decompress(data, self._max)

    async def wait_disconnect(self) -> None:
        """Read past the request's end until the client goes away (then raise)."""
        while True:
            await self._fill()


class GrpcApp:
    """An ASGI application serving gRPC methods; lifespan hooks run at startup and shutdown."""

    def __init__(
        self,
        *,
        max_receive_message_bytes: int = DEFAULT_MAX_RECEIVE_MESSAGE_BYTES,
        on_startup: Iterable[Hook] = (),
        on_shutdown: Iterable[Hook] = (),
    ) -> None:
        self.max_receive_message_bytes = max_receive_message_bytes
        self.methods: dict[str, Method] = {}
        self.on_startup = list(on_startup)
        self.on_shutdown = list(on_shutdown)

    def add_method(
        self,
        path: str,
        kind: str,
        handler: Callable[..., Any],
        decode: Callable[[bytes], Any],
        encode: Callable[[Any], bytes],
    ) -> None:
        if kind not in _KINDS:
            raise ValueError(f"unknown kind of method {kind!r}")
        if not path.startswith("/") or path.count("/") != 2:
            raise ValueError(f"a method's path is /package.Service/Method, not {path!r}")
        self.methods[path] = Method(kind, handler, decode, encode)

    @property
    def services(self) -> list[str]:
        return sorted({path.split("/")[1] for path in self.methods})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._call(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        # Anything else (websocket) is not gRPC: returning closes it.

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    for hook in self.on_startup:
                        await hook()
                except BaseException as exc:
                    log.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                try:
                    for hook in self.on_shutdown:
                        await hook()
                except BaseException as exc:
                    log.exception("shutdown failed")
                    await send({"type": "lifespan.shutdown.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _call(self, scope: Scope, receive: Receive, send: Send) -> None:
        content_type = encoding = timeout = None
        headers = scope["headers"]
        for key, value in headers:
            if key == b"content-type":
                content_type = value
            elif key == b"grpc-encoding":
                encoding = value
            elif key == b"grpc-timeout":
                timeout = value
        if content_type not in _CONTENT_TYPES and (
            content_type is None or not content_type.startswith(b"application/grpc;")
        ):
            await send(
                {
                    "type": "http.response.start",
                    "status": 415,
                    "headers": [(b"content-type", b"text/plain")],
                }
            )
            await send({"type": "http.response.body", "body": b"not gRPC: content-type"})
            return
        path = scope["path"]
        method = self.methods.get(path)
        if method is None:
            await _trailers_only(send, Status.UNIMPLEMENTED, f"Method not found: {path}")
            return
        if encoding is not None and encoding != b"identity" and encoding != b"gzip":
            await _trailers_only(
                send,
                Status.UNIMPLEMENTED,
                f"grpc-encoding {encoding.decode('latin-1')} is not supported (identity or gzip)",
            )
            return
        deadline = None
        if timeout is not None and (seconds := parse_timeout(timeout)) is not None:
            deadline = asyncio.get_running_loop().time() + seconds
        context = Context(path, headers, deadline, scope.get("client"))
        reader = _Reader(receive, encoding == b"gzip", self.max_receive_message_bytes)
        try:
            if method.kind is UNARY_UNARY:
                await self._unary(method, context, reader, send)
            elif deadline is None:
                await self._dispatch(method, context, reader, send)
            else:
                async with asyncio.timeout_at(deadline):
                    if asyncio.get_running_loop().time() >= deadline:
                        raise TimeoutError
                    await self._dispatch(method, context, reader, send)
        except TimeoutError:
            await _end(send, context, Status.DEADLINE_EXCEEDED, "Deadline Exceeded")
        except GrpcError as exc:
            context._trailing.extend(_encode_pairs(exc.trailers))  # noqa: SLF001
            await _end(send, context, exc.status, exc.message)
        except _Disconnected:
            return  # nobody to answer
        except Exception as exc:
            if _is_disconnect(exc):
                return
            log.exception("gRPC method %s failed", path)
            await _end(send, context, Status.UNKNOWN, "Exception calling application")

    async def _unary(self, method: Method, context: Context, reader: _Reader, send: Send) -> None:
        """The hot path: one message in (read before the deadline's timer starts: a client
        that stops sending resets the stream at its own deadline), one message out."""
        request = await _one_request(method, reader)
        deadline = context.deadline
        if deadline is None:
            response = await method.handler(request, context)
        else:
            if asyncio.get_running_loop().time() >= deadline:
                raise TimeoutError  # not handed to the handler: nothing decided
            async with asyncio.timeout_at(deadline):
                response = await method.handler(request, context)
        body = {"type": "http.response.body", "body": frame(method.encode(response))}
        if context._initial:  # noqa: SLF001
            await _start(send, context)
        else:
            context._started = True  # noqa: SLF001
            await send(_START)
        await send(body)
        await _finish(send, context)

    async def _dispatch(
        self, method: Method, context: Context, reader: _Reader, send: Send
    ) -> None:
        kind = method.kind
        reader.shielded = True  # the handler (and with it a read) may be cancelled
        if kind == UNARY_STREAM:
            request = await _one_request(method, reader)
            await _stream_out(method, method.handler(request, context), context, reader, send)
        else:
            queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=16)
            requests = _requests(queue)
            if kind == STREAM_UNARY:
                await _with_pump(reader, method, queue, _unary_out(method, requests, context, send))
            else:
                await _with_pump(
                    reader,
                    method,
                    queue,
                    _stream_out(method, method.handler(requests, context), context, None, send),
                )


_END = object()


def _is_disconnect(exc: BaseException) -> bool:
    """An error ``send`` raises for a client that went away (pyvoy's ClientDisconnectedError,
    or a socket error from another server)."""
    return isinstance(exc, OSError) or type(exc).__name__ == "ClientDisconnectedError"


async def _requests(queue: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    while True:
        item = await queue.get()
        if item is _END:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


async def _pump(reader: _Reader, method: Method, queue: asyncio.Queue[Any]) -> None:
    """Read request messages as they arrive; after the last, wait for a disconnect."""
    try:
        while (data := await reader.next()) is not None:
            await queue.put(_decode(method, data))
    except GrpcError as exc:
        await queue.put(exc)
        raise
    await queue.put(_END)
    await reader.wait_disconnect()


async def _with_pump(
    reader: _Reader, method: Method, queue: asyncio.Queue[Any], work: Awaitable[None]
) -> None:
    """Run ``work`` while a task reads requests; a disconnect or a bad frame ends the call."""
    pump = asyncio.ensure_future(_pump(reader, method, queue))
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait((pump, task), return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()
            return
        exc = pump.exception()
        if isinstance(exc, GrpcError):
            # The handler sees it through its request iterator; let it end.
            await task
            return
        task.cancel()
        raise _Disconnected
    finally:
        for t in (pump, task):
            if not t.done():
                t.cancel()
        await asyncio.gather(pump, task, return_exceptions=True)


async def _unary_out(
    method: Method, requests: AsyncIterator[Any], context: Context, send: Send
) -> None:
    response = await method.handler(requests, context)
    await _start(send, context)
    body = frame(method.encode(response))
    await send({"type": "http.response.body", "body": body, "more_body": False})
    await _finish(send, context)


async def _stream_out(
    method: Method,
    responses: AsyncIterator[Any],
    context: Context,
    reader: _Reader | None,
    send: Send,
) -> None:
    """Send each response message as the handler yields it. With ``reader`` (unary-stream),
    the client going away cancels the handler."""
    watcher = asyncio.ensure_future(reader.wait_disconnect()) if reader is not None else None
    started = False
    try:
        iterator = aiter(responses)
        while True:
            step = asyncio.ensure_future(anext(iterator))
            if watcher is not None:
                await asyncio.wait((step, watcher), return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    step.cancel()
                    await asyncio.gather(step, return_exceptions=True)
                    watcher.result()  # raises _Disconnected
            try:
                response = await step
            except StopAsyncIteration:
                break
            if not started:
                await _start(send, context)
                started = True
            body = frame(method.encode(response))
            await send({"type": "http.response.body", "body": body, "more_body": True})
    finally:
        if watcher is not None and not watcher.done():
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    if not started:
        await _start(send, context)
    await _close(send, context, Status.OK, "")


async def _one_request(method: Method, reader: _Reader) -> Any:
    data = await reader.next()
    if data is None:
        raise GrpcError(Status.INTERNAL, "a unary call without a request message")
    if await reader.next() is not None:
        raise GrpcError(Status.INTERNAL, "a unary call with more than one request message")
    return _decode(method, data)


def _decode(method: Method, data: bytes) -> Any:
    try:
        return method.decode(data)
    except Exception as exc:
        message = f"cannot parse the request message: {exc}"
        raise GrpcError(Status.INVALID_ARGUMENT, message) from None


async def _start(send: Send, context: Context) -> None:
    context._started = True  # noqa: SLF001
    headers = [_GRPC_CONTENT_TYPE, (b"grpc-accept-encoding", _ACCEPT_ENCODING)]
    headers += context._initial  # noqa: SLF001
    await send({"type": "http.response.start", "status": 200, "headers": headers, "trailers": True})


async def _finish(send: Send, context: Context) -> None:
    trailing = context._trailing  # noqa: SLF001
    if not trailing:
        await send(_OK_TRAILERS_MESSAGE)
        return
    message = {"type": "http.response.trailers", "headers": _OK_TRAILERS + trailing}
    await send(message)


async def _close(send: Send, context: Context, status: Status, message: str) -> None:
    """End a response whose headers are sent: the last (empty) body, then the trailers."""
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    trailers = [(b"grpc-status", b"%d" % status)]
    if message:
        trailers.append((b"grpc-message", percent_encode(message)))
    await send(
        {
            "type": "http.response.trailers",
            "headers": trailers + context._trailing,  # noqa: SLF001
            "more_trailers": False,
        }
    )


async def _end(send: Send, context: Context, status: Status, message: str) -> None:
    """An error response: trailers-only, or trailers after the messages already sent."""
    if context._started:  # noqa: SLF001
        try:
            await _close(send, context, status, message)
        except Exception as exc:
            if not _is_disconnect(exc):
                raise
        return
    await _trailers_only(
        send,
        status,
        message,
        context._initial + context._trailing,  # noqa: SLF001
    )


async def _trailers_only(
    send: Send,
    status: Status,
    message: str,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [
        _GRPC_CONTENT_TYPE,
        (b"grpc-accept-encoding", _ACCEPT_ENCODING),
        (b"grpc-status", b"%d" % status),
    ]
    if message:
        headers.append((b"grpc-message", percent_encode(message)))
    if extra:
        headers += extra
    try:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except Exception as exc:
        if not _is_disconnect(exc):
            raise
