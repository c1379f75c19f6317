"""DNS latency while the plan store stops answering: p50/p99 at 2,000 QPS, Redis healthy against
Redis stopped (SIGSTOP: connections are still accepted by the kernel, nothing is ever answered),
in interleaved rounds on the same pdns + pipe backend, which reads its plan from Redis.

With ``--baseline REV`` a second pdns runs the pipe backend of another git revision (checked out
in a temporary worktree) beside this tree's, in the same rounds: before the plan was loaded off
the query path, every poll of a stopped Redis cost a query its whole client timeout.

    .venv/bin/python -m bench.redis_outage                      # about a minute
    .venv/bin/python -m bench.redis_outage --baseline cc8ffc1   # and the revision before

Needs pdns_server (pipe backend), redis-server and dnsperf. Every process it starts is stopped,
also on Ctrl-C; the worktree is removed.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.pipe_backend import (
    FIXED_QPS,
    ZONE,
    bench_plan,
    dnsperf,
    dnsperf_datafile,
    free_port,
    say,
)
from daemons.pdns import PdnsServer, PdnsSettings
from daemons.process import spawn
from dnslb.plan_store import RedisPlanStore
from dnslb.resp import RedisAddress, redis_answers
from evaluation.percentile import percentile


@dataclass(slots=True)
class Server:
    label: str
    server: PdnsServer
    latencies: dict[str, list[float]] = field(default_factory=dict)


@contextlib.contextmanager
def redis_server(workdir: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    command += ["--appendonly", "no", "--dir", str(workdir)]
    process = spawn(
        command,
        name="redis-server",
        ready=lambda _: redis_answers(RedisAddress(port=port)),
        timeout=10,
    )
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
            process.terminate()
        process.wait(10)


@contextlib.contextmanager
def worktree(revision: str) -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(prefix="dnslb-baseline-"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(where), revision],
        check=True,
        capture_output=True,
    )
    try:
        yield where
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(where)], check=False)
        shutil.rmtree(where, ignore_errors=True)


def python_for(tree: Path, workdir: Path) -> str:
    """An interpreter path that imports dnslb from ``tree`` (PYTHONPATH comes before the
    editable install's path). A tree from before ``python -m pipe_backend`` runs its pipe backend
    as ``python -m dnslb pipe-backend``, without the options it does not know (``--state-dir``)."""
    old = not (tree / "pipe_backend" / "__main__.py").exists()
    wrapper = workdir / f"python-{tree.name}"
    wrapper.write_text(
        f"""#!{sys.executable}
import os, sys
argv = sys.argv[1:]
if {old!r} and argv[:3] == ["-P", "-m", "pipe_backend"]:
    rest = argv[3:]
    if "--state-dir" in rest:
        at = rest.index("--state-dir")
        del rest[at : at + 2]
    argv = ["-P", "-m", "dnslb", "pipe-backend", *rest]
os.environ["PYTHONPATH"] = {str(tree)!r}
os.execv(sys.executable, [sys.executable, *argv])
"""
    )
    wrapper.chmod(0o755)
    return str(wrapper)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per condition (3)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per round (5)")
    parser.add_argument("--baseline", help="git revision whose pipe backend runs beside")
    parser.add_argument("--port", type=int, default=5460, help="first DNS port to try")
    opts = parser.parse_args(argv)
    for program in ("pdns_server", "redis-server", "dnsperf"):
        if shutil.which(program) is None:
            print(f"{program} is not installed", file=sys.stderr)
            return 2
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as temp:
        workdir = Path(temp)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        taken: set[int] = set()
        redis_port = free_port("127.0.0.1", opts.port + 30, taken)
        redis = stack.enter_context(redis_server(workdir, redis_port))
        url = f"redis://127.0.0.1:{redis_port}/0?key=bench:plan"
        store = RedisPlanStore(RedisAddress.parse(url))
        store.publish(bench_plan())
        trees = [("this tree", Path.cwd())]
        if opts.baseline:
            trees.append((opts.baseline, stack.enter_context(worktree(opts.baseline))))
        servers = []
        for label, tree in trees:
            settings = PdnsSettings(
                plan=url,
                port=free_port("127.0.0.1", opts.port, taken),
                python=python_for(tree, workdir),
            )
            server = PdnsServer(settings, workdir / f"pdns-{len(servers)}")
            stack.callback(server.stop)
            server.start(probe_name=ZONE)
            servers.append(Server(label, server))
        datafile = workdir / "queries.txt"
        dnsperf_datafile(datafile)
        say(
            f"p50/p99 at {FIXED_QPS} QPS, {opts.rounds} interleaved rounds of {opts.seconds:g} s "
            "per condition; pdns with its caches as deployed (only the pool's ANY reaches the "
            "pipe), the plan in Redis"
        )
        for round_index in range(opts.rounds):
            for condition in ("redis healthy", "redis stopped"):
                stopped = condition == "redis stopped"
                os.kill(redis.pid, signal.SIGSTOP if stopped else signal.SIGCONT)
                for server in servers:
                    result = dnsperf(
                        server.server.settings.port,
                        datafile,
                        opts.seconds,
                        4,
                        rate=FIXED_QPS,
                        verbose=True,
                    )
                    server.latencies.setdefault(condition, []).extend(result.latencies)
                    lost = result.sent - result.completed
                    say(
                        f"  round {round_index + 1}: {server.label:<12} {condition:<14} "
                        f"{result.qps:>6,.0f} QPS, p99 "
                        f"{percentile(result.latencies, 0.99) * 1e3:8.3f} ms, {lost} lost"
                    )
        os.kill(redis.pid, signal.SIGCONT)
        say("\nsummary (every response of every round; a lost query counts as slower than any):")
        say(f"  {'pipe backend':<12} {'condition':<14} {'p50 ms':>8} {'p99 ms':>9} {'lost':>6}")
        for server in servers:
            p99s = {}
            for condition, values in server.latencies.items():
                lost = sum(1 for value in values if math.isinf(value))
                p99s[condition] = percentile(values, 0.99)
                say(
                    f"  {server.label:<12} {condition:<14} {percentile(values, 0.50) * 1e3:8.3f} "
                    f"{p99s[condition] * 1e3:9.3f} {lost:>6}"
                )
            ratio = p99s["redis stopped"] / p99s["redis healthy"]
            say(f"  {server.label}: p99 stopped / healthy = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
