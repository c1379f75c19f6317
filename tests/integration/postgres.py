"""The tests' PostgreSQL: a throwaway cluster (:mod:`daemons.postgres`) that skips the test,
with the reason, only when ``initdb`` is not installed (``scripts/install`` installs Debian's
``postgresql``); and a relay that cuts one client off from it (:class:`SocketProxy`)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemons.postgres import PostgresCluster, throwaway_cluster, unavailable_reason
from manager.postgres import drop_tables

__all__ = ["PostgresCluster", "SocketProxy", "postgres_cluster", "reset_database"]


@contextlib.contextmanager
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A started cluster, stopped and removed at the end; the test skips when none can start."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with throwaway_cluster() as cluster:
        yield cluster


def reset_database(cluster: PostgresCluster) -> None:
    """Drop every dnslb table (a test starting from an empty database)."""
    drop_tables(cluster.url)


class SocketProxy:
    """A unix-socket relay in front of a cluster, that a test can cut: the one manager given
    :attr:`url` loses its database (every connection dropped, new ones refused) while the others
    keep theirs. Started as a context manager; byte pumps run in daemon threads."""

    def __init__(self, cluster: PostgresCluster, directory: Path) -> None:
        self.cluster = cluster
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f".s.PGSQL.{cluster.port}"
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self.cut = False

    @property
    def url(self) -> str:
        return f"postgresql://dnslb@/dnslb?host={self.directory}&port={self.cluster.port}"

    def __enter__(self) -> SocketProxy:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        os.chmod(self.path, 0o777)
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sever()

    def sever(self) -> None:
        """Cut: close the listener and every relayed connection."""
        with self._lock:
            self.cut = True
            if self._listener is not None:
                with contextlib.suppress(OSError):
                    self._listener.close()
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
            self._open.clear()

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(str(self.cluster.socket_dir / f".s.PGSQL.{self.cluster.port}"))
            except OSError:
                client.close()
                continue
            with self._lock:
                if self.cut:
                    client.close()
                    upstream.close()
                    return
                self._open += [client, upstream]
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, target), daemon=True).start()


def _pump(source: socket.socket, target: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            target.sendall(data)
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)
