"""The load test's record of every request, one CSV row each: what the lab's report reads.

locust's own CSV files hold aggregates (percentiles per endpoint, a history of totals); the
paper's columns need each response time (its bands: < 3 s, 3-9 s, 9-60 s) and the TTL of each
DNS answer a client received. The load test (:mod:`loadtest`) writes this file through
:class:`RecordWriter`; :func:`read_records` reads it back.

Columns: ``start`` (unix seconds the request started), ``kind`` (``DNS`` or the HTTP method),
``name``, ``seconds`` (response time), ``ok`` (1 or 0), ``address`` (the server asked),
``ttl`` (a DNS answer's TTL; empty for HTTP), ``length`` (bytes, or addresses in a DNS answer),
``error``.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

FIELDS = ("start", "kind", "name", "seconds", "ok", "address", "ttl", "length", "error")
DNS = "DNS"


@dataclass(frozen=True, slots=True)
class Record:
    """One request (an HTTP request, or a DNS lookup that went to the server)."""

    start: float
    kind: str
    name: str
    seconds: float
    ok: bool
    address: str = ""
    ttl: int | None = None
    length: int = 0
    error: str = ""

    @property
    def is_dns(self) -> bool:
        return self.kind == DNS


class RecordWriter:
    """Appends records to a CSV file (with a header when the file is new)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        self._file: IO[str] = open(path, "a", newline="")  # noqa: SIM115 (closed in close())
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(FIELDS)

    def write(self, record: Record) -> None:
        self._writer.writerow(
            (
                f"{record.start:.3f}",
                record.kind,
                record.name,
                f"{record.seconds:.4f}",
                1 if record.ok else 0,
                record.address,
                "" if record.ttl is None else record.ttl,
                record.length,
                record.error[:200],
            )
        )

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_records(path: str | os.PathLike[str]) -> Iterator[Record]:
    """The records of a file :class:`RecordWriter` wrote; a row cut short (the writer was
    killed mid-line) ends the file."""
    with open(path, newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            return
        if tuple(header) != FIELDS:
            raise ValueError(f"{path}: not a request record file (header {header})")
        for row in reader:
            if len(row) != len(FIELDS):
                return
            try:
                yield Record(
                    start=float(row[0]),
                    kind=row[1],
                    name=row[2],
                    seconds=float(row[3]),
                    ok=row[4] == "1",
                    address=row[5],
                    ttl=int(row[6]) if row[6] else None,
                    length=int(row[7]),
                    error=row[8],
                )
            except ValueError:
                return
