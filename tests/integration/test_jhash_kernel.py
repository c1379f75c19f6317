"""The jhash replica against the running kernel: thousands of random (saddr, sport) pairs.

In a fresh network namespace, output-hook rules compute ``jhash ... mod N seed S [offset O]``
into the packet mark and add ``saddr . sport . mark`` to a dynamic set per case; a raw socket
sends one SYN per pair; the sets are read back with ``nft -j`` and every mark is compared with
:func:`dnslb.jhash.nft_bucket`. A 16-byte concatenation checks the replica's multi-block path.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dnslb.jhash import jhash, nft_bucket, reciprocal_scale
from tests.integration.cluster_lab import why_not_runnable

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
DST, DPORT = "127.0.0.9", 9
PAIRS = 3000
# name: (mod, seed, offset, hashed expression)
CASES = {
    "m256": (256, 0, 0, "ip saddr . tcp sport"),
    "m1024": (1024, 0xDEADBEEF, 0, "ip saddr . tcp sport"),
    "m4096": (4096, 0x5EED, 0, "ip saddr . tcp sport"),
    "m7off": (7, 0xFFFFFFFF, 100, "ip saddr . tcp sport"),
    "wide": (65536, 42, 0, "ip saddr . ip daddr . tcp sport . tcp dport"),
}


@pytest.fixture
def netns() -> Iterator[str]:
    reason = why_not_runnable()
    if reason:
        pytest.skip(reason)
    name = f"dljh{random.randrange(1 << 30):x}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def ruleset() -> str:
    sets, rules = [], []
    for name, (modulus, seed, offset, expression) in CASES.items():
        sets.append(
            f"set {name} {{ type ipv4_addr . inet_service . mark; flags dynamic; size 65535; }}"
        )
        rules.append(
            f"ip daddr {DST} tcp dport {DPORT} meta mark set jhash {expression} mod {modulus}"
            f" seed {seed:#x} offset {offset} update @{name} {{ ip saddr . tcp sport . meta mark }}"
        )
    body = "\n".join(sets) + "\nchain out { type filter hook output priority 0; policy accept;\n"
    body += "\n".join(rules) + f"\nip daddr {DST} drop\n}}"
    return f"table ip jhash_check {{\n{body}\n}}\n"


def wide_bucket(saddr: str, sport: int, modulus: int, seed: int) -> int:
    # Each field padded to a 32-bit register: 4 + 4 + (2+2) + (2+2) = 16 bytes.
    key = (
        socket.inet_aton(saddr)
        + socket.inet_aton(DST)
        + sport.to_bytes(2, "big")
        + b"\0\0"
        + DPORT.to_bytes(2, "big")
        + b"\0\0"
    )
    return reciprocal_scale(jhash(key, seed), modulus)


def test_replica_matches_the_kernel_bit_for_bit(netns: str):
    subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "-f", "-"], input=ruleset(), text=True, check=True
    )
    rng = random.Random(20261122)
    pairs = {
        (socket.inet_ntoa(rng.getrandbits(32).to_bytes(4, "big")), rng.randrange(65536))
        for _ in range(PAIRS)
    }
    # The kernel fills in 0.0.0.0 as a source address; leave it out.
    pairs = {pair for pair in pairs if pair[0] != "0.0.0.0"}
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            netns,
            sys.executable,
            str(HERE / "raw_syn_sender.py"),
            DST,
            str(DPORT),
        ],
        input=json.dumps(sorted(pairs)),
        text=True,
        check=True,
        timeout=120,
    )
    mismatches: dict[str, list[tuple[str, int, int, int]]] = {}
    for name, (modulus, seed, offset, expression) in CASES.items():
        listed = subprocess.run(
            ["ip", "netns", "exec", netns, "nft", "-j", "list", "set", "ip", "jhash_check", name],
            capture_output=True,
            text=True,
            check=True,
        )
        elements = [
            element["concat"]
            for entry in json.loads(listed.stdout)["nftables"]
            if "set" in entry
            for element in entry["set"].get("elem", [])
        ]
        assert len(elements) == len(pairs), name
        for saddr, sport, mark in elements:
            if expression == "ip saddr . tcp sport":
                expected = nft_bucket(saddr, sport, modulus, seed, offset)
            else:
                expected = wide_bucket(saddr, sport, modulus, seed) + offset
            if mark != expected:
                mismatches.setdefault(name, []).append((saddr, sport, mark, expected))
    print(f"\njhash replica: {len(pairs)} pairs x {len(CASES)} cases checked against the kernel")
    assert mismatches == {}
