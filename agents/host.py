"""The machine's CPU and memory in use, as fractions from 0 to 1, cheaply.

``psutil.cpu_percent(interval=None)`` does not sleep: it compares the CPU counters with the
previous call's, so each sample covers the time since the last one (one report interval).
:class:`HostUsage` primes it when it is created, so that the first sample already means
something.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil


@dataclass(frozen=True, slots=True)
class HostSample:
    """CPU and memory in use, each 0..1, or None when the machine would not tell."""

    cpu: float | None
    mem: float | None


def _fraction(percent: float) -> float:
    return min(1.0, max(0.0, percent / 100.0))


class HostUsage:
    """Samples the whole machine's CPU (since the previous sample) and memory (now)."""

    def __init__(self) -> None:
        self._cpu_ok = self._prime()

    @staticmethod
    def _prime() -> bool:
        try:
            psutil.cpu_percent(interval=None)
        except (OSError, psutil.Error):
            return False
        return True

    def sample(self) -> HostSample:
        """The usage now; a counter psutil cannot read is None rather than an error."""
        cpu = mem = None
        try:
            value = psutil.cpu_percent(interval=None)
            cpu = _fraction(value) if self._cpu_ok else None
            self._cpu_ok = True
        except (OSError, psutil.Error):
            self._cpu_ok = False
        try:
            # percent is (total - available) / total: what the page cache could not give back.
            mem = _fraction(psutil.virtual_memory().percent)
        except (OSError, psutil.Error):
            mem = None
        return HostSample(cpu=cpu, mem=mem)
