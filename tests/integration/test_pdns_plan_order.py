"""A real pdns_server never goes back to an older plan: (epoch, version) order end to end."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.conftest import plan_doc, write_plan
from tests.integration.test_pdns import Dns, pytestmark, start_pdns

__all__ = ["pytestmark"]  # the same marks as test_pdns: integration, skipped without pdns


def status(pdns: Dns) -> str:
    result = subprocess.run(
        ["pdnsutil", f"--config-dir={pdns.server.workdir}", "backend-cmd", "pipe", "status"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout


def with_member(address: str, **top: object) -> dict[str, object]:
    doc = plan_doc(**top)
    doc["pools"][0]["members"] = [{"id": "only", "address": address, "ttl": 33}]
    return doc


def test_a_deposed_managers_plan_is_never_served_and_a_newer_epoch_is(tmp_path: Path) -> None:
    pdns = start_pdns(tmp_path, with_member("10.2.2.2", epoch=2, version=7))
    try:
        assert pdns.addresses()[0] == ["10.2.2.2"]
        write_plan(pdns.plan_path, with_member("10.1.1.1", epoch=1, version=50))
        # Several loader rounds (every 0.25 s) of every coprocess: none takes the older epoch.
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert pdns.addresses()[0] == ["10.2.2.2"]
            time.sleep(0.05)
        text = status(pdns)
        assert "plan epoch: 2" in text and "plan version: 7" in text
        assert "plans refused as older than one served: 0" not in text
        assert "epoch 1 v50 is older than plan epoch 2 v7" in pdns.server.log_tail(400)
        write_plan(pdns.plan_path, with_member("10.3.3.3", epoch=3, version=1))
        deadline = time.monotonic() + 5
        while pdns.addresses()[0] != ["10.3.3.3"]:
            assert time.monotonic() < deadline, "the newer epoch was not served"
            time.sleep(0.05)
    finally:
        pdns.server.stop()


def test_a_lower_version_of_the_same_epoch_is_refused(tmp_path: Path) -> None:
    """A single manager (epoch 0) that restarted its numbering would be refused: it must not
    (manager/service.py starts from the published plan's version)."""
    pdns = start_pdns(tmp_path, with_member("10.2.2.2", version=7))
    try:
        write_plan(pdns.plan_path, with_member("10.1.1.1", version=6))
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert pdns.addresses()[0] == ["10.2.2.2"]
            time.sleep(0.05)
        assert "plan version: 7" in status(pdns)
    finally:
        pdns.server.stop()
