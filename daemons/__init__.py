"""Starting, checking and stopping the real parts the product runs beside: PowerDNS
(:mod:`daemons.pdns`), nginx (:mod:`daemons.nginx`), and the process helpers they share
(:mod:`daemons.process`).
"""
