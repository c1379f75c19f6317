"""The manager's history as the lab keeps it (through the API, paged) and the report reads it:
servers, their states from the events' fields, their cost (the real API in tests/integration)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dnslb.errors import ConfigError
from lab.history import (
    EVENTS_FILE,
    SERVERS_FILE,
    ManagerApi,
    ManagerHistory,
    read_events,
    read_servers,
)
from lab.records import Record, RecordWriter
from lab.report import load_run
from lab.runner import LAB_FILE, LabInfo


class FakeManagerApi(ManagerApi):
    """The two routes the lab asks, answered as the manager's API answers them: events newest
    first in pages of ``limit`` (``next_before_id`` while a page is full), servers now."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:1", "a-token")
        self.events: list[dict[str, Any]] = []
        self.servers_now: list[dict[str, Any]] = []
        self.pages = 0

    def add(
        self,
        time: float,
        kind: str,
        reason: str,
        *,
        server: str | None = None,
        change: tuple[str, str] | None = None,
        pool: str | None = "www",
    ) -> None:
        before, after = change or (None, None)
        self.events.append(
            {
                "id": len(self.events) + 1,
                "time": time,
                "kind": kind,
                "reason": reason,
                "pool": pool,
                "server": server,
                "from_state": before,
                "to_state": after,
            }
        )

    def get(self, path: str, params: Any = None) -> Any:
        if path == "/v1/servers":
            return self.servers_now
        assert path == "/v1/events"
        self.pages += 1
        limit, before = params["limit"], params.get("before_id")
        older = [e for e in reversed(self.events) if before is None or e["id"] < before]
        page = older[:limit]
        return {"events": page, "next_before_id": page[-1]["id"] if len(page) == limit else None}


def server(server_id: str, address: str, created_at: float) -> dict[str, Any]:
    return {"id": server_id, "pool": "www", "address": address, "created_at": created_at}


def test_every_event_is_kept_once_oldest_first_across_pages(tmp_path: Path) -> None:
    api = FakeManagerApi()
    for number in range(2500):
        api.add(float(number), "paused", f"event {number}", server="s1")
    history = ManagerHistory(api, tmp_path)
    history.poll()
    assert api.pages == 3  # 1000 a page
    kept = read_events(tmp_path / EVENTS_FILE)
    assert [event.id for event in kept] == list(range(1, 2501))
    api.pages = 0
    history.poll()
    assert api.pages == 1 and len(read_events(tmp_path / EVENTS_FILE)) == 2500
    api.add(3000.0, "state", "reporting", server="s1", change=("warming", "active"))
    ManagerHistory(api, tmp_path).poll()  # a lab kept with --keep-state: goes on where it was
    kept = read_events(tmp_path / EVENTS_FILE)
    assert [event.id for event in kept] == list(range(1, 2502))
    assert kept[-1].summary == "warming -> active: reporting"
    assert kept[0].from_state is kept[0].to_state is None


def test_a_server_is_kept_once_it_has_an_address_and_again_if_it_changes(
    tmp_path: Path,
) -> None:
    api = FakeManagerApi()
    history = ManagerHistory(api, tmp_path)
    api.servers_now = [server("s1", "", 10.0)]  # launching: no address yet
    history.poll()
    assert read_servers(tmp_path / SERVERS_FILE) == []
    api.servers_now = [server("s1", "127.0.1.1", 10.0)]
    history.poll()
    history.poll()
    api.servers_now = [server("s1", "127.0.1.9", 10.0), server("s2", "127.0.1.2", 20.0)]
    ManagerHistory(api, tmp_path).poll()
    seen = [(s.id, s.address) for s in read_servers(tmp_path / SERVERS_FILE)]
    assert seen == [("s1", "127.0.1.1"), ("s1", "127.0.1.9"), ("s2", "127.0.1.2")]


def test_a_line_cut_short_ends_the_file(tmp_path: Path) -> None:
    api = FakeManagerApi()
    api.add(1.0, "scale_out", "1: busy")
    ManagerHistory(api, tmp_path).poll()
    with open(tmp_path / EVENTS_FILE, "a") as handle:
        handle.write('{"id": 2, "time": 2.0, "ki')  # the lab was killed mid-line
    assert [event.id for event in read_events(tmp_path / EVENTS_FILE)] == [1]
    assert read_events(tmp_path / "none.jsonl") == []


