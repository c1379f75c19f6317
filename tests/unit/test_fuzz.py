"""Every fuzz harness, run with a fixed seed and a fixed number of inputs: reproducible.

``dnslb fuzz`` explores with random seeds for as long as asked (docs/security.md).
"""

from __future__ import annotations

import pytest

from cli.main import FUZZ_HARNESSES, fuzz_harness
from dnslb.fuzzing import run

SEED = 20261123


@pytest.mark.parametrize("name", list(FUZZ_HARNESSES))
def test_harness_finds_nothing(name: str) -> None:
    harness = fuzz_harness(name)
    result = run(harness, seed=SEED, inputs=harness.suite_inputs)
    details = "\n".join(f"{f.kind} at {f.index}: {f.detail}" for f in result.failures)
    assert result.ok, f"{result.summary()}\n{details}"
    assert result.inputs == harness.suite_inputs
