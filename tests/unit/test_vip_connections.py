"""Node load from /proc/net/tcp text."""

from __future__ import annotations

from pathlib import Path

from agents.vip_connections import VipConnections, measure, parse_proc_net_tcp

# Lines as Linux prints them on a little-endian host: 198.51.100.10 is 0A6433C6.
PROC = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0A6433C6:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0A6433C6:1F90 010012C6:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0A6433C6:1F90 010012C6:C351 01 00000000:00000000 00:00000000 00000000     0        0 3 1
   3: 0A6433C6:0016 010012C6:C352 01 00000000:00000000 00:00000000 00000000     0        0 4 1
   4: 0100007F:1F90 0100007F:C353 01 00000000:00000000 00:00000000 00000000     0        0 5 1
   5: 0A6433C6:1F90 010012C6:C354 06 00000000:00000000 00:00000000 00000000     0        0 6 1
   6: garbage
"""
VIP = "198.51.100.10"


def test_parses_address_port_and_state():
    sockets = list(parse_proc_net_tcp(PROC))
    assert len(sockets) == 6
    assert (sockets[0].address, sockets[0].port, sockets[0].state) == (VIP, 8080, 0x0A)


def test_counts_established_connections_to_the_vip():
    assert measure(PROC, VIP, ()).in_progress == 3
    assert measure(PROC, VIP, (8080,)).in_progress == 2


def test_a_listener_on_the_vip_or_any_address_counts_as_serving():
    assert measure(PROC, VIP, (8080,)).error is None
    wildcard = PROC.replace("0A6433C6:1F90 00000000:0000 0A", "00000000:1F90 00000000:0000 0A")
    assert measure(wildcard, VIP, (8080,)).error is None


def test_no_listener_on_the_service_port_is_an_error():
    load = measure(PROC, VIP, (443,))
    assert load.error == "nothing listens on 198.51.100.10 port 443"


def test_an_unreadable_source_is_an_error_not_a_crash(tmp_path: Path):
    load = VipConnections(VIP, (), tmp_path / "missing")()
    assert load.error is not None
    assert "cannot read" in load.error


def test_reads_this_machines_table():
    load = VipConnections("127.0.0.1", ())()
    assert load.error is None
    assert load.in_progress >= 0
