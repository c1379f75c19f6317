"""The lab end to end (the CI smoke test): the whole lab up, a small headless locust run through
its DNS, a report with plausible figures and non-empty plots, and the lab down with no process
left; the ``dnslb lab`` command stopped by Ctrl-C; a port in use refused with a clear error."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from daemons.process import free_port
from dnslb.errors import ConfigError
from dnslb.model import ServerState
from lab.history import EVENTS_FILE, read_events
from lab.loadtest.run import LoadTest, run_loadtest
from lab.loadtest.shape import StepLoad
from lab.report import load_run, write_report
from lab.runner import Lab
from lab.settings import LabSettings, default_scaling, with_policy

pytestmark = pytest.mark.integration


def processes_naming(directory: Path) -> list[str]:
    """Every live process whose command line mentions ``directory`` (read from /proc here, not
    with the lab's own helper, so that a bug there cannot hide a leftover)."""
    needle = str(directory).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if needle in command and state != "Z":
            text = command.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry.name}: {text}")
    return found


def lab_settings(workdir: Path, network: str) -> LabSettings:
    settings = LabSettings(
        workdir=workdir,
        dns_port=free_port(),
        api_port=free_port(),
        http_port=free_port(),
        origin_port=free_port(),
        network=network,
        # the caching resolvers on a network of this test's own (127.0.6 -> 127.0.106)
        resolver_network=f"127.0.{100 + int(network.rsplit('.', 1)[1])}",
        boot_delay=1.0,
        scaling=dataclasses.replace(
            default_scaling(), max_servers=2, window=5.0, boot_time=1.0, scale_in_window=20.0
        ),
    )
    return with_policy(settings, ttl_max=20, ttl_min=2)


def test_lab_loadtest_report_and_nothing_left(tmp_path: Path) -> None:
    started = time.monotonic()
    settings = lab_settings(tmp_path / "lab", "127.0.6")
    lines: list[str] = []
    lab = Lab(settings, say=lines.append)
    try:
        lab.start()
        assert lab.serving(), lines
        test = LoadTest(
            dns_server=f"127.0.0.1:{settings.dns_port}",
            lb_name=settings.dns_name,
            http_port=settings.http_port,
            objects=settings.objects.count,
            load=StepLoad(start=5, step=10, every=10, count=2, hold=5),
            out=tmp_path / "loadtest",
            think_time=0.5,
            seed=3,
            progress=0,
        )
        out = run_loadtest(test, quiet=True)
    finally:
        lab.stop()
    assert processes_naming(settings.workdir) == []
    # The manager's events and servers, kept through its API while it ran: the report reads them
    # after the lab has stopped (and never opens the state database).
    kept = read_events(settings.workdir / EVENTS_FILE)
    assert [event.id for event in kept] == sorted({event.id for event in kept})
    became_active = [e for e in kept if e.to_state is ServerState.ACTIVE]
    assert became_active and all(e.from_state is not None for e in became_active)
    run = load_run(settings.workdir, out)
    assert any(state == "active" for span in run.servers for _, state in span.states)
    assert all(span.address.startswith("127.0.6.") for span in run.servers)
    result = write_report(run, tmp_path / "report", name="smoke")
    print(f"smoke: {result}; {time.monotonic() - started:.0f} s")

    assert result.requests > 50
    assert result.cost > 0
    assert result.mean_response > 0
    assert result.requests_per_cost == pytest.approx(result.requests / result.cost)
    shares = result.under_3 + result.from_3_to_9 + result.from_9_to_60
    assert shares == pytest.approx(1.0, abs=1e-9)
    assert result.dns_queries > 0
    assert settings.policy.ttl_min <= result.mean_ttl <= settings.policy.ttl_max
    assert result.peak_servers >= 1 and result.peak_users == 25
    for name in ("report.html", "summary.csv", "timeseries.csv", "result.json"):
        assert (tmp_path / "report" / name).stat().st_size > 0
    for plot in ("utilization.png", "pool.png", "ttl.png", "response.png"):
        data = (tmp_path / "report" / plot).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000, plot
    page = (tmp_path / "report" / "report.html").read_text()
    assert "utilization.png" in page and f"{result.requests}" in page
    # State changes in the window are shown with their states and reasons (the first server
    # may have become active before the load test started: then there is none to show).
    changes = [e for e in kept if e.kind == "state" and run.start <= e.time <= run.end]
    for change in changes:
        assert f"{change.from_state} -&gt; {change.to_state}: " in page


