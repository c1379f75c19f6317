"""Single-IP cluster figures: table build, table apply and failover time (prints, asserts nothing).

Run as root from the repository root::

    .venv/bin/python bench/dispatch.py [--rounds 20] [--failovers 3]

1. **Build**: :func:`dnslb.dispatch.build_table` from scratch and as a rebalance (one node's
   weight halved), for 256 / 1,024 / 4,096 buckets and 3 / 10 / 50 nodes (pure Python).
2. **Apply**: one transaction through the ``nftables`` driver in a fresh network namespace,
   with libnftables in-process and with the ``nft -f -`` command, for 256 / 1,024 / 4,096
   buckets, the node holding a third of the buckets (a 3-node cluster) and all of them.
3. **Push**: a table pushed over HTTP to a node agent that applies it (the controller's
   pusher -> agent -> nft), the agent alone in a network namespace, over loopback.
4. **Failover**: in the 3-node lab of ``tests/integration/cluster_lab.py``, a node's agent
   and server are killed (SIGKILL); *detected* is the controller's failover decision, *moved* is
   when both survivors hold the new table. The node is then restarted and rejoins.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

# The lab lives with the integration tests; make the repository importable when run as a script.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dnslb.dispatch import build_table, table_to_json
from evaluation.percentile import percentile
from manager.clusters import ClusterNode, HttpTablePusher
from tests.integration.cluster_lab import (
    ClusterLab,
    cluster_lab,
    enter_netns,
    wait_until,
    why_not_runnable,
)

BUCKET_COUNTS = (256, 1024, 4096)


def figures(samples: list[float]) -> str:
    ordered = sorted(samples)
    return (
        f"median {statistics.median(ordered):7.2f} ms  p90 {percentile(ordered, 0.9):7.2f} ms  "
        f"max {ordered[-1]:7.2f} ms  (n={len(ordered)})"
    )


def timed(action: Callable[[], object], rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def bench_build(rounds: int) -> None:
    print("\n== build_table (pure Python) ==")
    for nodes in (3, 10, 50):
        weights = {f"node-{index}": float(1 + index % 4) for index in range(nodes)}
        changed = dict(weights, **{"node-0": weights["node-0"] / 2})
        for count in BUCKET_COUNTS:
            base = build_table("bench", weights, version=1, seed=1, bucket_count=count)
            fresh = timed(
                functools.partial(
                    build_table, "bench", weights, version=1, seed=1, bucket_count=count
                ),
                rounds,
            )
            rebalance = timed(
                functools.partial(
                    build_table,
                    "bench",
                    changed,
                    version=2,
                    seed=1,
                    bucket_count=count,
                    previous=base,
                ),
                rounds,
            )
            print(f"{nodes:3d} nodes {count:5d} buckets  fresh     {figures(fresh)}")
            print(f"{nodes:3d} nodes {count:5d} buckets  rebalance {figures(rebalance)}")


def bench_apply(rounds: int) -> None:
    print("\n== table apply, one transaction (nftables driver, fresh netns) ==")
    name = f"dlbench{random.randrange(1 << 20):x}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        script = (
            "import sys, time\n"
            "from agents.dispatch_drivers.base import NodeRules\n"
            "from agents.dispatch_drivers.nftables import NftablesDriver\n"
            "from agents.dispatch_drivers.nft_runner import LibNftables, NftCommand\n"
            "count, share, rounds = map(int, sys.argv[1:4])\n"
            "runner = LibNftables() if sys.argv[4] == 'lib' else NftCommand()\n"
            "driver = NftablesDriver(NodeRules(vip='198.18.0.100', lease=0.25), runner)\n"
            "driver.install()\n"
            "for index in range(rounds):\n"
            "    mine = range(index % 3, count, 3) if share == 3 else range(count)\n"
            "    started = time.perf_counter()\n"
            "    driver.apply(mine, count, 7 + index)\n"
            "    print((time.perf_counter() - started) * 1000)\n"
        )
        for runner, runner_label in (("lib", "libnftables"), ("cmd", "nft -f -")):
            for count in BUCKET_COUNTS:
                for share, label in ((3, "a third"), (1, "all")):
                    done = subprocess.run(
                        [
                            "ip",
                            "netns",
                            "exec",
                            name,
                            sys.executable,
                            "-c",
                            script,
                            str(count),
                            str(share),
                            str(rounds),
                            runner,
                        ],
                        capture_output=True,
                        text=True,
                        check=True,
                        timeout=600,
                        cwd=Path(__file__).resolve().parents[1],
                    )
                    samples = [float(line) for line in done.stdout.split()]
                    print(
                        f"{runner_label:11s} {count:5d} buckets, node holds {label:8s} "
                        f"{figures(samples)}"
                    )
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def bench_push(rounds: int) -> None:
    print("\n== HTTP push -> node agent -> nft apply (agent alone in a netns, loopback) ==")
    for count in BUCKET_COUNTS:
        name = f"dlpush{random.randrange(1 << 20):x}"
        token = secrets.token_urlsafe(24)
        subprocess.run(["ip", "netns", "add", name], check=True)
        agent = None
        try:
            subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
            agent = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    name,
                    sys.executable,
                    "-m",
                    "cli",
                    "node-agent",
                    "--cluster",
                    "bench",
                    "--node-id",
                    "n1",
                    "--vip",
                    "198.18.0.100",
                    "--listen",
                    "127.0.0.1:8470",
                    "--token-env",
                    "DNSLB_BENCH_TOKEN",
                    "--bucket-count",
                    str(count),
                ],
                env={**os.environ, "DNSLB_BENCH_TOKEN": token},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            samples: list[float] = []
            thread = threading.Thread(
                target=push_from_netns, args=(name, token, count, rounds, samples)
            )
            thread.start()
            thread.join(timeout=300)
            print(f"{count:5d} buckets, node holds a third  {figures(samples)}")
        finally:
            if agent is not None:
                agent.terminate()
                agent.wait(timeout=10)
            subprocess.run(["ip", "netns", "del", name], check=False)


def push_from_netns(ns: str, token: str, count: int, rounds: int, samples: list[float]) -> None:
    """Enter ``ns`` (this thread only) and time ``rounds`` pushes to the agent there."""
    enter_netns(ns)

    async def pushes() -> None:
        pusher = HttpTablePusher(timeout=5)
        target = ClusterNode("n1", "http://127.0.0.1:8470", token)
        try:
            # Wait for the agent to listen (bounded), then push tables that differ each time.
            for _ in range(200):
                probe = await pusher.push(target, b"{}")
                if probe.status == 400:
                    break
                await asyncio.sleep(0.05)
            for index in range(rounds):
                weights = {"n1": 1.0 + index % 2, "n2": 1.0, "n3": 1.0}
                table = build_table("bench", weights, version=index + 1, seed=9, bucket_count=count)
                started = time.perf_counter()
                result = await pusher.push(target, table_to_json(table))
                samples.append((time.perf_counter() - started) * 1000)
                if result.status != 200:
                    raise RuntimeError(f"push refused: {result}")
        finally:
            await pusher.aclose()

    asyncio.run(pushes())


def bench_failover(lab: ClusterLab, failovers: int) -> None:
    print(
        f"\n== failover (heartbeat {lab.heartbeat_interval * 1000:.0f} ms, failover_after "
        f"{lab.settings.failover_after * 1000:.0f} ms, tick 20 ms) =="
    )
    detected, moved = [], []
    for round_index in range(failovers):
        victim = lab.nodes[2 - round_index % 3]
        others = [node.node_id for node in lab.nodes if node is not victim]
        failovers_before = sum(event.what == "failover" for event in lab.events())
        killed_at = time.monotonic()
        lab.kill(victim.agent)
        lab.kill(victim.server)
        gone = victim.node_id

        def failed_over(others: list[str] = others, gone: str = gone) -> bool:
            return lab.settled(others) and gone not in lab.table().nodes

        if not wait_until(failed_over, timeout=5, interval=0.002):
            print("  failover did not complete within 5 s")
            return
        moved.append((time.monotonic() - killed_at) * 1000)
        event = [event for event in lab.events() if event.what == "failover"][failovers_before]
        detected.append((event.at - killed_at) * 1000)
        lab.start_server(victim)
        lab.start_agent(victim)

        def rejoined(back: str = gone) -> bool:
            return back in lab.table().nodes

        if not wait_until(rejoined, timeout=15, interval=0.05):
            print("  the node did not rejoin within 15 s")
            return
        wait_until(lab.settled, timeout=10, interval=0.05)
    print(f"detection (kill -> failover decided)        {figures(detected)}")
    print(f"moved (kill -> both survivors hold the table) {figures(moved)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="samples per apply figure")
    parser.add_argument("--failovers", type=int, default=3, help="node kills to time")
    args = parser.parse_args()
    bench_build(max(3, args.rounds // 4))
    reason = why_not_runnable()
    if reason:
        print(f"\nskipping apply, push and failover figures: {reason}")
        return 0
    bench_apply(args.rounds)
    bench_push(args.rounds)
    with (
        tempfile.TemporaryDirectory(prefix="dnslb-bench-") as workdir,
        cluster_lab(Path(workdir), bucket_count=1024) as lab,
    ):
        bench_failover(lab, args.failovers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
