"""A small Redis client (RESP2 over TCP), standard library only, for the plan store.

The pipe backend must stay small and start fast, so it does not import a Redis library: this
client speaks just what the plan store needs (``AUTH``, ``SELECT``, ``GET``, ``SET``, ``MULTI``
/ ``EXEC``, ``HSET``, ``HGETALL``, ``HDEL``, ``PING``).

A Redis server is a trust boundary: whatever it sends is checked as hostile input.

- **A deadline per call.** Connecting, the handshake, sending and reading every reply of one
  call share one deadline (``timeout``, or ``deadline=`` per call): a server that trickles one
  byte at a time fails the call when its deadline passes, not after a timeout per ``recv``.
  Host names are resolved by the system's resolver first, with its own timeouts: give an
  address where that matters.
- **Limits checked before anything is buffered** (:class:`RespLimits`): the length of a line,
  the bytes one call may receive (so the largest bulk string), the array elements it may claim
  and how deep arrays nest. A claimed 2 GB bulk string fails at its header; a line without
  CRLF fails once it passes the line limit; replies are parsed without recursion.
- **Out of sync is impossible.** Every parse problem (a size that is not a number, a negative
  size other than -1, an unknown type byte, a bulk string not ended by CRLF, a limit passed)
  is a :class:`RedisProtocolError` and closes the connection; so does a timeout. A connection
  that holds bytes nobody asked for (or that the server closed while idle) is dropped before
  the next command is sent on it.
- **Back off after a failure.** After a failure that closed the connection, calls raise
  :class:`RedisBackoffError` at once until a jittered delay has passed (0.1 s, doubling to
  5 s; reset by the next success), so a dead or hostile server is not reconnected to on every
  call. An error reply (``-ERR ...``) is not a failure: the connection stays in sync and open.

Every failure is an ``OSError``, so callers treat Redis like a file that cannot be read::

    OSError
    +-- RedisError                 Redis answered with an error reply (the connection stays open)
        +-- RedisProtocolError     the reply broke RESP2 or a limit (the connection was closed)
        +-- RedisTimeoutError      (also a TimeoutError) the call's deadline passed
        +-- RedisConnectionError   (also a ConnectionError) cannot connect, or the connection
            |                      was lost
            +-- RedisBackoffError  a recent failure, not retried until its back-off ends; the
                                   message is that failure's, so a caller logging changes of
                                   message logs an outage once
"""

from __future__ import annotations

import math
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from dnslb.errors import DnslbError

Reply = bytes | int | list["Reply"] | None

BACKOFF_MIN = 0.1
"""Seconds a connection rests after its first failure in a row (doubling with each one)."""
BACKOFF_MAX = 5.0
"""The longest rest between attempts, however many failures in a row."""

_CHUNK = 256 * 1024  # the most one recv asks for
_INTEGER = re.compile(rb"-?[0-9]{1,19}")  # a RESP integer or size: no sign, spaces or "_"
_INT64 = 2**63


class RedisError(OSError, DnslbError):
    """Redis answered with an error (or something this client does not understand).

    An ``OSError`` too: a plan store's readers catch ``OSError`` for any store unreachable.
    """


class RedisProtocolError(RedisError):
    """The reply broke RESP2 or one of the call's limits; the connection was closed."""


class RedisTimeoutError(RedisError, TimeoutError):
    """The call's deadline passed before every reply was read; the connection was closed."""


class RedisConnectionError(RedisError, ConnectionError):
    """The connection could not be made, or was lost during the call."""


class RedisBackoffError(RedisConnectionError):
    """A recent failure: no new attempt until the back-off ends (the message is the failure's)."""


@dataclass(frozen=True, slots=True)
class RespLimits:
    """What one call may receive; each is checked before the bytes are read or buffered.

    ``max_line``: bytes in one line (a simple string, an error, an integer, a size header).
    ``max_bytes``: bytes one call receives in all (lines and bulk strings with their CRLFs), so
    also the largest bulk string. ``max_elements``: array elements the call's replies claim in
    all. ``max_depth``: arrays within arrays (1: a flat array; 0: no arrays at all).
    """

    max_line: int = 64 * 1024
    max_bytes: int = 64 * 1024 * 1024
    max_elements: int = 100_000
    max_depth: int = 16

    def __post_init__(self) -> None:
        if self.max_line < 16 or self.max_bytes < 16:
            raise ValueError("max_line and max_bytes must be at least 16")
        if self.max_elements < 0 or self.max_depth < 0:
            raise ValueError("max_elements and max_depth must not be negative")


