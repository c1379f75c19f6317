"""What DNSSEC costs: QPS and p99 of pdns + pipe backend signing its answers live, against the
same pdns unsigned, in interleaved rounds of one run.

Two pdns_server, caches as ``daemons.pdns.render_config`` deploys them, one plan (zone
``bench.test``, pool ``www.bench.test``: 4 members, k = 2, so several answer sets rotate): one
``launch=pipe``, one ``launch=pipe,gsqlite3`` with the zone signed by
``daemons.dnssec.secure_zone`` (ECDSA P-256, narrow NSEC3). dnsperf sets the DO bit for both.
Two query mixes:

- ``pool``: the pool's A, the answer clients ask for. Its few sets are signed once each, then
  served from pdns's signature cache (the pipe's answers carry scope bits, so pdns's packet
  cache never holds them; the signature cache does not look at scope).
- ``nxdomain``: a fresh random name below the zone per query (a random-subdomain flood). Each
  NXDOMAIN needs a narrow NSEC3 record for a hash never seen before: one new signature a query.

For each mix and server: the QPS ceiling (dnsperf unthrottled) and p50/p99 at 2,000 QPS
(dnsperf -v, a lost query counted as slower than any); pdns's signatures made and backend
queries per DNS query.

    .venv/bin/python -m bench.dnssec            # about 80 seconds
    .venv/bin/python -m bench.dnssec --rounds 2 --seconds 2

Needs pdns_server with the pipe and gsqlite3 backends, pdnsutil, pdns_control and dnsperf
(apt-get install pdns-server pdns-backend-pipe pdns-backend-sqlite3 dnsperf). Listens on loopback
ports from 5480 up; every process it starts is stopped, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.pipe_backend import (
    FIXED_QPS,
    POOL,
    ZONE,
    bench_plan,
    dnsperf,
    free_port,
    say,
    versions,
)
from daemons.dnssec import secure_zone
from daemons.pdns import PdnsServer, PdnsSettings, render_config
from dnslb.plan import plan_to_json
from evaluation.percentile import percentile

MIXES = ("pool", "nxdomain")


@dataclass(slots=True)
class Server:
    label: str
    server: PdnsServer
    qps: dict[str, list[float]] = field(default_factory=dict)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    signatures: dict[str, int] = field(default_factory=dict)
    backend_queries: dict[str, int] = field(default_factory=dict)
    queries: dict[str, int] = field(default_factory=dict)
    response_size: dict[str, int] = field(default_factory=dict)

    def counters(self) -> tuple[int, int]:
        """pdns's ``signatures`` (RRSIGs computed; a signature-cache hit is not one) and
        ``backend-queries`` (questions to the pipe and, signed, to gsqlite3) counters."""
        values = []
        for name in ("signatures", "backend-queries"):
            output = subprocess.run(
                ["pdns_control", f"--config-dir={self.server.workdir}", "show", name],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout
            values.append(int(output.strip() or 0))
        return values[0], values[1]


def queries(path: Path, mix: str, rng: random.Random, count: int) -> None:
    """A dnsperf data file: the pool's A in the letter cases clients use, or fresh names."""
    if mix == "pool":
        names = [POOL, POOL.upper(), "Www.Bench.Test", "www.BENCH.test"]
        path.write_text("".join(f"{name} A\n" for name in names * 25))
    else:
        path.write_text("".join(f"n{rng.getrandbits(64):016x}.{ZONE} A\n" for _ in range(count)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per mix and server (3)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per dnsperf run (3)")
    parser.add_argument("--clients", type=int, default=4, help="dnsperf -c (4)")
    parser.add_argument("--port", type=int, default=5480, help="first loopback port to try")
    opts = parser.parse_args(argv)
    for program in ("pdns_server", "pdnsutil", "pdns_control", "dnsperf"):
        if shutil.which(program) is None:
            print(f"{program} is not installed", file=sys.stderr)
            return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as temp:
        workdir = Path(temp)
        plan = bench_plan()
        plan = dataclasses.replace(plan, pools=(dataclasses.replace(plan.pools[0], k=2),))
        plan_path = workdir / "plan.json"
        plan_path.write_text(plan_to_json(plan))
        taken: set[int] = set()
        servers = []
        for label in ("unsigned", "signed"):
            pdns_dir = workdir / label
            pdns_dir.mkdir()
            settings = PdnsSettings(
                plan=str(plan_path),
                port=free_port("127.0.0.1", opts.port, taken),
                state_dir=str(pdns_dir / "pipe-backend"),
                dnssec_database=str(pdns_dir / "keys.sqlite3") if label == "signed" else None,
            )
            config = render_config(settings, pdns_dir)
            (pdns_dir / "pdns.conf").write_text(config)
            if label == "signed":
                secure_zone(pdns_dir, ZONE)
            pdns = PdnsServer(settings, pdns_dir, config=config)
            stack.callback(pdns.stop)
            pdns.start(probe_name=ZONE)
            servers.append(Server(label, pdns))
        say(versions())
        say(
            f"{opts.rounds} interleaved rounds of {opts.seconds:g} s per mix and server: the QPS "
            f"ceiling ({opts.clients} dnsperf clients), then latency at {FIXED_QPS} QPS; DO set"
        )
        rng = random.Random(20_261_123)
        datafile = workdir / "queries.txt"
        fresh_names = int(opts.seconds * 60_000)  # more than a run sends: no name repeats
        for round_index in range(opts.rounds):
            for mix in MIXES:
                order = servers if round_index % 2 == 0 else servers[::-1]
                for server in order:
                    for rate in (None, FIXED_QPS):
                        queries(datafile, mix, rng, fresh_names)
                        before = server.counters()
                        result = dnsperf(
                            server.server.settings.port,
                            datafile,
                            opts.seconds,
                            opts.clients,
                            rate=rate,
                            verbose=rate is not None,
                            dnssec_ok=True,
                        )
                        after = server.counters()
                        expected = "NOERROR" if mix == "pool" else "NXDOMAIN"
                        if not result.rcodes.startswith(f"{expected} {result.completed} "):
                            raise RuntimeError(f"{server.label} {mix}: {result.rcodes}")
                        for total, at in ((server.signatures, 0), (server.backend_queries, 1)):
                            total[mix] = total.get(mix, 0) + after[at] - before[at]
                        server.queries[mix] = server.queries.get(mix, 0) + result.completed
                        server.response_size[mix] = result.response_size
                        if rate is None:
                            server.qps.setdefault(mix, []).append(result.qps)
                            figure = f"{result.qps:>8,.0f} QPS"
                        else:
                            server.latencies.setdefault(mix, []).extend(result.latencies)
                            p99 = percentile(result.latencies, 0.99) * 1e3
                            figure = f"p99 {p99:6.3f} ms at {result.qps:,.0f} QPS"
                        say(f"  round {round_index + 1}: {mix:<8} {server.label:<8} {figure}")
        say("\nsummary (median QPS of the rounds; p50/p99 over every response at 2,000 QPS):")
        say(
            f"  {'mix':<8} {'server':<8} {'QPS':>9} {'p50 ms':>7} {'p99 ms':>7} {'lost':>5} "
            f"{'bytes':>5} {'sigs/query':>10} {'backend/query':>13}"
        )
        for mix in MIXES:
            for server in servers:
                latencies = server.latencies[mix]
                lost = sum(1 for value in latencies if math.isinf(value))
                say(
                    f"  {mix:<8} {server.label:<8} {statistics.median(server.qps[mix]):>9,.0f} "
                    f"{percentile(latencies, 0.50) * 1e3:7.3f} "
                    f"{percentile(latencies, 0.99) * 1e3:7.3f} {lost:>5} "
                    f"{server.response_size[mix]:>5} "
                    f"{server.signatures[mix] / max(server.queries[mix], 1):10.3f} "
                    f"{server.backend_queries[mix] / max(server.queries[mix], 1):13.2f}"
                )
            unsigned, signed = servers
            qps_ratio = statistics.median(signed.qps[mix]) / statistics.median(unsigned.qps[mix])
            p99_ratio = percentile(signed.latencies[mix], 0.99) / percentile(
                unsigned.latencies[mix], 0.99
            )
            say(f"  {mix}: signed/unsigned QPS {qps_ratio:.2f}, p99 {p99_ratio:.2f}")
        load = Path("/proc/loadavg").read_text().split()[:3]
        say(f"load average at the end: {' '.join(load)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
