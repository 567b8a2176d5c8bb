"""What the weaker adversaries of the threat-model ladder see, recorded by the hook.

A white-box adversary sees every released gradient; someone who holds only the published
model sees less. Whatever they compute from it is post-processing of the releases, so the
accountant's claim is the same on every rung; only the evidence differs
(``experiment.judging.ladder``). The hook records what two weaker rungs need:

* **hidden state** (the final parameters only; gradient canaries): ``FinalState`` keeps the
  parameters on the union S of the sparse gradient canaries' supports when the first private
  step starts (theta_0) and at the end (theta_T: at ``detach``, or the current values while
  attached). O(|S|), i.e. O(K) for Dirac canaries, never O(d). The score of canary k with
  values v_k on its support is ``-<v_k, theta_T - theta_0> / ||v_k||``: for a Dirac canary on
  coordinate i, ``-(theta_T[i] - theta_0[i]) sign(v_k)`` (added to the gradient, the canary
  moves its parameter against itself). A function of the final model is post-processing of the
  releases, so it is valid for any base optimizer; for canaries on coordinates no data
  gradient reaches (the hook's ``canary_independence`` record), under an optimizer that
  updates each coordinate from its own gradient history only (``COORDINATEWISE``: SGD with
  momentum, Nesterov or weight decay, Adam, AdamW, RMSprop, ...), each canary's final
  coordinate depends only on its own releases, so the canaries stay independent experiments.
  With plain SGD at a constant learning rate and no weight decay, theta_T - theta_0 is
  -lr x the sum of the releases there: the score is an affine map of the white-box scalar
  sum, the same ranking and the same certified epsilon (``summary`` says whether the run was
  such a one);
* **black box** (input canaries scored by the final model): ``final_model_scores`` gives each
  input canary's negative loss and, for classifiers, its logit margin (the correct class's
  logit minus the largest other: a per-example calibrated score), from one no-grad forward in
  eval mode; ``reference_gains`` calibrates both against a reference model, the initial one
  (the hook scores the canaries when the first private step starts): ``loss_gain`` and
  ``margin_gain``, how much training moved each canary's own score. Canaries of different
  difficulty start from different losses; their gains share one scale, which is what a
  one-run audit of many canaries needs. The reference is the initial model, which the auditor
  knows when it chose it (Annamalai & De Cristofaro's threat model); an adversary without it
  has the uncalibrated scores.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from dpaudit.capture.gradient_canaries import GradientCanaries
from dpaudit.capture.input_canaries import InputCanaries

# base optimizers whose update of a coordinate reads only that coordinate's gradient history
# (and its own state): the hidden-state scores of canaries on separate dead coordinates are
# then independent (module doc). Anything else (LBFGS, a custom optimizer) mixes coordinates
# as far as the audit knows.
COORDINATEWISE = ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad",
                  "Adadelta", "Rprop", "ASGD")

BLACK_BOX_SCORES = ("neg_loss", "logit_margin", "loss_gain", "margin_gain")
"""The black-box rung's scores of an input canary from the final model: the negative loss
(Annamalai & De Cristofaro's score), the logit margin (a calibrated score), and both against
the initial model as the reference (``reference_gains``)."""


def base_optimizer(optimizer) -> torch.optim.Optimizer:
    """The optimizer an Opacus ``DPOptimizer`` wraps (or ``optimizer`` itself)."""
    return getattr(optimizer, "original_optimizer", optimizer)


def sums_releases(optimizer, lrs: Sequence[tuple[float, ...]]) -> tuple[bool, str]:
    """Whether theta_T - theta_0 was -lr x the sum of the releases (module doc), and why
    (not): the base optimizer plain ``torch.optim.SGD`` (no momentum, no weight decay, not
    maximising) at one learning rate on every step (``lrs``: each step's learning rate per
    parameter group)."""
    base = base_optimizer(optimizer)
    name = type(base).__name__
    if type(base) is not torch.optim.SGD:
        return False, f"base optimizer {name}: the final parameters are not a sum of releases"
    for g in base.param_groups:
        if float(g.get("momentum", 0.0)) != 0.0:
            return False, f"SGD with momentum {g['momentum']:g}: a weighted sum of the releases"
        if float(g.get("weight_decay", 0.0)) != 0.0:
            return False, f"SGD with weight decay {g['weight_decay']:g}"
        if g.get("maximize", False):
            return False, "SGD maximising"
    flat = {v for step in lrs for v in step}
    if len(flat) > 1:
        return False, f"the learning rate changed during training ({len(flat)} values)"
    return True, ("plain SGD at a constant learning rate without weight decay: theta_T - "
                  "theta_0 = -lr x the sum of the releases, an affine map of the white-box "
                  "scalar sum (the same ranking, the same certified epsilon)")


class FinalState:
    """theta_0 and theta_T on the union S of the sparse gradient canaries' supports.

    Args:
        insertion: the hook's ``GradientInsertion`` (its canaries, support, positions in S).
    """

    def __init__(self, insertion) -> None:
        self._insertion = insertion
        self.active = insertion.support() is not None
        self._theta0: torch.Tensor | None = None
        self._theta_t: torch.Tensor | None = None
        self._lrs: list[tuple[float, ...]] = []

    @torch.no_grad()
    def _read(self, params: Sequence[torch.Tensor]) -> torch.Tensor:
        """The parameters at S (full-selection indices, sorted), float64 on the CPU."""
        support = self._insertion.support()
        offsets = self._insertion.view.offsets
        out = torch.empty(support.numel(), dtype=torch.float64)
        for i, p in enumerate(params):
            lo = int(torch.searchsorted(support, offsets[i]))
            hi = int(torch.searchsorted(support, offsets[i + 1]))
            if hi > lo:  # take indexes the tensor as 1-D, contiguous or not
                local = (support[lo:hi] - offsets[i]).to(p.device)
                out[lo:hi] = p.detach().take(local).to(torch.float64).cpu()
        return out

    def start(self, params: Sequence[torch.Tensor]) -> None:
        """theta_0: when the first private step starts (before its update)."""
        if self.active and self._theta0 is None:
            self._theta0 = self._read(params)

    def observe(self, optimizer) -> None:
        """One private step: its learning rates (for ``sums_releases``)."""
        self._lrs.append(tuple(float(g["lr"]) for g in base_optimizer(optimizer).param_groups))

    def finish(self, params: Sequence[torch.Tensor]) -> None:
        """theta_T: at the end of training (the hook's ``detach``)."""
        if self.active and self._theta0 is not None:
            self._theta_t = self._read(params)

    @property
    def steps(self) -> int:
        """Private steps observed."""
        return len(self._lrs)

    def scores(self, params: Sequence[torch.Tensor]) -> np.ndarray:
        """(K,) hidden-state scores in canary order (module doc); NaN for canaries that have
        none (input canaries, dense gradient canaries). theta_T is the one recorded at the end
        of training, or the current parameters when training has not ended."""
        if self._theta0 is None:
            raise RuntimeError("no private step has started: theta_0 was not recorded")
        end = self._theta_t if self._theta_t is not None else self._read(params)
        delta = (end - self._theta0).numpy()
        out = []
        for c, pos in zip(self._insertion.canaries, self._insertion.support_positions(),
                          strict=True):
            if pos is None:
                out.append(np.full(len(c), np.nan))
                continue
            vals = c.values.detach().to(torch.float64).cpu().numpy()
            moved = (vals * delta[pos.cpu().numpy()]).sum(axis=1)
            out.append(-moved / np.linalg.norm(vals, axis=1))
        return np.concatenate(out)

    def summary(self, optimizer, post_step: bool = False) -> dict:
        """What the hidden-state scores are, for the report: the base optimizer, whether it
        updates coordinates separately (``COORDINATEWISE``), whether the final parameters
        are the sum of the releases (``sums_releases``), the coordinates recorded."""
        name = type(base_optimizer(optimizer)).__name__
        sums, why = sums_releases(optimizer, self._lrs)
        if post_step:
            sums, why = False, ("a post-step update of the parameters was declared "
                                "(post_step): the final parameters are not a sum of releases")
        return {
            "base_optimizer": name,
            "coordinatewise": name in COORDINATEWISE and not post_step,
            "sums_releases": sums,
            "sums_releases_reason": why,
            "coordinates": 0 if not self.active else int(self._insertion.support().numel()),
            "steps": self.steps,
            "ended": self._theta_t is not None,
        }


def hidden_state_canaries(canaries) -> tuple[bool, str]:
    """Whether a canary set has hidden-state scores, and why (not): sparse gradient canaries
    (Dirac or sparse) do; dense ones would need theta on their whole support (O(d)); input
    canaries' final-model scores are the black box's."""
    if isinstance(canaries, InputCanaries):
        return False, ("input canaries: the final model's scores of them are the black-box "
                       "rung's")
    if isinstance(canaries, GradientCanaries) and not canaries.is_sparse:
        return False, ("dense gradient canaries: their hidden-state score would read theta on "
                       "their whole support (O(d)); use GradientCanaries.dirac or .sparse")
    return True, "sparse gradient canaries: theta_0 and theta_T recorded on their support"


@torch.no_grad()
def final_model_scores(model: nn.Module, canaries: InputCanaries, chunk: int = 256,
                       reason: bool = False) -> dict:
    """The black-box scores (``BLACK_BOX_SCORES``) of ``canaries`` from ``model`` as it is:
    ``neg_loss`` (-loss_fn of each canary alone) and, when the output is (K, classes) logits
    with integer class targets, ``logit_margin`` (z_y - max_{j != y} z_j). One no-grad forward
    of the plain module (under Opacus' wrapper) in eval mode (a released model's: no dropout),
    ``chunk`` canaries at a time; every module's training flag is restored. Higher means
    "member" for both. A forward that cannot take the canaries alone (arguments only the
    training call had, an output that is not one tensor) is a ValueError saying so, or with
    ``reason`` the mapping ``{"reason": ...}`` (never in the way of training)."""
    from dpaudit.gradients.persample import unwrap_model

    module = unwrap_model(model)
    flags = [(m, m.training) for m in module.modules()]  # each module's own, restored
    device = next(module.parameters()).device
    module.eval()
    try:
        outs = []
        for a in range(0, len(canaries), chunk):
            part = canaries.select(slice(a, a + chunk)).to(device)
            outs.append(module(*part.positional, **part.kwargs))
        if not all(isinstance(o, torch.Tensor) for o in outs):
            raise TypeError(f"the model returns {type(outs[0]).__name__}, not one tensor")
        out = torch.cat(outs)
    except Exception as err:
        why = (f"the final model's scores need the model's forward on the input canaries "
               f"alone, which failed ({type(err).__name__}: {err})")
        if reason:
            return {"reason": why}
        raise ValueError(why) from err
    finally:
        for m, flag in flags:
            m.training = flag
    targets = canaries.targets.to(device)
    loss = np.array([float(canaries.loss_fn(out[k:k + 1], targets[k:k + 1]))
                     for k in range(len(canaries))])
    scores = {"neg_loss": -loss}
    if out.ndim == 2 and out.shape[1] >= 2 and targets.ndim == 1 and not (
            targets.dtype.is_floating_point):
        z = out.to(torch.float64)
        own = z.gather(1, targets.long().unsqueeze(1)).squeeze(1)
        others = z.scatter(1, targets.long().unsqueeze(1), float("-inf"))
        scores["logit_margin"] = (own - others.max(dim=1).values).cpu().numpy()
    return scores


def reference_gains(final: dict[str, np.ndarray], initial: dict[str, np.ndarray]
                    ) -> dict[str, np.ndarray]:
    """``final`` (``final_model_scores`` of the trained model) with ``loss_gain`` (its
    ``neg_loss`` minus the reference model's) and ``margin_gain`` (the same for
    ``logit_margin``, where both have it) against ``initial`` (the reference model's scores of
    the same canaries)."""
    out = dict(final)
    for name, gain in (("neg_loss", "loss_gain"), ("logit_margin", "margin_gain")):
        if name in final and name in initial:
            out[gain] = final[name] - initial[name]
    return out


HIDDEN_STATE_SCORES = ("final_params",)
"""The hidden-state rung's score of a gradient canary (``FinalState.scores``)."""
NO_INPUT = ("gradient canaries have no input to query: the black box sees the final model's "
            "outputs, so it needs input canaries")


def rung_scores(hook, index: int, start: int, stop: int) -> dict:
    """The weaker rungs' records of the hook's canary set ``index`` (canaries ``start`` to
    ``stop`` in canary order), plain lists for run files: ``{"hidden_state": {"scores":
    {"final_params": [...]}, "summary": {...}} | {"reason": ...}, "black_box": {"scores":
    {"neg_loss": [...], "logit_margin": [...]}} | {"reason": ...}}``."""
    c = hook.canaries[index]
    out: dict = {}
    ok, why = hidden_state_canaries(c)
    if ok:
        scores = hook.hidden_state_scores()[start:stop]
        out["hidden_state"] = {"scores": {"final_params": scores.tolist()},
                               "summary": hook.hidden_state_summary()}
    else:
        out["hidden_state"] = {"reason": why}
    if isinstance(c, InputCanaries):
        try:
            bb = hook.final_model_scores()
        except ValueError as err:
            out["black_box"] = {"reason": str(err)}
        else:
            out["black_box"] = {"scores": {k: v[start:stop].tolist() for k, v in bb.items()}}
    else:
        out["black_box"] = {"reason": NO_INPUT}
    return out
