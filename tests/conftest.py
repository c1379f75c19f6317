"""Shared test helpers: plan documents to start from; the property-based tests' seed.

A free port comes from :func:`daemons.process.free_port`.

Property-based tests (hypothesis, and schemathesis on top of it) run with a fixed seed by
default: the ``fixed`` profile derandomizes hypothesis (each test's examples follow from the test
itself) and keeps no example database, so the suite is the same run after run, on any machine.
``scripts/explore`` runs them with random seeds instead: ``--hypothesis-profile=explore
--hypothesis-seed=S`` and ``DNSLB_TEST_SEED=S`` (schemathesis's seed; see
tests/unit/test_api_schema.py); a failure found so is run again with the same two.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "fixed",
    derandomize=True,  # implies no example database
    deadline=None,  # how long an example takes is the machine's business, not a failure
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore",
    derandomize=False,
    database=None,  # a failure is replayed from its printed seed, not from a local file
    deadline=None,
    print_blob=True,
    max_examples=500,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("fixed")  # pytest's --hypothesis-profile, applied later, wins

FIXED_SEED = 20_251_122
"""The seed of generators outside hypothesis's profiles (schemathesis) in the test suite."""


def suite_seed() -> int:
    """``DNSLB_TEST_SEED`` when exploring, else :data:`FIXED_SEED`."""
    text = os.environ.get("DNSLB_TEST_SEED", "").strip()
    return int(text) if text else FIXED_SEED


BASE_PLAN: dict[str, Any] = {
    "format": 1,
    "version": 7,
    "generated_at": None,
    "stale_after": None,
    "zones": [
        {
            "name": "example.test",
            "soa": {"mname": "ns1.example.test", "rname": "hostmaster.example.test"},
            "ns": ["ns1.example.test", "ns2.example.test"],
            "records": [
                {"name": "ns1.example.test", "type": "A", "ttl": 3600, "content": "127.0.0.1"},
                {"name": "example.test", "type": "MX", "ttl": 300, "content": "10 mx.example.test"},
                {"name": "example.test", "type": "TXT", "ttl": 300, "content": '"hello"'},
            ],
        }
    ],
    "pools": [
        {
            "name": "www.example.test",
            "k": 2,
            "ttl_floor": 5,
            "fallback": "fail_open",
            "members": [
                {"id": "a", "address": "10.0.0.1", "weight": 4, "ttl": 60},
                {"id": "b", "address": "10.0.0.2", "weight": 3, "ttl": 60},
                {"id": "c", "address": "10.0.0.3", "weight": 2, "ttl": 30},
                {"id": "d", "address": "10.0.0.4", "weight": 1, "ttl": 20},
                {"id": "p", "address": "10.0.0.5", "weight": 5, "ttl": 60, "state": "paused"},
                {"id": "x", "address": "10.0.0.6", "weight": 5, "ttl": 60, "state": "down"},
            ],
        },
        {
            "name": "v6.example.test",
            "k": 4,
            "members": [
                {"id": "six-1", "address": "2001:db8::1", "weight": 1, "ttl": 40},
                {"id": "six-2", "address": "2001:db8::2", "weight": 1, "ttl": 50},
            ],
        },
    ],
}


def plan_doc(**top: Any) -> dict[str, Any]:
    """A deep copy of the base plan document with top-level fields replaced."""
    doc = copy.deepcopy(BASE_PLAN)
    doc.update(top)
    return doc


def write_plan(path: Path, doc: dict[str, Any]) -> None:
    """Publish ``doc`` at ``path`` atomically, as the manager does."""
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(json.dumps(doc))
    temp.replace(path)


@pytest.fixture
def base_doc() -> dict[str, Any]:
    return plan_doc()
