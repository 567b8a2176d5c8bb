"""The audit, end to end: the settings (``settings``) resolved once into a plan (``plan``),
the trainings wing (``trainings``: one-run and multi-run audits) and the judging wing
(``judging``: evaluation, verdict, reports), joined by ``audit`` (DESIGN 3).

``run_audit(output_dir=..., data={...}, model={...}, dp={...}, canary={...}, attack={...},
audit={...})`` is the Python entry point; the ``dpaudit`` CLI calls the same function.
``audit_report(hook, privacy_engine=...)`` gives the same report for your own training loop.
"""

import importlib

# Imported on first use, so that ``dpaudit.experiment.settings`` (the CLI's config schema)
# stays free of torch.
_LAZY = {
    "evaluate": "dpaudit.experiment.audit",
    "run_audit": "dpaudit.experiment.audit",
    "BUGS": "dpaudit.bugs",
    "plant_bug": "dpaudit.bugs",
    "plant_sampler_bug": "dpaudit.bugs",
    "audit_report": "dpaudit.experiment.judging.loop_report",
    "aggregate": "dpaudit.experiment.trainings.multirun",
    "run_multi": "dpaudit.experiment.trainings.multirun",
    "RunRecord": "dpaudit.experiment.trainings.run",
    "audit_run": "dpaudit.experiment.trainings.run",
    "AuditSettings": "dpaudit.experiment.settings",
    "AuditPlan": "dpaudit.experiment.plan",
    "plan_audit": "dpaudit.experiment.plan",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dpaudit.experiment' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "BUGS",
    "AuditPlan",
    "AuditSettings",
    "RunRecord",
    "aggregate",
    "audit_report",
    "audit_run",
    "evaluate",
    "plan_audit",
    "plant_bug",
    "plant_sampler_bug",
    "run_audit",
    "run_multi",
]
