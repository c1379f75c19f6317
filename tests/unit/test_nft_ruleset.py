"""The nftables text the drivers run, the dry-run driver, the runners' failures, the lease loop."""

from __future__ import annotations

import logging
import threading

import pytest

from agents.dispatch_drivers.base import NodeRules
from agents.dispatch_drivers.dry_run import DryRunDriver
from agents.dispatch_drivers.nft_ruleset import (
    render_apply,
    render_base,
    render_classify_rule,
    render_fence,
    render_renew,
)
from agents.dispatch_drivers.nft_runner import LibNftables, NftCommand
from agents.node_agent import lease_loop
from dnslb.errors import ProcessError

VIP = "198.51.100.10"


def test_base_ruleset_replaces_itself_in_one_script():
    text = render_base(VIP, "dnslb")
    assert text.startswith("table ip dnslb\ndelete table ip dnslb\ntable ip dnslb {")
    assert f"ip daddr {VIP} meta pkttype {{ broadcast, multicast }} meta pkttype set host" in text
    assert "ct state established,related accept" in text
    assert "chain classify {\n    }" in text  # fenced: nothing accepted yet


def test_classify_rule_accepts_pure_syns_of_our_buckets():
    rule = render_classify_rule(1024, 0x5EED, require_listener=True, leased=True)
    assert rule == (
        "ip daddr @lease tcp flags & (fin|syn|rst|ack) == syn meta mark set jhash ip saddr . "
        "tcp sport mod 1024 seed 0x5eed meta mark @active socket transparent 0 accept"
    )
    plain = render_classify_rule(256, 1, require_listener=False)
    assert "@lease" not in plain
    assert "socket" not in plain


def test_apply_is_one_script_with_rule_set_and_lease():
    text = render_apply("dnslb", [5, 1, 3, 3], 8, 9, require_listener=True, lease=0.25, vip=VIP)
    assert text.splitlines() == [
        "flush set ip dnslb lease",
        f"add element ip dnslb lease {{ {VIP} timeout 250ms }}",
        "flush chain ip dnslb classify",
        "add rule ip dnslb classify "
        + render_classify_rule(8, 9, require_listener=True, leased=True),
        "flush set ip dnslb active",
        "add element ip dnslb active { 1, 3, 5 }",
    ]


def test_apply_of_no_buckets_only_flushes():
    text = render_apply("dnslb", [], 8, 9, require_listener=False)
    assert text.splitlines()[-1] == "flush set ip dnslb active"


def test_large_tables_are_split_into_lines():
    text = render_apply("dnslb", range(4096), 4096, 1, require_listener=False)
    assert text.count("add element ip dnslb active") == 4096 // 32


@pytest.mark.parametrize(
    ("call", "message"),
    [
        pytest.param(lambda: render_base("::1", "dnslb"), "IPv4", id="IPv6 VIP"),
        pytest.param(lambda: render_base(VIP, "bad name"), "table name", id="bad table name"),
        pytest.param(lambda: render_base(VIP, "x; flush ruleset"), "table name", id="injection"),
        pytest.param(
            lambda: render_apply("t", [8], 8, 0, require_listener=False), "0..7", id="bucket >= N"
        ),
        pytest.param(
            lambda: render_apply("t", [-1], 8, 0, require_listener=False), "0..7", id="negative"
        ),
        pytest.param(
            lambda: render_classify_rule(8, 2**32, require_listener=False), "seed", id="seed"
        ),
    ],
)
def test_bad_input_never_reaches_nft(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_renew_and_fence():
    assert render_renew("dnslb", VIP, 0.3) == (
        f"flush set ip dnslb lease\nadd element ip dnslb lease {{ {VIP} timeout 300ms }}\n"
    )
    assert render_fence("dnslb") == "flush set ip dnslb active\n"


def test_dry_run_driver_keeps_what_it_would_run():
    driver = DryRunDriver(NodeRules(vip=VIP, lease=0.25))
    driver.install()
    driver.apply([1, 2], 4, 7)
    assert driver.accepted == frozenset({1, 2})
    driver.renew()
    driver.fence()
    assert driver.accepted == frozenset()
    assert driver.renewals == 1
    assert len(driver.scripts) == 3
    assert "timeout 250ms" in driver.scripts[1]


def test_a_missing_nft_binary_is_a_clear_error():
    with pytest.raises(ProcessError, match="nft not found"):
        NftCommand("/nonexistent/nft").run("list ruleset")


def test_a_missing_library_is_a_clear_error():
    with pytest.raises(ProcessError, match="cannot load"):
        LibNftables("libnftables-that-does-not-exist.so")


class FailingDriver(DryRunDriver):
    def __init__(self) -> None:
        super().__init__(NodeRules(vip=VIP, lease=0.25))
        self.calls = 0

    def renew(self) -> None:
        self.calls += 1
        if self.calls <= 3:
            raise ProcessError("nftables refused the script: busy")


def test_lease_loop_survives_failures_and_says_so_once(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="agents.node_agent")
    driver = FailingDriver()
    stop = threading.Event()
    thread = threading.Thread(target=lease_loop, args=(driver, stop, 0.01))
    thread.start()
    deadline = threading.Event()
    for _ in range(500):
        if driver.calls >= 6:
            break
        deadline.wait(0.01)
    stop.set()
    thread.join(timeout=5)
    assert driver.calls >= 6
    warnings = [r for r in caplog.records if "lease not renewed" in r.getMessage()]
    assert len(warnings) == 1
    assert any("lease renewed again" in r.getMessage() for r in caplog.records)
