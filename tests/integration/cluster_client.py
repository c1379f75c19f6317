"""The cluster lab's client, run in the client namespace; prints one JSON document per result.

Modes (arguments after the mode):

``connect VIP PORT``
    Reads a JSON list of source ports on stdin; opens one connection from each (bound to that
    port, so the bucket is known in advance), reads the node's name, closes. Prints
    ``{"results": [[sport, owner_or_null, error_or_null, seconds], ...]}``.
``hold VIP PORT``
    Reads a JSON list of source ports; opens and keeps one connection from each, prints
    ``{"held": [[sport, owner], ...]}``; then, on each stdin line ``ping``, sends a line on every
    connection and prints ``{"pings": [[sport, answer_or_null, error_or_null], ...]}``;
    ``quit`` ends.
``stream VIP PORT SECONDS INTERVAL``
    Opens a new connection every INTERVAL seconds for SECONDS (ephemeral ports), each allowed
    6 s (the kernel retries a lost SYN after 1 s and 3 s); prints ``{"results": [...]}`` as above
    with a fifth item: when the attempt started, in ``time.monotonic()`` seconds (one clock for
    every namespace, so the test can compare it with its own).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

CONNECT_TIMEOUT = 6.0


def read_name(sock: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(100)
        if not chunk:
            raise ConnectionError("closed before the node said its name")
        data += chunk
    return data.decode().strip()


def open_one(vip: str, port: int, sport: int | None) -> tuple[socket.socket | None, list]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.settimeout(CONNECT_TIMEOUT)
    started = time.monotonic()
    try:
        if sport is not None:
            sock.bind(("0.0.0.0", sport))
        sock.connect((vip, port))
        used = sock.getsockname()[1]
        owner = read_name(sock)
    except OSError as exc:
        sock.close()
        return None, [sport, None, f"{type(exc).__name__}: {exc}", time.monotonic() - started]
    return sock, [used, owner, None, time.monotonic() - started]


def connect(vip: str, port: int) -> None:
    results = []
    for sport in json.load(sys.stdin):
        sock, result = open_one(vip, port, sport)
        if sock is not None:
            sock.close()
        results.append(result)
    print(json.dumps({"results": results}), flush=True)


def hold(vip: str, port: int) -> None:
    sports = json.loads(sys.stdin.readline())
    held: list[tuple[int, socket.socket]] = []
    report = []
    for sport in sports:
        sock, result = open_one(vip, port, sport)
        report.append([result[0], result[1]])
        if sock is not None:
            held.append((sport, sock))
    print(json.dumps({"held": report}), flush=True)
    for line in sys.stdin:
        if line.strip() != "ping":
            break
        pings = []
        for sport, sock in held:
            try:
                sock.sendall(b"ping\n")
                answer = b""
                while not answer.endswith(b"\n"):
                    chunk = sock.recv(100)
                    if not chunk:
                        raise ConnectionError("closed")
                    answer += chunk
                pings.append([sport, answer.decode().strip(), None])
            except OSError as exc:
                pings.append([sport, None, f"{type(exc).__name__}: {exc}"])
        print(json.dumps({"pings": pings}), flush=True)
    for _, sock in held:
        sock.close()


def stream(vip: str, port: int, seconds: float, interval: float) -> None:
    results: list[list] = []
    lock = threading.Lock()
    threads = []
    start = time.monotonic()

    def one(started: float) -> None:
        sock, result = open_one(vip, port, None)
        if sock is not None:
            sock.close()
        with lock:
            results.append([*result, started])

    while time.monotonic() - start < seconds:
        thread = threading.Thread(target=one, args=(time.monotonic(),))
        thread.start()
        threads.append(thread)
        time.sleep(interval)
    for thread in threads:
        thread.join(CONNECT_TIMEOUT + 1)
    print(json.dumps({"results": results}), flush=True)


def main() -> None:
    mode, vip, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "connect":
        connect(vip, port)
    elif mode == "hold":
        hold(vip, port)
    else:
        stream(vip, port, float(sys.argv[4]), float(sys.argv[5]))


if __name__ == "__main__":
    main()
