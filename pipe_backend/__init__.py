"""The PowerDNS pipe backend coprocess: answers load-balanced names from the plan."""
