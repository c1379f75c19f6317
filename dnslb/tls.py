"""TLS on dnslb's HTTP links, and the rule that keeps tokens off the network in clear text.

Every link carries a bearer token: agents' reports and nodes' heartbeats to the manager, the
manager's table pushes to node agents, ``dnslb ctl`` to the REST API. A listener serves TLS 1.2 or
later when its configuration names a certificate and a key (:class:`TlsListenerConfig`,
:func:`server_context`); a client verifies the server against a CA file, or the system's trust
store when it names none (:func:`client_context`).

A link in clear text is refused unless it stays on the host or the operator says otherwise: an
``http://`` URL whose host is not a loopback address (:func:`plaintext_url_problem`), or a listener
without TLS bound beyond loopback (:func:`plaintext_listener_problem`), is a configuration error
unless that configuration sets ``allow_plaintext: true``. Host names other than ``localhost`` are
not resolved: they count as beyond loopback.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass

from dnslb.config import FileReference, setting

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2

PLAINTEXT_ADVICE = "set allow_plaintext: true to send tokens in clear text anyway"


@dataclass(frozen=True, slots=True)
class TlsListenerConfig:
    """A listener's certificate and private key: it serves TLS 1.2 or later with them."""

    certificate: FileReference = setting(
        help="PEM certificate, the server's own first, then any intermediates (`file:PATH`)"
    )
    key: FileReference = setting(
        help="PEM private key of the certificate, unencrypted (`file:PATH`; a secret: readable "
        "by the service's user alone)"
    )

    def config_problems(self) -> Iterator[str]:
        try:
            server_context(self.certificate, self.key)
        except ValueError as exc:
            yield str(exc)


def server_context(
    certificate: str | os.PathLike[str], key: str | os.PathLike[str]
) -> ssl.SSLContext:
    """A server's context: TLS 1.2 or later, HTTP/1.1, ``certificate`` with ``key``. ValueError
    says why the pair cannot be used (unreadable, not PEM, the key not the certificate's)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MINIMUM_VERSION
    context.set_alpn_protocols(["http/1.1"])
    try:
        # Never OpenSSL's own prompt for a passphrase: a service (or --check) would wait on it.
        context.load_cert_chain(certificate, key, password=_no_passphrase)
    except _EncryptedKey:
        raise ValueError(
            f"key {os.fspath(key)} is encrypted: give it unencrypted, readable by the service's "
            "user alone"
        ) from None
    except ssl.SSLError as exc:
        reason = exc.reason or str(exc)
        if "KEY_VALUES_MISMATCH" in reason:
            reason = "the key is not the certificate's"
        raise ValueError(
            f"certificate {os.fspath(certificate)} with key {os.fspath(key)}: {reason}"
        ) from None
    except OSError as exc:
        raise ValueError(f"cannot read {exc.filename or certificate}: {exc.strerror}") from None
    return context


class _EncryptedKey(Exception):
    pass


def _no_passphrase() -> str:
    raise _EncryptedKey


def client_context(ca_file: str | os.PathLike[str] | None = None) -> ssl.SSLContext:
    """A client's context: TLS 1.2 or later, the server's certificate verified (host name
    included) against ``ca_file`` (PEM), or the system's trust store when None. ValueError when
    the file holds no usable certificate."""
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except ssl.SSLError as exc:
        raise ValueError(f"CA file {os.fspath(ca_file or '')}: {exc.reason or exc}") from None
    except OSError as exc:
        raise ValueError(f"cannot read CA file {ca_file}: {exc.strerror}") from None
    context.minimum_version = MINIMUM_VERSION
    return context


def ca_file_problem(ca_file: FileReference | None) -> str | None:
    """Why ``ca_file`` cannot verify servers (for ``config_problems``), or None."""
    if ca_file is None:
        return None
    try:
        client_context(ca_file)
    except ValueError as exc:
        return f"ca_file: {exc}"
    return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name, brackets allowed) is this host: ``localhost`` or
    a loopback address. Other names are not resolved, so they are not loopback."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.partition("%")[0]).is_loopback
    except ValueError:
        return False


def plaintext_url_problem(name: str, url: str, allow_plaintext: bool) -> str | None:
    """The problem with setting ``name`` when ``url`` would carry a token in clear text beyond
    this host (``http://`` to a host that is not loopback) and that is not allowed; else None."""
    parts = urllib.parse.urlsplit(url)
    if allow_plaintext or parts.scheme != "http" or is_loopback(parts.hostname or ""):
        return None
    return (
        f"{name}: {url!r} would send tokens in clear text beyond this host: use https:// "
        f"or {PLAINTEXT_ADVICE}"
    )


def plaintext_listener_problem(
    name: str, address: str, has_tls: bool, allow_plaintext: bool
) -> str | None:
    """The problem with setting ``name`` when a listener without TLS binds ``address`` beyond
    loopback and that is not allowed (its clients' tokens would cross the network); else None."""
    if has_tls or allow_plaintext or is_loopback(address):
        return None
    return (
        f"{name}: {address} is beyond loopback and the listener has no TLS: tokens would come "
        f"in clear text; configure tls or {PLAINTEXT_ADVICE}"
    )


def verification_failure(exc: BaseException) -> str | None:
    """What a failed certificate verification says, when one is in ``exc``'s chain (httpx and
    http.client wrap it); None for any other failure."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            return f"TLS certificate not trusted: {current.verify_message or current.reason}"
        if isinstance(current, ssl.SSLError):
            return f"TLS failed: {current.reason or current}"
        current = current.__cause__ or current.__context__
    return None
