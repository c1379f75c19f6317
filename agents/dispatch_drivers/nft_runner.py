"""How the ``nftables`` driver hands a script to the kernel: one batch (transaction) per call.

Two ways, same semantics (the whole script is parsed, then committed as one netlink batch, exactly
as ``nft -f`` does): :class:`LibNftables` calls ``libnftables.so.1`` in-process through ctypes,
which saves starting a process per table (the bulk of an apply's time, and what makes a sub-second
lease renewal cheap); :class:`NftCommand` runs ``nft -f -``. :func:`default_runner` prefers the
library when it loads.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import subprocess
import threading
from abc import ABC, abstractmethod

from dnslb.errors import ProcessError

NFT_TIMEOUT = 10.0


class NftRunner(ABC):
    """Runs an nftables script as one transaction; raises :class:`ProcessError` when it fails
    (and then nothing of the script took effect)."""

    name: str

    @abstractmethod
    def run(self, script: str) -> None:
        """Commit ``script`` whole, or raise."""


class NftCommand(NftRunner):
    """``nft -f -`` as a subprocess."""

    name = "nft command"

    def __init__(self, nft: str = "nft") -> None:
        self.nft = nft

    def run(self, script: str) -> None:
        try:
            done = subprocess.run(
                [self.nft, "-f", "-"],
                input=script,
                capture_output=True,
                text=True,
                timeout=NFT_TIMEOUT,
                check=False,
            )
        except FileNotFoundError:
            raise ProcessError(f"nft not found ({self.nft!r}): install nftables") from None
        except subprocess.TimeoutExpired:
            raise ProcessError(f"nft did not finish in {NFT_TIMEOUT:.0f} s") from None
        if done.returncode != 0:
            detail = done.stderr.strip().splitlines()
            raise ProcessError(f"nft failed ({done.returncode}): {' | '.join(detail[:6])}")


class LibNftables(NftRunner):
    """``nft_run_cmd_from_buffer`` of libnftables, in this process (one context, one lock)."""

    name = "libnftables"

    def __init__(self, library: str = "libnftables.so.1") -> None:
        try:
            lib = ctypes.CDLL(library, use_errno=True)
        except OSError as exc:
            raise ProcessError(f"cannot load {library}: {exc}") from None
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        context = lib.nft_ctx_new(0)
        if not context:
            raise ProcessError("nft_ctx_new failed")
        lib.nft_ctx_buffer_output(context)  # keep nft's output off our stdout
        lib.nft_ctx_buffer_error(context)
        self._lib = lib
        self._context = context
        self._lock = threading.Lock()  # an nft context is not thread-safe

    def run(self, script: str) -> None:
        with self._lock:
            status = self._lib.nft_run_cmd_from_buffer(self._context, script.encode())
            if status != 0:
                error = (self._lib.nft_ctx_get_error_buffer(self._context) or b"").decode()
                detail = " | ".join(error.strip().splitlines()[:6])
                raise ProcessError(f"nftables refused the script: {detail or status}")


def default_runner(nft: str = "nft") -> NftRunner:
    """libnftables when it loads, else the ``nft`` command."""
    try:
        return LibNftables()
    except ProcessError:
        return NftCommand(nft)
