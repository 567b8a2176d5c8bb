"""dpaudit: white-box auditing of DP-SGD.

Evidence about epsilon from membership attacks on canaries, next to the claim that Opacus'
accountant makes for the same threat model. See README.md and docs/.

The most used names are available at the top level (imported on first use, so that
``import dpaudit.stats`` stays free of torch):

    import dpaudit
    dpaudit.add_canary_block(model)  # before make_private: coordinates no data reach
    hook = dpaudit.AuditHook(optimizer, model, data_loader=loader)  # canaries picked
    dpaudit.epsilon_lower_bound(scores_in, scores_out, delta=1e-5, method="gdp")
    dpaudit.run_audit(output_dir="out", dp={...}, canary={...})
    dpaudit.audit_report(hook, privacy_engine=engine, output_dir="out")  # your own loop
    dpaudit.register_score("mine", builder)  # also register_dataset / _model / _bound

``dir(dpaudit)`` lists this API and the subpackages. In the repository: the user guide
``docs/`` (``docs/index.md``; how to read a report: ``docs/evidence.md``), the tutorial
``notebooks/audit_your_opacus_model.ipynb`` and ``README.md``. Module docstrings cite sections
of the design reference ``docs/design.md`` as "DESIGN x.y".
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "AuditHook": "dpaudit.capture",
    "add_canary_block": "dpaudit.capture",
    "load_dataset": "dpaudit.data",
    "GradientCanaries": "dpaudit.capture",
    "InputCanaries": "dpaudit.capture",
    "epsilon_lower_bound": "dpaudit.stats",
    "roc_curve": "dpaudit.stats",
    "accountant_epsilon": "dpaudit.accounting",
    "run_audit": "dpaudit.experiment",
    "AuditSettings": "dpaudit.experiment",
    "audit_report": "dpaudit.experiment",
    "ThreatModel": "dpaudit.threat_model",
    "claim_test": "dpaudit.stats.claim",
    "AuditResult": "dpaudit.report.results",
    "register_dataset": "dpaudit.data",
    "register_model": "dpaudit.models",
    "register_score": "dpaudit.experiment.trainings.scores",
    "register_bound": "dpaudit.stats.bounds",
}

__all__ = ["__version__", *_LAZY]

# Subpackages and modules (``import dpaudit.stats`` etc.); shown by ``dir(dpaudit)``.
_SUBMODULES = (
    "accounting", "attacks", "bugs", "canaries", "capture", "cli", "conf", "covariance", "data",
    "experiment", "forecast", "gradients", "meanlab", "models", "names", "papers", "registry",
    "report", "sampler_bugs", "seeds", "stats", "tasks", "threat_model", "validity",
)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"dpaudit.{name}")
    raise AttributeError(f"module 'dpaudit' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API (``__all__``) and the subpackages, not the module's internals."""
    return sorted({*__all__, *_SUBMODULES})
