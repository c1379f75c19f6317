"""Utilization sources: where an agent reads how busy its server is, one module each.

=========  =====================================================  ===============================
``type``   reads                                                  class
=========  =====================================================  ===============================
nginx      nginx ``stub_status``: Reading + Writing - 1           :class:`NginxStatusSource`
port       established TCP connections to a local port            :class:`PortConnectionsSource`
json       the application's ``{"in_progress", "max_concurrency"}``  :class:`JsonEndpointSource`
=========  =====================================================  ===============================

A source's configuration class is in the core (:mod:`dnslb.agent_config`, registered in
:class:`~dnslb.agent_config.SourceConfig`): the manager writes agents' configurations without
this package. :data:`SOURCES` is the registry of implementations, one line a source, by the
``type`` of the configuration each reads; the two registries name the same sources (a test
checks it). :func:`create_source` builds the one a configuration names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agents.sources.base import Reading, Source
from agents.sources.json_endpoint import JsonEndpointSource
from agents.sources.nginx_status import NginxStatusSource
from agents.sources.port_connections import PortConnectionsSource
from dnslb.agent_config import SourceConfig
from dnslb.errors import ConfigError

SOURCES: Mapping[str, Callable[[Any], Source]] = {
    NginxStatusSource.name: NginxStatusSource,
    PortConnectionsSource.name: PortConnectionsSource,
    JsonEndpointSource.name: JsonEndpointSource,
}
"""Each source's implementation, by the ``type`` of its configuration."""


def create_source(config: SourceConfig) -> Source:
    """The source ``config`` describes (chosen by its ``type``); :class:`ConfigError` when this
    agent has no implementation of it."""
    try:
        source = SOURCES[config.type]
    except KeyError:
        known = ", ".join(sorted(SOURCES))
        raise ConfigError("source", [f"{config.type!r}: unknown (known: {known})"]) from None
    return source(config)


__all__ = ["SOURCES", "Reading", "Source", "create_source"]
