"""The nftables jhash replica against values the kernel computed (Linux 6.18, nft 1.0.6).

Each vector was read back from a dynamic set filled by ``meta mark set jhash ip saddr . tcp sport
mod N seed S offset O`` in a network namespace; ``tests/integration/test_jhash_kernel.py`` checks
thousands more against the running kernel.
"""

from __future__ import annotations

import pytest

from dnslb.jhash import jhash, nft_bucket, reciprocal_scale, saddr_sport_key

KERNEL_VECTORS = {
    "mod 256 seed 0": (
        (256, 0, 0),
        [
            ("198.51.100.7", 40000, 13),
            ("203.0.113.200", 1, 49),
            ("10.1.2.3", 65535, 57),
            ("192.0.2.1", 12345, 130),
            ("127.0.0.1", 0, 214),
            ("255.255.255.255", 443, 227),
        ],
    ),
    "mod 1024 seed 0xdeadbeef": (
        (1024, 0xDEADBEEF, 0),
        [
            ("127.0.0.1", 0, 219),
            ("192.0.2.1", 12345, 286),
            ("255.255.255.255", 443, 443),
            ("10.1.2.3", 65535, 658),
            ("198.51.100.7", 40000, 663),
            ("203.0.113.200", 1, 680),
        ],
    ),
    "mod 4096 seed 12345": (
        (4096, 12345, 0),
        [
            ("255.255.255.255", 443, 491),
            ("203.0.113.200", 1, 2261),
            ("127.0.0.1", 0, 3066),
            ("198.51.100.7", 40000, 3342),
            ("192.0.2.1", 12345, 3470),
            ("10.1.2.3", 65535, 3935),
        ],
    ),
    "mod 3 seed 1 offset 7": (
        (3, 1, 7),
        [
            ("127.0.0.1", 0, 7),
            ("255.255.255.255", 443, 7),
            ("10.1.2.3", 65535, 7),
            ("203.0.113.200", 1, 8),
            ("192.0.2.1", 12345, 8),
            ("198.51.100.7", 40000, 9),
        ],
    ),
}


@pytest.mark.parametrize("case", KERNEL_VECTORS.values(), ids=KERNEL_VECTORS.keys())
def test_matches_kernel_vectors(case: tuple[tuple[int, int, int], list[tuple[str, int, int]]]):
    (modulus, seed, offset), vectors = case
    for saddr, sport, expected in vectors:
        assert nft_bucket(saddr, sport, modulus, seed, offset) == expected, (saddr, sport)


def test_key_is_address_port_and_two_bytes_of_padding() -> None:
    assert saddr_sport_key("192.0.2.1", 0x1234) == bytes([192, 0, 2, 1, 0x12, 0x34, 0, 0])


def test_reciprocal_scale_is_not_modulo() -> None:
    assert reciprocal_scale(0xFFFFFFFF, 10) == 9
    assert reciprocal_scale(0x7FFFFFFF, 2) == 0
    assert reciprocal_scale(0x80000000, 2) == 1
    assert reciprocal_scale(5, 4) == 0  # 5 % 4 would be 1


def test_jhash_of_nothing_is_the_initial_value() -> None:
    assert jhash(b"", 0) == 0xDEADBEEF
    assert jhash(b"", 1) == 0xDEADBEF0


@pytest.mark.parametrize("length", [1, 4, 11, 12, 13, 24, 25])
def test_trailing_zero_bytes_change_the_hash_through_the_length(length: int) -> None:
    # The length is mixed into the initial value: padding is not neutral, which is why the
    # replica must hash exactly the 8 bytes nft loads, not the 6 meaningful ones.
    data = bytes(range(1, length + 1))
    assert jhash(data, 7) != jhash(data + b"\0", 7)


@pytest.mark.parametrize(
    ("saddr", "sport", "modulus", "seed"),
    [
        pytest.param("192.0.2.1", -1, 4, 0, id="negative port"),
        pytest.param("192.0.2.1", 65536, 4, 0, id="port too large"),
        pytest.param("2001:db8::1", 80, 4, 0, id="not IPv4"),
        pytest.param("192.0.2.1", 80, 0, 0, id="zero modulus"),
        pytest.param("192.0.2.1", 80, 4, 2**32, id="seed too large"),
    ],
)
def test_bad_arguments_raise(saddr: str, sport: int, modulus: int, seed: int) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        nft_bucket(saddr, sport, modulus, seed)
