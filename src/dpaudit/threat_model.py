"""The threat model of an audit as one frozen value: what the accountant claims for a canary.

A canary's neighbouring pair is "training with it" vs "training without it". What DP-SGD's
accountant promises about that pair depends on the noise multiplier sigma, the clip norm C,
how often the canary enters the noisy sum (its per-step sample rate: 1 for gradient canaries
inserted at every step, q for input canaries and for gradient canaries inserted like a real
example), the number of steps T, delta, and the canary's norm relative to C (a gradient
canary of norm r C has sensitivity r, i.e. an effective noise multiplier sigma / r).

The claim is a whole trade-off curve (DESIGN 4.5):

* every step (sample rate 1): exactly mu-GDP with mu = sqrt(T) r / sigma;
* Poisson-subsampled: the curve of Opacus' PRV privacy profile, shifted by its error bounds
  so it stays below the true trade-off curve (``accounting.subsampled_gaussian_tradeoff``).

This differs from the epsilon Opacus reports for the *training data* whenever the canaries
are not inserted like a real example (every-step gradient canaries: q = 1, not the data's q),
which ``training_sample_rate`` keeps beside it so reports can say so.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, fields, replace

import numpy as np
from scipy.special import ndtr, ndtri

from dpaudit import names
from dpaudit._validate import check_delta, require_choice
from dpaudit.accounting import (
    AccountantEpsilon,
    ProfileRoc,
    ProfileRocInverse,
    all_accountants,
    prv_epsilon,
    subsampled_gaussian_profile_grid,
)
from dpaudit.stats.gdp import gdp_epsilon

CANARY_KINDS = names.CANARY_KINDS
_NORM_TOLERANCE = 1e-6  # relative: a canary norm up to C (1 + 1e-6) counts as C
_REQUIRED = ("noise_multiplier", "max_grad_norm", "sample_rate", "steps", "delta")


@dataclass(frozen=True)
class ThreatModel:
    """What the accountant claims about one canary (module docstring).

    Args:
        noise_multiplier: sigma of the DP optimizer (noise std = sigma C).
        max_grad_norm: the clip norm C.
        sample_rate: probability that the canary enters a step's noisy sum (1 = every step).
        steps: number of optimizer steps T.
        delta: the delta at which epsilons are reported (0 < delta < 1).
        canary_kind: ``"gradient"`` or ``"input"``.
        canary_norm: norm of gradient canaries (<= C); None means C (input canaries: C).
        training_sample_rate: the data's Poisson sample rate, i.e. what Opacus' own epsilon
            for the training set is computed with (None when unknown).
    """

    noise_multiplier: float
    max_grad_norm: float
    sample_rate: float
    steps: int
    delta: float
    canary_kind: str = "input"
    canary_norm: float | None = None
    training_sample_rate: float | None = None

    def __post_init__(self) -> None:
        for name in ("noise_multiplier", "max_grad_norm"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and np.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite positive number, got {v!r}")
        if not 0.0 < float(self.sample_rate) <= 1.0:
            raise ValueError(f"sample_rate must lie in (0, 1], got {self.sample_rate!r}")
        if int(self.steps) != self.steps or self.steps < 1:
            raise ValueError(f"steps must be a positive integer, got {self.steps!r}")
        check_delta(self.delta)
        require_choice("canary_kind", self.canary_kind, CANARY_KINDS)
        if self.canary_norm is not None:
            r = float(self.canary_norm)
            if not np.isfinite(r) or r <= 0:
                raise ValueError(f"canary_norm must be a finite positive number, got {r!r}")
            if r > self.max_grad_norm * (1 + _NORM_TOLERANCE):
                raise ValueError(
                    f"canary_norm={r} exceeds the clip norm max_grad_norm={self.max_grad_norm}: "
                    "such a canary is not a neighbouring record"
                )
        if self.training_sample_rate is not None and not 0 < self.training_sample_rate <= 1:
            raise ValueError(
                f"training_sample_rate must lie in (0, 1], got {self.training_sample_rate!r}"
            )

    # --- derived quantities -------------------------------------------------------------
    @property
    def sensitivity(self) -> float:
        """Canary norm / C (1 for input canaries and full-norm gradient canaries)."""
        if self.canary_norm is None:
            return 1.0
        return min(1.0, float(self.canary_norm) / self.max_grad_norm)

    @property
    def every_step(self) -> bool:
        """True when the canary enters every step (the q = 1 composition)."""
        return float(self.sample_rate) == 1.0

    def effective_noise(self, noise_multiplier: float | None = None) -> float:
        """Noise multiplier seen by the canary: sigma / sensitivity."""
        sigma = self.noise_multiplier if noise_multiplier is None else float(noise_multiplier)
        return sigma / self.sensitivity

    def mu(self, noise_multiplier: float | None = None) -> float | None:
        """GDP parameter sqrt(T) r / sigma when every step, else None (no GDP closed form)."""
        if not self.every_step:
            return None
        return float(np.sqrt(self.steps) / self.effective_noise(noise_multiplier))

    def accountants(self, noise_multiplier: float | None = None) -> dict[str, AccountantEpsilon]:
        """Opacus' RDP, PRV and GDP epsilons for this threat model (at another sigma if given)."""
        return all_accountants(
            self.effective_noise(noise_multiplier), self.sample_rate, self.steps, self.delta
        )

    def exact_epsilon(self, noise_multiplier: float | None = None) -> float | None:
        """Exact epsilon where known in closed form (every step: the Gaussian mechanism)."""
        mu = self.mu(noise_multiplier)
        return None if mu is None else gdp_epsilon(mu, self.delta)

    def claimed_epsilon(self, noise_multiplier: float | None = None) -> float:
        """The epsilon the claim amounts to at ``delta``: exact where known, else the smaller
        of the RDP and PRV accountants (both upper bounds)."""
        exact = self.exact_epsilon(noise_multiplier)
        if exact is not None:
            return exact
        acc = self.accountants(noise_multiplier)
        return float(min(acc["rdp"].epsilon, acc["prv"].epsilon))

    def estimated_epsilon(self, noise_multiplier: float) -> float:
        """Epsilon of the DP-SGD family member at ``noise_multiplier`` (same q, T, C): exact
        where known, else the PRV accountant's (``accounting.prv_epsilon``, Opacus' number to
        rounding, faster at large q). For effective-noise estimates, not for the claim."""
        exact = self.exact_epsilon(noise_multiplier)
        if exact is not None:
            return exact
        sigma = self.effective_noise(noise_multiplier)
        return prv_epsilon(sigma, float(self.sample_rate), int(self.steps), self.delta)

    @property
    def accountant_name(self) -> str:
        """Which accountant the claim comes from, in words."""
        if self.every_step:
            return "exact Gaussian mechanism (mu-GDP, q = 1 composition)"
        return "Opacus PRV accountant (Poisson-subsampled Gaussian, with its error bounds)"

    def tradeoff(self, alpha, noise_multiplier: float | None = None) -> np.ndarray:
        """Claimed trade-off curve: the smallest FNR any test may have at FPR ``alpha``.

        At the configured sigma, or at ``noise_multiplier`` with everything else unchanged
        (the DP-SGD family used for the effective-noise bound). Symmetric in the pair's order.
        """
        a = np.asarray(alpha, dtype=np.float64)
        return _tradeoff(
            self.effective_noise(noise_multiplier), float(self.sample_rate), int(self.steps), a
        )

    def roc_curve(self, alpha, noise_multiplier: float | None = None) -> np.ndarray:
        """The same claim as an ROC upper curve: the largest TPR at FPR ``alpha``."""
        return 1.0 - self.tradeoff(alpha, noise_multiplier)

    def roc_inverse(self, tpr, noise_multiplier: float | None = None) -> np.ndarray:
        """The smallest FPR at which the claimed ROC reaches ``tpr`` (the inverse of
        ``roc_curve``), in closed form: Phi(Phi^-1(tpr) - mu) every step, the profile's lines
        otherwise (``accounting.roc_inverse_from_profile``). Used by the one-run claim test."""
        y = np.asarray(tpr, dtype=np.float64)
        sigma = self.effective_noise(noise_multiplier)
        q, steps = float(self.sample_rate), int(self.steps)
        if q == 1.0:
            with np.errstate(divide="ignore"):
                return ndtr(ndtri(y) - np.sqrt(steps) / sigma)
        return _profile_roc_inverse(sigma, q, steps)(y)

    def clt_noise_for_mu(self, mu: float) -> float:
        """Noise multiplier whose CLT (GDP-accountant) mu equals ``mu``, a starting guess:
        mu = q sqrt(T (e^{1/s^2} - 1)) with s = sigma / sensitivity (exact when q = 1)."""
        if mu <= 0:
            return float("inf")
        if self.every_step:
            return float(np.sqrt(self.steps) * self.sensitivity / mu)
        ratio = (mu / self.sample_rate) ** 2 / self.steps
        return float(self.sensitivity / np.sqrt(np.log1p(ratio)))

    def with_noise(self, noise_multiplier: float) -> ThreatModel:
        """The same threat model at another noise multiplier."""
        return replace(self, noise_multiplier=float(noise_multiplier))

    def describe(self) -> str:
        """One line for reports: the canary, how often it is inserted, sigma, T, C, delta."""
        how = "every step" if self.every_step else f"with probability q={self.sample_rate:.4g}"
        norm = "" if self.canary_kind == "input" else f", norm {self.sensitivity:.3g} C"
        return (
            f"{self.canary_kind} canaries{norm} inserted {how}, T={self.steps}, "
            f"sigma={self.noise_multiplier:g}, C={self.max_grad_norm:g}, delta={self.delta:g}"
        )

    @classmethod
    def from_dict(cls, d: dict) -> ThreatModel:
        """Rebuild from ``to_dict()`` output (derived keys are ignored)."""
        names = {f.name for f in fields(cls)}
        missing = sorted(n for n in names if n not in d and n in _REQUIRED)
        if missing:
            raise ValueError(f"threat model record lacks {missing}")
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_dict(self) -> dict:
        """Plain dictionary of the fields plus the derived numbers reports show."""
        out = asdict(self)
        out["sensitivity"] = self.sensitivity
        out["every_step"] = self.every_step
        out["mu"] = self.mu()
        out["accountant"] = self.accountant_name
        return out


