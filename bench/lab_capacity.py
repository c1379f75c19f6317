"""Calibration of the lab's cache servers: utilization and response time against offered load.

One cache server exactly as the lab runs it (nginx with the lab's capacity emulation, in front of
the lab's origin, warm cache) gets an open-loop Poisson load of requests for random objects at a
series of rates, as fractions of its capacity. Every 0.1 s its ``stub_status`` is read, as the
agent reads it. Printed per rate: requests started and finished a second, mean requests in
progress and the utilization it makes (``in_progress / max_concurrency``, what the agent
reports), the same from Little's law (requests finished a second x their mean response time /
max_concurrency: the two agree when the agent's samples see what the clients see), and
response times. Run: ``.venv/bin/python bench/lab_capacity.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from daemons.nginx import NginxServer, NginxSettings
from daemons.process import http_answers, spawn, stop_group
from evaluation.percentile import percentile
from lab.settings import LabSettings

ADDRESS = "127.0.9.1"


async def fetch(port: int, path: str, timeout: float) -> float | None:
    started = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(ADDRESS, port), timeout)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        await asyncio.wait_for(reader.read(-1), timeout)
        writer.close()
    except (OSError, TimeoutError):
        return None
    return time.perf_counter() - started


async def status(port: int) -> int:
    reader, writer = await asyncio.open_connection(ADDRESS, port)
    writer.write(b"GET /nginx_status HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n")
    body = await reader.read(-1)
    writer.close()
    line = next(x for x in body.decode().splitlines() if x.startswith("Reading")).split()
    return max(0, int(line[1]) + int(line[3]) - 1)


async def one_rate(settings: LabSettings, rate: float, seconds: float) -> dict[str, float]:
    rng = random.Random(int(rate * 1000))
    tasks: list[asyncio.Task[float | None]] = []
    samples: list[int] = []
    stop = asyncio.Event()

    async def sampler() -> None:
        while not stop.is_set():
            samples.append(await status(settings.http_port))
            await asyncio.sleep(0.1)

    watcher = asyncio.create_task(sampler())
    started = time.perf_counter()
    next_at = started
    while next_at - started < seconds:
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        path = settings.objects.path(rng.randrange(settings.objects.count))
        tasks.append(asyncio.create_task(fetch(settings.http_port, path, 120.0)))
        next_at += rng.expovariate(rate)
    stop.set()
    await watcher
    finished = [t for t in await asyncio.gather(*tasks) if t is not None]
    in_progress = statistics.fmean(samples[len(samples) // 5 :])  # past the first fifth
    return {
        "rate": rate,
        "started": len(tasks) / seconds,
        "failed": len(tasks) - len(finished),
        "in_progress": in_progress,
        "utilization": in_progress / settings.max_concurrency,
        # Little's law: requests in the server = arrival rate x time each spends there.
        "little": (len(finished) / seconds)
        * (statistics.fmean(finished) if finished else 0.0)
        / settings.max_concurrency,
        "mean": statistics.fmean(finished) if finished else 0.0,
        "p95": percentile(finished, 0.95) if finished else 0.0,
    }


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM too runs the finally below: nothing is left running


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupted)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="seconds per rate")
    parser.add_argument(
        "--fractions",
        default="0.25,0.5,0.75,0.9,1.0,1.1,1.25",
        help="offered load as fractions of capacity_rps",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dnslb-capacity-") as work:
        settings = LabSettings(workdir=Path(work), origin_port=18123, http_port=18124)
        objects = settings.objects
        origin = spawn(
            [
                sys.executable,
                "-m",
                "cli",
                "origin",
                "--pid-file",
                f"{work}/origin.pid",
                "--port",
                str(settings.origin_port),
                "--objects",
                str(objects.count),
                "--mean-size",
                str(objects.mean_size),
                "--min-size",
                str(objects.min_size),
            ],
            name="origin",
            ready=lambda _: http_answers(f"{settings.origin_url}/healthz"),
            log=Path(work) / "origin.log",
        )
        nginx = NginxServer(
            NginxSettings(
                address=ADDRESS,
                port=settings.http_port,
                origin=settings.origin_url,
                capacity_rps=settings.capacity_rps,
                send_rate=settings.send_rate,
                send_chunk=settings.send_chunk,
            ),
            Path(work) / "nginx",
        )
        try:
            nginx.start()
            for index in range(objects.count):  # warm the cache, as a running lab's is
                urllib.request.urlopen(
                    f"http://{ADDRESS}:{settings.http_port}{objects.path(index)}"
                ).read()
            print(
                f"cache server: capacity_rps {settings.capacity_rps:g}, max_concurrency "
                f"{settings.max_concurrency}, send_rate {settings.send_rate} B/s in "
                f"{settings.send_chunk} B writes; objects: {objects.count}, mean "
                f"{objects.mean_size} B, min {objects.min_size} B -> mean service "
                f"{settings.mean_service_time:.3f} s; {args.seconds:g} s per rate"
            )
            print(
                "offered/s  started/s  failed  in progress  utilization  Little's law  "
                "mean resp s  p95 s"
            )
            for fraction in (float(x) for x in args.fractions.split(",")):
                rate = fraction * settings.capacity_rps
                row = asyncio.run(one_rate(settings, rate, args.seconds))
                print(
                    f"{rate:9.1f}  {row['started']:9.1f}  {row['failed']:6.0f}  "
                    f"{row['in_progress']:11.2f}  {row['utilization']:11.2f}  "
                    f"{row['little']:12.2f}  {row['mean']:11.3f}  {row['p95']:5.2f}",
                    flush=True,
                )
                time.sleep(3)  # let the queue empty
        finally:
            nginx.stop()
            stop_group(origin)


if __name__ == "__main__":
    main()
