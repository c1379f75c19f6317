"""The RESP client against a hostile fake Redis (dnslb.fuzz_resp.HostileRedis): each reply that
broke it before (issue 14) is a test here, named for what it checks."""

from __future__ import annotations

import random
import socket
import threading
import tracemalloc
from collections.abc import Iterator

import pytest

from dnslb.fuzz_resp import Behaviour, HostileRedis, bulk, whole
from dnslb.resp import (
    BACKOFF_MAX,
    BACKOFF_MIN,
    RedisAddress,
    RedisBackoffError,
    RedisConnection,
    RedisConnectionError,
    RedisError,
    RedisProtocolError,
    RedisTimeoutError,
    RespLimits,
    redact_url,
    url_has_password,
)

TAG = "T0123456789ab"
KEY = f"k{TAG}"


class Clock:
    """The back-off's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server() -> Iterator[HostileRedis]:
    fake = HostileRedis()
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def connections() -> Iterator[list[RedisConnection]]:
    opened: list[RedisConnection] = []
    yield opened
    for connection in opened:
        connection.close()


def connect(
    server: HostileRedis,
    clock: Clock,
    opened: list[RedisConnection],
    *,
    timeout: float = 2.0,
    limits: RespLimits | None = None,
    password: str | None = None,
) -> RedisConnection:
    address = RedisAddress(port=server.port, password=password)
    connection = RedisConnection(
        address, timeout, limits=limits or RespLimits(), clock=clock, rng=random.Random(1)
    )
    opened.append(connection)
    return connection


def answer(server: HostileRedis, connection: RedisConnection, behaviour: Behaviour) -> object:
    """One GET answered as ``behaviour`` says; its reply, or the exception it raised."""
    server.script("GET", TAG, behaviour)
    try:
        return connection.command("GET", KEY)
    except OSError as exc:
        return exc
    finally:
        server.settle()


def test_every_reply_type_reads_back(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections)
    data = (
        b"*7\r\n+OK\r\n:-9223372036854775808\r\n:9223372036854775807\r\n"
        + bulk(b"a\r\nb")
        + b"$-1\r\n*-1\r\n*2\r\n*0\r\n"
        + bulk(b"")
    )
    assert answer(server, connection, whole(data)) == [
        b"OK",
        -(2**63),
        2**63 - 1,
        b"a\r\nb",
        None,
        None,
        [[], b""],
    ]


def test_a_reply_that_never_comes_fails_at_the_deadline(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections, timeout=0.2)
    failure = answer(server, connection, Behaviour(()))
    assert isinstance(failure, RedisTimeoutError)
    assert isinstance(failure, TimeoutError) and isinstance(failure, RedisError)
    assert not connection.connected


def test_a_reply_trickled_a_byte_every_0_3_s_fails_at_the_call_deadline(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    # 40 bytes, one every 0.3 s: a timeout per recv (0.5 s) would wait 12 s and read it all.
    data = bulk(b"x" * 33)
    trickled = Behaviour(tuple(data[i : i + 1] for i in range(len(data))), interval=0.3)
    connection = connect(server, clock, connections, timeout=0.5)
    failure = answer(server, connection, trickled)
    assert isinstance(failure, RedisTimeoutError)
    assert "within 0.5 s" in str(failure)


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(b"$abc\r\n", id="bulk size not a number"),
        pytest.param(b":xyz\r\n", id="integer not a number"),
        pytest.param(b"*q\r\n", id="array size not a number"),
        pytest.param(b"$-2\r\n", id="negative bulk size"),
        pytest.param(b"*-3\r\n", id="negative array size"),
        pytest.param(b"?1\r\n", id="unknown type byte"),
        pytest.param(b"\r\n", id="empty line"),
        pytest.param(b": 1\r\n", id="integer with a space"),
        pytest.param(b":1_000\r\n", id="integer with an underscore"),
        pytest.param(b":+5\r\n", id="integer with a plus"),
        pytest.param(b":99999999999999999999\r\n", id="integer of 20 digits"),
        pytest.param(b":9223372036854775808\r\n", id="integer beyond int64"),
        pytest.param(b"$3\r\nabcXY\r\n", id="bulk not ended by CRLF"),
        pytest.param(b"*2\r\n:1\r\n$x\r\n", id="bad element inside an array"),
    ],
)
def test_a_malformed_reply_is_a_protocol_error_that_closes_the_connection(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection], reply: bytes
) -> None:
    connection = connect(server, clock, connections)
    failure = answer(server, connection, whole(reply))
    assert isinstance(failure, RedisProtocolError)
    assert isinstance(failure, OSError)  # callers that catch OSError keep working
    assert not connection.connected


def test_a_claimed_2_gb_bulk_fails_at_its_header_without_buffering(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections, timeout=5.0)
    tracemalloc.start()
    try:
        # The server then holds: a client that waits for the bytes would time out instead.
        failure = answer(server, connection, whole(b"$2147483648\r\n" + b"x" * 1000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(failure, RedisProtocolError)
    assert "larger than" in str(failure)
    assert peak < 1024 * 1024


def test_a_line_without_crlf_fails_once_past_the_line_limit_with_bounded_memory(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections, limits=RespLimits(max_line=1024))
    endless = b"+" + b"x" * (8 * 1024 * 1024)
    tracemalloc.start()
    try:
        failure = answer(server, connection, whole(endless))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(failure, RedisProtocolError)
    assert "longer than 1024" in str(failure)
    assert peak < 1024 * 1024  # of 8 MiB sent


def test_a_line_at_the_limit_is_read(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections, limits=RespLimits(max_line=1024))
    assert answer(server, connection, whole(b"+" + b"a" * 1023 + b"\r\n")) == b"a" * 1023
    failure = answer(server, connection, whole(b"+" + b"a" * 1024 + b"\r\n"))
    assert isinstance(failure, RedisProtocolError)


def test_a_bulk_string_may_be_longer_than_a_line(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections, limits=RespLimits(max_line=1024))
    assert answer(server, connection, whole(bulk(b"y" * 100_000))) == b"y" * 100_000


def test_arrays_nested_5000_deep_are_refused_at_the_depth_limit(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections)
    failure = answer(server, connection, whole(b"*1\r\n" * 5000 + b":1\r\n"))
    assert isinstance(failure, RedisProtocolError)
    assert "nested deeper than 16" in str(failure)


def test_arrays_nested_5000_deep_parse_without_recursion_when_allowed(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    limits = RespLimits(max_depth=10_000)
    connection = connect(server, clock, connections, limits=limits)
    value = answer(server, connection, whole(b"*1\r\n" * 5000 + b":1\r\n"))
    depth = 0
    while isinstance(value, list):
        [value] = value
        depth += 1
    assert (depth, value) == (5000, 1)


def test_an_array_claiming_more_elements_than_allowed_fails_at_its_header(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections, timeout=5.0)
    failure = answer(server, connection, whole(b"*2147483647\r\n:1\r\n"))
    assert isinstance(failure, RedisProtocolError)
    assert "2147483647 elements" in str(failure)


def test_an_error_reply_keeps_the_connection_open_and_in_sync(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections)
    failure = answer(server, connection, whole(b"-WRONGTYPE not a string\r\n"))
    assert type(failure) is RedisError and str(failure) == "WRONGTYPE not a string"
    assert connection.connected and connection.backoff_remaining() == 0
    assert answer(server, connection, whole(b":42\r\n")) == 42


def test_an_error_inside_an_array_is_raised_after_the_whole_reply_is_read(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections)
    reply = b"*3\r\n-EXECABORT inner\r\n:1\r\n-ERR second\r\n"
    failure = answer(server, connection, whole(reply))
    assert type(failure) is RedisError and str(failure) == "EXECABORT inner"
    assert connection.connected
    assert answer(server, connection, whole(b"+next\r\n")) == b"next"


def test_an_empty_error_reply_is_still_an_error(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections)
    failure = answer(server, connection, whole(b"*2\r\n-\r\n-ERR later\r\n"))
    assert type(failure) is RedisError and str(failure) == ""


def test_error_text_cannot_inject_lines_into_a_log(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections)
    failure = answer(
        server, connection, whole(b"-ERR a\nINJECTED\x1b[31m\x00" + b"z" * 900 + b"\r\n")
    )
    assert isinstance(failure, RedisError)
    text = str(failure)
    assert text.startswith("ERR a?INJECTED?[31m?") and text.isprintable() and len(text) == 300


def test_after_a_failure_the_next_good_reply_is_read_in_sync(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections, timeout=0.2)
    # Half an array, then nothing: the rest must never be taken for the next reply.
    failure = answer(server, connection, whole(b"*3\r\n:1\r\n"))
    assert isinstance(failure, RedisTimeoutError)
    clock.now += BACKOFF_MAX + 1
    assert answer(server, connection, whole(b"*2\r\n$4\r\ngood\r\n:2\r\n")) == [b"good", 2]


def test_bytes_nobody_asked_for_are_dropped_before_the_next_command(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections)
    assert answer(server, connection, whole(b":1\r\n:666\r\n+stray\r\n")) == 1
    assert answer(server, connection, whole(b":2\r\n")) == 2
    assert connection.backoff_remaining() == 0  # not a failure: no back-off


def test_a_connection_the_server_closed_while_idle_is_reopened_quietly(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections)
    assert answer(server, connection, Behaviour((b":1\r\n",), then="close")) == 1
    assert answer(server, connection, whole(b":2\r\n")) == 2


def test_a_lost_connection_is_a_connection_error(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections)
    failure = answer(server, connection, Behaviour((b"*2\r\n:1\r\n",), then="close"))
    assert isinstance(failure, RedisConnectionError)
    assert isinstance(failure, ConnectionError)


def test_after_a_failure_calls_back_off_without_sending_anything(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections)
    failure = answer(server, connection, whole(b"$abc\r\n"))
    assert isinstance(failure, RedisProtocolError)
    received = server.received
    for _ in range(3):
        again = answer(server, connection, whole(b":1\r\n"))
        assert isinstance(again, RedisBackoffError)
        assert str(again) == str(failure)  # one message for one outage: logged once
    assert server.received == received
    clock.now += connection.backoff_remaining()
    assert answer(server, connection, whole(b":1\r\n")) == 1


def test_the_back_off_doubles_from_0_1_s_to_5_s_with_jitter_and_resets_on_success(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections)
    waits = []
    for _ in range(9):
        clock.now += connection.backoff_remaining()
        assert isinstance(answer(server, connection, whole(b"*q\r\n")), RedisProtocolError)
        waits.append(connection.backoff_remaining())
    bases = [min(BACKOFF_MAX, BACKOFF_MIN * 2**n) for n in range(9)]
    assert all(base / 2 <= wait <= base for wait, base in zip(waits, bases, strict=True))
    assert len(set(waits)) == len(waits)  # jittered
    clock.now += connection.backoff_remaining()
    assert answer(server, connection, whole(b":1\r\n")) == 1
    assert isinstance(answer(server, connection, whole(b"*q\r\n")), RedisProtocolError)
    assert connection.backoff_remaining() <= BACKOFF_MIN  # the first failure in a row again


def test_a_refused_connection_backs_off_too(
    clock: Clock, connections: list[RedisConnection]
) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    connection = RedisConnection(RedisAddress(port=port), 1.0, clock=clock)
    connections.append(connection)
    with pytest.raises(RedisConnectionError, match="refused") as first:
        connection.command("PING")
    with pytest.raises(RedisBackoffError) as second:
        connection.command("PING")
    assert str(second.value) == str(first.value)


def test_a_failed_auth_is_a_connection_error_and_backs_off(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections, password=f"pw{TAG}")
    server.script("AUTH", TAG, whole(b"-WRONGPASS invalid username-password pair\r\n"))
    failure = answer(server, connection, whole(b":1\r\n"))
    assert isinstance(failure, RedisConnectionError) and "WRONGPASS" in str(failure)
    assert isinstance(answer(server, connection, whole(b":1\r\n")), RedisBackoffError)


def test_a_call_waiting_for_another_threads_call_keeps_to_its_deadline(
    server: HostileRedis, clock: Clock, connections: list[RedisConnection]
) -> None:
    connection = connect(server, clock, connections, timeout=1.0)
    server.script("GET", TAG, Behaviour(()))  # never answered: holds the connection 1 s
    first: list[object] = []

    def slow_call() -> None:
        try:
            first.append(connection.command("GET", KEY))
        except OSError as exc:
            first.append(exc)

    thread = threading.Thread(target=slow_call)
    thread.start()
    while server.received == 0:  # the first call holds the connection
        threading.Event().wait(0.001)
    with pytest.raises(RedisTimeoutError, match="busy"):
        connection.command("GET", "other", deadline=0.0)
    thread.join()
    server.settle()
    assert isinstance(first[0], RedisTimeoutError)


def test_limits_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="at least 16"):
        RespLimits(max_line=0)
    with pytest.raises(ValueError, match="negative"):
        RespLimits(max_elements=-1)


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("redis://:s3cret@db:6379/0?key=k", "redis://:***@db:6379/0?key=k"),
        ("redis://user:s3cret@db/2", "redis://user:***@db/2"),
        ("redis://db:6379/0", None),
        ("redis://user@db/0", None),
        ("/srv/a:b@c/plan.json", None),
    ],
)
def test_a_password_in_a_url_is_found_and_redacted(url: str, redacted: str | None) -> None:
    assert url_has_password(url) is (redacted is not None)
    assert redact_url(url) == (redacted or url)


def test_a_bad_database_number_is_refused_without_showing_the_password() -> None:
    with pytest.raises(ValueError, match="database number") as caught:
        RedisAddress.parse("redis://:s3cret@db/zero")
    assert "s3cret" not in str(caught.value)
