"""Agents that run beside the servers dnslb balances and report to the manager.

:mod:`agents.agent` is the agent of a cache server (``dnslb agent --config FILE``): every
second it reads the requests in progress from a utilization source (:mod:`agents.sources`),
adds the machine's CPU and memory (:mod:`agents.host`) and posts a
:class:`~dnslb.report.Report` to the manager (:mod:`agents.manager_client`).

:mod:`agents.node_agent` is the agent of a single-IP cluster node: it installs the dispatch
table the manager pushes into the node's packet filter through a dispatch driver
(:mod:`agents.dispatch_drivers`) and posts heartbeats with the node's utilization.
"""
