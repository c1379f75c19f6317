"""The simulator: the product's policy, autoscaler and answer selection on a simulated fleet.

``dnslb sim`` replays the evaluation of the research this product comes from (a step load on a
pool of cache servers behind DNS) and any other scenario, at any scale, and reports the paper's
columns. It imports the product's pure core only (:mod:`dnslb.policy`, :mod:`dnslb.scaling`,
:mod:`dnslb.selection`, :mod:`dnslb.plan`) and calls it as the manager and the pipe backend do;
everything else (clients, resolvers, servers, the cloud) is modelled here.

- :mod:`sim.scenario`: scenario files (YAML) into frozen dataclasses, with cases;
- :mod:`sim.engine`: the discrete-event simulation, pure given a scenario and a seed;
- :mod:`sim.metrics`: what a run measured (the columns and tables are
  :mod:`evaluation.columns`'s, shared with the lab; plots are :mod:`evaluation.plots`);
- :mod:`sim.runner`: the command line, suites, output files.
"""
