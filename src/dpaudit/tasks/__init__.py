"""Hydra tasks: what a preset's ``task._target_`` names, each a thin function over the Python API.

* ``audit.audit_task``: the audit (``experiment=default``, ``bug_*``, ``tight_*``, ...), over
  ``dpaudit.experiment.run_audit``;
* ``figure3.figure3``: the seed 001 Figure 3 experiment (``experiment=fig3_*``);
* ``meanlab_figures.*``: the empirical-mean lab's figures (``experiment=meanlab_*``);
* ``stats_demo.stats_demo``: every lower-bound method on synthetic mu-GDP scores;
* ``aggregate.main``: the ``dpaudit-aggregate`` console command.

A task takes ``output_dir`` (the CLI passes Hydra's run directory), writes its JSON and plots
there and returns its results. Nothing else in the package imports this one.
"""
