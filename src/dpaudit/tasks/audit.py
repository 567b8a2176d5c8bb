"""The audit as a Hydra task (``experiment=default``, ``bug_*``, ``tight_*``, ...)."""

from __future__ import annotations

from dpaudit.experiment.audit import run_audit

__all__ = ["audit_task"]


def audit_task(output_dir: str | None = None, **groups) -> dict:
    """Hydra task (``experiment=audit_*``): group mappings in, report written to output_dir."""
    return run_audit(output_dir=output_dir, **groups)
