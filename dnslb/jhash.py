"""A bit-exact replica of the bucket nftables computes for ``jhash ip saddr . tcp sport``.

A cluster node classifies each new connection with::

    meta mark set jhash ip saddr . tcp sport mod N seed S

and the manager must predict, for any client address and port, the bucket (and so the node) the
kernel picks. Three details make a naive replica wrong; each was checked against the kernel
(Linux 6.x, nft 1.0.6) by ``tests/integration/test_jhash_kernel.py``:

* **Padding.** nft loads each part of a concatenation into its own 32-bit registers: the 4 bytes
  of ``ip saddr`` then the 2 bytes of ``tcp sport`` followed by 2 zero bytes. The kernel hashes
  all 8 bytes (``nft --debug=netlink`` shows ``jhash(reg 2, 8, seed)``), both fields in network
  byte order.
* **The hash.** The kernel's ``jhash()`` (``include/linux/jhash.h``, Bob Jenkins' lookup2/3 mix)
  reads its input as native-endian (little-endian on x86 and arm64) 32-bit words, with the
  initial value ``0xdeadbeef + length + seed``.
* **Scaling.** ``mod N`` is not a modulo: ``nft_jhash_eval`` uses ``reciprocal_scale``,
  ``(hash * N) >> 32``, then adds the offset.
"""

from __future__ import annotations

import ipaddress

_MASK = 0xFFFFFFFF
_JHASH_INITVAL = 0xDEADBEEF


def _rol32(word: int, shift: int) -> int:
    return ((word << shift) | (word >> (32 - shift))) & _MASK


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    a = (a - c) & _MASK
    a ^= _rol32(c, 4)
    c = (c + b) & _MASK
    b = (b - a) & _MASK
    b ^= _rol32(a, 6)
    a = (a + c) & _MASK
    c = (c - b) & _MASK
    c ^= _rol32(b, 8)
    b = (b + a) & _MASK
    a = (a - c) & _MASK
    a ^= _rol32(c, 16)
    c = (c + b) & _MASK
    b = (b - a) & _MASK
    b ^= _rol32(a, 19)
    a = (a + c) & _MASK
    c = (c - b) & _MASK
    c ^= _rol32(b, 4)
    b = (b + a) & _MASK
    return a, b, c


def _final(a: int, b: int, c: int) -> int:
    c ^= b
    c = (c - _rol32(b, 14)) & _MASK
    a ^= c
    a = (a - _rol32(c, 11)) & _MASK
    b ^= a
    b = (b - _rol32(a, 25)) & _MASK
    c ^= b
    c = (c - _rol32(b, 16)) & _MASK
    a ^= c
    a = (a - _rol32(c, 4)) & _MASK
    b ^= a
    b = (b - _rol32(a, 14)) & _MASK
    c ^= b
    return (c - _rol32(b, 24)) & _MASK


def jhash(data: bytes, initval: int) -> int:
    """The Linux kernel's ``jhash(key, length, initval)`` over ``data``, as an unsigned 32-bit."""
    if not 0 <= initval <= _MASK:
        raise ValueError(f"initval must fit 32 bits, not {initval}")
    length = len(data)
    a = b = c = (_JHASH_INITVAL + length + initval) & _MASK
    offset = 0
    while length > 12:
        a = (a + int.from_bytes(data[offset : offset + 4], "little")) & _MASK
        b = (b + int.from_bytes(data[offset + 4 : offset + 8], "little")) & _MASK
        c = (c + int.from_bytes(data[offset + 8 : offset + 12], "little")) & _MASK
        a, b, c = _mix(a, b, c)
        length -= 12
        offset += 12
    if length == 0:
        return c
    # The kernel adds the 1..12 trailing bytes one by one into a, b, c; zero-padding them to 12
    # bytes and reading little-endian words adds exactly the same amounts.
    tail = data[offset:] + bytes(12 - length)
    a = (a + int.from_bytes(tail[0:4], "little")) & _MASK
    b = (b + int.from_bytes(tail[4:8], "little")) & _MASK
    c = (c + int.from_bytes(tail[8:12], "little")) & _MASK
    return _final(a, b, c)


def reciprocal_scale(value: int, modulus: int) -> int:
    """The kernel's ``reciprocal_scale``: maps a 32-bit ``value`` onto ``[0, modulus)``."""
    return (value * modulus) >> 32


def saddr_sport_key(saddr: str, sport: int) -> bytes:
    """The 8 bytes nft hashes for ``ip saddr . tcp sport``: address, port, two bytes of padding."""
    if not 0 <= sport <= 0xFFFF:
        raise ValueError(f"port must be 0..65535, not {sport}")
    return ipaddress.IPv4Address(saddr).packed + sport.to_bytes(2, "big") + b"\0\0"


def nft_bucket(saddr: str, sport: int, modulus: int, seed: int, offset: int = 0) -> int:
    """The value of ``jhash ip saddr . tcp sport mod modulus seed seed offset offset``."""
    if not 1 <= modulus <= _MASK:
        raise ValueError(f"modulus must be 1..2^32-1, not {modulus}")
    return reciprocal_scale(jhash(saddr_sport_key(saddr, sport), seed), modulus) + offset
