"""The ``dnslb`` command line: the composition root, the one package that imports every component.

- :mod:`cli.main`: the entry point and its subcommands;
- :mod:`cli.ctl`: ``dnslb ctl``, a client of the REST API;
- :mod:`cli.docgen`: ``dnslb docs``, the configuration references in docs/.
"""
