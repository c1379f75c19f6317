"""A client's resolver cache: an answer is reused for its TTL, then asked for again.

A real client's stub resolver (or its browser, or its JVM) caches answers. Most honour the TTL;
some keep an answer much longer whatever it says (``hold``), which is why a DNS load balancer
cannot move every client at once. :class:`CachingResolver` is the cache, with the lookup and
the clock passed in; :func:`dns_lookup` is the real lookup over UDP (dnspython).
"""

from __future__ import annotations

import ipaddress
import random
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import dns.exception
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype

from dnslb.errors import DnslbError


class LookupFailed(DnslbError):
    """A DNS lookup got no usable answer (timeout, error rcode, no address)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """The addresses of an answer, in the order received, and its TTL."""

    addresses: tuple[str, ...]
    ttl: int


Lookup = Callable[[str], Answer]


class CachingResolver:
    """One client's cache in front of ``lookup``.

    With ``hold`` None an answer is reused until its TTL runs out; with ``hold`` set, for
    ``hold`` seconds whatever its TTL (a client that ignores TTLs).
    """

    def __init__(
        self, lookup: Lookup, clock: Callable[[], float], *, hold: float | None = None
    ) -> None:
        self.lookup = lookup
        self.clock = clock
        self.hold = hold
        self._cache: dict[str, tuple[float, Answer]] = {}

    def cached(self, name: str) -> Answer | None:
        """The answer for ``name`` if it is still fresh for this client, else None."""
        entry = self._cache.get(name)
        if entry is None or self.clock() >= entry[0]:
            return None
        return entry[1]

    def resolve(self, name: str) -> tuple[Answer, bool]:
        """The answer for ``name`` and whether it was looked up now (False: from the cache).

        Raises :class:`LookupFailed` when a lookup fails; nothing is cached then.
        """
        answer = self.cached(name)
        if answer is not None:
            return answer, False
        answer = self.lookup(name)
        keep = self.hold if self.hold is not None else answer.ttl
        self._cache[name] = (self.clock() + keep, answer)
        return answer, True

    def forget(self, name: str) -> None:
        """Drop the cached answer (after its address failed, a client asks again)."""
        self._cache.pop(name, None)


def server_address(server: str) -> str:
    """The IP address of the DNS server ``server``: itself when it is one, else the address its
    name resolves to here (the compose lab's locust names the ``dns`` service)."""
    try:
        return str(ipaddress.ip_address(server.strip("[]")))
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(server, 53, proto=socket.IPPROTO_UDP)[0][4][0])
    except OSError as exc:
        raise LookupFailed(f"DNS server {server!r}: cannot resolve its name: {exc}") from None


def dns_lookup(server: str, port: int, *, timeout: float = 2.0) -> Lookup:
    """A lookup of A records at ``server:port`` over UDP (``server`` an IP address)."""

    def lookup(name: str) -> Answer:
        query = dns.message.make_query(name, "A")
        try:
            reply = dns.query.udp(query, server, port=port, timeout=timeout)
        except (dns.exception.DNSException, OSError) as exc:
            raise LookupFailed(f"{type(exc).__name__}: {exc}") from None
        if reply.rcode() != dns.rcode.NOERROR:
            raise LookupFailed(dns.rcode.to_text(reply.rcode()))
        for rrset in reply.answer:
            if rrset.rdtype == dns.rdatatype.A:
                return Answer(addresses=tuple(str(rdata) for rdata in rrset), ttl=rrset.ttl)
        raise LookupFailed("no A record in the answer")

    return lookup


def choose(addresses: Sequence[str], mode: str, rng: random.Random) -> str:
    """The address a client connects to: the ``first`` (what most clients do) or a ``random``
    one of the answer."""
    if not addresses:
        raise LookupFailed("empty answer")
    if mode == "first":
        return addresses[0]
    if mode == "random":
        return rng.choice(list(addresses))
    raise ValueError(f"connect mode must be first or random, not {mode!r}")
