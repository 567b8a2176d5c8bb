"""``CheckResult``: one typed outcome for every white-box check, statistical or deterministic.

A check refutes DP-SGD's claim about the mechanism itself (the noise, the sampling, the
clipping, the accountant's bookkeeping). Statistical checks carry a p-value (already corrected
for the comparisons the check makes inside itself) and two levels: ``level``, the check's share
of the PRIVACY BUG verdict's failure probability (``rejected`` holds when ``p_value < level``),
and ``warning_level``, its share of the bounds' (``warning`` holds when the evidence is below
that level but not below ``level``: reported, not a bug). Deterministic checks state a fact
about what the optimizer did: ``p_value`` is 0 when they fire and 1 otherwise, and they have no
levels. ``run_audit``, the CLI and ``audit_report`` build and print the same records.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from dpaudit._jsonable import to_jsonable

STATISTICAL = "certified (statistical)"
DETERMINISTIC = "certified (deterministic)"


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one white-box check (module doc).

    Attributes:
        name: the check's name (``noise_scale``, ``clipping``, ...).
        kind: ``STATISTICAL`` or ``DETERMINISTIC``.
        rejected: the claim is refuted (statistical: ``p_value < level``).
        p_value: the smallest p-value found, corrected inside the check (deterministic: 0 when
            the check fired, else 1).
        level: the check's share of the PRIVACY BUG verdict's failure probability (None for a
            deterministic check).
        statement: what the check tests, in words.
        witness: where the strongest evidence was found (a step, a tensor, a lag ...).
        checked / unchecked: what the check examined and what it could not, in words.
        details: numbers for the report and the plots.
        warning_level: the check's share of the bounds' failure probability; ``p_value``
            below it but not below ``level`` is a warning (None: no warning level).
        noted: a deterministic fact short of a refutation, reported as a warning (a clipped
            contribution above C whose epsilon cost is within the stated tolerance).
    """

    name: str
    kind: str
    rejected: bool
    p_value: float
    level: float | None
    statement: str
    witness: dict[str, Any] = field(default_factory=dict)
    checked: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    warning_level: float | None = None
    noted: bool = False

    @property
    def statistical(self) -> bool:
        return self.kind == STATISTICAL

    @property
    def warning(self) -> bool:
        """Evidence against the claim at the bounds' level, short of the PRIVACY BUG level."""
        return bool(
            not self.rejected
            and (self.noted or (self.warning_level is not None
                                and self.p_value < self.warning_level))
        )

    def at_levels(self, level: float, warning_level: float) -> CheckResult:
        """The same statistical evidence judged at ``level`` (refutation) and
        ``warning_level`` (the bounds' share)."""
        if not self.statistical:
            return self
        return replace(self, level=level, warning_level=warning_level,
                       rejected=bool(self.p_value < level))

    def to_dict(self) -> dict[str, Any]:
        out = to_jsonable(asdict(self))
        out["warning"] = self.warning
        return out


def deterministic(name: str, fired: bool, statement: str, *, witness=None, checked=(),
                  unchecked=(), details=None, warn: bool = False) -> CheckResult:
    """A deterministic check's result: a fact, no levels (``warn``: a fact reported as a
    warning, short of a refutation)."""
    return CheckResult(
        name=name, kind=DETERMINISTIC, rejected=bool(fired), p_value=0.0 if fired else 1.0,
        level=None, statement=statement, witness=dict(witness or {}), checked=list(checked),
        unchecked=list(unchecked), details=dict(details or {}), noted=bool(warn and not fired),
    )
