"""The fuzzing engine: hostile inputs thrown at every trust boundary, deterministic per seed.

A :class:`Harness` guards one boundary (plan documents, pipe protocol lines, agent reports, Redis
replies, node heartbeats, dispatch tables). Its :meth:`~Harness.one` builds one input from the
random generator it is given, feeds it to the real code, and checks what came back: a result
that breaks the boundary's contract raises :class:`Finding` (a *malformed* result); any other
exception is a *crash*, and so is an exception that the code under test caught and logged (a
catch-all that keeps a process up must not hide a bug); an input that takes longer than the
harness's ``deadline`` is a *hang*.
Harnesses live beside the code they guard (``pipe_backend/fuzz.py``, ``dnslb/plan_fuzz.py``...);
``dnslb fuzz`` lists and runs them.

Every input has its own seed, derived from the run's seed and the input's index, so a failure is
reproduced with ``dnslb fuzz NAME --seed S --start I --inputs 1``. The test suite runs each
harness with a fixed seed and a fixed number of inputs (reproducible); ``dnslb fuzz --seconds N``
explores with a random seed for as long as asked.

The helpers below (:func:`hostile_number`, :func:`hostile_text`, :func:`mutate_document`,
:func:`mutate_bytes`) build the inputs that broke things before: numbers that overflow a float,
huge integers, NaN and infinities as JSON accepts them, deep nesting, tabs and newlines in names,
lone surrogates, claimed sizes far beyond what follows.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import math
import random
import signal
import threading
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from dnslb.errors import DnslbError


class Finding(DnslbError):
    """A harness saw the code under test break its contract (a malformed result)."""


class Hang(Exception):
    """Raised inside an input that ran past its deadline (main thread only)."""


class Harness(ABC):
    """One boundary under fuzzing. Subclasses set ``name`` and ``boundary`` and implement
    :meth:`one`; :meth:`open` and :meth:`close` bracket a run (start a fake server...)."""

    name: str = ""
    boundary: str = ""  # one line: what crosses it, who may send it
    deadline: float = 2.0  # seconds one input may take before it counts as a hang
    suite_inputs: int = 2000  # inputs the test suite runs (fixed seed): a few seconds' worth
    unit: str = ""  # what an input holds several of ("request lines"), counted in ``units``
    units: int = 0

    def open(self) -> None:  # noqa: B027 - optional hook
        """Prepare a run (called once before the first input)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what :meth:`open` took (called once, also after a failure)."""

    @abstractmethod
    def one(self, rng: random.Random) -> str:
        """Build one input from ``rng``, run it, check the outcome; raise :class:`Finding` when
        the result breaks the contract. Returns a short label of the outcome (``accepted``,
        ``rejected``...), counted in the run's summary."""


@dataclass(slots=True)
class Failure:
    """One input that failed: how, and how to run it again."""

    kind: str  # "crash", "hang" or "malformed"
    index: int
    detail: str


@dataclass(slots=True)
class RunResult:
    """What a run of one harness did."""

    name: str
    seed: int
    inputs: int = 0
    seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    failures_total: int = 0
    units: str = ""  # e.g. "52,000 request lines": what the inputs held

    def count(self, kind: str) -> int:
        return sum(1 for failure in self.failures if failure.kind == kind)

    @property
    def ok(self) -> bool:
        return self.failures_total == 0

    def summary(self) -> str:
        """One line: inputs, rate, crashes, hangs, malformed results, and the outcomes."""
        rate = self.inputs / self.seconds if self.seconds > 0 else 0.0
        kinds = dict.fromkeys(("crash", "hang", "malformed"), 0)
        for failure in self.failures:
            kinds[failure.kind] += 1
        outcomes = ", ".join(f"{label} {n}" for label, n in sorted(self.outcomes.items()))
        held = f" ({self.units})" if self.units else ""
        return (
            f"{self.name}: {self.inputs} inputs{held} in {self.seconds:.1f} s ({rate:,.0f}/s), "
            f"seed {self.seed}: {kinds['crash']} crashes, {kinds['hang']} hangs, "
            f"{kinds['malformed']} malformed [{outcomes}]"
        )


