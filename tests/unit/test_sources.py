"""The pure parts of the utilization sources: stub_status, application JSON, netlink records."""

from __future__ import annotations

import socket
import struct
from collections import Counter

import pytest

from agents.sources import SOURCES, create_source
from agents.sources.json_endpoint import JsonEndpointSource, parse_application_status
from agents.sources.nginx_status import NginxStatusSource, StubStatus, parse_stub_status
from agents.sources.port_connections import (
    TCP_ESTABLISHED,
    TCP_LISTEN,
    PortConnectionsSource,
    count_diag_states,
    diag_request,
)
from dnslb.agent_config import JsonSourceConfig, NginxSourceConfig, PortSourceConfig
from dnslb.errors import SourceError

# Captured from nginx 1.22.1 (Debian 12) with five requests held by a slow origin.
BUSY = (
    b"Active connections: 6 \nserver accepts handled requests\n 8 8 8 \n"
    b"Reading: 0 Writing: 6 Waiting: 0 \n"
)
# The same nginx with one idle keep-alive client and one client half-way through its header.
MIXED = (
    b"Active connections: 3 \nserver accepts handled requests\n 5 5 4 \n"
    b"Reading: 1 Writing: 1 Waiting: 1 \n"
)
IDLE = (
    b"Active connections: 1 \nserver accepts handled requests\n 2 2 2 \n"
    b"Reading: 0 Writing: 1 Waiting: 0 \n"
)


@pytest.mark.parametrize(
    ("page", "expected", "in_progress"),
    [
        (BUSY, StubStatus(6, 8, 8, 8, 0, 6, 0), 5),
        (MIXED, StubStatus(3, 5, 5, 4, 1, 1, 1), 1),
        (IDLE, StubStatus(1, 2, 2, 2, 0, 1, 0), 0),
        (
            b"Active connections: 0\nserver accepts handled requests\n0 0 0\n"
            b"Reading: 0 Writing: 0 Waiting: 0\n",
            StubStatus(0, 0, 0, 0, 0, 0, 0),
            0,
        ),
    ],
    ids=["busy", "reading-and-waiting", "idle", "no-self-count-clamped"],
)
def test_stub_status_is_parsed(page: bytes, expected: StubStatus, in_progress: int) -> None:
    status = parse_stub_status(page)
    assert status == expected
    assert status.in_progress == in_progress


@pytest.mark.parametrize(
    "page",
    [
        b"",
        b"<html><body>Welcome to nginx!</body></html>",
        BUSY.replace(b"Writing: 6", b"Writing: x"),
        BUSY[:40],
        b'{"in_progress": 3}',
    ],
    ids=["empty", "html", "non-number", "truncated", "json"],
)
def test_what_is_not_stub_status_is_an_error(page: bytes) -> None:
    with pytest.raises(SourceError, match="not an nginx stub_status page"):
        parse_stub_status(page)


@pytest.mark.parametrize(
    ("body", "configured", "expected"),
    [
        (b'{"in_progress": 3, "max_concurrency": 10}', None, (3, 10, None)),
        (b'{"in_progress": 0, "max_concurrency": 1, "served_total": 7}', None, (0, 1, 7)),
        (b'{"in_progress": 3.0, "max_concurrency": "10", "extra": [1]}', None, (3, 10, None)),
        (b'{"in_progress": " 4 "}', 50, (4, 50, None)),
        (b'{"in_progress": 4, "max_concurrency": null}', 50, (4, 50, None)),
        (b'{"in_progress": 4, "max_concurrency": 8}', 50, (4, 8, None)),
        (b'{"in_progress": 4, "max_concurrency": 8, "served_total": -1}', None, (4, 8, None)),
        (b'{"in_progress": 4, "max_concurrency": 8, "served_total": "many"}', None, (4, 8, None)),
    ],
    ids=[
        "plain",
        "served-total",
        "float-and-string",
        "string-and-configured-capacity",
        "null-capacity-uses-configured",
        "answer-beats-configuration",
        "negative-served-dropped",
        "bad-served-dropped",
    ],
)
def test_application_status_is_read_tolerantly(
    body: bytes, configured: int | None, expected: tuple[int, int, int | None]
) -> None:
    reading = parse_application_status(body, max_concurrency=configured)
    assert (reading.in_progress, reading.max_concurrency, reading.served_total) == expected
    assert reading.error is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "answer is not JSON"),
        (b"in_progress=3", "answer is not JSON"),
        (b"\xff\xfe", "answer is not JSON"),
        (b"[3, 10]", "must be a JSON object, not list"),
        (b'{"max_concurrency": 10}', "answer has no in_progress"),
        (b'{"in_progress": -1, "max_concurrency": 10}', "in_progress must be a whole number >= 0"),
        (b'{"in_progress": 2.5, "max_concurrency": 10}', "in_progress must be a whole number"),
        (b'{"in_progress": true, "max_concurrency": 10}', "not True"),
        (b'{"in_progress": "NaN", "max_concurrency": 10}', "in_progress must be"),
        (
            b'{"in_progress": 1, "max_concurrency": 0}',
            "max_concurrency must be a whole number >= 1",
        ),
        (b'{"in_progress": 1}', "no max_concurrency and none is configured"),
    ],
    ids=[
        "empty",
        "not-json",
        "not-utf8",
        "list",
        "no-in-progress",
        "negative",
        "fraction",
        "bool",
        "nan",
        "zero-capacity",
        "no-capacity",
    ],
)
def test_bad_application_status_says_what_is_wrong(body: bytes, message: str) -> None:
    with pytest.raises(SourceError, match=message):
        parse_application_status(body)