@functools.lru_cache(maxsize=64)
def _subsampled_profile(sigma: float, q: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The PRV-based privacy profile of the claim, memoised per (sigma, q, T)."""
    return subsampled_gaussian_profile_grid(sigma, q, steps)


@functools.lru_cache(maxsize=64)
def _profile_roc(sigma: float, q: float, steps: int) -> ProfileRoc:
    """``tradeoff_from_profile`` of the claim's profile, prepared once per (sigma, q, T)
    (``accounting.ProfileRoc``: the same numbers, or larger TPRs by a rounding, O(log n) per
    FPR)."""
    return ProfileRoc(*_subsampled_profile(sigma, q, steps))


@functools.lru_cache(maxsize=64)
def _profile_roc_inverse(sigma: float, q: float, steps: int) -> ProfileRocInverse:
    """``roc_inverse_from_profile`` of the claim's profile, prepared once per (sigma, q, T)
    (``accounting.ProfileRocInverse``: the same numbers, O(log n) per TPR)."""
    return ProfileRocInverse(*_subsampled_profile(sigma, q, steps))


def _tradeoff(sigma: float, q: float, steps: int, alpha: np.ndarray) -> np.ndarray:
    if np.any((alpha < 0) | (alpha > 1)) or not np.all(np.isfinite(alpha)):
        raise ValueError("alpha must lie in [0, 1]")
    if q == 1.0:
        mu = np.sqrt(steps) / sigma
        with np.errstate(divide="ignore"):
            return ndtr(ndtri(1.0 - alpha) - mu)
    return np.maximum(0.0, 1.0 - _profile_roc(sigma, q, steps)(alpha))
