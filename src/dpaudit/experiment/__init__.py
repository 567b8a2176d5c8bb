"""The audit, end to end: one-run and multi-run audits, evaluation and reports (DESIGN 3).

``run_audit(output_dir=..., data={...}, model={...}, dp={...}, canary={...}, attack={...},
audit={...})`` is the Python entry point; the ``dpaudit`` CLI calls the same function.
``audit_report(hook, privacy_engine=...)`` gives the same report for your own training loop.
"""

from dpaudit.experiment.audit import audit_task, evaluate, run_audit
from dpaudit.experiment.bugs import BUGS, plant_bug
from dpaudit.experiment.loop_report import audit_report
from dpaudit.experiment.multirun import aggregate, run_multi
from dpaudit.experiment.run import RunRecord, audit_run
from dpaudit.experiment.settings import AuditSettings

__all__ = [
    "BUGS",
    "AuditSettings",
    "RunRecord",
    "aggregate",
    "audit_report",
    "audit_run",
    "audit_task",
    "evaluate",
    "plant_bug",
    "run_audit",
    "run_multi",
]
