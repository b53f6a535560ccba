"""The lean path for the backend's one hot command: EVALSHA of the apply script over a minimal
RESP connection (``asyncio.Protocol``, replies parsed by hiredis), standalone and Sentinel.

Why: redis-py's asyncio client costs far more Python per round trip than Redis spends on the
call (it encodes every argument one by one, then goes through its pool, its parser and a
stream reader). The backend sends one command shape, so this module writes the RESP bytes
itself (``scripts.encode_command`` builds them from per-limit chunks computed once) and
pipelines calls over one connection: replies come back in order, to a FIFO of futures.
Everything else stays with redis-py: Cluster (its slot table and redirections), Sentinel
discovery, admin commands, the tests' own clients.

What it takes from the redis-py client it is built from (``ScriptConnection.from_client``),
so a URL means the same either way: the address and DB, the credentials (username and
password, or a credential provider), the TLS context (``rediss://`` and its options, the CA,
client certificate and key) and both timeouts. With Sentinel, the master's address is asked
of the Sentinels (through redis-py's pool) at each connect, and a ``READONLY`` reply (the
master was demoted) closes the connection, so the next call asks again.

Errors are redis-py's classes, so the backend translates them as before:

* ``ConnectionError``: refused, reset, closed by the server, ``READONLY``, AUTH or SELECT
  refused (``AuthenticationError``), a reply that does not parse.
* ``TimeoutError``: no connection, or no reply, within the timeout. The connection is then
  closed: replies still to come would answer the wrong calls.
* ``ResponseError``: any other error reply (the script's own included). ``NOSCRIPT`` (a
  restarted Redis, ``SCRIPT FLUSH``) is not one: the script is loaded and the call retried
  once, which is safe, since a script Redis does not know did not run.

Every failure of the connection fails every call waiting on it; the next call reconnects.
Nothing is retried after a call went out (a script call is not idempotent).
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import hiredis
from redis.asyncio.connection import Connection, ConnectionPool, SSLConnection
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.credentials import CredentialProvider, UsernamePasswordCredentialProvider
from redis.exceptions import (
    AuthenticationError,
    ConnectionError,
    ResponseError,
    TimeoutError,
)

__all__ = ["ScriptConnection", "bulk"]

Address = Callable[[], Awaitable[tuple[str, int]]]


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


def command(*args: bytes) -> bytes:
    """One RESP command."""
    return b"*%d\r\n" % len(args) + b"".join(map(bulk, args))


class _Replies(asyncio.Protocol):
    """One socket: bytes out, replies in, each to the oldest waiting future."""

    def __init__(self) -> None:
        self.reader = hiredis.Reader()  # error replies come back as hiredis.ReplyError values
        self.waiters: deque[asyncio.Future[Any]] = deque()
        self.transport: asyncio.Transport | None = None
        self.lost: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        reader, waiters = self.reader, self.waiters
        reader.feed(data)
        while True:
            try:
                reply = reader.gets()
            except hiredis.ProtocolError as exc:
                self.abort(ConnectionError(f"unparsable reply from Redis: {exc}"))
                return
            if reply is False:
                return
            if not waiters:
                self.abort(ConnectionError("a reply from Redis nobody asked for"))
                return
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lost is None:
            error = ConnectionError(f"Connection closed by Redis: {exc or 'end of stream'}")
            self.lost = error
        self._fail_waiters(self.lost)

    def abort(self, exc: BaseException) -> None:
        """Close now (unsent bytes dropped), failing every waiting call with ``exc``."""
        if self.lost is None:
            self.lost = exc
        if self.transport is not None:
            self.transport.abort()
        self._fail_waiters(exc)

    def _fail_waiters(self, exc: BaseException) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(exc)

    def send(self, data: bytes, replies: int) -> list[asyncio.Future[Any]]:
        """Write ``data``; one future per reply it asks for."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(replies)]
        self.waiters.extend(futures)
        self.transport.write(data)
        return futures


