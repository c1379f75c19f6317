"""Report ingest at the manager's HTTP boundary: the token is checked from the headers before any
body is read, a body over the cap is never read, and a token valid for another reporter learns
nothing about which servers exist."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from dnslb.clock import FakeClock
from dnslb.model import ServerState
from dnslb.tokens import token_hash
from manager.config import load_manager_config
from manager.http import ManagerApp
from manager.ingest import MAX_BODY, REINDEX_BURST, REINDEX_RATE, Rejected, TokenIndex
from manager.service import Manager
from manager.state import ServerRecord

AGENT = "agent-secret-0123456789"
OWN = "s3-own-secret-0123456789"
NODE = "node-secret-0123456789"

CONFIG = """
zones: [{name: example.test, ns: [ns1.example.test]}]
auth: {agent_token: env:DNSLB_TEST_AGENT_TOKEN}
down_after: 3
clusters:
  - name: vip-1
    vip: 10.9.0.1
    seed: 4242
    nodes:
      - {id: n1, agent_url: "http://127.0.0.1:1", token: env:DNSLB_TEST_NODE_TOKEN}
pools:
  - name: www
    zone: example.test
    policy: {slow_start: 0, smoothing: 0}
    members:
      - {id: s1, address: 10.0.0.1}
      - {id: s3, address: 10.0.0.3, token: env:DNSLB_TEST_S3_TOKEN}
      - {id: vip-1, address: 10.9.0.1, cluster: vip-1}
