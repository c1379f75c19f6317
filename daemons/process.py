"""Child processes in a process group of their own: starting one and waiting until it is ready,
stopping the whole group, reading its log, finding free ports.

The programs dnslb runs (pdns_server with its coprocesses, nginx with its workers, agents in the
lab) each start in a new session (:func:`spawn`), so that one signal reaches everything they
started and a stop leaves nothing behind. "Gone" means no *live* process is left in the group:
an orphan that has exited but that no one reaps (PID 1 in some containers never does) stays a
zombie, holding no memory, socket or file, and would otherwise make a clean stop look like a
hang.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from dnslb.errors import ProcessError

_PROC = Path("/proc")


def spawn(
    command: Sequence[str],
    *,
    name: str,
    ready: Callable[[subprocess.Popen[bytes]], bool],
    log: str | os.PathLike[str] | None = None,
    timeout: float = 15.0,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    describe_log: Callable[[], str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``command`` as the leader of a process group of its own and wait until it is ready.

    Its standard output and error are appended to ``log`` (discarded without one); its standard
    input is closed. ``ready(process)`` is polled every 50 ms: it should be cheap, must not raise,
    and is true once the program serves (answers on its port, say). When the process exits
    first, or is not ready within ``timeout`` seconds, its whole group is stopped and
    :class:`ProcessError` says so with the end of its log (``describe_log()`` when given, else
    the tail of ``log``), naming it ``name``. Whatever else interrupts the wait (Ctrl-C) stops
    the group too. An ``OSError`` from starting it (no such program) is raised as it is.
    """
    if log is None:
        process = _popen(command, subprocess.DEVNULL, cwd, env)
    else:
        with open(log, "ab") as output:
            process = _popen(command, output, cwd, env)

    def tail() -> str:
        if describe_log is not None:
            return describe_log()
        return (log_tail(log, 30) if log is not None else "") or "(no log)"

    deadline = time.monotonic() + timeout
    try:
        while True:
            status = process.poll()
            if status is not None:
                raise ProcessError(f"{name} exited with status {status}:\n{tail()}")
            if ready(process):
                return process
            if time.monotonic() >= deadline:
                raise ProcessError(f"{name} did not answer within {timeout:g} s:\n{tail()}")
            time.sleep(0.05)
    except BaseException:
        stop_group(process)  # what it started may still run, even when it has exited
        raise


def _popen(
    command: Sequence[str],
    output: int | IO[bytes],
    cwd: str | os.PathLike[str] | None,
    env: Mapping[str, str] | None,
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        list(command),
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=cwd,
        env=env,
    )


def http_answers(url: str, timeout: float = 1.0) -> bool:
    """True when ``url`` (plain http, ours) answers with a 2xx status: a readiness check."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):  # noqa: S310 (our own http URL)
            return True
    except (OSError, http.client.HTTPException):  # refused, reset, an error status, a bad reply
        return False


def live_group_members(pgid: int) -> list[int]:
    """The pids of the processes of group ``pgid`` that have not exited (zombies excluded).

    Reads ``/proc``; where there is none, falls back to asking the kernel whether the group
    can be signalled (which counts zombies too).
    """
    if not _PROC.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    members = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it exited while we looked
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so split
        # after the last ')'.
        fields = stat.rpartition(")")[2].split()
        if len(fields) >= 3 and fields[0] != "Z" and fields[2] == str(pgid):
            members.append(int(entry.name))
    return members


def wait_for_group_exit(pgid: int, timeout: float = 5.0) -> None:
    """Kill what is left of process group ``pgid`` and wait until no live process is in it.

    Raises :class:`ProcessError` if something survives SIGKILL for ``timeout`` seconds.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not live_group_members(pgid):
            return
        time.sleep(0.02)
    raise ProcessError(f"processes of group {pgid} still exist {timeout:.0f} s after SIGKILL")


def stop_group(
    process: subprocess.Popen[bytes], *, sig: int = signal.SIGTERM, timeout: float = 5.0
) -> None:
    """Stop ``process`` (the leader of its own group) and everything in its group.

    Sends ``sig`` to the group, gives the leader ``timeout`` seconds to exit, then SIGKILLs the
    group, reaps the leader and waits until no live process is left in the group.
    """
    if process.poll() is None:
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        except ProcessLookupError:
            process.wait()
    wait_for_group_exit(process.pid, timeout)


