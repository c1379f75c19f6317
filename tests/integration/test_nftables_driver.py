"""The nftables driver against the kernel, in a fresh network namespace, with both runners."""

from __future__ import annotations

import json
import logging
import random
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from agents.dispatch_drivers.base import NodeRules
from agents.dispatch_drivers.nft_ruleset import render_base
from agents.dispatch_drivers.nft_runner import LibNftables, NftCommand, NftRunner
from agents.dispatch_drivers.nftables import NftablesDriver
from dnslb.errors import ConfigError, ProcessError
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
        driver.renew()
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
        assert elements(netns, "lease") == []  # applying a table does not start the lease
        driver.renew()

    in_netns(netns, scenario)
    assert len(elements(netns, "lease")) == 1
    time.sleep(0.4)
    assert elements(netns, "lease") == []
    assert len(elements(netns, "active")) == 2  # the buckets stay; the rule just stops matching


# --- whose table it is, and tcp_loose (issue 14, item 9) ---------------------------------------


def nft_text(ns: str, *args: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", ns, "nft", *args], capture_output=True, text=True, check=True
    ).stdout


def sysctl_loose(ns: str, value: str | None = None) -> str:
    key = "net.netfilter.nf_conntrack_tcp_loose"
    if value is not None:
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"{key}={value}"], check=True)
    return subprocess.run(
        ["ip", "netns", "exec", ns, "sysctl", "-n", key], capture_output=True, text=True, check=True
    ).stdout.strip()


FIREWALL = """\
table ip filter {
    chain input {
        type filter hook input priority filter; policy accept;
        tcp dport 22 accept
    }
}
"""


@pytest.mark.parametrize("runner", [LibNftables, NftCommand], ids=["libnftables", "nft"])
def test_a_table_the_agent_did_not_create_is_refused_and_kept(netns: str, runner: type[NftRunner]):
    subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "-f", "-"], input=FIREWALL, text=True, check=True
    )
    before = nft_text(netns, "list", "table", "ip", "filter")

    def scenario() -> None:
        rules = NodeRules(vip=VIP, table_name="filter", owner="vip-1")
        NftablesDriver(rules, runner()).install()

    with pytest.raises(ConfigError, match="not created by a dnslb node agent"):
        in_netns(netns, scenario)
    assert nft_text(netns, "list", "table", "ip", "filter") == before
    assert "tcp dport 22 accept" in before


@pytest.mark.parametrize("runner", [LibNftables, NftCommand], ids=["libnftables", "nft"])
def test_the_agents_table_is_marked_and_replaced_by_its_handle(netns: str, runner: type[NftRunner]):
    def install(owner: str) -> None:
        NftablesDriver(NodeRules(vip=VIP, owner=owner), runner()).install()

    in_netns(netns, lambda: install("vip-1"))
    first = nft_text(netns, "-a", "list", "table", "ip", "dnslb")
    assert 'comment "dnslb node agent for cluster vip-1"' in first
    in_netns(netns, lambda: install("vip-1"))  # a restart replaces it
    second = nft_text(netns, "-a", "list", "table", "ip", "dnslb")
    assert first.splitlines()[0] != second.splitlines()[0]  # a new handle: a new table
    assert 'comment "dnslb node agent for cluster vip-1"' in second
    # Another cluster's agent configured with the same table name is refused.
    with pytest.raises(ConfigError, match="belongs to another node agent"):
        in_netns(netns, lambda: install("vip-2"))
    assert nft_text(netns, "-a", "list", "table", "ip", "dnslb") == second


def test_a_table_of_an_agent_from_before_the_mark_is_taken_over(netns: str):
    # What the agent installed before tables were marked: the same table without a comment.
    legacy = render_base(VIP, "dnslb").split("\n", 1)[1]  # without the "create ... comment"
    subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "-f", "-"], input=legacy, text=True, check=True
    )
    assert "comment" not in nft_text(netns, "list", "table", "ip", "dnslb")
    in_netns(netns, lambda: NftablesDriver(NodeRules(vip=VIP, owner="vip-1")).install())
    assert "dnslb node agent for cluster vip-1" in nft_text(netns, "list", "table", "ip", "dnslb")


def test_tcp_loose_is_set_and_said_or_left_alone(netns: str, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="agents.dispatch_drivers.nftables")
    in_netns(netns, lambda: NftablesDriver(NodeRules(vip=VIP)).install())  # loads conntrack
    sysctl_loose(netns, "1")
    caplog.clear()
    in_netns(netns, lambda: NftablesDriver(NodeRules(vip=VIP, set_tcp_loose=False)).install())
    assert sysctl_loose(netns) == "1"
    assert "left at 1" in caplog.text
    in_netns(netns, lambda: NftablesDriver(NodeRules(vip=VIP)).install())
    assert sysctl_loose(netns) == "0"
    assert "nf_conntrack_tcp_loose 1 -> 0" in caplog.text