def _diag_record(family: int, state: int, local_port: int) -> bytes:
    """One SOCK_DIAG_BY_FAMILY message as the kernel sends it (an inet_diag_msg, 72 bytes)."""
    body = struct.pack("=BBBB", family, state, 0, 0) + struct.pack("!HH", local_port, 40000)
    body += bytes(72 - len(body))
    return struct.pack("=IHHII", 16 + len(body), 20, 2, 1, 0) + body


def test_netlink_records_are_counted_by_state_for_the_port() -> None:
    done = struct.pack("=IHHII", 20, 3, 2, 1, 0) + struct.pack("=i", 0)
    data = (
        _diag_record(socket.AF_INET, TCP_LISTEN, 8080)
        + _diag_record(socket.AF_INET, TCP_ESTABLISHED, 8080)
        + _diag_record(socket.AF_INET6, TCP_ESTABLISHED, 8080)
        + _diag_record(socket.AF_INET, TCP_ESTABLISHED, 9090)
    )
    counts: Counter[int] = Counter()
    assert count_diag_states(data, 8080, counts) is False  # the dump goes on
    assert count_diag_states(done, 8080, counts) is True
    assert counts == Counter({TCP_ESTABLISHED: 2, TCP_LISTEN: 1})


def test_a_netlink_error_record_is_an_os_error() -> None:
    error = struct.pack("=IHHII", 36, 2, 0, 1, 0) + struct.pack("=i", -22) + bytes(16)
    with pytest.raises(OSError, match="Invalid argument"):
        count_diag_states(error, 8080, Counter())


def test_the_netlink_request_filters_on_the_port_in_the_kernel() -> None:
    request = diag_request(socket.AF_INET6, 8080, sequence=2)
    length, kind, flags, sequence, _ = struct.unpack_from("=IHHII", request)
    assert (length, kind, sequence) == (len(request), 20, 2)
    assert flags == 0x301  # request + dump
    family, protocol, _, _, states = struct.unpack_from("=BBBBI", request, 16)
    assert (family, protocol) == (socket.AF_INET6, socket.IPPROTO_TCP)
    assert states == (1 << TCP_ESTABLISHED) | (1 << TCP_LISTEN)
    # the bytecode attribute: sport == 8080, accept by jumping to the end, else past it
    assert request[72:] == struct.pack("=HHBBHBBH", 12, 1, 11, 8, 12, 0, 0, 8080)


@pytest.mark.parametrize(
    ("config", "kind"),
    [
        (NginxSourceConfig(max_concurrency=5), NginxStatusSource),
        (PortSourceConfig(port=80, max_concurrency=5), PortConnectionsSource),
        (JsonSourceConfig(url="http://127.0.0.1/status"), JsonEndpointSource),
    ],
    ids=["nginx", "port", "json"],
)
def test_the_registry_builds_the_source_a_config_names(config, kind) -> None:
    assert set(SOURCES) == {"nginx", "port", "json"}
    source = create_source(config)
    assert type(source) is kind
    assert source.name == config.type
