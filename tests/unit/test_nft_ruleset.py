"""The nftables text the drivers run, the dry-run driver, the runners' failures, the lease loop."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from agents.dispatch_drivers.base import NodeRules
from agents.dispatch_drivers.dry_run import DryRunDriver
from agents.dispatch_drivers.nft_ruleset import (
    OWNER_MARK,
    TableListing,
    owner_comment,
    ownership_problem,
    parse_table_listing,
    render_apply,
    render_base,
    render_classify_rule,
    render_fence,
    render_renew,
)
from agents.dispatch_drivers.nft_runner import LibNftables, NftCommand, NftRunner
from agents.dispatch_drivers.nftables import NftablesDriver
from agents.node_agent import LeaseKeeper
from dnslb.errors import ConfigError, ProcessError

VIP = "198.51.100.10"


def test_base_ruleset_creates_a_marked_table_in_one_script():
    text = render_base(VIP, "dnslb", owner="vip-1")
    # "create" fails whole when a table of that name exists: it never replaces one unchecked.
    assert text.startswith(
        'create table ip dnslb { comment "dnslb node agent for cluster vip-1"; }\ntable ip dnslb {'
    )
    assert "delete" not in text
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


def test_apply_is_one_script_with_rule_and_set_and_leaves_the_lease_alone():
    # Renewing the lease on a push would let it outlive the last heartbeat the manager heard.
    text = render_apply("dnslb", [5, 1, 3, 3], 8, 9, require_listener=True, leased=True)
    assert text.splitlines() == [
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
    assert "ip daddr @lease" in driver.scripts[1]


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

    def renew(self, seconds: float | None = None) -> None:
        self.calls += 1
        if self.calls <= 3:
            raise ProcessError("nftables refused the script: busy")


def test_lease_loop_survives_failures_and_says_so_once(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="agents.node_agent")
    driver = FailingDriver()
    stop = threading.Event()
    keeper = LeaseKeeper(driver, 0.03, heartbeats=False)
    thread = threading.Thread(target=keeper.loop, args=(stop,))
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


# --- whose table is it (issue 14: an nft_table naming an existing table got it deleted) --------

OURS = """table ip dnslb { # handle 7
\tcomment "dnslb node agent for cluster vip-1"
\tset active { # handle 1
\t\ttype mark
\t}

\tset lease { # handle 2
\t\ttype ipv4_addr
\t\tflags timeout
\t}

\tchain prerouting { # handle 3
\t\ttype filter hook prerouting priority raw; policy accept;
\t}

\tchain input { # handle 4
\t\ttype filter hook input priority filter; policy accept;
\t}

\tchain vip { # handle 5
\t}

\tchain classify { # handle 6
\t}
}
"""
LEGACY = OURS.replace('\tcomment "dnslb node agent for cluster vip-1"\n', "")
FIREWALL = """table ip filter { # handle 3
\tchain input { # handle 1
\t\ttype filter hook input priority filter; policy drop;
\t\tct state established,related accept
\t\ttcp dport 22 accept
\t}
}
"""


def test_a_listing_gives_handle_comment_sets_and_chains():
    listing = parse_table_listing(OURS)
    assert listing == TableListing(
        handle=7,
        comment="dnslb node agent for cluster vip-1",
        sets=frozenset({"active", "lease"}),
        chains=frozenset({"prerouting", "input", "vip", "classify"}),
    )
    assert parse_table_listing(FIREWALL) == TableListing(3, None, frozenset(), frozenset({"input"}))


@pytest.mark.parametrize(
    ("listing", "owner", "problem"),
    [
        pytest.param(OURS, "vip-1", None, id="ours"),
        pytest.param(OURS.replace(" for cluster vip-1", ""), "vip-1", None, id="ours, no cluster"),
        pytest.param(LEGACY, "vip-1", None, id="an unmarked table of an earlier agent"),
        pytest.param(OURS, "vip-2", "belongs to another node agent", id="another cluster's"),
        pytest.param(FIREWALL, "vip-1", "not created by a dnslb node agent", id="a firewall"),
        pytest.param(
            LEGACY.replace("chain vip {", "chain ssh {"),
            "vip-1",
            "no dnslb comment",
            id="unmarked, other chains",
        ),
        pytest.param(
            OURS.replace("dnslb node agent for cluster vip-1", "firewalld"),
            "vip-1",
            "comment 'firewalld'",
            id="someone else's comment",
        ),
    ],
)
def test_only_our_tables_may_be_replaced(listing: str, owner: str, problem: str | None):
    found = ownership_problem(parse_table_listing(listing), "dnslb", owner)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
        assert "nft delete table ip dnslb" in found or "another nft_table" in found


def test_the_mark_names_the_cluster_only_when_nft_can_carry_it():
    assert owner_comment("vip-1") == f"{OWNER_MARK} for cluster vip-1"
    assert owner_comment('vip "1"') == OWNER_MARK
    assert owner_comment("") == OWNER_MARK
    assert '"vip' not in render_base(VIP, "dnslb", owner='vip" ; flush ruleset ; "')


class FakeKernel(NftRunner):
    """Answers listings from ``tables`` (name -> listing) and keeps the scripts it ran."""

    name = "fake"

    def __init__(self, tables: dict[str, str]) -> None:
        self.tables = tables
        self.scripts: list[str] = []

    def run(self, script: str) -> None:
        self.scripts.append(script)

    def output(self, command: str) -> str:
        if command == "list tables":
            return "".join(f"table ip {name}\n" for name in self.tables)
        return self.tables[command.rsplit(" ", 1)[1]]


def loose(tmp_path: Path, value: str) -> Path:
    path = tmp_path / "nf_conntrack_tcp_loose"
    path.write_text(value + "\n")
    return path


def test_an_existing_table_that_is_not_ours_is_refused_and_left_alone(tmp_path: Path):
    kernel = FakeKernel({"filter": FIREWALL})
    rules = NodeRules(vip=VIP, table_name="filter", owner="vip-1")
    driver = NftablesDriver(rules, kernel, tcp_loose=loose(tmp_path, "1"))
    with pytest.raises(ConfigError, match="not created by a dnslb node agent"):
        driver.install()
    assert kernel.scripts == []  # nothing ran: the table is untouched
    assert (tmp_path / "nf_conntrack_tcp_loose").read_text() == "1\n"


def test_our_table_is_replaced_by_its_handle_and_a_new_one_created(tmp_path: Path):
    kernel = FakeKernel({"dnslb": OURS})
    rules = NodeRules(vip=VIP, owner="vip-1")
    NftablesDriver(rules, kernel, tcp_loose=loose(tmp_path, "0")).install()
    assert kernel.scripts[-1].startswith("delete table ip handle 7\ncreate table ip dnslb {")
    kernel.tables.clear()
    NftablesDriver(rules, kernel, tcp_loose=loose(tmp_path, "0")).install()
    assert kernel.scripts[-1].startswith("create table ip dnslb {")


def test_tcp_loose_is_set_and_the_change_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="agents.dispatch_drivers.nftables")
    path = loose(tmp_path, "1")
    NftablesDriver(NodeRules(vip=VIP), FakeKernel({}), tcp_loose=path).install()
    assert path.read_text() == "0\n"
    assert "nf_conntrack_tcp_loose 1 -> 0" in caplog.text
    caplog.clear()
    NftablesDriver(NodeRules(vip=VIP), FakeKernel({}), tcp_loose=path).install()
    assert "is 0 already" in caplog.text


def test_tcp_loose_can_be_left_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="agents.dispatch_drivers.nftables")
    path = loose(tmp_path, "1")
    NftablesDriver(
        NodeRules(vip=VIP, set_tcp_loose=False), FakeKernel({}), tcp_loose=path
    ).install()
    assert path.read_text() == "1\n"
    assert "left at 1" in caplog.text


def test_the_lease_is_renewed_after_each_heartbeat_heard_and_on_its_own_only_while_posts_fail():
    # A renewal reaching past the last heartbeat the manager heard would let a dead agent's node
    # accept its buckets after the manager gave them away.
    driver = DryRunDriver(NodeRules(vip=VIP, lease=0.03))
    keeper = LeaseKeeper(driver, 0.03, heartbeats=True)
    stop = threading.Event()
    thread = threading.Thread(target=keeper.loop, args=(stop,))
    thread.start()
    try:
        keeper.heard(time.monotonic())
        assert driver.renewals == 1
        threading.Event().wait(0.1)  # ~10 timer rounds: heartbeats are flowing, the timer rests
        assert driver.renewals == 1
        keeper.post_failed()
        for _ in range(500):
            if driver.renewals >= 3:
                break
            threading.Event().wait(0.01)
        assert driver.renewals >= 3  # the manager is unreachable: the timer keeps the lease
        assert driver.last_renewal == 0.03  # the whole lease, on its own
        keeper.heard(time.monotonic())
        seen = driver.renewals
        threading.Event().wait(0.1)
        assert driver.renewals == seen
    finally:
        stop.set()
        thread.join(timeout=5)
