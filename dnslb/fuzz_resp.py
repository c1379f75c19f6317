"""Fuzz harness for Redis replies: the real :class:`~dnslb.resp.RedisConnection` and
:class:`~dnslb.plan_store.RedisPlanStore` against :class:`HostileRedis`, a fake Redis server on
127.0.0.1 that answers each command as scripted: valid replies, mutated ones, truncated,
trickled a byte at a time, claiming sizes far beyond what follows, arrays nested thousands
deep, followed by bytes nobody asked for, or no reply at all.

Contract checked per input:

- every call returns within its deadline (plus a small margin);
- what it returns or raises is what a reference reading of the bytes the server sent says
  (:func:`reference_reply`): the reply's value; a :class:`~dnslb.resp.RedisError` with the
  server's error text; a :class:`~dnslb.resp.RedisProtocolError` for bytes that break RESP2 or
  a limit; a timeout or a lost connection for a reply that never completes. A store's method
  returns what it documents (a stamp, a plan or ``PlanError``, statistics that are JSON
  objects it was sent, and never an exception from ``read_stats``);
- after a failure the connection backs off (the next call raises at once, without a byte sent);
- the next good reply is read correctly, whatever came before (never out of sync: every
  command carries a fresh tag that the server's reply echoes);
- memory stays bounded: what the client holds unread, and the process's peak resident size.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import random
import re
import resource
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dnslb.errors import PlanError
from dnslb.fuzz_plan import hostile_plan_text
from dnslb.fuzzing import Finding, Harness, deep_json, hostile_number, json_text, mutate_bytes
from dnslb.plan import Plan, parse_plan_json
from dnslb.plan_store import RedisPlanStore
from dnslb.resp import (
    SMALL_LIMITS,
    RedisAddress,
    RedisBackoffError,
    RedisConnection,
    RedisConnectionError,
    RedisError,
    RedisProtocolError,
    RedisTimeoutError,
    Reply,
    RespLimits,
)

# -- the fake server ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Behaviour:
    """How the server answers one command: ``pieces`` sent one after another, ``interval``
    seconds apart, then ``then``: ``"stay"`` (read the next command), ``"close"`` or
    ``"reset"`` (close with an RST)."""

    pieces: tuple[bytes, ...]
    interval: float = 0.0
    then: str = "stay"

    @property
    def delivered(self) -> bytes:
        return b"".join(self.pieces)

    @property
    def duration(self) -> float:
        return self.interval * max(0, len(self.pieces) - 1)


def whole(data: bytes) -> Behaviour:
    """Send ``data`` at once and stay."""
    return Behaviour((data,))


_TAG = re.compile(rb"T[0-9a-f]{12}")


def new_tag(rng: random.Random) -> str:
    """A fresh tag for one command (the server finds its script by it)."""
    return f"T{rng.getrandbits(48):012x}"


@dataclass
class HostileRedis:
    """A fake Redis on 127.0.0.1, one thread per connection, answering as scripted.

    :meth:`script` sets how to answer the command named ``name`` whose arguments hold ``tag``
    (once). Unscripted: ``AUTH``/``SELECT`` get ``+OK``, ``HDEL`` gets ``:1``, anything else
    an error reply. :meth:`settle` ends what is being sent and waits until every byte sent so
    far has reached the client's socket, so that one input cannot leak into the next.
    ``received`` counts the commands received.
    """

    port: int = 0
    received: int = 0
    _listener: socket.socket | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _connections: set[socket.socket] = field(default_factory=set)
    _script: dict[tuple[bytes, bytes], Behaviour] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _abort: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _busy: int = 0

    def __post_init__(self) -> None:
        self._idle = threading.Condition(self._lock)

    def start(self) -> None:
        listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        listener.settimeout(0.05)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._spawn(self._accept_loop)

    def stop(self) -> None:
        self._stop.set()
        self._abort.set()
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(2.0)

    def script(self, name: str, tag: str, behaviour: Behaviour) -> None:
        with self._lock:
            self._script[(name.encode(), tag.encode())] = behaviour

    def settle(self, timeout: float = 1.0) -> None:
        self._abort.set()
        with self._idle:
            self._idle.wait_for(lambda: self._busy == 0, timeout)
            connections = list(self._connections)
            self._script.clear()
        deadline = time.monotonic() + 0.2
        for connection in connections:
            while _unsent(connection) > 0 and time.monotonic() < deadline:
                time.sleep(0.0005)
        self._abort.clear()

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name="hostile-redis")
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._connections.add(connection)
            self._spawn(self._serve, connection)

    def _serve(self, connection: socket.socket) -> None:
        buffer = bytearray()
        try:
            while not self._stop.is_set():
                command = self._read_command(connection, buffer)
                if command is None:
                    return
                name = command[0].upper()
                found = _TAG.search(b" ".join(command[1:]))
                tag = found.group() if found else None
                with self._lock:
                    self._busy += 1
                    self.received += 1
                    behaviour = self._script.pop((name, tag), None) if tag else None
                try:
                    alive = self._perform(connection, behaviour or _default(name))
                    if not alive:  # closed before settle() may return
                        connection.close()
                finally:
                    with self._idle:
                        self._busy -= 1
                        self._idle.notify_all()
                if not alive:
                    return
        finally:
            with self._lock:
                self._connections.discard(connection)
            connection.close()

    def _read_command(self, connection: socket.socket, buffer: bytearray) -> list[bytes] | None:
        connection.settimeout(0.05)
        while not self._stop.is_set():
            command = _parse_command(buffer)
            if command is not None:
                return command
            try:
                chunk = connection.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return None
            if not chunk:
                return None
            buffer += chunk
        return None

    def _perform(self, connection: socket.socket, behaviour: Behaviour) -> bool:
        """Answer as ``behaviour`` says; False when the connection is done with."""
        connection.settimeout(0.5)
        for index, piece in enumerate(behaviour.pieces):
            if index and behaviour.interval and self._abort.wait(behaviour.interval):
                return True  # the client gave up: stop sending, keep reading
            try:
                connection.sendall(piece)
            except OSError:
                return False
        if behaviour.then == "reset":
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        return behaviour.then != "close"


def _default(name: bytes) -> Behaviour:
    if name in (b"AUTH", b"SELECT"):
        return whole(b"+OK\r\n")
    if name == b"HDEL":
        return whole(b":1\r\n")
    return whole(b"-ERR unscripted command\r\n")


def _parse_command(buffer: bytearray) -> list[bytes] | None:
    """One command (an array of bulk strings) from the front of ``buffer``, if all there."""
    end = buffer.find(b"\r\n")
    if end < 0:
        return None
    count = int(buffer[1:end])
    position = end + 2
    args = []
    for _ in range(count):
        end = buffer.find(b"\r\n", position)
        if end < 0:
            return None
        size = int(buffer[position + 1 : end])
        if len(buffer) < end + 2 + size + 2:
            return None
        args.append(bytes(buffer[end + 2 : end + 2 + size]))
        position = end + 2 + size + 2
    del buffer[:position]
    return args


_SIOCOUTQNSD = 0x894B  # Linux: bytes in a TCP socket's send queue not sent yet


def _unsent(connection: socket.socket) -> int:
    """Bytes written to ``connection`` and not sent yet (on loopback, a byte sent is a byte
    in the peer's socket)."""
    try:
        raw = fcntl.ioctl(connection.fileno(), _SIOCOUTQNSD, struct.pack("i", 0))
    except (OSError, ValueError):
        return 0
    value: int = struct.unpack("i", raw)[0]
    return value


# -- the reference reading of a reply -----------------------------------------------------------


class _Stop(Exception):
    """The reference's verdict on a reply it could not read to the end."""

    def __init__(self, verdict: str) -> None:
        self.verdict = verdict


_REFERENCE_INTEGER = re.compile(rb"-?[0-9]{1,19}")


def reference_reply(data: bytes, limits: RespLimits) -> tuple[str, object]:
    """What the first reply in ``data`` is under RESP2 and ``limits``: ``("value", v)``,
    ``("error", text)`` (an error reply, also one inside an array), ``("invalid", None)`` or
    ``("incomplete", None)`` (more bytes were needed). Written apart from the client, from the
    protocol and the limits' documentation, recursively (the depth limit bounds it)."""
    position = 0
    budget = limits.max_bytes
    elements = limits.max_elements
    errors: list[str] = []

    def take(count: int) -> None:
        nonlocal budget
        if count > budget:
            raise _Stop("invalid")
        budget -= count

    def line() -> bytes:
        nonlocal position
        end = data.find(b"\r\n", position)
        if end < 0:
            raise _Stop("invalid" if len(data) - position >= limits.max_line + 2 else "incomplete")
        if end - position > limits.max_line:
            raise _Stop("invalid")
        text = data[position:end]
        position = end + 2
        take(len(text) + 2)
        return text

    def number(text: bytes, *, size: bool) -> int | None:
        if _REFERENCE_INTEGER.fullmatch(text) is None:
            raise _Stop("invalid")
        value = int(text)
        if not -(2**63) <= value <= 2**63 - 1:
            raise _Stop("invalid")
        if size and value == -1:
            return None
        if size and value < 0:
            raise _Stop("invalid")
        return value

    def reply(depth: int) -> Reply:
        nonlocal position, elements
        text = line()
        kind, rest = text[:1], text[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            shown = rest[:300].decode("utf-8", "replace")
            errors.append("".join(c if c.isprintable() else "?" for c in shown))
            return None
        if kind == b":":
            return number(rest, size=False)
        if kind == b"$":
            size = number(rest, size=True)
            if size is None:
                return None
            take(size + 2)
            if len(data) - position < size + 2:
                raise _Stop("incomplete")
            if data[position + size : position + size + 2] != b"\r\n":
                raise _Stop("invalid")
            position += size + 2
            return data[position - size - 2 : position - 2]
        if kind == b"*":
            size = number(rest, size=True)
            if size is None:
                return None
            if depth >= limits.max_depth or size > elements:
                raise _Stop("invalid")
            elements -= size
            return [reply(depth + 1) for _ in range(size)]
        raise _Stop("invalid")

    try:
        value = reply(0)
    except _Stop as stop:
        return stop.verdict, None
    if errors:
        return "error", errors[0]
    return "value", value


# -- replies ------------------------------------------------------------------------------------


def bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


def valid_reply(rng: random.Random, depth: int = 0, *, errors: bool = True) -> bytes:
    """A well-formed reply of any type (errors too, when ``errors``), arrays up to 3 deep."""
    choice = rng.random()
    if depth < 3 and choice < 0.25:
        count = rng.choice((0, 1, 2, 3, 5))
        items = b"".join(valid_reply(rng, depth + 1, errors=errors) for _ in range(count))
        return b"*%d\r\n%s" % (count, items)
    if choice < 0.5:
        payload = rng.choice(
            (
                b"",
                b"x",
                b"\r\n",
                b"a\r\nb",
                b"$3\r\n",
                bytes(rng.randrange(256) for _ in range(rng.choice((1, 10, 100)))),
                b"y" * rng.choice((1023, 1024, 1025, 3000)),  # beyond the line limit: no matter
            )
        )
        return bulk(payload)
    if choice < 0.65:
        text = "".join(rng.choice("abcXYZ 019:-_.") for _ in range(rng.choice((0, 1, 8, 40))))
        return b"+%s\r\n" % text.encode()
    if choice < 0.8:
        value = rng.choice((0, -1, 1, 2**63 - 1, -(2**63), rng.randint(-(10**9), 10**9)))
        return b":%d\r\n" % value
    if choice < 0.9 or not errors:
        return rng.choice((b"$-1\r\n", b"*-1\r\n"))
    message = rng.choice((b"ERR wrong", b"WRONGTYPE x", b"ERR a\nb\x1b[31m\x00", b"\xff\xfe", b""))
    return b"-%s\r\n" % message


def tagged_reply(rng: random.Random, tag: str, *, errors: bool = True) -> bytes:
    """``[tag, value]``: a reply that says which command it answers."""
    return b"*2\r\n" + bulk(tag.encode()) + valid_reply(rng, 1, errors=errors)


def _classic(rng: random.Random, limits: RespLimits) -> bytes:
    """The replies that broke the client before, and the limits' edges."""
    deep = rng.choice((limits.max_depth, limits.max_depth + 1, 5000))
    return rng.choice(
        (
            b"$abc\r\n",
            b":xyz\r\n",
            b"*q\r\n",
            b"$-2\r\n",
            b"*-7\r\n",
            b"$-1x\r\n",
            b": 1\r\n",
            b":1_000\r\n",
            b":+5\r\n",
            b":\r\n",
            b"$\r\n",
            b":99999999999999999999\r\n",
            b":9223372036854775808\r\n",
            b":-9223372036854775808\r\n",
            b"$2147483648\r\n" + b"x" * rng.choice((0, 100, 5000)),
            b"$%d\r\n" % (limits.max_bytes - 8),
            b"*2147483647\r\n:1\r\n",
            b"*1\r\n" * deep + b":1\r\n",
            b"*%d\r\n" % (limits.max_elements + 1) + b":1\r\n" * 3,
            b"*2\r\n*%d\r\n" % limits.max_elements + b":7\r\n" * limits.max_elements + b":8\r\n",
            b"x" * rng.choice((limits.max_line + 1, limits.max_line + 2, 5000, 200_000)),
            b"+" + b"a" * (limits.max_line - 1) + b"\r\n",
            b"+" + b"a" * limits.max_line + b"\r\n",
            b"+" + b"a" * (limits.max_line + 1) + b"\r\n",
            b"$3\r\nabcXY",
            b"$3\r\nab",
            b"\r\n",
            b"",
            b"\x00\r\n",
            bytes([rng.randrange(256)]) + b"1\r\n",
            b"*2\r\n-ERR inner\r\n:1\r\n",
            b"-ERR bad\nINJECTED\x1b[31m\r\n",
            b"*3\r\n:1\r\n:2\r\n",
        )
    )


def hostile_reply(rng: random.Random, tag: str, limits: RespLimits) -> bytes:
    """A reply to the command tagged ``tag``: valid, mutated, trailed by more, or nasty."""
    choice = rng.random()
    if choice < 0.3:
        return tagged_reply(rng, tag)
    if choice < 0.4:
        return valid_reply(rng)
    if choice < 0.65:
        return mutate_bytes(tagged_reply(rng, tag), rng, mutations=rng.choice((1, 2, 4)))
    if choice < 0.72:
        trailing = rng.choice((valid_reply(rng), tagged_reply(rng, tag), b"\x00garbage"))
        return tagged_reply(rng, tag) + trailing
    return _classic(rng, limits)


SLOW = 0.02  # the deadline of a call whose reply cannot complete in time
FAST = 2.0  # the deadline of a call whose reply is all there at once
MARGIN = 0.35  # how late after its deadline a call may return (a loaded machine stalls)


def delivery(rng: random.Random, data: bytes) -> Behaviour:
    """How ``data`` is sent: at once, in pieces, cut short, a byte at a time, or not at all."""
    # Replies that cannot complete in time make a call wait for its deadline: they are the
    # rarer kinds, so that a run tries many inputs (each kind still comes hundreds of times
    # in the suite's run).
    choice = rng.random()
    if choice < 0.62:
        then = rng.choices(("stay", "close", "reset"), (16, 3, 1))[0]
        return Behaviour((data,), then=then)
    if choice < 0.82 and len(data) > 1:
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 7))))
        pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        return Behaviour(tuple(pieces), interval=rng.choice((0.0, 0.0005)))
    if choice < 0.94:
        cut = rng.randrange(len(data) + 1)
        return Behaviour((data[:cut],), then=rng.choices(("close", "stay"), (3, 1))[0])
    if choice < 0.97:
        # 150 bytes take 1 s: a client with a timeout per recv instead of per call is late.
        count = min(len(data), rng.choice((2, 30, 150, 150)))
        trickled = tuple(data[i : i + 1] for i in range(count))
        return Behaviour((*trickled, data[count:]), interval=SLOW / 3)
    return Behaviour((), then=rng.choice(("stay", "close")))


