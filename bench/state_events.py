"""The state database's event log at its row limit: what an insert and a prune cost.

Fills a database with ``--rows`` events (default 1,000,000: the default limit), then measures,
with the default pruning (every 1,000 inserts or a minute of event time, 10,000 rows at most):

- inserts one at a time in autocommit (as events outside a tick are written), and in batches of
  100 in one transaction (as a tick writes them), at the limit, so that every 1,000th insert
  deletes 1,000 rows: mean and worst microseconds per insert (the worst is a pruning insert);
- one prune of a database 10,000 rows over its limit (the most a prune deletes) and one with
  nothing to delete;
- one prune by age, 10,000 rows past ``events_max_age``.

Then the servers table with ``--servers`` terminated servers (100,000) beside 10,000 live ones:
reading every server (start-up, a takeover), one prune of old servers (``PRUNE_CHUNK`` of them,
their cost kept), one with nothing to do, and the read again once all are pruned.

    .venv/bin/python bench/state_events.py            # about a minute
    .venv/bin/python bench/state_events.py --rows 200000

Nothing here asserts a time: it prints figures. The database is in a temporary directory.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from dnslb.model import Event, ServerState
from evaluation.percentile import percentile
from manager.state import PRUNE_CHUNK, ServerRecord, StateStore

T0 = 1_700_000_000.0


def event(number: int, at: float) -> Event:
    return Event(
        time=at,
        kind="state",
        reason=f"active -> draining: scale in: utilization 0.12 < th_low 0.3 ({number})",
        pool="www",
        server=f"www-{number % 64:08x}",
    )


def fill(path: Path, rows: int, at: float) -> None:
    """``rows`` events straight into the table (fast: no pruning, one transaction)."""
    StateStore(path).close()
    with sqlite3.connect(path) as db:
        db.executemany(
            "INSERT INTO events (time, pool, server, kind, reason) VALUES (?, ?, ?, ?, ?)",
            (
                (e.time, e.pool, e.server, e.kind, e.reason)
                for e in (event(n, at + n * 1e-3) for n in range(rows))
            ),
        )


def inserts(store: StateStore, count: int, batch: int, start: float) -> list[float]:
    """Microseconds per insert (each insert alone, or ``batch`` per transaction)."""
    costs = []
    number = 0
    while number < count:
        began = time.perf_counter()
        with store.batch() if batch > 1 else _nothing():
            for _ in range(batch):
                store.add_event(event(number, start + number * 1e-3))
                number += 1
        costs.append((time.perf_counter() - began) * 1e6 / batch)
    return costs


class _nothing:  # noqa: N801 - a context manager that does nothing
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def servers(path: Path, terminated: int, live: int = 10_000) -> None:
    """The servers table's part: see the module docstring."""
    store = StateStore(path)
    with store.batch():
        for number in range(terminated + live):
            gone = number < terminated
            at = T0 + number
            store.save_server(
                ServerRecord(
                    id=f"www-{number:08x}",
                    pool=f"p{number % 100}",
                    address=f"10.{number >> 16 & 255}.{number >> 8 & 255}.{number & 255}",
                    origin="ec2",
                    state=ServerState.TERMINATED if gone else ServerState.ACTIVE,
                    state_reason="scale in" if gone else "reporting",
                    state_since=at,
                    created_at=at - 3600,
                    terminated_at=at if gone else None,
                    provider_ref=f"i-{number:017x}",
                    data={"served": number},
                )
            )
    now = T0 + terminated + live + 1e6
    costs = store.pool_costs(now)

    def timed(label: str, work: Callable[[], object]) -> object:
        began = time.perf_counter()
        result = work()
        print(f"  {label}: {(time.perf_counter() - began) * 1e3:.1f} ms")
        return result

    print(f"servers table, {terminated:,} terminated and {live:,} live:")
    timed("every server read (start-up, takeover)", store.load_servers)
    timed(f"a prune of {PRUNE_CHUNK:,} old servers", lambda: store.prune_servers(now))
    while store.prune_servers(now):
        pass
    timed("a prune with nothing to do", lambda: store.prune_servers(now))
    timed("every server read, the old ones pruned", store.load_servers)
    kept = store.pool_costs(now)
    drift = max(abs(kept[pool] - costs[pool]) / costs[pool] for pool in costs)
    print(f"  pools' costs after: the same within {drift:.1e} (relative)")
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="events at the limit")
    parser.add_argument("--inserts", type=int, default=20_000, help="inserts measured")
    parser.add_argument(
        "--servers", type=int, default=100_000, help="terminated servers in the servers part"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temp:
        path = Path(temp) / "state.db"
        began = time.perf_counter()
        fill(path, args.rows, T0)
        print(f"filled {args.rows:,} events in {time.perf_counter() - began:.1f} s")
        runs = (
            ("no pruning", {"events_max_rows": 10**12, "prune_interval": 1e18}, 1),
            ("pruning, one per commit", {"events_max_rows": args.rows}, 1),
            ("no pruning", {"events_max_rows": 10**12, "prune_interval": 1e18}, 100),
            ("pruning, 100 per commit", {"events_max_rows": args.rows}, 100),
        )
        start = T0 + args.rows * 1e-3
        print("inserts at the limit (microseconds per insert):")
        for label, settings, batch in runs:
            store = StateStore(path, **settings)
            costs = sorted(inserts(store, args.inserts, batch, start))
            start += args.inserts * 1e-3
            print(
                f"  {label:<24} batch {batch:>3}: mean {statistics.fmean(costs):6.1f}, "
                f"p99 {percentile(costs, 0.99):7.1f}, worst {costs[-1]:8.1f}; "
                f"rows after: {store.count_events():,}"
            )
            store.close()

        counter = StateStore(path, events_max_rows=10**12)
        rows = counter.count_events()
        counter.close()
        store = StateStore(path, events_max_rows=rows - PRUNE_CHUNK)  # PRUNE_CHUNK rows over
        for label in ("a full prune by count", "a prune with nothing to do"):
            began = time.perf_counter()
            deleted = store.prune_events()
            elapsed = (time.perf_counter() - began) * 1e3
            print(f"{label}: {deleted:,} rows in {elapsed:.1f} ms")
        store.close()

        oldest = sqlite3.connect(path).execute("SELECT MIN(time) FROM events").fetchone()[0]
        store = StateStore(path, events_max_age=3600)
        began = time.perf_counter()
        deleted = store.prune_events(oldest + 3600 + 2 * PRUNE_CHUNK * 1e-3)
        elapsed = (time.perf_counter() - began) * 1e3
        print(f"a full prune by age: {deleted:,} rows in {elapsed:.1f} ms")
        store.close()
        size = sum(p.stat().st_size for p in Path(temp).iterdir()) / 2**20
        print(f"database with its WAL: {size:.0f} MiB")
        servers(Path(temp) / "servers.db", args.servers)


if __name__ == "__main__":
    main()
