"""The user's claim about their training data, read exactly as they made it (DESIGN 4.5, "the
claim as the user made it").

A user who trains with Opacus claims "this training is (epsilon, delta)-DP", where epsilon is
what their accountant (RDP, PRV or GDP) computes on its history at *their* delta. Opacus keeps
the accountant and its history (the mechanism and the steps, like Opacus' own accountant
state) but not the target delta, so the audit asks for it and says when it used its own. The
claim is resolved once, like the settings (``resolve_user_claim`` for the own loop,
``claim_of_run`` for the CLI's trainings), and passed down as one value: the verdict's status,
message and upper side all read it, never a default accountant of their own.

Two facts about the claim are said beside it, in the verdict: a delta at or above 1/n protects
nobody (a mechanism that publishes a random 1/n of the records in the clear meets it), and a
target epsilon below what the user's own accountant computes is not the claim their training
makes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from dpaudit._validate import check_open_unit
from dpaudit.accounting import ACCOUNTANTS, history_epsilon

DEFAULT_DELTA = 1e-5  # dpaudit's delta where the user gave none (said in the verdict)
DEFAULT_ACCOUNTANT = "prv"  # Opacus' default, where no engine says which one the user reads


@dataclass(frozen=True)
class UserClaim:
    """The user's (epsilon, delta) claim about the training data.

    Attributes:
        accountant: the accountant whose epsilon the user reads (``rdp`` / ``prv`` / ``gdp``).
        accountant_source: where that was read ("the PrivacyEngine's accountant", ...).
        history: the accountant's history, (noise multiplier, sample rate, steps) entries, or
            None when no engine was given.
        delta: the claim's delta.
        delta_given: whether the user gave it (False: dpaudit's ``DEFAULT_DELTA``).
        delta_source: where it was read ("delta=", "dp.delta", "threat_model.delta").
        target_epsilon: the epsilon the user aimed at (``make_private_with_epsilon``'s
            target), when given.
        dataset_size: n, the examples the training sampled from, when known.
        dataset_size_range: (lo, hi) when n is known only to within rounding (from the
            optimizer's expected batch size and the accountant's rate).
        dataset_size_source: where n was read.
        engine_epsilons: Opacus' epsilon of the history at ``delta`` by every accountant
            (``AccountantEpsilon.to_dict`` form), when the history is known.
    """

    accountant: str
    accountant_source: str
    history: tuple | None
    delta: float
    delta_given: bool
    delta_source: str
    target_epsilon: float | None = None
    dataset_size: int | None = None
    dataset_size_range: tuple[int, int] | None = None
    dataset_size_source: str | None = None
    engine_epsilons: dict | None = None

    def epsilon(self) -> float | None:
        """The user's accountant's epsilon of its history at the claim's delta (None without
        a history)."""
        row = (self.engine_epsilons or {}).get(self.accountant)
        eps = None if row is None else row.get("epsilon")
        return float(eps) if eps is not None and np.isfinite(eps) else None

    def smallest_n(self) -> int | None:
        """The smallest data set size consistent with what is known (None: unknown)."""
        if self.dataset_size is not None:
            return int(self.dataset_size)
        return None if self.dataset_size_range is None else int(self.dataset_size_range[0])

    def delta_note(self) -> str | None:
        """The verdict's words when delta >= 1/n (None when it is below, or n is unknown)."""
        n = self.smallest_n()
        if n is None or self.delta < 1.0 / n:
            return None
        return (f"delta {self.delta:.2g} is at least 1/n = 1/{n:,}: an epsilon at that delta "
                "does not protect individuals (publishing a random 1/n of the records in the "
                "clear meets it)")

    def target_note(self) -> str | None:
        """The verdict's words when the user's accountant exceeds their target epsilon."""
        eps = self.epsilon()
        if self.target_epsilon is None or eps is None:
            return None
        if eps <= self.target_epsilon * (1 + 1e-9):
            return None
        return (f"your {self.accountant.upper()} accountant gives {eps:.4g} at delta "
                f"{self.delta:.2g}, above your target {self.target_epsilon:.4g}")

    def to_dict(self) -> dict:
        """Plain JSON (results.json's ``verdict.claim``)."""
        out = asdict(self)
        out["history"] = None if self.history is None else [list(h) for h in self.history]
        out["dataset_size_range"] = (None if self.dataset_size_range is None
                                     else list(self.dataset_size_range))
        out["epsilon"] = self.epsilon()
        return out

    @classmethod
    def from_dict(cls, d: dict) -> UserClaim:
        """The inverse of ``to_dict`` (keys it does not know are ignored)."""
        keys = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in keys}
        if kw.get("history") is not None:
            kw["history"] = tuple(tuple(h) for h in kw["history"])
        if kw.get("dataset_size_range") is not None:
            kw["dataset_size_range"] = tuple(kw["dataset_size_range"])
        return cls(**kw)