def test_the_lab_command_serves_the_api_and_stops_everything_on_ctrl_c(tmp_path: Path) -> None:
    settings = lab_settings(tmp_path / "lab", "127.0.7")
    command = [
        sys.executable,
        "-m",
        "cli",
        "lab",
        "--workdir",
        str(settings.workdir),
        "--dns-port",
        str(settings.dns_port),
        "--api-port",
        str(settings.api_port),
        "--http-port",
        str(settings.http_port),
        "--origin-port",
        str(settings.origin_port),
        "--network",
        settings.network,
        "--boot-delay",
        "1",
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    output = []
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        for line in process.stdout:
            output.append(line)
            if "Ctrl-C stops everything" in line or time.monotonic() > deadline:
                break
        text = "".join(output)
        assert "Ctrl-C stops everything" in text, text
        assert f"127.0.0.1:{settings.dns_port}" in text
        assert str(settings.workdir) in text
        assert processes_naming(settings.workdir), "the lab runs nothing?"
        check_api(settings, text)
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, rest
    assert "stopped: no process of the lab is left" in rest
    assert processes_naming(settings.workdir) == []

    # Run again: --keep-state goes on with the same state database, a plain run starts clean.
    first_events = event_count(settings.workdir)
    first_kept = [event.id for event in read_events(settings.workdir / EVENTS_FILE)]
    assert first_kept and len(first_kept) <= first_events  # all, but what stopping it logged
    once = [*command, "--once"]
    kept = subprocess.run(
        [*once, "--keep-state"], check=False, capture_output=True, text=True, timeout=90
    )
    assert kept.returncode == 0, kept.stdout + kept.stderr
    kept_events = event_count(settings.workdir)
    assert kept_events > first_events
    ids = [event.id for event in read_events(settings.workdir / EVENTS_FILE)]
    assert ids[: len(first_kept)] == first_kept and ids == sorted(set(ids))  # goes on, each once
    assert len(ids) > len(first_kept)
    clean = subprocess.run(once, check=False, capture_output=True, text=True, timeout=90)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert event_count(settings.workdir) < kept_events
    assert processes_naming(settings.workdir) == []


def event_count(workdir: Path) -> int:
    with contextlib.closing(sqlite3.connect(workdir / "state.db")) as db:
        return int(db.execute("SELECT COUNT(*) FROM events").fetchone()[0])


def check_api(settings: LabSettings, printed: str) -> None:
    """The dashboard, API and metrics answer with the token the lab printed, not without."""
    token_file = settings.workdir / "api.token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    token = token_file.read_text().strip()
    assert token in printed
    base = f"http://127.0.0.1:{settings.api_port}"
    for path in ("/v1/status", "/metrics", "/dashboard/"):
        assert f"{base}{path}" in printed, path
    with httpx.Client(base_url=base, timeout=10) as client:
        assert client.get("/v1/status").status_code == 401
        headers = {"Authorization": f"Bearer {token}"}
        assert client.get("/v1/status", headers=headers).status_code == 200
        metrics = client.get("/metrics", headers=headers)
        assert metrics.status_code == 200 and "dnslb" in metrics.text
        assert client.get("/dashboard/").status_code == 200


def test_a_port_in_use_is_refused_with_the_option_to_change(tmp_path: Path) -> None:
    settings = lab_settings(tmp_path / "lab", "127.0.8")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", settings.dns_port))
        lab = Lab(settings, say=lambda text: None)
        with pytest.raises(ConfigError) as caught:
            lab.start()
    assert caught.value.problems == [
        f"--dns-port {settings.dns_port}: 127.0.0.1:{settings.dns_port} is in use (udp); "
        "choose another port with --dns-port"
    ]
    assert processes_naming(settings.workdir) == []
    # The same through the command: one clear line, status 1, nothing started.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", settings.api_port))
        busy.listen()
        finished = subprocess.run(
            [
                sys.executable,
                "-m",
                "cli",
                "lab",
                "--once",
                "--workdir",
                str(settings.workdir),
                "--dns-port",
                str(settings.dns_port),
                "--api-port",
                str(settings.api_port),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert finished.returncode == 1
    assert f"--api-port {settings.api_port}: 127.0.0.1:{settings.api_port} is in use" in (
        finished.stdout + finished.stderr
    )