DEFAULT_LIMITS = RespLimits()
"""For any reply: up to 64 MiB (a plan of 100,000 members is tens of MB)."""
SMALL_LIMITS = RespLimits(max_line=4096, max_bytes=64 * 1024, max_elements=64, max_depth=4)
"""For small replies: the handshake (AUTH, SELECT), a stamp, the replies of MULTI/EXEC."""


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
        """Parse ``url``; ``password``, when given, wins over one in the URL. Raises
        ``ValueError`` on a URL this client cannot use."""
        parts = urlsplit(url)
        if parts.scheme != "redis":
            raise ValueError(f"{redact_url(url)!r}: not a redis:// URL")
        query = parse_qs(parts.query)
        db_text = parts.path.strip("/") or "0"
        if not (db_text.isascii() and db_text.isdigit() and len(db_text) <= 5):
            raise ValueError(f"{redact_url(url)!r}: the path must be a database number")
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


_URL_PASSWORD = re.compile(r"(//[^/?#@]*?:)[^/?#]+@")


def url_has_password(url: str) -> bool:
    """True when ``url`` carries a password (``redis://:secret@host``)."""
    return redact_url(url) != url


def redact_url(url: str) -> str:
    """``url`` with any password in it replaced by ``***``, for messages."""
    return _URL_PASSWORD.sub(r"\1***@", url, count=1)


class _Budget:
    """What is left of one call's limits while its replies are read."""

    __slots__ = ("bytes", "elements", "limits")

    def __init__(self, limits: RespLimits) -> None:
        self.limits = limits
        self.bytes = limits.max_bytes
        self.elements = limits.max_elements

    def take_bytes(self, count: int) -> None:
        if count > self.bytes:
            raise RedisProtocolError(f"a reply larger than {self.limits.max_bytes} bytes")
        self.bytes -= count

    def take_elements(self, count: int) -> None:
        if count > self.elements:
            raise RedisProtocolError(
                f"an array of {count} elements (at most {self.limits.max_elements} a call)"
            )
        self.elements -= count