def a_lab(directory: Path) -> None:
    info = LabInfo(
        workdir=str(directory),
        pid=1,
        started_at=0.0,
        dns_address="127.0.0.1",
        dns_port=5300,
        dns_name="www.lab.test",
        http_port=8080,
        network="127.0.1",
        manager_url="http://127.0.0.1:8700",
        token_file=str(directory / "api.token"),
        objects={"count": 100, "mean_size": 10240, "min_size": 2048},
        settings={},
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / LAB_FILE).write_text(info.to_json())


def a_loadtest(directory: Path, records: list[Record]) -> None:
    directory.mkdir(parents=True)
    document = {"started_at": 100.0, "ended_at": 110.0, "test": {}}
    (directory / "loadtest.json").write_text(json.dumps(document))
    writer = RecordWriter(directory / "requests.csv")
    for record in records:
        writer.write(record)
    writer.close()


def test_the_report_reads_servers_and_states_from_the_kept_history(tmp_path: Path) -> None:
    lab, loadtest = tmp_path / "lab", tmp_path / "loadtest"
    a_lab(lab)
    a_loadtest(
        loadtest,
        [
            Record(start=101.0, kind="GET", name="o", seconds=0.5, ok=True, address="127.0.1.1"),
            Record(start=106.0, kind="GET", name="o", seconds=0.5, ok=True, address="127.0.1.2"),
        ],
    )
    api = FakeManagerApi()
    api.add(80.0, "server_added", "launching: min_servers", server="s0")
    api.add(85.0, "state", "gone", server="s0", change=("launching", "terminated"))
    api.add(90.0, "server_added", "launching: min_servers", server="s1")
    api.add(91.0, "state", "running at 127.0.1.1", server="s1", change=("launching", "warming"))
    api.add(92.0, "state", "reporting", server="s1", change=("warming", "active"))
    api.add(103.0, "scale_out", "1: mean utilization 0.90", server=None)
    api.add(104.0, "server_added", "launching: scale out", server="s2")
    api.add(105.0, "state", "running at 127.0.1.2", server="s2", change=("launching", "warming"))
    api.add(106.0, "state", "reporting", server="s2", change=("warming", "active"))
    api.add(108.0, "state", "scale in", server="s2", change=("active", "draining"))
    api.add(109.0, "state", "drained", server="s2", change=("draining", "terminated"))
    api.add(109.5, "server_added", "launching: scale out", server="s3")  # never shown by the API
    api.add(109.6, "pool_created", "another pool", pool="other", server="x1")
    api.servers_now = [server("s1", "127.0.1.1", 90.0), server("s2", "127.0.1.2", 104.0)]
    ManagerHistory(api, lab).poll()

    run = load_run(lab, loadtest)
    spans = {span.id: span for span in run.servers}
    assert list(spans) == ["s1", "s2", "s3"]  # s0 was gone before the window; x1 is not ours
    s1, s2, s3 = spans["s1"], spans["s2"], spans["s3"]
    assert s1.states == ((90.0, "launching"), (91.0, "warming"), (92.0, "active"))
    assert (s1.cost, s1.served, s1.terminated_at) == (10.0, 1, None)
    assert s2.states[-1] == (109.0, "terminated")
    assert (s2.cost, s2.served, s2.terminated_at) == (5.0, 1, 109.0)
    assert (s3.address, s3.created_at, s3.states) == ("", 109.5, ((109.5, "launching"),))
    rows = {(kind, server, text) for _, kind, server, text in run.events}
    assert ("state", "s2", "active -> draining: scale in") in rows
    assert ("scale_out", "", "1: mean utilization 0.90") in rows
    assert all(100.0 <= when <= 110.0 for when, *_ in run.events)


def test_a_lab_without_a_kept_history_is_refused(tmp_path: Path) -> None:
    a_lab(tmp_path / "lab")
    a_loadtest(tmp_path / "loadtest", [])
    with pytest.raises(ConfigError, match=EVENTS_FILE):
        load_run(tmp_path / "lab", tmp_path / "loadtest")
