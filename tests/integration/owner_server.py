"""A tiny TCP server for the cluster lab: says which node answered, then echoes lines.

Run inside a node's network namespace: ``python owner_server.py NODE_ID ADDRESS PORT``. On each
connection it sends ``NODE_ID\\n``; for each line received it answers ``NODE_ID:line``.
"""

from __future__ import annotations

import socket
import sys
import threading


def serve(conn: socket.socket, name: bytes) -> None:
    with conn:
        conn.sendall(name + b"\n")
        buffered = b""
        while True:
            data = conn.recv(4096)
            if not data:
                return
            buffered += data
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                conn.sendall(name + b":" + line + b"\n")


def main() -> None:
    name, address, port = sys.argv[1].encode(), sys.argv[2], int(sys.argv[3])
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, port))
    listener.listen(512)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn, name), daemon=True).start()


if __name__ == "__main__":
    main()