class RedisConnection:
    """One connection, opened on first use and again after any failure (after its back-off).

    ``timeout`` is the default deadline of a call in seconds; ``limits`` the default limits of
    what it may receive. ``clock`` and ``rng`` time and jitter the back-off only (deadlines are
    real time: they are socket timeouts). Calls from several threads take turns; waiting for
    one's turn counts against the call's deadline.
    """

    def __init__(
        self,
        address: RedisAddress,
        timeout: float = 0.5,
        *,
        limits: RespLimits = DEFAULT_LIMITS,
        backoff_min: float = BACKOFF_MIN,
        backoff_max: float = BACKOFF_MAX,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.limits = limits
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self._clock = clock
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._buffer = bytearray()
        self._pos = 0  # where the unread bytes of _buffer start
        self._failures = 0  # in a row
        self._retry_at = -math.inf
        self._last_failure = ""

    @property
    def connected(self) -> bool:
        """True while a connection is open."""
        return self._sock is not None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet parsed (bounded by the limits of the call that read them)."""
        return len(self._buffer) - self._pos

    def backoff_remaining(self) -> float:
        """Seconds until the next attempt is allowed (0 when a call may try now)."""
        return max(0.0, self._retry_at - self._clock())

    def close(self) -> None:
        """Close the connection (the next call opens a new one; the back-off is kept)."""
        sock, self._sock = self._sock, None
        self._buffer = bytearray()
        self._pos = 0
        if sock is not None:
            sock.close()

    def command(
        self, *args: str | bytes, deadline: float | None = None, limits: RespLimits | None = None
    ) -> Reply:
        """Send one command and return its reply; raises ``OSError`` on any failure (a
        :class:`RedisError` for an error reply), within ``deadline`` seconds (default: the
        connection's ``timeout``)."""
        return self.pipeline([args], deadline=deadline, limits=limits)[0]

    def pipeline(
        self,
        commands: Sequence[Sequence[str | bytes]],
        *,
        deadline: float | None = None,
        limits: RespLimits | None = None,
    ) -> list[Reply]:
        """Send several commands in one write and read every reply (e.g. MULTI ... EXEC).

        Every reply is read before an error reply is raised (as a :class:`RedisError`, the
        first one, also one inside an array), so the connection stays in sync. ``limits``
        bound the replies of all the commands together.
        """
        request = _encode(commands)
        seconds = self.timeout if deadline is None else deadline
        end = time.monotonic() + seconds
        if not self._lock.acquire(timeout=max(seconds, 0.0)):
            raise RedisTimeoutError(f"no reply within {seconds:g} s (the connection was busy)")
        try:
            return self._call(request, len(commands), end, seconds, limits or self.limits)
        finally:
            self._lock.release()

    def _call(
        self, request: bytes, count: int, end: float, seconds: float, limits: RespLimits
    ) -> list[Reply]:
        if self._clock() < self._retry_at:
            raise RedisBackoffError(self._last_failure)
        try:
            replies, error = self._exchange(request, count, end, seconds, limits)
        except RedisError as exc:
            self._failed(exc)
            raise
        except OSError as exc:  # from the socket: refused, reset, unreachable...
            failure = RedisConnectionError(str(exc))
            self._failed(failure)
            raise failure from exc
        except BaseException:  # interrupted (a signal, a bug): never leave a reply half read
            self.close()
            raise
        self._failures = 0
        if error is not None:
            raise RedisError(error)
        return replies

    def _failed(self, exc: OSError) -> None:
        """Close, and rest before the next attempt: doubling, jittered (half to all of it)."""
        self.close()
        self._failures += 1
        base = min(self.backoff_max, self.backoff_min * 2 ** min(self._failures - 1, 30))
        self._retry_at = self._clock() + base * (0.5 + 0.5 * self._rng.random())
        self._last_failure = str(exc)

    def _exchange(
        self, request: bytes, count: int, end: float, seconds: float, limits: RespLimits
    ) -> tuple[list[Reply], str | None]:
        if self._sock is not None and not self._idle_and_clean():
            self.close()  # closed by the server while idle, or bytes nobody asked for
        handshake: list[tuple[str, ...]] = []
        if self._sock is None:
            self._connect(end, seconds)
            if self.address.password:
                handshake.append(("AUTH", self.address.password))
            if self.address.db:
                handshake.append(("SELECT", str(self.address.db)))
        # One write: the handshake (when connecting) and the commands.
        self._send(_encode(handshake) + request if handshake else request, end, seconds)
        for _ in handshake:
            _, error = self._read_replies(1, end, seconds, SMALL_LIMITS)
            if error is not None:
                raise RedisConnectionError(error)  # e.g. WRONGPASS: a failure, backed off
        return self._read_replies(count, end, seconds, limits)

    def _idle_and_clean(self) -> bool:
        """True when the open connection has nothing unread and was not closed by the server."""
        assert self._sock is not None
        if self.buffered:
            return False
        self._sock.settimeout(0.0)  # a timeout would make recv wait for data first
        try:
            self._sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return True  # nothing waiting: in sync
        except OSError:
            return False
        return False  # b"" (closed) or bytes no command asked for

    def _connect(self, end: float, seconds: float) -> None:
        last: OSError | None = None
        infos = socket.getaddrinfo(self.address.host, self.address.port, type=socket.SOCK_STREAM)
        for family, kind, proto, _, sockaddr in infos:
            remaining = end - time.monotonic()
            if remaining <= 0:
                break
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(remaining)
                sock.connect(sockaddr)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as exc:
                sock.close()
                last = exc
                continue
            self._sock = sock
            self._buffer = bytearray()
            self._pos = 0
            return
        if last is None or isinstance(last, TimeoutError):
            raise RedisTimeoutError(f"cannot connect within {seconds:g} s")
        raise RedisConnectionError(str(last))

    def _send(self, data: bytes, end: float, seconds: float) -> None:
        assert self._sock is not None
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise RedisTimeoutError(f"no reply within {seconds:g} s")
        self._sock.settimeout(remaining)  # sendall's timeout bounds the whole send
        try:
            self._sock.sendall(data)
        except TimeoutError:
            raise RedisTimeoutError(f"cannot send within {seconds:g} s") from None

    def _fill(self, end: float, seconds: float, want: int) -> None:
        """Receive at most ``want`` more bytes (at least one) before the deadline."""
        assert self._sock is not None
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise RedisTimeoutError(f"no complete reply within {seconds:g} s")
        if self._pos:
            del self._buffer[: self._pos]
            self._pos = 0
        self._sock.settimeout(remaining)
        try:
            chunk = self._sock.recv(max(1, min(want, _CHUNK)))
        except TimeoutError:
            raise RedisTimeoutError(f"no complete reply within {seconds:g} s") from None
        if not chunk:
            raise RedisConnectionError("the server closed the connection")
        self._buffer += chunk

    def _line(self, end: float, seconds: float, budget: _Budget) -> bytes:
        """The next line without its CRLF, refused once it passes ``max_line``."""
        max_line = budget.limits.max_line
        checked = 0  # unread bytes known to hold no CRLF
        while True:
            index = self._buffer.find(b"\r\n", self._pos + checked)
            if index >= 0:
                if index - self._pos > max_line:
                    break
                line = bytes(self._buffer[self._pos : index])
                self._pos = index + 2
                budget.take_bytes(len(line) + 2)
                return line
            have = self.buffered
            if have >= max_line + 2:
                break
            checked = max(0, have - 1)  # a CR at the end may be followed by its LF
            self._fill(end, seconds, max_line + 2 - have)
        raise RedisProtocolError(f"a line longer than {max_line} bytes")

    def _bulk(self, size: int, end: float, seconds: float, budget: _Budget) -> bytes:
        budget.take_bytes(size + 2)  # before reading: a claimed 2 GB fails here
        while self.buffered < size + 2:
            self._fill(end, seconds, size + 2 - self.buffered)
        start = self._pos
        if self._buffer[start + size : start + size + 2] != b"\r\n":
            raise RedisProtocolError("a bulk string not ended by CRLF")
        self._pos = start + size + 2
        return bytes(self._buffer[start : start + size])

    def _read_replies(
        self, count: int, end: float, seconds: float, limits: RespLimits
    ) -> tuple[list[Reply], str | None]:
        """``count`` replies and the first error reply among them (raised by the caller)."""
        budget = _Budget(limits)
        replies: list[Reply] = []
        first_error: str | None = None
        for _ in range(count):
            reply, error = self._read_reply(end, seconds, budget)
            replies.append(reply)
            if first_error is None:
                first_error = error
        return replies, first_error

    def _read_reply(self, end: float, seconds: float, budget: _Budget) -> tuple[Reply, str | None]:
        """One reply, parsed iteratively: arrays under construction wait on a stack."""
        stack: list[tuple[list[Reply], int]] = []
        error: str | None = None
        while True:
            line = self._line(end, seconds, budget)
            kind, rest = line[:1], line[1:]
            value: Reply
            if kind == b"+":
                value = rest
            elif kind == b"-":
                value = None
                if error is None:
                    error = _printable(rest)
            elif kind == b":":
                value = _integer(rest)
            elif kind == b"$":
                size = _size(rest)
                value = None if size is None else self._bulk(size, end, seconds, budget)
            elif kind == b"*":
                size = _size(rest)
                if size is None:
                    value = None
                else:
                    if len(stack) >= budget.limits.max_depth:
                        raise RedisProtocolError(
                            f"arrays nested deeper than {budget.limits.max_depth}"
                        )
                    budget.take_elements(size)
                    if size:
                        stack.append(([], size))
                        continue
                    value = []
            else:
                raise RedisProtocolError(f"unknown reply type {_show(line)}")
            # Put the value in its array; a full array is a value for the one around it.
            while stack:
                items, wanted = stack[-1]
                items.append(value)
                if len(items) < wanted:
                    break
                stack.pop()
                value = items
            else:
                return value, error


def redis_answers(address: RedisAddress, timeout: float = 0.5) -> bool:
    """True when a Redis server at ``address`` answers ``PING`` now (a readiness check: one
    fresh connection, no back-off, closed after)."""
    connection = RedisConnection(address, timeout, backoff_min=0, backoff_max=0)
    try:
        connection.command("PING")
    except OSError:
        return False
    finally:
        connection.close()
    return True


def _encode(commands: Sequence[Sequence[str | bytes]]) -> bytes:
    out = bytearray()
    for command in commands:
        out += b"*%d\r\n" % len(command)
        for arg in command:
            data = arg.encode("utf-8") if isinstance(arg, str) else arg
            out += b"$%d\r\n" % len(data)
            out += data
            out += b"\r\n"
    return bytes(out)


def _integer(text: bytes) -> int:
    """A RESP integer: optional minus and 1 to 19 digits, within a signed 64-bit range."""
    if _INTEGER.fullmatch(text) is None:
        raise RedisProtocolError(f"not an integer: {_show(text)}")
    value = int(text)
    if not -_INT64 <= value < _INT64:
        raise RedisProtocolError(f"an integer beyond 64 bits: {_show(text)}")
    return value


def _size(text: bytes) -> int | None:
    """A bulk string's or an array's size: None for -1 (a null), else at least 0."""
    value = _integer(text)
    if value == -1:
        return None
    if value < 0:
        raise RedisProtocolError(f"a negative size: {value}")
    return value


def _show(data: bytes) -> str:
    return repr(data[:40]) + ("..." if len(data) > 40 else "")


def _printable(message: bytes) -> str:
    """An error reply's text for a message or a log: printable, at most 300 characters."""
    text = message[:300].decode("utf-8", "replace")
    return "".join(char if char.isprintable() else "?" for char in text)
