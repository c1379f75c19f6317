"""How a dnslb process logs: one line a record on its standard error, named after the program.

Every entry point calls :func:`configure` once, before it does anything worth logging. A line
reads ``dnslb PROGRAM[PID]: LEVEL message`` (the manager's: ``TIME dnslb manager: LEVEL message``,
as it has always been). The prefix matters beyond looks: PowerDNS copies its pipe coprocesses'
standard error into its own log, where ``dnslb pipe-backend[PID]:`` tells them apart, and
operators grep for these prefixes.
"""

from __future__ import annotations

import logging
import os
import sys

QUIET = ("httpx", "httpcore")
"""Libraries that log every request at INFO (an agent reports every second, the docker provider
polls a booting container twice a second): only their warnings are let through."""


def configure(
    program: str,
    level: int | str = logging.INFO,
    *,
    pid: bool = True,
    timestamps: bool = False,
) -> None:
    """Send this process's log records at ``level`` and above to standard error, one line each,
    prefixed ``dnslb PROGRAM[PID]:`` (without ``[PID]`` when ``pid`` is false; with the time
    first when ``timestamps``). ``level`` is a number or a name (``"info"``, ``"DEBUG"``).

    Like :func:`logging.basicConfig`, it does nothing to a root logger that has handlers
    already (a test's log capture stays in place).
    """
    name = f"dnslb {program}[{os.getpid()}]" if pid else f"dnslb {program}"
    time = "%(asctime)s " if timestamps else ""
    logging.basicConfig(
        stream=sys.stderr,
        level=level.upper() if isinstance(level, str) else level,
        format=f"{time}{name}: %(levelname)s %(message)s",
    )
    for library in QUIET:
        logging.getLogger(library).setLevel(logging.WARNING)