def log_tail(path: str | os.PathLike[str], lines: int = 20) -> str:
    """The last ``lines`` lines of a log file; empty when it is empty or cannot be read."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def stop_pgid(pgid: int, *, sig: int = signal.SIGTERM, timeout: float = 5.0) -> None:
    """Stop process group ``pgid`` when there is no ``Popen`` for it (started by an earlier
    manager): ``sig``, up to ``timeout`` seconds to go, then SIGKILL."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not live_group_members(pgid):
            return
        time.sleep(0.02)
    wait_for_group_exit(pgid, timeout)


def process_runs(pid: int, marker: str) -> bool:
    """True when ``pid`` is a live process whose command line holds ``marker`` (a path of ours):
    a recycled pid belongs to someone else."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
        command = (_PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    if stat.rpartition(")")[2].split()[0] == "Z":
        return False
    return marker.encode() in command


def processes_mentioning(marker: str, *, exclude: int | None = None) -> list[int]:
    """Live processes (zombies excluded) whose command line holds ``marker``, a path of ours.

    This process and its ancestors (the shell that started ``dnslb lab --workdir DIR``) are
    never listed, nor ``exclude``. A lab and its tests use this to find anything left of a run:
    every process a lab starts names the lab's directory.
    """
    skip = _ancestors()
    if exclude is not None:
        skip.add(exclude)
    needle = marker.encode()
    found = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if needle in command and stat.rpartition(")")[2].split()[0] != "Z":
            found.append(int(entry.name))
    return sorted(found)


def kill_processes_mentioning(marker: str, timeout: float = 5.0) -> list[int]:
    """Stop every process :func:`processes_mentioning` ``marker`` with its whole process group
    (nginx workers do not name their directory; their master does): SIGTERM, then SIGKILL after
    ``timeout`` seconds. Returns the pids found. Never signals this process's own group. Raises
    :class:`ProcessError` if anything survives SIGKILL."""
    found = processes_mentioning(marker)
    own = os.getpgrp()
    groups = set()
    for pid in found:
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            continue
        if group != own:
            groups.add(group)
        else:  # started in our own group: only the process itself
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(live_group_members(g) for g in groups):
        time.sleep(0.05)
    for group in groups:
        wait_for_group_exit(group, timeout)
    deadline = time.monotonic() + timeout
    while (left := processes_mentioning(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        raise ProcessError(f"processes {left} naming {marker} survive SIGKILL")
    return found


def _ancestors() -> set[int]:
    """This process and its parents, up to PID 1."""
    found = set()
    pid = os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            stat = (_PROC / str(pid) / "stat").read_text()
        except OSError:
            break
        pid = int(stat.rpartition(")")[2].split()[1])
    return found


def port_free(address: str, port: int, kind: str = "tcp") -> bool:
    """True when a program we start could bind ``address:port`` (``kind`` "tcp" or "udp").

    TCP is probed with ``SO_REUSEADDR``, as servers bind, so that connections of an earlier run
    still in TIME_WAIT do not count as the port being in use.
    """
    with socket.socket(
        socket.AF_INET, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM
    ) as probe:
        if kind == "tcp":
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


_HANDED_OUT: set[int] = set()  # ports free_port gave this process (at most 65,535)


def free_port(address: str = "127.0.0.1", kinds: Sequence[str] = ("tcp", "udp")) -> int:
    """A port the kernel picked as free on ``address``, and free there for every one of
    ``kinds`` ("tcp", "udp") right now (another program may take it before it is used); never
    one it gave this process before: picks made in a row, before any is bound, could otherwise
    be the same port (a lab's DNS and API ports were, once)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
            port = int(probe.getsockname()[1])
        if port not in _HANDED_OUT and all(port_free(address, port, kind) for kind in kinds):
            _HANDED_OUT.add(port)
            return port
    raise ProcessError(f"no port free for {'/'.join(kinds)} on {address} after 50 tries")