def input_seed(seed: int, index: int) -> int:
    """The seed of input ``index`` of a run with ``seed`` (stable across Python versions)."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


MAX_FAILURES_KEPT = 20


def run(
    harness: Harness,
    *,
    seed: int,
    inputs: int | None = None,
    seconds: float | None = None,
    start: int = 0,
    stop_on_failure: bool = False,
    progress: Callable[[RunResult], None] | None = None,
    stop: threading.Event | None = None,
) -> RunResult:
    """Run ``harness`` from input ``start`` until ``inputs`` inputs or ``seconds`` have passed
    (whichever comes first; at least one of them must be given), or ``stop`` is set."""
    if inputs is None and seconds is None:
        raise ValueError("give inputs, seconds or both")
    result = RunResult(name=harness.name, seed=seed)
    began = time.monotonic()
    end = began + seconds if seconds is not None else math.inf
    next_progress = began + 10.0
    swallowed = _Swallowed()
    root = logging.getLogger()
    root.addHandler(swallowed)
    harness.open()
    try:
        index = start
        while (inputs is None or result.inputs < inputs) and time.monotonic() < end:
            if stop is not None and stop.is_set():
                break
            swallowed.records.clear()
            failure = _one(harness, index, seed)
            if not isinstance(failure, Failure) and swallowed.records:
                failure = Failure("crash", index, "swallowed and logged:\n" + swallowed.text())
            result.inputs += 1
            if isinstance(failure, Failure):
                result.failures_total += 1
                if len(result.failures) < MAX_FAILURES_KEPT:
                    result.failures.append(failure)
                if stop_on_failure:
                    break
            else:
                result.outcomes[failure] = result.outcomes.get(failure, 0) + 1
            index += 1
            if harness.unit:
                result.units = f"{harness.units:,} {harness.unit}"
            if progress is not None and time.monotonic() >= next_progress:
                result.seconds = time.monotonic() - began
                progress(result)
                next_progress += 10.0
    finally:
        harness.close()
        root.removeHandler(swallowed)
    result.seconds = time.monotonic() - began
    return result


class _Swallowed(logging.Handler):
    """Keeps log records that carry an exception: code that catches every exception to stay
    up (and logs it) must not hide a crash from the harness. Other records are dropped (a
    harness provokes refusals, and their logs, by the thousand)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and len(self.records) < 5:
            self.records.append(record)

    def text(self) -> str:
        formatter = logging.Formatter("%(name)s: %(message)s")
        return "\n".join(formatter.format(record)[-3000:] for record in self.records)


def _one(harness: Harness, index: int, seed: int) -> str | Failure:
    rng = random.Random(input_seed(seed, index))
    started = time.monotonic()
    try:
        with _deadline(harness.deadline * 5):
            outcome = harness.one(rng)
    except Finding as finding:
        return Failure("malformed", index, str(finding)[:2000])
    except Hang:
        return Failure("hang", index, f"still running after {harness.deadline * 5:g} s")
    except Exception:
        return Failure("crash", index, traceback.format_exc(limit=8)[-3000:])
    elapsed = time.monotonic() - started
    if elapsed > harness.deadline:
        return Failure("hang", index, f"took {elapsed:.2f} s (deadline {harness.deadline:g} s)")
    return outcome


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Interrupt the main thread after ``seconds`` (a real hang); elsewhere, measure only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise Hang

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# -- hostile values ---------------------------------------------------------------------------

HOSTILE_NUMBERS: tuple[object, ...] = (
    0,
    -1,
    1,
    -0.0,
    0.5,
    5e-324,
    2**31 - 1,
    2**31,
    2**32,
    2**53 + 1,
    2**62,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63) - 1,
    10**308,
    10**400,
    -(10**400),
    1e308,
    1.7976931348623157e308,
    math.inf,
    -math.inf,
    math.nan,
    True,
    False,
    None,
    "1",
    "",
    [],
    {},
)
"""Values that broke or nearly broke number handling: overflow to infinity, beyond int64,
float precision, NaN (Python's json reads and writes ``NaN`` and ``Infinity``), booleans that
are ints in Python, and values of the wrong type."""

HOSTILE_TEXTS: tuple[str, ...] = (
    "",
    " ",
    "a\tb",
    "a\nb",
    "a\r\nDATA\tx",
    "\x00",
    "\ud800",
    "\udfff",
    "é",
    "ü.example.test",
    "\u2028",
    "\x85",
    "\u202e",
    "%",
    "fe80::1%eth0",
    "fe80::1%\u00e9",
    "fe80::1%\nDATA",
    "..",
    ".",
    "*",
    "a" * 64,
    "a" * 300,
    "x" * 70000,
    "\\",
    '"',
    "{}",
    "NaN",
    "Infinity",
    "-1",
    "1e400",
)
"""Texts that broke or nearly broke text handling: protocol separators (tab, newline, CRLF,
NUL), lone surrogates (valid in JSON, not UTF-8), line breaks Python's ``splitlines`` honours
(U+2028, U+0085), non-ASCII names and IPv6 scopes, and lengths past every limit."""


def hostile_number(rng: random.Random) -> object:
    """A number (or a non-number in a number's place) from :data:`HOSTILE_NUMBERS` or nearby."""
    choice = rng.random()
    if choice < 0.7:
        return rng.choice(HOSTILE_NUMBERS)
    if choice < 0.85:
        return rng.randint(-(2**70), 2**70)
    return rng.uniform(-1e6, 1e6) * 10 ** rng.randint(-10, 300)


