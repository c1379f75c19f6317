"""Load tests of the lab with locust: users that resolve through the lab's DNS as real ones do.

- :mod:`lab.loadtest.resolver`: a client's own resolver cache, honouring TTLs (or not);
- :mod:`lab.loadtest.shape`: the step load (users raised gradually in steps, as in the paper);
- :mod:`lab.loadtest.locustfile`: the locust user and shape
  (``locust -f lab/loadtest/locustfile.py``);
- :mod:`lab.loadtest.run`: ``dnslb loadtest``, a headless run against a lab, with CSV output.

Imports the :mod:`dnslb` core only (and locust, in the locustfile).
"""
