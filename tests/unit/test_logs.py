"""Every process's log lines: ``dnslb PROGRAM[PID]: LEVEL message`` on standard error."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

SCRIPT = """
import logging, sys
from dnslb import logs
logs.configure(sys.argv[1], sys.argv[2], pid=sys.argv[3] == "pid", timestamps=sys.argv[4] == "ts")
logging.getLogger("dnslb.test").debug("details")
logging.getLogger("dnslb.test").info("started")
logging.getLogger("httpx").info("GET / 200")
logging.getLogger("httpx").warning("retrying")
"""


def log_of(*args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, check=True
    )
    assert done.stdout == ""
    return done.stderr.splitlines()


def test_a_line_names_the_program_and_its_pid() -> None:
    lines = log_of("pipe-backend", "info", "pid", "-")
    pid = re.fullmatch(r"dnslb pipe-backend\[(\d+)\]: INFO started", lines[0])
    assert pid is not None, lines
    # pdns copies the coprocess's stderr into its log: the prefix tells the lines apart
    assert lines == [
        f"dnslb pipe-backend[{pid[1]}]: INFO started",
        f"dnslb pipe-backend[{pid[1]}]: WARNING retrying",  # httpx's requests are quieted
    ]


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        pytest.param("debug", ["DEBUG details", "INFO started", "WARNING retrying"], id="debug"),
        pytest.param("WARNING", ["WARNING retrying"], id="warning-by-upper-case-name"),
    ],
)
def test_the_level_is_a_name(level: str, expected: list[str]) -> None:
    lines = log_of("agent", level, "pid", "-")
    assert [line.split(": ", 1)[1] for line in lines] == expected


def test_the_manager_lines_carry_the_time_and_no_pid() -> None:
    [line, _] = log_of("manager", "info", "-", "ts")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} dnslb manager: INFO started", line)
