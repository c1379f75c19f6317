"""The local lab: the whole product on one machine, loaded and measured.

- :mod:`lab.objects`: the objects the lab serves, their sizes (deterministic);
- :mod:`lab.origin`: the lab's origin web server (``dnslb origin``);
- :mod:`lab.settings`: what a lab runs with, and the manager configuration it generates;
- :mod:`lab.runner`: starting and stopping the lab's processes (``dnslb lab``);
- :mod:`lab.history`: the manager's events and servers, kept through its REST API while it runs;
- :mod:`lab.report`: the paper's columns and plots of a run (``dnslb report``);
- :mod:`lab.experiments`: the paper's cases replayed on the lab (``dnslb experiments``);
- :mod:`lab.command`: the command lines, options turned into the settings above.

The lab imports the :mod:`dnslb` core only: the manager, PowerDNS, nginx, agents and locust run as
processes, and their results are read from the files they write and from the manager's API.
"""