class ScriptConnection:
    """One pipelined connection that runs one script: ``await call(numkeys_and_args)``."""

    def __init__(
        self,
        script: str,
        address: Address,
        *,
        db: int = 0,
        credentials: CredentialProvider | None = None,
        ssl_context: ssl.SSLContext | None = None,
        timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
    ) -> None:
        self._script = script.encode()
        self._sha = hashlib.sha1(self._script).hexdigest().encode()
        self._prefix = bulk(b"EVALSHA") + bulk(self._sha)
        self._address = address
        self._db = db
        self._credentials = credentials
        self._ssl = ssl_context
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._conn: _Replies | None = None
        self._connecting: asyncio.Task[_Replies] | None = None
        self.connects = 0  # for tests and metrics: how many connections were opened
        self.script_loads = 0

    @classmethod
    def from_client(cls, client: Any, script: str) -> ScriptConnection | None:
        """A connection as ``client`` (a ``redis.asyncio.Redis``) would open for the master;
        None when this path cannot stand in for it (a Unix socket, a replica pool, ...)."""
        pool = getattr(client, "connection_pool", None)
        if not isinstance(pool, ConnectionPool):
            return None
        like = pool.make_connection()  # type: ignore[no-untyped-call]  # only read
        if not isinstance(like, Connection):  # Unix sockets: redis-py's path
            return None
        if isinstance(pool, SentinelConnectionPool):
            if not pool.is_master:
                return None
            sentinel_pool = pool

            async def address() -> tuple[str, int]:
                host, port = await sentinel_pool.get_master_address()  # type: ignore[no-untyped-call]
                return str(host), int(port)

        else:
            fixed = (str(like.host), int(like.port))

            async def address() -> tuple[str, int]:
                return fixed

        credentials = like.credential_provider
        if credentials is None and (like.username or like.password):
            credentials = UsernamePasswordCredentialProvider(like.username, like.password)
        return cls(
            script,
            address,
            db=int(like.db),
            credentials=credentials,
            ssl_context=like.ssl_context.get() if isinstance(like, SSLConnection) else None,
            timeout_s=like.socket_timeout,
            connect_timeout_s=like.socket_connect_timeout or like.socket_timeout,
        )

    @property
    def connected(self) -> bool:
        """A connection is open now (closed ones: ``connects`` less this)."""
        return self._conn is not None and self._conn.lost is None

    async def call(self, numkeys_and_args: bytes, nargs: int) -> Any:
        """EVALSHA with ``numkeys_and_args``: RESP bulk strings for numkeys, the keys and the
        arguments, ``nargs`` of them in all. Loads the script on NOSCRIPT and tries again."""
        head = b"*%d\r\n" % (nargs + 2) + self._prefix
        reply = await self._request(head + numkeys_and_args)
        if isinstance(reply, hiredis.ReplyError) and str(reply).startswith("NOSCRIPT"):
            self.script_loads += 1
            loaded = await self._request(command(b"SCRIPT", b"LOAD", self._script))
            if isinstance(loaded, hiredis.ReplyError):
                raise ResponseError(str(loaded))
            reply = await self._request(head + numkeys_and_args)
        if isinstance(reply, hiredis.ReplyError):
            message = str(reply)
            if message.startswith("READONLY"):
                # A demoted master (Sentinel failover): the next connect asks who leads now.
                self._drop(ConnectionError("Redis is read-only (the master was demoted)"))
                raise ConnectionError(f"Redis: {message}")
            raise ResponseError(message)
        return reply

    async def _request(self, data: bytes) -> Any:
        conn = self._conn
        if conn is None or conn.lost is not None:
            conn = await self._connected()
        [future] = conn.send(data, 1)
        return await self._wait(conn, future)

    async def _wait(self, conn: _Replies, future: asyncio.Future[Any]) -> Any:
        if self._timeout_s is None:
            return await future
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self._timeout_s, self._expire, conn, future)
        try:
            return await future
        finally:
            timer.cancel()

    def _expire(self, conn: _Replies, future: asyncio.Future[Any]) -> None:
        if not future.done():
            # Later replies would answer the wrong calls: this connection is done.
            conn.abort(TimeoutError(f"no reply from Redis within {self._timeout_s}s"))
            if self._conn is conn:
                self._conn = None

    async def _connected(self) -> _Replies:
        # One connect at a time; every call arriving meanwhile waits for the same one. A
        # finished one is stale (its callers gave up before it ended): the caller is here
        # because there is no usable connection.
        task = self._connecting
        if task is None or task.done():
            task = self._connecting = asyncio.get_running_loop().create_task(self._connect())
            # Its failure reaches every caller still waiting; none may be left (all cancelled).
            task.add_done_callback(_consume)
        try:
            return await asyncio.shield(task)
        finally:
            if task.done() and self._connecting is task:
                self._connecting = None

    async def _connect(self) -> _Replies:
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                host, port = await self._address()
                loop = asyncio.get_running_loop()
                _, conn = await loop.create_connection(
                    _Replies,
                    host,
                    port,
                    ssl=self._ssl,
                    server_hostname=host if self._ssl is not None else None,
                )
        except builtins.TimeoutError as exc:  # not redis-py's TimeoutError
            raise TimeoutError("Timeout connecting to Redis") from exc
        except OSError as exc:  # refused, unreachable, TLS handshake failed
            raise ConnectionError(f"Error connecting to Redis: {exc}") from exc
        setup = b""
        replies = 0
        if self._credentials is not None:
            auth = await self._credentials.get_credentials_async()
            setup += command(b"AUTH", *(str(part).encode() for part in auth))
            replies += 1
        if self._db:
            setup += command(b"SELECT", str(self._db).encode())
            replies += 1
        if replies:
            for future in conn.send(setup, replies):
                reply = await self._wait(conn, future)
                if isinstance(reply, hiredis.ReplyError):
                    conn.abort(ConnectionError("Redis refused the connection's setup"))
                    # The server's words (it never echoes the password).
                    raise AuthenticationError(f"Redis refused the connection: {reply}")
        self._conn = conn
        self.connects += 1
        return conn

    def _drop(self, exc: BaseException) -> None:
        if self._conn is not None:
            self._conn.abort(exc)
            self._conn = None

    async def aclose(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
            self._connecting = None
        self._drop(ConnectionError("Redis connection closed"))


def _consume(task: asyncio.Task[_Replies]) -> None:
    if not task.cancelled():
        task.exception()
