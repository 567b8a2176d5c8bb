"""The weaker rungs of the threat-model ladder as validity scenarios: one canary's experiment
seen through the final parameters or the final model, with the truth known or bounded.

The canary enters T Gaussian steps (every step, unit sensitivity, noise multiplier sigma):
mu-GDP with mu = sqrt(T) / sigma for the white-box adversary. A weaker view is a function of
the releases, so its truth is at most that; each scenario draws the score such an adversary
reads by running the optimizer or the model itself (numpy, vectorised over draws):

* ``HiddenStateMomentum``: SGD with momentum beta (a constant learning rate) on the canary's
  own coordinate, scored by -(theta_T - theta_0). The final coordinate is a fixed linear
  function of the releases, sum_s w_s g_s with w_s = (1 - beta^(T - s)) / (1 - beta), so the
  view is EXACTLY a Gaussian shift with mu_view = mu sum(w) / sqrt(T sum(w^2)) (beta = 0: the
  white box's mu): the truth is exact;
* ``HiddenStateAdam``: Adam (bias-corrected moments, eps 1e-8) on the coordinate; its update
  is not linear in the releases and the view's exact trade-off curve is not known: the truth
  used is the composition's mu-GDP, an upper bound of the view's (post-processing). A
  certified bound above it would be wrong for any truth;
* ``BlackBoxFinalLoss``: the canary is an input x = v e_1 of a softmax regression with
  ``classes`` classes whose weight column and bias only the canary and the noise reach (the
  black box's best case: a pixel no example uses); every step adds its clipped gradient
  (norm <= C, at the current parameters) when it is a member, then Gaussian noise sigma C on
  every coordinate, and the score is the final model's negative loss on the canary minus the
  initial model's (``loss_gain``). Each step is a Gaussian mechanism of sensitivity C chosen
  adaptively, so the composition is mu-GDP: the truth used is that bound.

``RUNG_SCENARIOS`` are the default instances, T = 100: the nulls (the canary never enters:
truth 0, so any positive certified epsilon is wrong), small truths (sigma 40: epsilon about
0.4, which the bounds approach), and claims of epsilon 8 to 27 at delta 1e-5;
``tests/validity/test_rungs.py`` (slow) runs the certified methods and the claim test on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from scipy.special import log_softmax

from dpaudit.validity.scenarios import GaussianShift, NoSignal, Scenario


class _BoundedByGaussian(Scenario):
    """A scenario whose truth is (or is bounded by) ``GaussianShift(self.truth_mu)``: the
    hockey-stick divergences, the trade-off curve and the epsilon are that shift's (the null,
    ``signal = 0``: ``NoSignal``'s, epsilon 0: the canary never enters, members and
    non-members are drawn alike)."""

    @property
    def _shift(self) -> Scenario:
        return GaussianShift(self.truth_mu) if self.truth_mu > 0 else NoSignal()

    def _hs(self, eps, reverse):
        return self._shift._hs(eps, reverse)

    def pure_epsilon(self):
        return self._shift.pure_epsilon()

    def true_epsilon(self, delta):
        """The epsilon of ``truth_mu``-GDP at ``delta`` (exact, or an upper bound: class doc)."""
        return self._shift.true_epsilon(delta)

    def tradeoff(self, alpha):
        return self._shift.tradeoff(alpha)

    def llr(self, x):
        raise NotImplementedError(f"{type(self).__name__}: no closed-form likelihood ratio")


def _releases(n: int, steps: int, noise: float, signal: float, rng) -> np.ndarray:
    """(n, T) releases on a coordinate, in units of C: the canary (``signal``: its norm
    over C for a member, 0 for a non-member or the null) plus N(0, sigma^2)."""
    return noise * rng.standard_normal((n, steps)) + signal


class _HiddenState(_BoundedByGaussian):
    """A canary's own coordinate after T steps of a base optimizer: ``_score`` maps the (n, T)
    releases (noise plus the canary's signal when a member) to -(theta_T - theta_0); each
    subclass defines it."""

    def sample(self, n_in, n_out, rng):
        return (self._score(_releases(n_in, self.steps, self.noise, self.signal, rng)),
                self._score(_releases(n_out, self.steps, self.noise, 0.0, rng)))


@dataclass(frozen=True)
class HiddenStateMomentum(_HiddenState):
    """SGD with momentum ``beta`` on a canary's own coordinate (module doc); exact truth."""

    noise: float = 6.0
    steps: int = 100
    beta: float = 0.9
    signal: float = 1.0
    exactness: ClassVar[str] = "closed form (a linear function of the releases: mu-GDP)"

    @property
    def name(self) -> str:
        return (f"hidden_momentum{self.beta:g}_sigma{self.noise:g}_T{self.steps}"
                + ("" if self.signal == 1 else f"_signal{self.signal:g}"))

    @property
    def weights(self) -> np.ndarray:
        """w_s: how much release s moves theta_T (s = 0 .. T-1)."""
        s = np.arange(self.steps)
        if self.beta == 0:
            return np.ones(self.steps)
        return (1.0 - self.beta ** (self.steps - s)) / (1.0 - self.beta)

    @property
    def truth_mu(self) -> float:
        w = self.weights
        mu = self.signal * np.sqrt(self.steps) / self.noise
        return float(mu * w.sum() / np.sqrt(self.steps * (w * w).sum()))

    def _score(self, g: np.ndarray) -> np.ndarray:
        buf = np.zeros(g.shape[0])
        theta = np.zeros(g.shape[0])
        for t in range(g.shape[1]):  # torch.optim.SGD's momentum (dampening 0), lr 1
            buf = self.beta * buf + g[:, t] if t else g[:, t].copy()
            theta -= buf
        return -theta


@dataclass(frozen=True)
class HiddenStateAdam(_HiddenState):
    """Adam on a canary's own coordinate (module doc); truth bounded by the composition's."""

    noise: float = 6.0
    steps: int = 100
    betas: tuple[float, float] = (0.9, 0.999)
    signal: float = 1.0
    exactness: ClassVar[str] = ("upper bound: the composition's mu-GDP (the view is its "
                                "post-processing); the null (signal 0): exact")

    @property
    def name(self) -> str:
        return (f"hidden_adam_sigma{self.noise:g}_T{self.steps}"
                + ("" if self.signal == 1 else f"_signal{self.signal:g}"))

    @property
    def truth_mu(self) -> float:
        return float(self.signal * np.sqrt(self.steps) / self.noise)

    def _score(self, g: np.ndarray) -> np.ndarray:
        b1, b2 = self.betas
        m = np.zeros(g.shape[0])
        v = np.zeros(g.shape[0])
        theta = np.zeros(g.shape[0])
        for t in range(g.shape[1]):
            m = b1 * m + (1 - b1) * g[:, t]
            v = b2 * v + (1 - b2) * g[:, t] ** 2
            theta -= (m / (1 - b1 ** (t + 1))) / (np.sqrt(v / (1 - b2 ** (t + 1))) + 1e-8)
        return -theta


@dataclass(frozen=True)
class BlackBoxFinalLoss(_BoundedByGaussian):
    """The final model's loss gain on a crafted input canary (module doc); truth bounded by
    the composition's mu-GDP."""

    noise: float = 5.0
    steps: int = 100
    value: float = 10.0
    lr: float = 1.33e-4  # per unit of the summed release (Opacus: lr / B)
    classes: int = 10
    label: int = 0
    init: tuple = field(default=(0.5, -0.3, 0.2, 0.0, 0.1, -0.1, 0.3, -0.2, 0.0, 0.05))
    member_enters: bool = True  # False: the null, the canary never enters (truth 0)
    exactness: ClassVar[str] = ("upper bound: the composition's mu-GDP (each step a Gaussian "
                                "mechanism of sensitivity C); the null: exact")

    @property
    def name(self) -> str:
        return (f"black_box_loss_sigma{self.noise:g}_T{self.steps}"
                + ("" if self.member_enters else "_null"))

    @property
    def truth_mu(self) -> float:
        return float(np.sqrt(self.steps) / self.noise) if self.member_enters else 0.0

    def _loss_gain(self, n: int, member: bool, rng) -> np.ndarray:
        k, v = self.classes, self.value
        w = np.tile(np.asarray(self.init[:k], dtype=np.float64), (n, 1))  # weight column
        b = np.zeros((n, k))
        onehot = np.eye(k)[self.label]

        def neg_loss(w, b):
            return log_softmax(v * w + b, axis=1)[:, self.label]

        start = neg_loss(w, b)
        for _ in range(self.steps):
            noise = self.noise * rng.standard_normal((n, 2 * k))
            gw = gb = 0.0
            if member:  # the canary's gradient at the current parameters, clipped to C = 1
                p = np.exp(log_softmax(v * w + b, axis=1))
                gw, gb = v * (p - onehot), p - onehot
                norm = np.sqrt((gw * gw).sum(1) + (gb * gb).sum(1))[:, None]
                scale = 1.0 / np.maximum(1.0, norm)
                gw, gb = gw * scale, gb * scale
            w = w - self.lr * (gw + noise[:, :k])
            b = b - self.lr * (gb + noise[:, k:])
        return neg_loss(w, b) - start

    def sample(self, n_in, n_out, rng):
        return (self._loss_gain(n_in, self.member_enters, rng),
                self._loss_gain(n_out, False, rng))


RUNG_SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        HiddenStateMomentum(noise=6.0, steps=100, beta=0.9),
        HiddenStateMomentum(noise=2.3, steps=100, beta=0.0),
        HiddenStateAdam(noise=6.0, steps=100),
        BlackBoxFinalLoss(noise=4.998886197090085, steps=100),
        # the nulls: the canary never enters, truth 0 (any positive certified epsilon is wrong)
        HiddenStateMomentum(noise=6.0, steps=100, beta=0.9, signal=0.0),
        HiddenStateAdam(noise=6.0, steps=100, signal=0.0),
        BlackBoxFinalLoss(noise=4.998886197090085, steps=100, member_enters=False),
        # small truths: the bounds come close to them
        HiddenStateMomentum(noise=40.0, steps=100, beta=0.9),
        HiddenStateAdam(noise=40.0, steps=100),
    )
}
"""The default instances, keyed by ``name``."""