# -- the harness --------------------------------------------------------------------------------

_LIMITS = RespLimits(max_line=1024, max_bytes=256 * 1024, max_elements=1000, max_depth=8)
_MAX_PLAN_BYTES = 256 * 1024
_RSS_GROWTH_KIB = 256 * 1024


@dataclass(frozen=True, slots=True)
class _Outcome:
    value: object = None
    error: BaseException | None = None
    seconds: float = 0.0


class RespHarness(Harness):
    name = "resp"
    boundary = "Redis replies to the plan store's client (a Redis server, or anyone on its path)"
    deadline = 2.5  # a stalled machine, not the client: every call's own deadline is checked
    suite_inputs = 1500

    def open(self) -> None:
        self.server = HostileRedis()
        self.server.start()
        self.now = 0.0  # the back-off's clock: moved on by the harness
        self.connection = self._connection(RedisAddress(port=self.server.port))
        self.rss_at_open = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def close(self) -> None:
        self.connection.close()
        self.server.stop()

    def _connection(self, address: RedisAddress) -> RedisConnection:
        return RedisConnection(
            address, FAST, limits=_LIMITS, clock=lambda: self.now, rng=random.Random(7)
        )

    def one(self, rng: random.Random) -> str:
        self.now += 3600.0  # whatever the last input left, its back-off is over
        choice = rng.random()
        if choice < 0.45:
            label = self._raw(rng)
        elif choice < 0.6:
            label = self._stamp(rng)
        elif choice < 0.75:
            label = self._read(rng)
        elif choice < 0.88:
            label = self._stats(rng)
        else:
            label = self._handshake(rng)
        self._follow_up(rng)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if rss - self.rss_at_open > _RSS_GROWTH_KIB:
            raise Finding(f"peak resident memory grew by {(rss - self.rss_at_open) // 1024} MiB")
        return label

    # -- one call, timed and settled -----------------------------------------------------------

    def _call(
        self, call: Callable[[], object], seconds: float, connection: RedisConnection
    ) -> _Outcome:
        started = time.monotonic()
        try:
            value = call()
        except (OSError, PlanError) as exc:
            outcome = _Outcome(error=exc, seconds=time.monotonic() - started)
        else:
            outcome = _Outcome(value=value, seconds=time.monotonic() - started)
        self.server.settle()
        if outcome.seconds > seconds + MARGIN:
            raise Finding(f"a call with a {seconds:g} s deadline took {outcome.seconds:.3f} s")
        # Every failure is a RedisError, but for the store's "no plan" (FileNotFoundError).
        if isinstance(outcome.error, OSError) and not isinstance(
            outcome.error, RedisError | FileNotFoundError
        ):
            raise Finding(f"{type(outcome.error).__name__} is not a RedisError: {outcome.error}")
        limits_bytes = _LIMITS.max_line + max(_LIMITS.max_bytes, _MAX_PLAN_BYTES) + 4096
        if connection.buffered > limits_bytes:
            raise Finding(f"{connection.buffered} bytes held unread")
        return outcome

    def _deadline(self, behaviour: Behaviour, verdict: str) -> float:
        if behaviour.duration > 0.005 or (verdict == "incomplete" and behaviour.then == "stay"):
            return SLOW
        return FAST

    def _expect_reply(
        self,
        outcome: _Outcome,
        behaviour: Behaviour,
        verdict: str,
        detail: object,
        expected: Callable[[Any], object] = lambda value: value,
    ) -> str:
        """Check ``outcome`` against the reference verdict on what was sent; its label."""
        error = outcome.error
        slow = behaviour.duration > 0.005
        lost = behaviour.then == "reset" or (verdict == "incomplete" and behaviour.then == "close")
        if isinstance(error, RedisTimeoutError) and (slow or verdict == "incomplete"):
            return "timeout"
        if isinstance(error, RedisConnectionError) and lost:
            if isinstance(error, RedisBackoffError):
                raise Finding(f"backing off before any failure: {error!r}")
            return "connection-lost"
        if verdict == "value":
            want = expected(detail)
            if error is None and _same(outcome.value, want):
                return "value"
            if isinstance(want, PlanError) and isinstance(error, PlanError):
                return "plan-refused"
            if isinstance(want, BaseException) and type(error) is type(want):
                return "refused"
        elif verdict == "error":
            if type(error) is RedisError and str(error) == detail:
                return "reply-error"
        elif verdict == "invalid" and isinstance(error, RedisProtocolError):
            return "protocol-error"
        raise Finding(
            f"sent {_shown(behaviour)}: reference says {verdict} {_brief(detail)}, "
            f"got {_brief(outcome.value)} / {type(error).__name__}: {error}"
        )

    def _check_backoff(self, rng: random.Random, outcome: _Outcome) -> str | None:
        """After a failure, the next call raises at once without sending a byte."""
        error = outcome.error
        if not isinstance(error, RedisError) or type(error) is RedisError:
            return None
        if self.connection.connected:
            raise Finding(f"the connection stayed open after {type(error).__name__}: {error}")
        if rng.random() >= 0.3:
            return None
        sent = self.server.received
        again = self._call(
            lambda: self.connection.command("GET", "kT000000000000"), FAST, self.connection
        )
        if not isinstance(again.error, RedisBackoffError) or str(again.error) != str(error):
            raise Finding(f"no back-off after {error!r}: got {again.error!r}")
        if self.server.received != sent:
            raise Finding("a command was sent while backing off")
        return "backoff"

    def _follow_up(self, rng: random.Random) -> None:
        """A good reply, right after whatever happened: it must read exactly."""
        self.now += 3600.0
        tag = new_tag(rng)
        verdict, want = "", None
        while verdict != "value":  # nearly always at once: rarely beyond the size limit
            data = tagged_reply(rng, tag, errors=False)
            verdict, want = reference_reply(data, _LIMITS)
        self.server.script("GET", tag, whole(data))
        self.connection.timeout = FAST
        outcome = self._call(
            lambda: self.connection.command("GET", f"k{tag}"), FAST, self.connection
        )
        if outcome.error is not None or not _same(outcome.value, want):
            raise Finding(
                f"out of sync: a good reply read as {_brief(outcome.value)} / {outcome.error!r}"
            )

    # -- the inputs ------------------------------------------------------------------------------

    def _raw(self, rng: random.Random) -> str:
        tag = new_tag(rng)
        behaviour = delivery(rng, hostile_reply(rng, tag, _LIMITS))
        verdict, detail = reference_reply(behaviour.delivered, _LIMITS)
        seconds = self._deadline(behaviour, verdict)
        self.server.script("GET", tag, behaviour)
        outcome = self._call(
            lambda: self.connection.command("GET", f"k{tag}", deadline=seconds),
            seconds,
            self.connection,
        )
        label = self._expect_reply(outcome, behaviour, verdict, detail)
        return self._check_backoff(rng, outcome) or label

    def _store(self, tag: str, seconds: float) -> RedisPlanStore:
        self.connection.timeout = seconds
        return RedisPlanStore(
            RedisAddress(port=self.server.port, key=f"k{tag}"),
            seconds,
            bulk_timeout=seconds,
            max_plan_bytes=_MAX_PLAN_BYTES,
            connection=self.connection,
        )

    def _stamp(self, rng: random.Random) -> str:
        tag = new_tag(rng)
        choice = rng.random()
        if choice < 0.4:
            data = bulk(b"%d:%r" % (rng.randrange(2**63), rng.uniform(0, 2e9)))
        elif choice < 0.5:
            data = b"$-1\r\n"
        else:
            data = hostile_reply(rng, tag, SMALL_LIMITS)
        behaviour = delivery(rng, data)
        verdict, detail = reference_reply(behaviour.delivered, SMALL_LIMITS)
        seconds = self._deadline(behaviour, verdict)
        store = self._store(tag, seconds)
        self.server.script("GET", tag, behaviour)
        outcome = self._call(store.stamp, seconds, self.connection)
        label = self._expect_reply(
            outcome,
            behaviour,
            verdict,
            detail,
            lambda value: value if isinstance(value, bytes) else None,
        )
        return "stamp " + (self._check_backoff(rng, outcome) or label)

    def _read(self, rng: random.Random) -> str:
        tag = new_tag(rng)
        choice = rng.random()
        if choice < 0.6:
            data = bulk(hostile_plan_text(rng))
        elif choice < 0.65:
            data = b"$%d\r\n" % (_MAX_PLAN_BYTES + 1) + b"{" * 1000
        elif choice < 0.7:
            data = b"$-1\r\n"
        else:
            data = hostile_reply(rng, tag, _LIMITS)
        behaviour = delivery(rng, data)
        store = self._store(tag, FAST)
        verdict, detail = reference_reply(behaviour.delivered, store.plan_limits)
        seconds = self._deadline(behaviour, verdict)
        store = self._store(tag, seconds)
        self.server.script("GET", tag, behaviour)
        outcome = self._call(store.read, seconds, self.connection)
        label = self._expect_reply(outcome, behaviour, verdict, detail, _expected_plan)
        if outcome.error is None and not isinstance(outcome.value, Plan):
            raise Finding(f"read returned {_brief(outcome.value)}")
        return "read " + (self._check_backoff(rng, outcome) or label)

    def _stats(self, rng: random.Random) -> str:
        tag = new_tag(rng)
        documents = [_stats_text(rng) for _ in range(rng.choice((0, 1, 2, 5)))]
        choice = rng.random()
        if choice < 0.6:
            items = [bulk(b"host-%d" % i) + bulk(raw) for i, raw in enumerate(documents)]
            data = b"*%d\r\n%s" % (2 * len(items), b"".join(items))
        elif choice < 0.8:
            items = [
                rng.choice((bulk(raw), b":1\r\n", b"$-1\r\n", b"*1\r\n:1\r\n")) for raw in documents
            ]
            data = b"*%d\r\n%s" % (len(items), b"".join(items))
        else:
            data = hostile_reply(rng, tag, _LIMITS)
        behaviour = delivery(rng, data)
        store = self._store(tag, FAST)
        verdict, _ = reference_reply(behaviour.delivered, store.stats_limits)
        seconds = self._deadline(behaviour, verdict)
        self.server.script("HGETALL", tag, behaviour)
        if rng.random() < 0.3:  # the removal of old documents answered in any way too
            self.server.script("HDEL", tag, delivery(rng, hostile_reply(rng, tag, SMALL_LIMITS)))
            seconds = SLOW
        store = self._store(tag, seconds)
        outcome = self._call(store.read_stats, 2 * seconds, self.connection)
        if outcome.error is not None:
            raise Finding(f"read_stats raised {outcome.error!r}")
        result = outcome.value
        if not isinstance(result, list) or not all(isinstance(d, dict) for d in result):
            raise Finding(f"read_stats returned {_brief(result)}")
        if choice < 0.8:  # documents that came in the reply, and nothing else
            sent = [raw for raw in documents if raw in behaviour.delivered]
            for document in result:
                if not any(_json_equal(document, raw) for raw in sent):
                    raise Finding(f"read_stats returned a document not sent: {_brief(document)}")
        return f"stats {min(len(result), 3)}"

    def _handshake(self, rng: random.Random) -> str:
        """AUTH answered in any way, then a command: a good value or a RedisError, in time."""
        tag = new_tag(rng)
        connection = self._connection(
            RedisAddress(port=self.server.port, password=f"pw{tag}", db=rng.choice((0, 3)))
        )
        choice = rng.random()
        if choice < 0.3:
            auth = b"+OK\r\n"
        elif choice < 0.5:
            auth = rng.choice((b"-WRONGPASS invalid password\r\n", b"-NOAUTH x\r\n"))
        else:
            auth = hostile_reply(rng, tag, SMALL_LIMITS)
        behaviour = delivery(rng, auth)
        verdict, _ = reference_reply(behaviour.delivered, SMALL_LIMITS)
        # Bytes after the AUTH reply are read as the replies that follow, which may wait for
        # more: a short deadline whatever the verdict (the outcome is checked loosely).
        seconds = min(self._deadline(behaviour, verdict), 0.25)
        connection.timeout = seconds
        data = tagged_reply(rng, tag, errors=False)
        _, want = reference_reply(data, _LIMITS)
        self.server.script("AUTH", tag, behaviour)
        self.server.script("GET", tag, whole(data))
        try:
            outcome = self._call(lambda: connection.command("GET", f"k{tag}"), seconds, connection)
            left_open = connection.connected
        finally:
            connection.close()
        if outcome.error is None:
            if not _well_typed(outcome.value, _LIMITS.max_depth):
                raise Finding(f"handshake: returned {_brief(outcome.value)}")
            return "handshake value" if _same(outcome.value, want) else "handshake other"
        if left_open and type(outcome.error) is not RedisError:
            raise Finding(f"handshake: the connection stayed open after {outcome.error!r}")
        plain = behaviour.duration <= 0.005 and behaviour.then != "reset"
        if (
            verdict == "error"
            and plain
            and not isinstance(outcome.error, RedisConnectionError | RedisTimeoutError)
        ):
            raise Finding(f"handshake: an AUTH error reply raised {outcome.error!r}")
        return "handshake failed"