def hostile_text(rng: random.Random) -> str:
    """A string from :data:`HOSTILE_TEXTS`, or random characters (any plane, surrogates too)."""
    if rng.random() < 0.7:
        return rng.choice(HOSTILE_TEXTS)
    length = rng.choice((1, 2, 5, 20, 100))
    alphabet = "ab.-_:%\t\n\r\x00 \\\"'\u00e9\ud800\U0001f600"
    return "".join(rng.choice(alphabet) for _ in range(length))


def deep_json(depth: int, *, opener: str = "[", closer: str = "]") -> str:
    """JSON text nested ``depth`` levels deep (``[[[...]]]``)."""
    return opener * depth + closer * depth


def _random_path(document: object, rng: random.Random) -> tuple[Any, ...]:
    """A path into ``document`` by a random walk from its root (cheap however big it is):
    stops at a leaf, or with probability 0.25 at each container on the way."""
    path: tuple[Any, ...] = ()
    value = document
    while True:
        if isinstance(value, dict) and value:
            key: Any = rng.choice(list(value))
        elif isinstance(value, list) and value:
            key = rng.randrange(len(value))
        else:
            return path
        if path and rng.random() < 0.25:
            return path
        path = (*path, key)
        value = value[key]


def _get(document: Any, path: Sequence[Any]) -> Any:
    for key in path:
        document = document[key]
    return document


def mutate_document(document: Any, rng: random.Random, *, mutations: int = 1) -> Any:
    """A mutated deep copy of a JSON-like ``document``: values replaced by hostile ones, keys
    dropped or added, lists emptied or repeated, values nested deep."""
    result = copy.deepcopy(document)
    for _ in range(mutations):
        path = _random_path(result, rng) if rng.random() < 0.97 else ()
        if not path:
            if rng.random() < 0.5:
                return rng.choice((hostile_number(rng), hostile_text(rng), [], None))
            continue
        parent = _get(result, path[:-1])
        key = path[-1]
        action = rng.random()
        if action < 0.35:
            parent[key] = hostile_number(rng)
        elif action < 0.6:
            parent[key] = hostile_text(rng)
        elif action < 0.68 and isinstance(parent, dict):
            del parent[key]
        elif action < 0.74 and isinstance(parent, dict):
            parent[hostile_text(rng)] = hostile_number(rng)
        elif action < 0.8 and isinstance(parent[key], list) and parent[key]:
            parent[key] = parent[key] * rng.choice((0, 2, 50))
        elif action < 0.86:
            value: Any = parent[key]
            for _ in range(rng.choice((2, 50, 400))):  # deeper: deep_json(), as text
                value = [value]
            parent[key] = value
        elif action < 0.93 and isinstance(parent, list):
            parent.insert(rng.randrange(len(parent) + 1), copy.deepcopy(parent[key]))
        else:
            parent[key] = rng.choice(([], {}, None, True, [None], {"": None}))
    return result


def mutate_bytes(data: bytes, rng: random.Random, *, mutations: int = 1) -> bytes:
    """``data`` with bytes flipped, inserted, deleted, repeated or cut off."""
    buffer = bytearray(data)
    for _ in range(mutations):
        if not buffer:
            buffer += bytes([rng.randrange(256)])
            continue
        where = rng.randrange(len(buffer))
        action = rng.random()
        if action < 0.25:
            buffer[where] ^= 1 << rng.randrange(8)
        elif action < 0.45:
            buffer[where:where] = rng.choice(
                (b"\t", b"\n", b"\r\n", b"\x00", b"\xff", b"9" * 30, b"-", b"\\u0000", b"\xed\xa0")
            )
        elif action < 0.6:
            del buffer[where : where + rng.choice((1, 4, 64))]
        elif action < 0.75:
            end = min(len(buffer), where + rng.choice((1, 8, 64)))
            buffer[where:where] = buffer[where:end] * rng.choice((2, 16, 500))
        elif action < 0.85:
            del buffer[where:]
        else:
            buffer[where] = rng.randrange(256)
    return bytes(buffer)


def json_text(document: object, rng: random.Random) -> bytes:
    """``document`` as JSON text the way a hostile writer might send it: NaN and Infinity as
    Python writes them, non-ASCII escaped or raw (lone surrogates escaped), sometimes mutated."""
    try:
        text = json.dumps(document, ensure_ascii=rng.random() < 0.5, allow_nan=True)
    except RecursionError:  # nested deeper than json can write: send it deep as text
        return deep_json(2000).encode()
    data = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.2:
        data = mutate_bytes(data, rng, mutations=rng.choice((1, 3)))
    return data


__all__ = [
    "HOSTILE_NUMBERS",
    "HOSTILE_TEXTS",
    "Failure",
    "Finding",
    "Harness",
    "RunResult",
    "deep_json",
    "hostile_number",
    "hostile_text",
    "input_seed",
    "json_text",
    "mutate_bytes",
    "mutate_document",
    "run",
]
