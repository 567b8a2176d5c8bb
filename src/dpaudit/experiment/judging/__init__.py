"""The judging wing of an audit: evidence, verdict and report from recorded runs (DESIGN 3,
steps 5-6, DESIGN 4.5).

``evaluation`` turns per-canary scores and memberships into typed evidence (``ClaimRow`` s,
``BoundRow`` s, ``Evidence``), with the confidence split of ``levels`` and the ``Verdict`` of
``verdict``; ``white_box`` adds the per-step invariant tests; ``outputs`` writes
``results.json``, the plots and the console table; ``loop_report`` judges a user's own
training loop from its hook. Nothing here trains: it reads what the trainings wing
(``experiment.trainings``) recorded, and ``experiment.audit`` joins the two.
"""
