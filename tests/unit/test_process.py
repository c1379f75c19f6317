"""Starting a program and waiting until it is ready (:func:`daemons.process.spawn`), free ports."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from daemons.process import (
    free_port,
    http_answers,
    live_group_members,
    port_free,
    spawn,
    stop_group,
)
from dnslb.errors import ProcessError


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_spawn_returns_once_the_program_is_ready(tmp_path: Path) -> None:
    flag = tmp_path / "ready"
    process = spawn(
        python(f"import pathlib, time; pathlib.Path({str(flag)!r}).touch(); time.sleep(60)"),
        name="sleeper",
        ready=lambda _: flag.exists(),
        log=tmp_path / "sleeper.log",
    )
    try:
        assert process.poll() is None and live_group_members(process.pid) == [process.pid]
    finally:
        stop_group(process)
    assert live_group_members(process.pid) == []


def test_a_program_that_exits_first_is_reported_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "quitter.log"
    log.write_text("an earlier run\n")
    with pytest.raises(ProcessError, match=r"^quitter exited with status 3:\n") as caught:
        spawn(
            python("import sys; print('port 53 is in use', file=sys.stderr); sys.exit(3)"),
            name="quitter",
            ready=lambda _: False,
            log=log,
        )
    assert str(caught.value).endswith("an earlier run\nport 53 is in use")


def test_a_program_never_ready_is_stopped_with_everything_it_started(tmp_path: Path) -> None:
    # The leader starts a child in its group, as pdns starts its coprocesses.
    child = (
        "import subprocess, sys, time;"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        "print('started', flush=True); time.sleep(60)"
    )
    leaders: list[int] = []

    def never(process: subprocess.Popen[bytes]) -> bool:
        leaders.append(process.pid)
        return False

    with pytest.raises(ProcessError, match=r"^slow did not answer within 0\.5 s:\n") as caught:
        spawn(python(child), name="slow", ready=never, log=tmp_path / "slow.log", timeout=0.5)
    assert live_group_members(leaders[0]) == []
    assert "started" in str(caught.value)


def test_without_a_log_the_error_says_so(tmp_path: Path) -> None:
    with pytest.raises(ProcessError, match="exited with status 1:\n\\(no log\\)"):
        spawn(python("raise SystemExit(1)"), name="mute", ready=lambda _: False)


def test_a_missing_program_raises_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        spawn([str(tmp_path / "nothing")], name="nothing", ready=lambda _: True)


def test_a_free_port_is_free_for_both_kinds() -> None:
    port = free_port()
    assert port_free("127.0.0.1", port, "tcp") and port_free("127.0.0.1", port, "udp")


def test_free_port_never_gives_the_same_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Picks made in a row, before any is bound, may get the same port from the kernel: the
    second pick must not hand it out again (a lab once got one port for DNS and API)."""
    first = free_port()
    real_socket = socket.socket

    class SamePortFirst(real_socket):  # the kernel offers ``first`` again, then anything
        offered = False

        def getsockname(self) -> tuple[str, int]:
            if not SamePortFirst.offered:
                SamePortFirst.offered = True
                return ("127.0.0.1", first)
            return super().getsockname()  # type: ignore[no-any-return]

    monkeypatch.setattr(socket, "socket", SamePortFirst)
    assert free_port() != first
    assert SamePortFirst.offered


def test_http_answers_is_false_where_nothing_listens() -> None:
    assert not http_answers(f"http://127.0.0.1:{free_port()}/healthz", timeout=0.5)
