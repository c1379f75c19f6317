"""Plans are ordered by (epoch, version): the plan's ``epoch`` field, pipe backends that never go
back to an older plan (also through the last good copy), and a manager that lost its state."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest

from dnslb.clock import FakeClock
from dnslb.errors import PlanError
from dnslb.plan import MAX_EPOCH, parse_plan_json, plan_to_json
from dnslb.plan_store import FilePlanStore, last_good_store
from manager.config import load_manager_config
from manager.service import Manager
from pipe_backend.backend import PipeBackend, plan_order
from tests.conftest import plan_doc, write_plan
from tests.unit.test_manager import CONFIG, TOKEN


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- the plan field -----------------------------------------------------------------------------


@pytest.mark.parametrize("epoch", [0, 1, 7, MAX_EPOCH], ids=["zero", "one", "seven", "largest"])
def test_the_epoch_reads_back_from_the_plan_written(epoch: int) -> None:
    plan = parse_plan_json(json.dumps(plan_doc(epoch=epoch)))
    assert plan.epoch == epoch
    again = parse_plan_json(plan_to_json(plan))
    assert again == plan
    # A single manager's plan (epoch 0) is written as before: older pipe backends still read it.
    assert ('"epoch"' in plan_to_json(plan)) is (epoch != 0)


def test_a_plan_without_an_epoch_has_epoch_zero() -> None:
    document = plan_doc()
    document.pop("epoch", None)
    assert parse_plan_json(json.dumps(document)).epoch == 0


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (-1, "epoch: must be between 0 and 9007199254740992, not -1"),
        (MAX_EPOCH + 1, "epoch: must be between 0 and 9007199254740992, not 9007199254740993"),
        (1.5, "epoch: must be an integer, not float"),
        (True, "epoch: must be an integer, not a boolean"),
        ("3", "epoch: must be an integer, not a string"),
    ],
    ids=["negative", "too-large", "fraction", "boolean", "text"],
)
def test_a_bad_epoch_is_refused_with_its_path(value: object, problem: str) -> None:
    with pytest.raises(PlanError) as caught:
        parse_plan_json(json.dumps(plan_doc(epoch=value)))
    assert caught.value.problems == [problem]


# -- the pipe backend ---------------------------------------------------------------------------


def backend_on(path: Path, clock: Clock, *, last_good: bool = True) -> PipeBackend:
    store = FilePlanStore(path)
    kept = last_good_store(store, path.parent) if last_good else None
    backend = PipeBackend(store, last_good=kept, rng=random.Random(5), monotonic=clock, wall=clock)
    backend.poll(force=True)
    assert backend.handle(b"HELO\t5").startswith(b"OK")
    return backend


def served(backend: PipeBackend) -> tuple[int, int]:
    assert backend.plan is not None
    return plan_order(backend.plan)


def test_a_lower_epoch_is_refused_whatever_its_version_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "plan.json"
    clock = Clock()
    write_plan(path, plan_doc(epoch=2, version=5))
    backend = backend_on(path, clock)
    write_plan(path, plan_doc(epoch=1, version=900))  # a deposed leader still publishing
    with caplog.at_level(logging.ERROR, logger="dnslb.pipe_backend"):
        for _ in range(3):
            clock.now += 1
            backend.poll(force=True)
    assert served(backend) == (2, 5)
    assert backend.refused == 3
    assert caplog.text.count("epoch 1 v900 is older than plan epoch 2 v5") == 1
    status = backend.status()
    assert "plan epoch: 2" in status
    assert "plans refused as older than one served: 3" in status
    write_plan(path, plan_doc(epoch=3, version=1))  # the next leader numbers from its database
    backend.poll(force=True)
    assert served(backend) == (3, 1)


def test_within_an_epoch_a_lower_version_is_refused_and_the_same_is_served(
    tmp_path: Path,
) -> None:
    path = tmp_path / "plan.json"
    clock = Clock()
    write_plan(path, plan_doc(epoch=4, version=10, generated_at=900.0))
    backend = backend_on(path, clock)
    write_plan(path, plan_doc(epoch=4, version=9))
    backend.poll(force=True)
    assert served(backend) == (4, 10)
    assert backend.refused == 1
    # The same version republished to refresh its age is taken.
    write_plan(path, plan_doc(epoch=4, version=10, generated_at=990.0))
    backend.poll(force=True)
    assert backend.plan is not None and backend.plan.generated_at == 990.0
    assert backend.refused == 1


def test_the_refused_count_reaches_the_stats_beside_the_plan(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    clock = Clock()
    write_plan(path, plan_doc(epoch=2, version=5))
    backend = backend_on(path, clock)
    write_plan(path, plan_doc(epoch=1, version=6))
    backend.poll(force=True)
    backend.store.open_stats()  # the manager makes the directory when it publishes
    backend.requests += 1  # counts are written when requests were answered since
    backend.write_stats()
    (document,) = backend.store.read_stats()
    assert document["plan_epoch"] == 2
    assert document["plan_version"] == 5
    assert document["plans_refused"] == 1


def test_a_new_coprocess_does_not_start_on_a_plan_older_than_the_last_good(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """pdns starts coprocesses at any time: one started after the store went back must serve
    what the others served, not the older plan."""
    path = tmp_path / "plan.json"
    clock = Clock()
    write_plan(path, plan_doc(epoch=2, version=5))
    backend_on(path, clock)  # serves it and keeps the last good copy
    write_plan(path, plan_doc(epoch=1, version=8))
    with caplog.at_level(logging.ERROR, logger="dnslb.pipe_backend"):
        later = backend_on(path, clock)
    assert served(later) == (2, 5)
    assert later.refused == 1
    assert "older than plan epoch 2 v5 served before: refused" in caplog.text
    assert later.last_good is not None and plan_order(later.last_good.read()) == (2, 5)


def test_the_last_good_copy_is_served_only_when_newer(tmp_path: Path) -> None:
    """A broken store falls back to the last good copy only when that copy is newer by
    (epoch, version) than the plan in service: never back to an older epoch."""
    path = tmp_path / "plan.json"
    clock = Clock()
    write_plan(path, plan_doc(epoch=1, version=50))
    first = backend_on(path, clock)  # keeps epoch 1 v50
    write_plan(path, plan_doc(epoch=2, version=3))
    second = backend_on(path, clock, last_good=False)  # serves epoch 2 v3, keeps nothing
    assert served(second) == (2, 3)
    second.last_good = first.last_good  # now it may fall back to the copy of epoch 1 v50
    path.write_text('{"format": 1, "vers')
    second.poll(force=True)
    assert served(second) == (2, 3)
    first.poll(force=True)  # first serves epoch 1 v50: the copy is not newer either
    assert served(first) == (1, 50)


# -- the manager --------------------------------------------------------------------------------


@pytest.fixture
def tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DNSLB_TEST_AGENT_TOKEN", TOKEN)
    monkeypatch.setenv("DNSLB_TEST_S3_TOKEN", "s3-own-secret")


def start_manager(config_path: Path, clock: FakeClock) -> Manager:
    return Manager(load_manager_config(config_path), clock=clock)


def report_all(manager: Manager, clock: FakeClock, seq: int) -> None:
    for index, server in enumerate(("s1", "s2", "s3")):
        token = "s3-own-secret" if server == "s3" else TOKEN
        body = {
            "server_id": server,
            "seq": seq,
            "time": clock.time(),
            # the servers' shares change every round: a new plan version (the manager publishes
            # a pool again only when its answers change)
            "in_progress": 10 + seq * 8 * index,
            "max_concurrency": 100,
        }
        manager.ingest.accept(token, json.dumps(body).encode())


@pytest.mark.usefixtures("tokens")
def test_a_manager_that_lost_its_database_numbers_on_from_the_published_plan(
    tmp_path: Path,
) -> None:
    config_path = tmp_path / "manager.yaml"
    config_path.write_text(CONFIG)
    clock = FakeClock()
    manager = start_manager(config_path, clock)
    for seq in range(1, 4):
        report_all(manager, clock, seq)
        clock.advance(1.0)
        manager.tick()
    assert manager.plan is not None
    published = manager.plan.version
    assert published >= 3
    manager.store.close()
    (tmp_path / "state.db").unlink()

    path = tmp_path / "plan.json"
    backend = backend_on(path, Clock(), last_good=False)
    assert served(backend) == (0, published)

    again = start_manager(config_path, clock)
    assert again.version == published
    for seq in range(1, 5):
        report_all(again, clock, seq)
        clock.advance(1.0)
        again.tick()
    assert again.plan is not None and again.plan.version > published
    backend.poll(force=True)
    assert served(backend) == (0, again.plan.version)
    assert backend.refused == 0
    again.store.close()


@pytest.mark.usefixtures("tokens")
def test_a_manager_starts_from_its_stored_version_when_the_plan_is_unreadable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config_path = tmp_path / "manager.yaml"
    config_path.write_text(CONFIG)
    (tmp_path / "plan.json").write_text('{"format": 1, "version": 99, "zo')
    with caplog.at_level(logging.WARNING, logger="dnslb.manager"):
        manager = start_manager(config_path, FakeClock())
    assert manager.version == 0
    assert "cannot read the published plan" in caplog.text
    manager.store.close()