def _history_epsilons(history, delta: float) -> dict:
    return {a: history_epsilon(list(history), delta, a).to_dict() for a in ACCOUNTANTS}


def _check_accountant(name: str, where: str) -> str:
    if name not in ACCOUNTANTS:
        raise ValueError(f"{where} must be one of {ACCOUNTANTS}, got {name!r}")
    return name


def resolve_user_claim(*, privacy_engine=None, delta: float | None = None,
                       target_epsilon: float | None = None, threat_model=None,
                       dataset_size: int | None = None,
                       dataset_size_range: tuple[int, int] | None = None,
                       dataset_size_source: str | None = None) -> UserClaim:
    """The own loop's claim, from what ``audit_report`` was given (module doc).

    Args:
        privacy_engine: the ``opacus.PrivacyEngine`` (its accountant and history), or None.
        delta: the user's delta; None: the ``threat_model``'s when one is given, else
            ``DEFAULT_DELTA`` (and the verdict says it is not the user's). A delta that
            differs from a given ``threat_model``'s is refused.
        target_epsilon: the epsilon the user aimed at, when they want it compared.
        threat_model: the canaries' ``ThreatModel``, when the caller passed one.
        dataset_size / dataset_size_range / dataset_size_source: n, or its range, and where
            it was read.
    """
    if delta is not None:
        delta = check_open_unit(delta, "delta")
        if threat_model is not None and abs(float(threat_model.delta) - delta) > 1e-15 * delta:
            raise ValueError(
                f"delta: {delta:g} conflicts with threat_model.delta = {threat_model.delta:g}: "
                "the claim has one delta (pass the same, or leave delta out to use the threat "
                "model's)")
        given, source = True, "delta="
    elif threat_model is not None:
        delta, given, source = float(threat_model.delta), True, "threat_model.delta"
    else:
        delta, given, source = DEFAULT_DELTA, False, "dpaudit's default"
    if target_epsilon is not None and not (isinstance(target_epsilon, (int, float))
                                           and not isinstance(target_epsilon, bool)
                                           and np.isfinite(target_epsilon)
                                           and target_epsilon > 0):
        raise ValueError(f"target_epsilon must be a positive number, got {target_epsilon!r}")
    history, epsilons = None, None
    if privacy_engine is not None:
        acc = getattr(privacy_engine, "accountant", None)
        if acc is None or not hasattr(acc, "history"):
            raise ValueError("privacy_engine must be an opacus.PrivacyEngine with an "
                             "accountant")
        name = _check_accountant(acc.mechanism(), "privacy_engine.accountant.mechanism()")
        accountant_source = "the PrivacyEngine's accountant"
        history = tuple(tuple(h) for h in acc.history)
        epsilons = _history_epsilons(history, delta)
    else:
        name = DEFAULT_ACCOUNTANT
        accountant_source = ("no PrivacyEngine given: Opacus' default accountant, on the "
                             "optimizer's settings as recorded")
    return UserClaim(
        accountant=name, accountant_source=accountant_source, history=history, delta=delta,
        delta_given=given, delta_source=source,
        target_epsilon=None if target_epsilon is None else float(target_epsilon),
        dataset_size=None if dataset_size is None else int(dataset_size),
        dataset_size_range=dataset_size_range, dataset_size_source=dataset_size_source,
        engine_epsilons=epsilons)


def claim_of_run(engine_accountants: dict | None, *, delta: float, accountant: str | None,
                 history=None, dataset_size: int | None = None,
                 delta_source: str = "dp.delta") -> UserClaim:
    """The claim of a training dpaudit ran itself (the CLI, ``run_audit``): its engine's
    accountant (``accountant``; PRV when unknown) and history, at the settings' delta."""
    name = accountant if accountant in ACCOUNTANTS else DEFAULT_ACCOUNTANT
    return UserClaim(
        accountant=name,
        accountant_source=("the training's PrivacyEngine" if accountant in ACCOUNTANTS
                           else "Opacus' default accountant"),
        history=None if history is None else tuple(tuple(h) for h in history),
        delta=float(delta), delta_given=True, delta_source=delta_source,
        dataset_size=dataset_size,
        dataset_size_source=None if dataset_size is None else "the training's data set",
        engine_epsilons=engine_accountants)