def _expected_plan(value: Reply) -> object:
    if value is None:
        return FileNotFoundError()
    if not isinstance(value, bytes):
        return RedisError()
    try:
        return parse_plan_json(value)
    except PlanError as exc:
        return exc


def _stats_text(rng: random.Random) -> bytes:
    now = time.time()
    choice = rng.random()
    if choice < 0.1:
        return deep_json(rng.choice((100, 5000))).encode()
    if choice < 0.2:
        return rng.choice((b'["x", 1]', b"[1e400, 1]", b"not json", b"\xff\xfe", b"", b"null"))
    written = rng.choice((now - rng.uniform(0, 100), now - 10**6, now + 10, hostile_number(rng)))
    document = {
        "process": "host:1",
        "written_at": written,
        "requests": hostile_number(rng),
        "pools": {"www.example.test": {"a": [rng.randrange(100), hostile_number(rng)]}},
    }
    return json_text(document, rng)


def _json_equal(document: object, raw: bytes) -> bool:
    try:
        return json.dumps(json.loads(raw), sort_keys=True) == json.dumps(document, sort_keys=True)
    except (ValueError, RecursionError):
        return False


def _same(got: object, want: object) -> bool:
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    return type(got) is type(want) and got == want


def _well_typed(value: object, depth: int) -> bool:
    """A reply value: bytes, a 64-bit int, None, or a list of them at most ``depth`` deep."""
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, list):
            if level >= depth:
                return False
            stack += [(element, level + 1) for element in item]
        elif isinstance(item, int):
            if isinstance(item, bool) or not -(2**63) <= item < 2**63:
                return False
        elif not (item is None or isinstance(item, bytes)):
            return False
    return True


def _brief(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:120] + "..."


def _shown(behaviour: Behaviour) -> str:
    data = behaviour.delivered
    shown = repr(data[:80]) + ("..." if len(data) > 80 else "")
    pieces = len(behaviour.pieces)
    return f"{shown} ({pieces} pieces, {behaviour.interval:g} s apart, then {behaviour.then})"


__all__ = [
    "Behaviour",
    "HostileRedis",
    "RespHarness",
    "bulk",
    "delivery",
    "hostile_reply",
    "new_tag",
    "reference_reply",
    "tagged_reply",
    "valid_reply",
    "whole",
]
