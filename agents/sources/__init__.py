"""Utilization sources: where an agent reads how busy its server is, one module each.

=========  =====================================================  ===============================
``type``   reads                                                  class
=========  =====================================================  ===============================
nginx      nginx ``stub_status``: Reading + Writing - 1           :class:`NginxStatusSource`
port       established TCP connections to a local port            :class:`PortConnectionsSource`
json       the application's ``{"in_progress", "max_concurrency"}``  :class:`JsonEndpointSource`
=========  =====================================================  ===============================

:func:`create_source` builds the one a configuration names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agents.sources.base import Reading, Source
from agents.sources.json_endpoint import JsonEndpointSource
from agents.sources.nginx_status import NginxStatusSource
from agents.sources.port_connections import PortConnectionsSource
from dnslb.agent_config import SourceConfig

SOURCES: Mapping[str, Callable[[Any], Source]] = {
    NginxStatusSource.name: NginxStatusSource,
    PortConnectionsSource.name: PortConnectionsSource,
    JsonEndpointSource.name: JsonEndpointSource,
}


def create_source(config: SourceConfig) -> Source:
    """The source ``config`` describes (chosen by its ``type``)."""
    return SOURCES[config.type](config)


__all__ = ["SOURCES", "Reading", "Source", "create_source"]
