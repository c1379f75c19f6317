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
_HANDLE = 1 << 3  # NFT_CTX_OUTPUT_HANDLE: list with "# handle N"
_TERSE = 1 << 11  # NFT_CTX_OUTPUT_TERSE: list sets without their elements


class NftRunner(ABC):
    """Runs an nftables script as one transaction; raises :class:`ProcessError` when it fails
    (and then nothing of the script took effect)."""

    name: str

    @abstractmethod
    def run(self, script: str) -> None:
        """Commit ``script`` whole, or raise."""

    @abstractmethod
    def output(self, command: str) -> str:
        """What a listing ``command`` (``list tables``...) prints, terse and with handles;
        raises :class:`ProcessError` when it fails."""


class NftCommand(NftRunner):
    """``nft -f -`` as a subprocess."""

    name = "nft command"

    def __init__(self, nft: str = "nft") -> None:
        self.nft = nft

    def run(self, script: str) -> None:
        done = self._nft(["-f", "-"], script)
        if done.returncode != 0:
            detail = done.stderr.strip().splitlines()
            raise ProcessError(f"nft failed ({done.returncode}): {' | '.join(detail[:6])}")

    def output(self, command: str) -> str:
        done = self._nft(["-t", "-a", *command.split()], None)
        if done.returncode != 0:
            detail = done.stderr.strip().splitlines()
            raise ProcessError(f"nft {command} failed: {' | '.join(detail[:6])}")
        return done.stdout

    def _nft(self, arguments: list[str], script: str | None) -> subprocess.CompletedProcess[str]:
        """``nft ARGUMENTS`` (reading ``script`` on its standard input), within the timeout."""
        try:
            return subprocess.run(
                [self.nft, *arguments],
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
        lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
        lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_output_get_flags.restype = ctypes.c_uint
        lib.nft_ctx_output_get_flags.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
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
            # Read both buffers every time (reading empties them), so that nothing of this
            # script is left to show up in the next one's error.
            self._lib.nft_ctx_get_output_buffer(self._context)
            error = (self._lib.nft_ctx_get_error_buffer(self._context) or b"").decode()
            if status != 0:
                detail = " | ".join(error.strip().splitlines()[:6])
                raise ProcessError(f"nftables refused the script: {detail or status}")

    def output(self, command: str) -> str:
        with self._lock:
            flags = self._lib.nft_ctx_output_get_flags(self._context)
            self._lib.nft_ctx_output_set_flags(self._context, flags | _HANDLE | _TERSE)
            try:
                status = self._lib.nft_run_cmd_from_buffer(self._context, command.encode())
                text = (self._lib.nft_ctx_get_output_buffer(self._context) or b"").decode()
                error = (self._lib.nft_ctx_get_error_buffer(self._context) or b"").decode()
            finally:
                self._lib.nft_ctx_output_set_flags(self._context, flags)
            if status != 0:
                detail = " | ".join(error.strip().splitlines()[:6])
                raise ProcessError(f"nft {command} failed: {detail or status}")
            return text


def default_runner(nft: str = "nft") -> NftRunner:
    """libnftables when it loads, else the ``nft`` command."""
    try:
        return LibNftables()
    except ProcessError:
        return NftCommand(nft)
