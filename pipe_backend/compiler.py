"""The pipe backend's compiler process: pools' answer cycles computed beside the coprocess.

Computing a pool's answer cycles (:func:`~pipe_backend.answers.cycle_parts`) is the costly part
of loading a plan: milliseconds of Python per pool of a hundred members, and at fleet scale
every pool changes with every plan (the manager's weights follow each report). Done on the
coprocess's loader thread, that work shares the interpreter lock and the CPUs with the query
loop: on a 2-CPU host, queries waited for it (``bench/fleet_plan.py``). Here it runs in a child
process of each coprocess, at the idle scheduling class (``SCHED_IDLE``; ``nice 19`` where that
is refused): it runs only on CPU time nothing else wants, and the query loop never waits for it,
since nothing but the loader thread talks to it.

:class:`PartsCompiler` is the coprocess's side: one job at a time (a pickled
:class:`~pipe_backend.answers.PartsJob`, length-prefixed), its answer read back with a deadline.
A compiler that fails, answers garbage, exits or misses the deadline is killed; the pools it did
not answer are compiled on the loader thread as before, and a new compiler is started for the
next plan, at most once every ``RESTART_AFTER`` seconds. Both sides are this package's code run
by the same user: the pickles cross a pipe between a parent and its own child, never anything
another party can write to. The child exits when its input ends (the coprocess is gone).

    python -P -m pipe_backend.compiler      (started by the coprocess, never by hand)
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

from pipe_backend.answers import CycleParts, PartsJob, cycle_parts

log = logging.getLogger("dnslb.pipe_backend")

_LENGTH = struct.Struct("!I")
MAX_FRAME = 64 * 1024 * 1024
"""Largest message either side accepts (a pool's parts are tens of kilobytes)."""
JOB_DEADLINE = 10.0
"""Seconds a job may take before the compiler is given up (it runs only on idle CPU)."""
RESTART_AFTER = 30.0
"""Seconds after a compiler was given up before another is started."""


class PartsCompiler:
    """The coprocess's compiler process (started on first use)."""

    def __init__(self, *, deadline: float = JOB_DEADLINE, restart_after: float = RESTART_AFTER):
        self.deadline = deadline
        self.restart_after = restart_after
        self._process: subprocess.Popen[bytes] | None = None
        self._failed_at = -float("inf")
        self.jobs = 0  # pools computed by the compiler process (status, tests)
        self.failures = 0  # times it was given up
        self.closed = False

    def parts(self, jobs: list[PartsJob]) -> Iterator[CycleParts | None]:
        """Each job's parts in order; None for those it could not do (after it failed)."""
        for job in jobs:
            yield self._one(job)

    def _one(self, job: PartsJob) -> CycleParts | None:
        process = self._started()
        if process is None:
            return None
        try:
            assert process.stdin is not None
            assert process.stdout is not None
            data = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
            _write_frame(process.stdin.fileno(), data)
            reply = _read_frame(process.stdout.fileno(), time.monotonic() + self.deadline)
            parts = pickle.loads(reply)  # noqa: S301 - our own child's answer (module docstring)
            if parts is None:  # the pool made it fail: compiled here, which says why
                return None
            if not isinstance(parts, CycleParts):
                raise ValueError(f"the compiler answered {type(parts).__name__}")
        except (OSError, ValueError, EOFError, pickle.PickleError, TimeoutError) as exc:
            self._give_up(f"{type(exc).__name__}: {exc}"[:300])
            return None
        self.jobs += 1
        return parts

    def _started(self) -> subprocess.Popen[bytes] | None:
        if self.closed:
            return None
        if self._process is not None and self._process.poll() is None:
            return self._process
        if self._process is not None:
            self._give_up(f"it exited with status {self._process.returncode}")
        if time.monotonic() - self._failed_at < self.restart_after:
            return None
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-P", "-m", "pipe_backend.compiler"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                close_fds=True,
            )
        except OSError as exc:
            self._give_up(f"cannot start it: {exc}")
            return None
        return self._process

    def _give_up(self, why: str) -> None:
        if self.closed:  # closed under a job (the coprocess is stopping): nothing failed
            return
        self.failures += 1
        self._failed_at = time.monotonic()
        self._stop()
        log.error(
            "the pipe backend's compiler process failed (%s); compiling on the loader thread, "
            "another compiler in %.0f s",
            why,
            self.restart_after,
        )

    def close(self) -> None:
        """Stop the compiler process for good (it also stops by itself when this process
        ends); a job under way, on another thread, then comes back None."""
        self.closed = True
        self._stop()

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if process.poll() is None:
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)


def _write_frame(fd: int, data: bytes) -> None:
    if len(data) > MAX_FRAME:
        raise ValueError(f"a message of {len(data)} bytes")
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes:
    chunks = []
    while size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("no answer in time")
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the pipe")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int, deadline: float | None) -> bytes:
    (size,) = _LENGTH.unpack(_read_exactly(fd, _LENGTH.size, deadline))
    if size > MAX_FRAME:
        raise ValueError(f"a message of {size} bytes")
    return _read_exactly(fd, size, deadline)


def _idle() -> None:
    """Run only on CPU time nothing else wants."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(19)


def main() -> int:
    """Answer jobs on stdin with their parts on stdout until stdin ends."""
    _idle()
    fd_in, fd_out = sys.stdin.fileno(), sys.stdout.fileno()
    while True:
        try:
            job = pickle.loads(_read_frame(fd_in, None))  # noqa: S301 - from our parent
        except EOFError:
            return 0
        if not isinstance(job, PartsJob):
            return 2
        try:
            parts: CycleParts | None = cycle_parts(job)
        except Exception:  # the loader compiles this pool itself, and logs why it cannot
            parts = None
        _write_frame(fd_out, pickle.dumps(parts, protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    sys.exit(main())
