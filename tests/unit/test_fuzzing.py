"""The fuzz engine itself: each kind of failure is seen, runs are reproducible per seed."""

from __future__ import annotations

import logging
import random
import time

import pytest

from dnslb.fuzzing import (
    Finding,
    Harness,
    deep_json,
    hostile_number,
    hostile_text,
    input_seed,
    json_text,
    mutate_bytes,
    mutate_document,
    run,
)


class Scripted(Harness):
    """Fails in a chosen way on chosen inputs (by the first number its generator draws)."""

    name = "scripted"
    deadline = 0.2

    def __init__(self, how: str) -> None:
        self.how = how
        self.seen: list[float] = []

    def one(self, rng: random.Random) -> str:
        value = rng.random()
        self.seen.append(value)
        if value > 0.8:
            if self.how == "crash":
                raise KeyError("boom")
            if self.how == "malformed":
                raise Finding("wrong answer")
            if self.how == "hang":
                time.sleep(0.3)
            if self.how == "swallowed":
                try:
                    raise ValueError("hidden")
                except ValueError:
                    logging.getLogger("dnslb.test").exception("caught and carried on")
        return "low" if value < 0.5 else "high"


@pytest.mark.parametrize("how", ["crash", "malformed", "hang", "swallowed"])
def test_each_kind_of_failure_is_counted_at_its_input(how: str) -> None:
    harness = Scripted(how)
    result = run(harness, seed=3, inputs=40)
    failing = [index for index, value in enumerate(harness.seen) if value > 0.8]
    assert failing
    assert [failure.index for failure in result.failures] == failing
    kind = {"swallowed": "crash", "hang": "hang"}.get(how, how)
    assert {failure.kind for failure in result.failures} == {kind}
    assert not result.ok
    assert result.inputs == 40
    assert sum(result.outcomes.values()) == 40 - len(failing)


def test_a_run_is_the_same_for_the_same_seed_and_replays_one_input() -> None:
    first, second = Scripted("none"), Scripted("none")
    run(first, seed=11, inputs=30)
    run(second, seed=11, inputs=30)
    assert first.seen == second.seen
    replay = Scripted("none")
    run(replay, seed=11, inputs=1, start=17)
    assert replay.seen == [first.seen[17]]
    other = Scripted("none")
    run(other, seed=12, inputs=30)
    assert other.seen != first.seen


def test_input_seeds_are_stable() -> None:
    # Reproduction commands printed today must mean the same input tomorrow.
    assert input_seed(1, 0) == input_seed(1, 0)
    assert input_seed(1, 0) != input_seed(1, 1) != input_seed(2, 0)
    assert input_seed(20261123, 5) == 6398441727538784162


def test_mutators_terminate_and_stay_serializable() -> None:
    rng = random.Random(1)
    document = {"a": [1, 2, {"b": "c"}], "d": None}
    for _ in range(2000):
        mutated = mutate_document(document, rng, mutations=3)
        json_text(mutated, rng)
        mutate_bytes(b'{"a": 1}', rng, mutations=3)
        hostile_number(rng)
        hostile_text(rng)
    assert document == {"a": [1, 2, {"b": "c"}], "d": None}  # the original is untouched
    assert deep_json(3) == "[[[]]]"
