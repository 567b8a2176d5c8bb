"""The trainings wing of an audit: set up, train and record runs (DESIGN 3, steps 1-4).

``run.prepare_run`` / ``run.audit_run`` train one audited run of an ``AuditPlan``
(``experiment.plan``: the settings resolved once; this wing never sees the settings) into a
``RunRecord`` (``training``: Opacus with the capture hook; ``canary_setup``: the canaries;
``scores``: the attack scores); ``engine`` plans, claims and trains many runs with any number
of workers, and ``multirun`` is the multi-run audit on top of it (the one module here that
takes the settings: it writes them into its files). Nothing here judges a run: the judging
wing (``experiment.judging``) reads the records, and ``experiment.audit`` joins the two.
"""
