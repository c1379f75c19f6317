"""The manager: collects utilization from agents, publishes the plan, scales the pools."""
