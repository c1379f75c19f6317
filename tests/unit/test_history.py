"""The manager's history ring: one sample per pool per interval, bounded by count."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from dnslb.clock import FakeClock
from dnslb.control import AdminAction, NotFound
from manager.config import load_manager_config
from manager.control import Control
from manager.history import RESOLUTION, SAMPLES, HistoryRing
from manager.service import Manager

CONFIG = """
zones: [{name: example.test, ns: [ns1.example.test]}]
auth: {agent_token: env:DNSLB_TEST_AGENT_TOKEN}
down_after: 3
pools:
  - name: www
    zone: example.test
    policy: {slow_start: 0, smoothing: 0, th_over: 0.8, hysteresis: 0.1}
    members:
      - {id: s1, address: 10.0.0.1}
      - {id: s2, address: 10.0.0.2}
      - {id: s3, address: 10.0.0.3}
"""
TOKEN = "agent-secret"


@pytest.fixture(autouse=True)
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DNSLB_TEST_AGENT_TOKEN", TOKEN)


class Lab:
    def __init__(self, tmp_path: Path) -> None:
        path = tmp_path / "manager.yaml"
        path.write_text(CONFIG)
        self.clock = FakeClock()  # wall time starts on a multiple of 5 s
        self.manager = Manager(load_manager_config(path), clock=self.clock)
        self.control = Control(self.manager)
        self.seq = 0

    def step(self, load: Callable[[str], int | None] | int = 10, seconds: int = 1) -> None:
        """``seconds`` ticks, every server reporting ``load`` (None: it stays silent)."""
        for _ in range(seconds):
            self.seq += 1
            for server in list(self.manager.fleet.servers.values()):
                value = load(server.id) if callable(load) else load
                if value is None:
                    continue
                body = {
                    "server_id": server.id,
                    "seq": self.seq,
                    "time": 1.0,
                    "in_progress": value,
                    "max_concurrency": 100,
                }
                self.manager.ingest.accept(TOKEN, json.dumps(body).encode())
            self.clock.advance(1)
            self.manager.tick()


def test_the_defaults_keep_an_hour() -> None:
    ring = HistoryRing()
    assert ring.resolution == RESOLUTION == 5.0
    assert ring.retention == RESOLUTION * SAMPLES == 3600.0


def test_one_sample_per_interval_with_the_mean_and_any_pause(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    start = lab.clock.time()
    # s3 is above th_over for one tick only: the sample still says it was paused.
    lab.step(lambda s: 95 if s == "s3" and lab.seq == 7 else 20 if lab.seq % 2 else 40, seconds=16)
    history = lab.control.history()
    assert history.resolution == 5.0
    times = [sample.time for sample in history.samples]
    assert times == [start + 5, start + 10, start + 15]  # the open interval is not shown
    first, second, third = history.samples
    assert first.pool == "www" and first.servers == {"active": 3}
    assert [m.id for m in second.members] == ["s1", "s2", "s3"]
    s1 = second.members[0]
    # The ticks at seconds 5 to 9 of [5, 10): loads 20, 40, 20, 40, 20 -> mean 0.28
    assert s1.utilization == pytest.approx(0.28)
    assert s1.weight is not None and s1.ttl is not None and not s1.paused
    assert second.members[2].paused and not third.members[2].paused
    assert third.cost_seconds > second.cost_seconds > 0


def test_since_gives_only_newer_samples(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    lab.step(seconds=21)
    samples = lab.control.history().samples
    assert len(samples) == 4
    newer = lab.control.history(pool="www", since=samples[1].time).samples
    assert newer == samples[2:]
    assert lab.control.history(since=samples[-1].time).samples == ()
    assert lab.control.history(since=math.nan).samples == samples
    with pytest.raises(NotFound):
        lab.control.history(pool="nope")


def test_the_ring_is_bounded_by_count(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    lab.manager.history = HistoryRing(resolution=2, samples=3, max_servers=2)
    lab.step(seconds=30)
    samples = lab.control.history().samples
    assert len(samples) == 3
    assert samples[-1].time == lab.clock.time() - lab.clock.time() % 2
    assert [sample.time for sample in samples] == [
        samples[-1].time - 4,
        samples[-1].time - 2,
        samples[-1].time,
    ]
    for sample in samples:
        assert len(sample.members) == 2  # servers beyond the bound are not sampled...
        assert sample.servers == {"active": 3}  # ...but still counted


def test_operator_pauses_and_state_changes_show(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    lab.step(seconds=6)
    lab.manager.admin("s2", AdminAction.PAUSE, "kernel update")
    lab.manager.admin("s1", AdminAction.DISABLE, "broken disk")
    lab.step(seconds=5)
    last = lab.control.history().samples[-1]
    by_id = {member.id: member for member in last.members}
    assert by_id["s2"].paused and by_id["s2"].weight is None
    assert by_id["s1"].state.value == "disabled"
    assert last.servers == {"active": 2, "disabled": 1}


def test_a_pool_gone_for_an_hour_leaves_the_ring(tmp_path: Path) -> None:
    lab = Lab(tmp_path)
    ring = lab.manager.history
    lab.step(seconds=6)
    pool = lab.manager.fleet.pools.pop("www")
    lab.step(seconds=10)
    assert ring.pools() == {"www"}  # its samples stay while they are recent
    lab.clock.advance(ring.retention)
    lab.step(seconds=6)
    assert ring.pools() == set()
    lab.manager.fleet.pools["www"] = pool


def test_odd_clocks_are_ignored() -> None:
    ring = HistoryRing()
    for wall in (math.nan, math.inf, -math.inf):
        ring.observe(wall, [], None, lambda pool: 0.0)
    assert ring.view().samples == ()