"""


@pytest.fixture
def manager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Manager:
    monkeypatch.setenv("DNSLB_TEST_AGENT_TOKEN", AGENT)
    monkeypatch.setenv("DNSLB_TEST_S3_TOKEN", OWN)
    monkeypatch.setenv("DNSLB_TEST_NODE_TOKEN", NODE)
    (tmp_path / "manager.yaml").write_text(CONFIG)
    return Manager(load_manager_config(tmp_path / "manager.yaml"), clock=FakeClock())


def report(server_id: str, seq: int = 1, **extra: Any) -> bytes:
    body = {
        "server_id": server_id,
        "seq": seq,
        "time": 1.0,
        "in_progress": 1,
        "max_concurrency": 10,
        **extra,
    }
    return json.dumps(body).encode()


class Exchange:
    """One request through :class:`ManagerApp`: the body is handed over only when asked for,
    so a test sees whether it was read at all."""

    def __init__(self, token: str | None, body: bytes, *, length: int | None = None) -> None:
        headers = [(b"content-type", b"application/json")]
        if token is not None:
            headers.append((b"authorization", f"Bearer {token}".encode()))
        headers.append((b"content-length", str(len(body) if length is None else length).encode()))
        self.scope = {"type": "http", "method": "POST", "path": "/v1/reports", "headers": headers}
        self.chunks = [body]
        self.reads = 0
        self.status: int | None = None
        self.headers: dict[bytes, bytes] = {}
        self.body = b""

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        if not self.chunks:
            return {"type": "http.disconnect"}
        chunk = self.chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(self.chunks)}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = dict(message.get("headers", []))
        else:
            self.body += message.get("body", b"")

    def run(self, app: ManagerApp) -> Exchange:
        asyncio.run(app(self.scope, self.receive, self.send))
        return self

    @property
    def error(self) -> str:
        return str(json.loads(self.body)["error"])


def app_of(manager: Manager) -> ManagerApp:
    return ManagerApp(manager.ingest, ready=lambda: True)


@pytest.mark.parametrize(
    "token",
    [
        pytest.param(None, id="no-token"),
        pytest.param("not-a-token", id="unknown"),
        pytest.param(AGENT + "x", id="longer"),
        pytest.param("x" * 10_000, id="very-long"),
    ],
)
def test_an_unknown_token_is_refused_before_the_body_is_read(
    manager: Manager, token: str | None
) -> None:
    exchange = Exchange(token, report("s1")).run(app_of(manager))
    assert exchange.status == 401
    assert exchange.reads == 0
    assert exchange.headers[b"connection"] == b"close"  # its body is not drained either
    assert manager.ingest.counts == {"bad_token": 1}
    assert manager.fleet.servers["s1"].report is None


def test_a_declared_length_over_the_cap_is_refused_before_reading(manager: Manager) -> None:
    exchange = Exchange(AGENT, report("s1"), length=MAX_BODY + 1).run(app_of(manager))
    assert (exchange.status, exchange.reads) == (413, 0)
    assert exchange.headers[b"connection"] == b"close"
    assert manager.ingest.counts == {"too_large": 1}


def test_a_body_growing_past_the_cap_in_chunks_is_refused(manager: Manager) -> None:
    exchange = Exchange(AGENT, b"")
    exchange.scope["headers"] = [(b"authorization", f"Bearer {AGENT}".encode())]  # chunked
    exchange.chunks = [b" " * 4096] * 5
    exchange.run(app_of(manager))
    assert exchange.status == 413
    assert exchange.reads == 5  # stopped as soon as the cap was passed
    assert manager.ingest.counts == {"too_large": 1}


def test_a_client_gone_mid_body_leaves_nothing(manager: Manager) -> None:
    exchange = Exchange(AGENT, b"")
    exchange.chunks = [report("s1")[:20]]
    exchange.scope["headers"].append((b"transfer-encoding", b"chunked"))

    async def receive() -> dict[str, Any]:
        exchange.reads += 1
        if exchange.reads == 1:
            return {"type": "http.request", "body": exchange.chunks[0], "more_body": True}
        return {"type": "http.disconnect"}

    asyncio.run(app_of(manager)(exchange.scope, receive, exchange.send))
    assert exchange.status is None  # nobody to answer
    assert manager.fleet.servers["s1"].report is None
    assert "accepted" not in manager.ingest.counts


def test_a_valid_report_is_read_and_recorded(manager: Manager) -> None:
    exchange = Exchange(AGENT, report("s1")).run(app_of(manager))
    assert (exchange.status, exchange.reads) == (204, 1)
    assert manager.fleet.servers["s1"].report is not None
    own = Exchange(OWN, report("s3")).run(app_of(manager))
    assert own.status == 204
    assert manager.ingest.counts == {"accepted": 2}


@pytest.mark.parametrize(
    ("token", "known", "unknown"),
    [
        pytest.param(OWN, "s1", "nope", id="a-server-token"),
        pytest.param(NODE, "s1", "nope", id="a-node-token"),
        pytest.param(OWN, "n1", "n9", id="a-server-token-for-nodes"),
    ],
)
def test_a_token_valid_elsewhere_cannot_tell_known_ids_from_unknown(
    manager: Manager, token: str, known: str, unknown: str
) -> None:
    answers = [Exchange(token, report(server)).run(app_of(manager)) for server in (known, unknown)]
    assert [answer.status for answer in answers] == [401, 401]
    # The same text but for the id the caller sent itself: nothing learnt.
    assert answers[0].error == f"token not valid for {known!r}"
    assert answers[1].error == f"token not valid for {unknown!r}"
    assert manager.ingest.counts == {"bad_token": 2}


def test_the_shared_token_may_learn_an_id_is_unknown(manager: Manager) -> None:
    # It may report for every static member without a token of its own: nothing to hide there.
    assert Exchange(AGENT, report("nope")).run(app_of(manager)).status == 404
    assert Exchange(AGENT, report("s3")).run(app_of(manager)).status == 401


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"[" * 15_000, id="deep-array"),
        pytest.param(b'{"a":' * 3000, id="deep-object"),
        pytest.param(b"\xff\xfe", id="not-utf8"),
        pytest.param(b"", id="empty"),
    ],
)
def test_bodies_that_are_not_json_are_400(manager: Manager, body: bytes) -> None:
    exchange = Exchange(AGENT, body).run(app_of(manager))
    assert exchange.status == 400
    assert manager.ingest.counts == {"malformed": 1}


def test_a_server_launched_after_indexing_reports_at_once(manager: Manager) -> None:
    manager.ingest.accept(AGENT, report("s1"))  # the index is built
    token = "fresh-launch-token-0123456789"
    record = ServerRecord(
        id="late",
        pool="www",
        address="10.0.0.9",
        check_address=None,
        origin="memory",
        state=ServerState.WARMING,
        state_reason="launched",
        state_since=0.0,
        created_at=0.0,
        token_hash=token_hash(token),
    )
    manager.fleet.add_server(record, now=0.0)
    manager.ingest.accept(token, report("late"))
    assert manager.fleet.servers["late"].report is not None
    manager.fleet.update(manager.fleet.servers["late"], state=ServerState.TERMINATED)
    with pytest.raises(Rejected) as refused:
        manager.ingest.accept(token, report("late", seq=2))
    assert refused.value.status == 401


def test_a_new_token_of_a_known_server_is_found_by_a_rebuild(manager: Manager) -> None:
    manager.ingest.accept(OWN, report("s3"))
    new = "s3-rotated-0123456789"
    manager.fleet.update(manager.fleet.servers["s3"], token_hash=token_hash(new))
    manager.ingest.accept(new, report("s3", seq=2))  # same fleet size: found on a miss
    with pytest.raises(Rejected):
        manager.ingest.accept(OWN, report("s3", seq=3))  # the old one: index hit, fleet says no


def test_unknown_tokens_cannot_make_every_request_walk_the_fleet(manager: Manager) -> None:
    now = [0.0]
    index = TokenIndex(manager.fleet, {}, clock=lambda: now[0])
    assert index.knows(token_hash(AGENT))
    built = index.rebuilds
    for number in range(10_000):
        assert not index.knows(token_hash(f"guess-{number}"))
    assert index.rebuilds - built == REINDEX_BURST  # then no more until time passes
    now[0] += 1.0
    for number in range(100):
        index.knows(token_hash(f"more-{number}"))
    assert index.rebuilds - built == REINDEX_BURST + REINDEX_RATE * 1.0  # refilled: 4 a second
    assert index.knows(token_hash(OWN))  # the fleet's own tokens are always found
