"""Agents that run beside the servers dnslb balances and report to the manager.

:mod:`agents.node_agent` is the agent of a single-IP cluster node: it installs the dispatch
table the manager pushes into the node's packet filter through a dispatch driver
(:mod:`agents.dispatch_drivers`) and posts heartbeats with the node's utilization.
"""
