"""What produced a result: versions, git revision, time, machine and device (results.json).

A result that does not describe itself cannot be reproduced; every results.json carries this
block and a ``schema_version``.
"""

from __future__ import annotations

import datetime
import platform
import subprocess
from importlib import metadata
from pathlib import Path

# 3: results.json is AuditResult.to_dict() (docs/results.md): every field of a bound / claim
# row and of the verdict written (None as null); the claim no longer repeated as upper_bound.
# 4: the PRIVACY BUG verdict's own failure probability: verdict.refutation_level, .warnings,
# .white_box_warned; claim rows' refuted / refutation_level; white-box checks are CheckResults
# (kind, level, warning_level, warning); refutation_per_statement
# 5: the training data's epsilon from both sides: verdict.training_data (epsilon_claimed,
# epsilon_upper, epsilon_lower, premises, sentence); white_box.canary_independence
# 6: the verdict is the user's claim's: status not_verified (a premise unseen), verdict.claim
# (accountant, history, delta and whether the user gave it, target epsilon), .verified, and
# .stress_test (the every-step canaries' own claim and numbers, apart); the message's first
# paragraph is the user's claim only
SCHEMA_VERSION = 6
_PACKAGES = ("dpaudit", "torch", "opacus", "numpy", "scipy", "hydra-core")


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_revision(start: str | Path | None = None) -> str | None:
    """The git commit of the source tree dpaudit runs from (None outside a checkout)."""
    here = Path(start) if start is not None else Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=5, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    rev = out.stdout.strip()
    if out.returncode != 0 or not rev:
        return None
    dirty = subprocess.run(
        ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True, text=True, timeout=5, check=False,
    ).stdout.strip()
    return rev + ("-dirty" if dirty else "")


def provenance(device: str | None = None) -> dict:
    """Versions, git revision, UTC timestamp, Python, platform and the device used."""
    return {
        "schema_version": SCHEMA_VERSION,
        "versions": {name: _version(name) for name in _PACKAGES},
        "git_revision": git_revision(),
        "timestamp_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
    }


def stamped(result: dict, device: str | None = None) -> dict:
    """``result`` with the top-level ``schema_version`` and ``provenance`` every task's results
    file carries (audits, Figure 3, the mean lab, stats_demo), unless it already has them."""
    out = dict(result)
    out.setdefault("schema_version", SCHEMA_VERSION)
    out.setdefault("provenance", provenance(device))
    return out
