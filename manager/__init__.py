"""The manager: collects utilization from agents, publishes the plan, scales the pools, and keeps
single-IP clusters' dispatch tables on their nodes (:mod:`manager.clusters`)."""
