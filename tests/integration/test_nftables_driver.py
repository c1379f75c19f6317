"""The nftables driver against the kernel, in a fresh network namespace, with both runners."""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from agents.dispatch_drivers.base import NodeRules
from agents.dispatch_drivers.nft_runner import LibNftables, NftCommand, NftRunner
from agents.dispatch_drivers.nftables import NftablesDriver
from dnslb.errors import ProcessError
from tests.integration.cluster_lab import enter_netns, why_not_runnable

pytestmark = pytest.mark.integration

VIP = "198.18.0.100"


@pytest.fixture
def netns() -> Iterator[str]:
    reason = why_not_runnable()
    if reason:
        pytest.skip(reason)
    name = f"dldrv{random.randrange(1 << 30):x}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def nft_json(ns: str, *args: str) -> list[dict]:
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "-j", "list", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)["nftables"]


def elements(ns: str, set_name: str) -> list:
    for entry in nft_json(ns, "set", "ip", "dnslb", set_name):
        if "set" in entry:
            return entry["set"].get("elem", [])
    return []


def in_netns(ns: str, action) -> object:
    """Run ``action`` in a thread that entered ``ns`` (the driver talks to that kernel)."""
    box: dict[str, object] = {}

    def target() -> None:
        enter_netns(ns)
        try:
            box["value"] = action()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=60)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


@pytest.mark.parametrize("runner", [LibNftables, NftCommand], ids=["libnftables", "nft"])
def test_install_apply_fence_and_refuse(netns: str, runner: type[NftRunner]):
    def scenario() -> NftablesDriver:
        driver = NftablesDriver(NodeRules(vip=VIP, lease=5.0), runner())
        driver.install()
        driver.install()  # idempotent: replaces itself
        driver.apply(range(0, 1024, 4), 1024, 0x5EED)
        return driver

    driver = in_netns(netns, scenario)
    assert len(elements(netns, "active")) == 256
    lease = elements(netns, "lease")
    assert len(lease) == 1
    assert lease[0]["elem"]["val"] == VIP
    assert lease[0]["elem"]["timeout"] == 5
    loose = subprocess.run(
        ["ip", "netns", "exec", netns, "sysctl", "-n", "net.netfilter.nf_conntrack_tcp_loose"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert loose == "0"

    def broken() -> None:
        # A bucket past N is refused by our renderer; a bad table name by nft itself.
        driver.rules = NodeRules(vip=VIP, table_name="missing", lease=5.0)  # type: ignore[misc]
        driver.apply([1, 2], 1024, 1)

    with pytest.raises(ProcessError):
        in_netns(netns, broken)
    assert len(elements(netns, "active")) == 256  # nothing changed

    def fence() -> None:
        driver.rules = NodeRules(vip=VIP, lease=5.0)  # type: ignore[misc]
        driver.fence()

    in_netns(netns, fence)
    assert elements(netns, "active") == []


def test_the_lease_runs_out_without_renewal(netns: str):
    def scenario() -> None:
        driver = NftablesDriver(NodeRules(vip=VIP, lease=0.2))
        driver.install()
        driver.apply([0, 1], 2, 1)

    in_netns(netns, scenario)
    assert len(elements(netns, "lease")) == 1
    time.sleep(0.4)
    assert elements(netns, "lease") == []
    assert len(elements(netns, "active")) == 2  # the buckets stay; the rule just stops matching
