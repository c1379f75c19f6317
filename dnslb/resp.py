"""A minimal Redis client (RESP2 over TCP), standard library only, for the plan store.

The pipe backend must stay small and start fast, so it does not import a Redis library: this
client speaks just what the plan store needs (``AUTH``, ``SELECT``, ``GET``, ``SET``, ``MULTI``
/ ``EXEC``, ``HSET``, ``HGETALL``, ``HDEL``, ``PING``) with short timeouts, and reconnects on the
next command after any failure. Every failure is an ``OSError`` (a :class:`RedisError` for an
error reply), so callers treat Redis like a file that cannot be read.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

Reply = bytes | int | list["Reply"] | None


class RedisError(OSError):
    """Redis answered with an error (or something this client does not understand)."""


@dataclass(frozen=True, slots=True)
class RedisAddress:
    """Where a Redis server is, parsed from ``redis://[:password@]host[:port][/db][?key=...]``."""

    host: str = "127.0.0.1"
    port: int = 6379
    db: int = 0
    password: str | None = None
    key: str = "dnslb:plan"

    @classmethod
    def parse(cls, url: str, *, password: str | None = None) -> RedisAddress:
        parts = urlsplit(url)
        if parts.scheme != "redis":
            raise ValueError(f"{url!r}: not a redis:// URL")
        query = parse_qs(parts.query)
        db_text = parts.path.strip("/") or "0"
        if not db_text.isdigit():
            raise ValueError(f"{url!r}: the path must be a database number")
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 6379,
            db=int(db_text),
            password=password or (unquote(parts.password) if parts.password else None),
            key=query.get("key", ["dnslb:plan"])[0],
        )

    def describe(self) -> str:
        """The address without its password, for logs."""
        return f"redis://{self.host}:{self.port}/{self.db} key {self.key}"


class RedisConnection:
    """One connection, opened on first use and again after any failure."""

    def __init__(self, address: RedisAddress, timeout: float = 0.5) -> None:
        self.address = address
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buffer = b""

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            self._buffer = b""

    def _connect(self) -> None:
        sock = socket.create_connection((self.address.host, self.address.port), self.timeout)
        sock.settimeout(self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._buffer = b""
        if self.address.password:
            self._roundtrip(("AUTH", self.address.password))
        if self.address.db:
            self._roundtrip(("SELECT", str(self.address.db)))

    def command(self, *args: str | bytes) -> Reply:
        """Send one command and return its reply; raises ``OSError`` on any failure."""
        return self.pipeline([args])[0]

    def pipeline(self, commands: list[tuple[str | bytes, ...]]) -> list[Reply]:
        """Send several commands in one write and read every reply (e.g. MULTI ... EXEC)."""
        try:
            if self._sock is None:
                self._connect()
            return [self._reply() for _ in self._send(commands)]
        except OSError:
            self.close()
            raise

    def _roundtrip(self, command: tuple[str | bytes, ...]) -> Reply:
        self._send([command])
        return self._reply()

    def _send(self, commands: list[tuple[str | bytes, ...]]) -> list[None]:
        assert self._sock is not None
        out = bytearray()
        for command in commands:
            out += b"*%d\r\n" % len(command)
            for arg in command:
                data = arg.encode("utf-8") if isinstance(arg, str) else arg
                out += b"$%d\r\n%s\r\n" % (len(data), data)
        self._sock.sendall(out)
        return [None] * len(commands)

    def _line(self) -> bytes:
        while b"\r\n" not in self._buffer:
            self._fill()
        line, _, self._buffer = self._buffer.partition(b"\r\n")
        return line

    def _fill(self) -> None:
        assert self._sock is not None
        chunk = self._sock.recv(65536)
        if not chunk:
            raise ConnectionError("redis closed the connection")
        self._buffer += chunk

    def _reply(self) -> Reply:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RedisError(rest.decode("utf-8", "replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            while len(self._buffer) < size + 2:
                self._fill()
            data, self._buffer = self._buffer[:size], self._buffer[size + 2 :]
            return data
        if kind == b"*":
            count = int(rest)
            if count < 0:
                return None
            return [self._reply() for _ in range(count)]
        raise RedisError(f"unexpected reply {line[:40]!r}")
