"""``AuditHook``: the white-box view of Opacus DP-SGD, recorded without changing the loop.

Attached to the ``DPOptimizer`` that ``PrivacyEngine.make_private`` returns, the hook
orchestrates four phases, each in its own module:

* gradient insertion (``insertion.GradientInsertion``): it wraps the optimizer's ``add_noise``
  (on the instance, through ``patching.InstancePatch``) to add the included gradient canaries
  to ``p.summed_grad`` *before* noise, drawing the inclusions per real step by policy;
* the coordinate view (``view.CoordinateView``): after the accountant has run (the hook chains
  Opacus' step hook, the accountant's one slot), it reads the released gradient g_t from
  ``p.grad`` (after noise and ``scale_grad``, before the base optimizer mutates anything), so
  g_t = (clipped sum [+ canaries] + noise) / B_exp for any base optimizer (SGD, momentum, Adam),
  gathered at the view's coordinates;
* input-canary gradients (``input_grads.InputGradients``): the input canaries' (and reference
  points') clipped gradients at the current parameters theta_t (the ones the batch gradient was
  computed at), with Opacus' flat clip rule, on the model's device: by default folded into the
  training batch's own forward/backward (``input_pass="auto"``, ``dpaudit.capture.fold``: K
  more rows in a pass that runs anyway, stripped before Opacus clips the batch, so training is
  unchanged), or in one separate batched ``per_sample_clipped_grads`` call per step
  (``input_pass="separate"``, and the automatic fallback for models or forward calls that
  cannot be folded);
* score accumulation (``accumulate.ScoreAccumulator``): every ``StepScore`` streamed into
  per-canary accumulators (``aggregate`` ``"sum"`` or ``"max"``), optionally keeping the K x T
  per-step values; optionally a ``Trace`` is written;
* the white-box records (``recorder.WhiteBoxRecorder``): per step, the batch size and the
  clipping probes before the noise, the noise the optimizer really added (release minus its
  clipped sum, sketched: ``noise_record``) right after it, and every tensor's released sum
  after the accountant; ``white_box_records()`` gives them typed, for the white-box checks;
* the weaker rungs of the threat-model ladder (``final_state``): theta_0 and theta_T on the
  sparse gradient canaries' support (``hidden_state_scores()``, O(K)), and the input
  canaries' scores by the model when the first private step starts and now
  (``final_model_scores()``: loss, logit margin and their gains over the initial model).

Coordinate view (``coordinates=``): an optional 1-D list of distinct indices into the flattened
parameter selection. Everything recorded and scored then lives in those coordinates only — a
coordinate-level parameter selection: the released gradient and the input canaries' (and
references') clipped gradients are gathered at them, gradient canaries are given as (K, |view|)
vectors in view coordinates and scattered into the full vector for insertion before noise, and
traces / scores see vectors of length |view|. What a score cannot see outside the view does not
enter it; for Dirac canaries on the view's coordinates (the union of their supports) the
scores are those of the full run. This is what makes K = 10^4 Dirac canaries cheap on a model
with d ~ 10^5 parameters: O(K |view|) per step instead of O(K d).

Set-ups (``support``): flat clipping with ``grad_sample_mode`` hooks / functorch / ew; ghost
clipping (``"ghost"``) with gradient canaries only (they are added to ``p.summed_grad``, which
ghost clipping fills with the clipped sum, before noise); Opacus' distributed optimizers
(DPDDP): every rank draws the same inclusions, only rank 0 inserts the canaries (before the
all-reduce, as Opacus adds its noise on rank 0 only), and every rank records the gradient
after ``reduce_gradients`` (the one applied, noise included; the ranks' scores agree), with
B_exp x world size as the divisor under ``loss_reduction="mean"``. Per-layer clipping
(``DPPerLayerOptimizer``, one process): gradient canaries of norm <= C = ||(C_p)|| (the claim
is a Gaussian mechanism of sensitivity C whatever the layer), input canaries clipped layer by
layer as the optimizer clips examples. Adaptive clipping (``AdaClipDPOptimizer``): the bound
C_t of each step is read when it is used; a gradient canary of norm c <= C_0 (the initial bound)
is inserted at step t as c C_t / C_0, input canaries are clipped at C_t, and the scores see the
release and the canaries times C_0 / C_t, so every step is the same Gaussian mechanism in units
of C_0, with the gradient's noise multiplier sigma_g (``support.gradient_noise_multiplier``).
Per-layer clipping under DPDDP, FSDP and multi-process runs without Opacus' distributed
optimizer are refused at construction.

Only real optimizer steps are recorded: ``BatchMemoryManager`` virtual steps (skipped steps)
never reach ``add_noise`` or the step hook, so the whole logical batch is captured once.
Canary index order: the canaries list in order, each set's canaries in its own order.
``detach()`` restores the optimizer's ``step_hook`` (or ``reduce_gradients``) and
``add_noise`` exactly (``patching.InstancePatch``).
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from opacus.optimizers import DPOptimizer
from torch import nn

from dpaudit.attacks.base import StepContext, StepScore
from dpaudit.attacks.mixture import MixtureLR
from dpaudit.attacks.scalar import ScalarProduct
from dpaudit.capture.accumulate import ScoreAccumulator
from dpaudit.capture.canary_kinds import Canaries, InputCanaries, as_canary_list
from dpaudit.capture.final_state import FinalState, final_model_scores, reference_gains
from dpaudit.capture.independence import IndependenceWatch
from dpaudit.capture.input_grads import INPUT_PASSES, InputGradients, all_finite, check_reference
from dpaudit.capture.insertion import (
    DiracRows,
    GradientInsertion,
    RowBlocks,
    check_gradient_canaries,
)
from dpaudit.capture.patching import InstancePatch
from dpaudit.capture.recorder import WhiteBoxRecorder
from dpaudit.capture.records import WhiteBoxRecords
from dpaudit.capture.support import (
    check_input_canaries_supported,
    check_optimizer_supported,
    clip_bound,
    gradient_noise_multiplier,
    is_distributed,
)
from dpaudit.capture.trace import Trace
from dpaudit.capture.view import CoordinateView, check_coordinates
from dpaudit.gradients.persample import unwrap_model
from dpaudit.gradients.selection import resolve_parameter_names

__all__ = ["INPUT_PASSES", "AuditHook", "infer_sample_rate"]

# scores that read the released gradient only through <g*, g_t> (and g* itself): on sparse
# canaries they give the same values on the union of the supports as on the full vector
_SUPPORT_LOCAL = (ScalarProduct, MixtureLR)
# scores that read the canaries only through ``canary_grads @ v`` and ``canary_grads.norm(dim=1)``:
# Dirac canaries reach them as ``DiracRows`` (O(K) per step, the same values)
_DIRAC_ROWS = (ScalarProduct, MixtureLR)


def infer_sample_rate(step_hook: object) -> float | None:
    """The ``sample_rate`` captured by Opacus' accountant hook closure, if there is one."""
    owner = getattr(step_hook, "__self__", None)
    if isinstance(owner, AuditHook):  # another audit hook already chained in front
        return owner.sample_rate
    code = getattr(step_hook, "__code__", None)
    closure = getattr(step_hook, "__closure__", None)
    if code is None or closure is None or "sample_rate" not in code.co_freevars:
        return None
    value = closure[code.co_freevars.index("sample_rate")].cell_contents
    return float(value) if isinstance(value, numbers.Real) else None


def sample_rate_of(optimizer, data_loader=None, given=None, *,
                   loader_first: bool = False) -> float:
    """The data's Poisson rate q: ``given`` (the hook's ``sample_rate=``), else the one
    Opacus' accountant hook closes over, else the DP data loader's (``DPDataLoader.
    sample_rate``, or its batch sampler's: a step hook wrapped by the user's code hides its
    closure); ``loader_first``: the loader's before the accountant's (the rate real examples
    are drawn at, for canaries inserted like one: an accountant told another rate is then the
    claim they test, not the rate they are drawn at). A clear error naming ``sample_rate``
    when none is in (0, 1]."""
    def from_loader():
        for owner in (data_loader, getattr(data_loader, "batch_sampler", None)):
            value = getattr(owner, "sample_rate", None)
            if isinstance(value, numbers.Real):
                return float(value)
        return None

    q = given
    if q is None and loader_first and data_loader is not None:
        q = from_loader()
    if q is None:
        q = infer_sample_rate(optimizer.step_hook)
    if q is None and data_loader is not None:
        q = from_loader()
    if q is None or not 0.0 < float(q) <= 1.0:
        raise ValueError(
            "sample_rate must be in (0, 1]; it could not be read from the optimizer's "
            f"accountant hook or the data loader, got {q!r}: pass sample_rate=")
    return float(q)


def _check_arguments(optimizer, model, seed) -> None:
    """The hook's arguments that need nothing else: an Opacus DP optimizer of a supported
    kind, a torch module, an integer seed."""
    if not isinstance(optimizer, DPOptimizer):
        raise ValueError(
            "optimizer must be an Opacus DPOptimizer (from PrivacyEngine.make_private), "
            f"got {type(optimizer).__name__}"
        )
    check_optimizer_supported(optimizer)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch nn.Module, got {type(model).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an integer, got {seed!r}")


class AuditHook:
    """Record released gradients, canary gradients and streaming scores of an Opacus run.

    ``hook = AuditHook(optimizer, model, canaries, scores=(ScalarProduct(),))`` then
    ``hook.attach()`` (or ``with hook:``) around the unchanged training loop; afterwards
    ``hook.scores()`` gives each score's (K,) accumulated values. ``canaries=None`` picks
    Dirac canaries no data gradient can reach at any step (``canary_choice.default_canaries``:
    on the model's canary block, ``add_canary_block``, or on coordinates its structure keeps
    dead on the loader's data), each a member with probability 1/2, in two sets: the
    every-step stress test of the mechanism, and canaries inserted like an example (each
    member at the data's rate q per step: the training data's threat model, the lower side of
    the user's epsilon; ``canary_note`` says when the coordinates held fewer than 10^4 per
    side). ``scores=None``: the scalar product, and the per-step mixture likelihood ratio
    (``MixtureLR``, q_c = q) when a set is inserted like an example. ``params`` selects parameter
    or module names (default: every trainable parameter the DP optimizer updates; trainable
    ones it does not update, ``outside_optimizer``, are watched by the integrity check) for
    everything the canaries insert and scores read.
    ``keep_per_step`` keeps every step's score values, (K, T) per score (``per_step()``); an
    integer k keeps the first k canaries' only (an audited set's, beside a large set whose
    per-step values are not needed).
    ``reference=(inputs, targets[, loss_fn])`` or an ``InputCanaries`` (which may carry
    ``args`` / ``kwargs``) provides reference points whose clipped gradients at theta_t are
    passed to scores with ``requires_reference_grads``.
    ``sample_rate`` defaults to the one in Opacus' accountant hook. ``coordinates`` restricts
    everything recorded and scored to those indices of the flattened selection (module doc);
    gradient canaries, trace bases and scores then have ``dim = len(coordinates)`` columns,
    ``full_dim`` is the selection's size. ``input_pass`` says how input canaries' and reference
    gradients are computed: ``"auto"`` folds them into the batch's forward/backward when the
    model is a batch-first Opacus ``GradSampleModule`` and the step's forward can be folded,
    else a separate pass; ``"batch"`` requires folding (error otherwise); ``"separate"``
    always uses the separate pass. ``seed`` seeds the separate pass's private random stream
    (e.g. the canaries' dropout masks; the training's own streams are never touched) and the
    clipping check's draws.

    White-box records (``white_box_records()``; judged by ``audit_report`` and ``run_audit``
    alike), on every tensor the optimizer releases: each step's released sum (squared norm),
    the claimed noise std and the batch size; with ``record_noise`` (default) the noise the
    optimizer really added (its release minus its clipped sum, read right after ``add_noise``;
    under DPDDP summed over the ranks), sketched for the tests of its scale, law, alignment
    and freshness (``stats.noise_law``); with ``check_clipping`` (default) the optimizer's own
    clipping probed example by example. ``noise_probes``: indices into the flattened selection
    of coordinates no example touches; every step the released sum there, minus the canaries
    inserted there, is kept (``probe_noise``): the noise independence test of the released
    gradient alone, for when the noise is not recorded.

    The mechanism's other doors (DESIGN 4.5), on by default: ``data_loader`` (the loader you
    train with: Opacus' ``DPDataLoader``, any ``DataLoader`` whose batch sampler yields
    indices, or ``BatchMemoryManager``'s; under DPDDP give it on every rank) records which
    examples each batch used, in O(n + T) (``sampling_record``): without it the report names
    the sampling by example as not checked; ``check_integrity`` compares every parameter
    and buffer of the model, bit for bit, with a copy when each private step starts and
    returns (``integrity``): the model may move only inside it, and ``post_step`` declares a
    post-processing of the parameters after ``optimizer.step()`` (a function of
    {name: tensor} returning {name: new value}, e.g.
    ``lambda t: {"fc.weight": t["fc.weight"].clamp(-1, 1)}``) that then explains such changes
    exactly; ``check_noise_data`` probes the optimizer's own
    ``add_noise`` at seeded steps with every generator state restored (``noise_probe``): the
    noise must not depend on the clipped sum and must change when the generator advances.
    Each leaves training bit for bit unchanged.

    Sparse gradient canaries (``GradientCanaries.dirac`` / ``sparse``) cost O(K x |support|)
    per step: they are inserted at their support only, and when they are the only canaries,
    no ``coordinates``, ``trace`` or ``reference`` is given and every score reads the released
    gradient only through <g*, g_t> (``ScalarProduct``, ``MixtureLR``, or a score with
    ``support_local = True``), scores are computed on the union S of the supports
    (``routed`` is True, ``scored_dim`` = |S|) with the same values as on the full vector.
    Otherwise the sparse canaries are given to scores as dense (K, dim) rows. Sparse canaries
    with one entry each (Dirac), without ``trace`` or ``reference``, reach ``ScalarProduct``
    and ``MixtureLR`` as ``insertion.DiracRows`` (``dirac_rows`` is True): O(K) per step
    instead of O(K x scored_dim), the same scores; beside other canary sets (input canaries,
    dense gradient canaries) every set keeps its own block (``insertion.RowBlocks``), never
    one concatenated (K, scored_dim) matrix.
    """

    def __init__(
        self,
        optimizer: DPOptimizer,
        model: nn.Module,
        canaries: Canaries | Sequence[Canaries] | None = None,
        scores: Sequence[StepScore] | None = None,
        params: str | Sequence[str] | None = None,
        keep_per_step: bool | int = False,
        trace: Trace | None = None,
        reference: tuple | None = None,
        sample_rate: float | None = None,
        check_finite: bool = True,
        coordinates: Sequence[int] | np.ndarray | torch.Tensor | None = None,
        input_pass: str = "auto",
        seed: int = 0,
        noise_probes: Sequence[int] | np.ndarray | torch.Tensor | None = None,
        check_clipping: bool = True,
        record_noise: bool = True,
        data_loader=None,
        check_integrity: bool = True,
        post_step=None,
        check_noise_data: bool = True,
    ) -> None:
        _check_arguments(optimizer, model, seed)
        self.optimizer = optimizer
        self._post_step = post_step is not None
        self.model = model
        self.max_grad_norm = clip_bound(optimizer)
        self._select_parameters(params, coordinates)
        self.canary_note = ""
        if canaries is None:  # picked: canaries no data gradient can reach at any step
            from dpaudit.capture.canary_choice import default_canaries

            data = None if data_loader is None else getattr(data_loader, "dataset", None)
            # the rate real examples are drawn at: the DP loader's where it was given
            q = sample_rate_of(optimizer, data_loader, sample_rate, loader_first=True)
            canaries, self.canary_note = default_canaries(
                model, data, sample_rate=float(q), seed=seed, norm=self.max_grad_norm,
                params=params)
        if scores is None:  # the scalar product; the mixture LR for canaries inserted like
            # an example too (their optimal per-step test, O(K) per step on Dirac canaries)
            bernoulli = any("bernoulli" in getattr(c, "policies", ()) for c in
                            as_canary_list(canaries))
            scores = (ScalarProduct(), MixtureLR()) if bernoulli else (ScalarProduct(),)
        self._set_canaries(canaries)
        self._set_scores(scores, keep_per_step, reference, sample_rate, data_loader)
        self._set_trace(trace)
        self.keep_per_step = bool(keep_per_step)
        self.check_finite = bool(check_finite)
        self.input_pass = input_pass
        self._set_passes(input_pass, seed)
        self._reset_records(noise_probes, check_clipping, record_noise, seed,
                            data_loader=data_loader, check_integrity=check_integrity,
                            post_step=post_step, check_noise_data=check_noise_data)

    def _select_parameters(self, params, coordinates) -> None:
        """The parameters the canaries live in (all optimized by the DP optimizer) and the
        coordinate view the hook records."""
        named = dict(unwrap_model(self.model).named_parameters())
        optimized = {id(p) for p in self.optimizer.params}
        trainable = resolve_parameter_names(self.model, None)
        # trainable parameters the DP optimizer does not update (a head trained by a second
        # optimizer, say): no canary can live there, but the integrity check watches them, so
        # that their moving is the finding, not a refusal to attach
        self.outside_optimizer = [n for n in trainable if id(named[n]) not in optimized]
        if params is None:
            chosen = [n for n in trainable if id(named[n]) in optimized]
            if not chosen:
                raise ValueError("params: none of the model's trainable parameters is updated "
                                 "by the DP optimizer (is this the model make_private wrapped?)")
            self.param_names = chosen
        else:
            self.param_names = resolve_parameter_names(self.model, params)
            missing = [n for n in self.param_names if id(named[n]) not in optimized]
            if missing:
                raise ValueError(
                    f"params: {missing} are not updated by the DP optimizer, so no canary can "
                    "be inserted or scored there; leave them out of params (the integrity "
                    "check watches every parameter of the model whatever params says, and "
                    "reports one that moves outside the private step)")
        self._params = [named[n] for n in self.param_names]
        # the whole model's trainable flattening (what trainable_dim / dead_coordinates number)
        # -> this selection's, -1 off it: canaries numbered over the whole model are mapped
        self._from_model = None
        if params is None and self.outside_optimizer:
            keep = np.concatenate([np.full(named[n].numel(), n in self.param_names)
                                   for n in trainable])
            self._from_model = np.where(keep, np.cumsum(keep) - 1, -1)
            self._from_model_names = [(n, named[n].numel()) for n in trainable]
        full_dim = sum(p.numel() for p in self._params)
        self.view = CoordinateView(self._params, check_coordinates(coordinates, full_dim))
        self.full_dim = self.view.full_dim
        self.coordinates = self.view.coordinates
        self.dim = self.view.dim

    def _set_canaries(self, canaries) -> None:
        """The canary sets, checked against the view and the clip norm."""
        self.dropped_canaries: list[dict] = []
        self.canaries = [self._in_selection(c) for c in as_canary_list(canaries)]
        self.num_canaries = sum(len(c) for c in self.canaries)
        where = f"parameters {self.param_names}" + (
            ", in view coordinates" if self.coordinates is not None else ""
        )
        check_gradient_canaries(self.canaries, self.dim, self.max_grad_norm, where)
        self._insertion = GradientInsertion(self.canaries, self.view)
        self._independence = IndependenceWatch(self._insertion, self.param_names,
                                               [tuple(p.shape) for p in self._params])
        # the hidden-state rung: theta_0 and theta_T on the sparse canaries' support (O(K))
        self._final = FinalState(self._insertion)

    def _in_selection(self, c):
        """Gradient canaries numbered over the whole model's trainable parameters (e.g. by
        ``dead_coordinates`` and ``trainable_dim(model)``) when some of those are outside the
        DP optimizer: the same canaries in the selection's coordinates. Canaries that touch a
        parameter the DP optimizer does not update (no noise is added there, so none can be
        inserted) are dropped and named in ``dropped_canaries``; those parameters are watched
        by the integrity check, and their moving is the finding. A set left empty is refused."""
        from dpaudit.capture import GradientCanaries

        lookup = self._from_model
        if (lookup is None or self.coordinates is not None or not isinstance(c, GradientCanaries)
                or c.dim != lookup.size or c.dim == self.full_dim):
            return c
        if c.is_sparse:
            cols = c.indices.cpu().numpy()
            off_rows = ((lookup[cols] < 0) & (c.values.cpu().numpy() != 0)).any(axis=1)
            touched_cols = cols[off_rows][lookup[cols[off_rows]] < 0]
        else:
            off = torch.from_numpy(lookup < 0)
            hits = c.vectors[:, off].ne(0)
            off_rows = hits.any(1).cpu().numpy()
            touched_cols = np.flatnonzero(lookup < 0)[
                torch.nonzero(hits.any(0)).reshape(-1).cpu().numpy()]
        keep = np.flatnonzero(~off_rows)
        if off_rows.any():
            ends = np.cumsum([k for _, k in self._from_model_names])
            touched = sorted({self._from_model_names[int(np.searchsorted(ends, i, "right"))][0]
                              for i in np.unique(touched_cols).tolist()})
            if keep.size == 0:
                raise ValueError(
                    f"canaries: every gradient canary touches {touched}, which the DP optimizer "
                    "does not update (no noise is added there, so no canary can be inserted); "
                    f"put them on parameters it updates: {self.param_names}")
            self.dropped_canaries.append({
                "count": int(off_rows.sum()), "of": len(c), "parameters": touched,
                "why": "the DP optimizer does not update them (no noise is added there); they "
                       "are watched by the model-integrity check instead"})
        policies = [c.policies[i] for i in keep.tolist()]
        kw = {"policy": policies, "inclusion_prob": c.inclusion_prob, "seed": c.seed}
        rows = torch.from_numpy(keep)
        if c.is_sparse:
            idx = torch.from_numpy(lookup[c.indices.cpu().numpy()[keep]]).to(c.indices.dtype)
            return GradientCanaries.sparse(idx, c.values[rows.to(c.values.device)],
                                           self.full_dim, **kw)
        kept = c.vectors[rows.to(c.vectors.device)]
        return GradientCanaries(kept[:, torch.from_numpy(lookup >= 0).to(kept.device)], **kw)

    def _set_scores(self, scores, keep_per_step, reference, sample_rate,
                    data_loader=None) -> None:
        """The scores' accumulator, their reference points, the process group and q."""
        self._accumulator = ScoreAccumulator(scores, self.num_canaries, keep_per_step)
        self.score_fns = self._accumulator.score_fns
        self.reference = check_reference(reference)
        if self.reference is not None or any(isinstance(c, InputCanaries) for c in self.canaries):
            check_input_canaries_supported(self.optimizer)
        # Opacus' distributed optimizers: noise on rank 0, all-reduce after the step hook
        self.distributed = is_distributed(self.optimizer)
        self.rank = int(self.optimizer.rank) if self.distributed else 0
        self.world_size = int(self.optimizer.world_size) if self.distributed else 1
        if self._accumulator.needs_reference and self.reference is None:
            raise ValueError("reference=(inputs, targets) is required by a score that needs it")
        self.sample_rate = sample_rate_of(self.optimizer, data_loader, sample_rate)
        # the rate real examples are drawn at (the DP loader's where given): the default
        # canaries inserted like an example use it; it differs from ``sample_rate`` only when
        # the accountant was told another rate than the loader draws at
        self.data_sample_rate = sample_rate_of(self.optimizer, data_loader, sample_rate,
                                               loader_first=True)

    def _set_trace(self, trace) -> None:
        """An optional on-disk trace of what the hook sees (its basis fits the view)."""
        if trace is not None and not isinstance(trace, Trace):
            raise ValueError(f"trace must be a dpaudit.capture.Trace, got {type(trace).__name__}")
        if trace is not None and trace.basis is not None and trace.basis.shape[1] != self.dim:
            raise ValueError(
                f"trace: basis must have d = {self.dim} columns (the parameter selection "
                "or coordinate view), "
                f"got shape {tuple(trace.basis.shape)}"
            )
        self.trace = trace

    def _set_passes(self, input_pass, seed) -> None:
        """Where scores are computed (routed to the canaries' support when that is exact) and
        the input canaries' gradient pass."""
        # sparse gradient canaries only, scores that read the released gradient only through
        # <g*, g_t>: score on the union S of the supports (exactly the full run's values)
        self.routed = (
            self._insertion.all_sparse
            and self.coordinates is None
            and self.trace is None
            and self.reference is None
            and all(
                type(s) in _SUPPORT_LOCAL or getattr(s, "support_local", False)
                for s in self.score_fns
            )
        )
        self._score_view = (
            CoordinateView(self._params, self._insertion.support()) if self.routed else self.view
        )
        # Dirac canaries, scores that read them through products and row norms: those
        # canaries as DiracRows, never a (K, scored_dim) matrix; beside other canary sets
        # (input canaries, other gradient canaries) the blocks as RowBlocks, never concatenated
        self.dirac_rows = (
            self._insertion.any_dirac
            and self.trace is None
            and self.reference is None
            and all(type(s) in _DIRAC_ROWS for s in self.score_fns)
        )
        self._inputs = InputGradients(
            self.model,
            self.optimizer,
            [c for c in self.canaries if isinstance(c, InputCanaries)],
            self.reference,
            self.param_names,
            self.max_grad_norm,
            input_pass=input_pass,
            check_finite=self.check_finite,
            seed=seed,
        )

    def _reset_records(self, noise_probes, check_clipping, record_noise, seed,
                       **doors) -> None:
        """Step counters and the white-box phase (``recorder.WhiteBoxRecorder``); ``doors``:
        the training loader, the integrity check and its ``post_step``, the noise probe."""
        self._patches: list[InstancePatch] = []
        self._attached = False
        self._started = False
        self._steps = 0
        self._pending_inclusion: np.ndarray | None = None
        self._inclusions: list[np.ndarray] = []
        self._white_box = WhiteBoxRecorder(
            self.optimizer, self.model, self._params, self.full_dim, self.coordinates,
            self.canaries, seed, noise_probes=noise_probes, check_clipping=check_clipping,
            record_noise=record_noise, distributed=self.distributed, rank=self.rank, **doors,
        )

    # ------------------------------------------------------------------ attach / detach
    def attach(self) -> AuditHook:
        """Chain into the optimizer's step hook and wrap its ``add_noise``; returns self."""
        if self._attached:
            raise RuntimeError("AuditHook is already attached")
        opt = self.optimizer
        if getattr(opt, "_dpaudit_hook", None) is not None:
            raise RuntimeError("another AuditHook is attached to this optimizer")
        self._prev_step_hook = opt.step_hook
        if self.distributed:  # record after the all-reduce: the gradient really applied
            patches = [InstancePatch(opt, "reduce_gradients", self._reduce_gradients, "AuditHook")]
        else:  # record after the accountant, before the base optimizer's step
            patches = [InstancePatch(opt, "step_hook", self._step_hook, "AuditHook")]
        # just before the noise: canary insertion, batch size, clipping check
        patches.append(InstancePatch(opt, "add_noise", self._add_noise, "AuditHook"))
        applied = []
        try:
            for p in patches:
                applied.append(p.apply())
        except RuntimeError:  # leave the optimizer as it was
            for p in reversed(applied):
                p.restore()
            raise
        try:
            self._white_box.attach()
        except Exception:
            for p in reversed(applied):
                p.restore()
            raise
        try:
            self._inputs.attach()
        except Exception:
            self._white_box.detach()
            for p in reversed(applied):
                p.restore()
            raise
        self._patches = patches
        self._add_noise_patch = patches[1]
        opt._dpaudit_hook = self
        self._attached = True
        self._quiet = _silence_backward_hook_warning()
        return self

    def detach(self) -> None:
        """Restore the optimizer exactly as it was and flush the trace."""
        if not self._attached:
            return
        opt = self.optimizer
        first = self._patches[0]
        if opt.__dict__.get(first.name) is not first.replacement:
            raise RuntimeError(
                f"optimizer.{first.name} was replaced while the AuditHook was attached; "
                "cannot restore it safely"
            )
        for p in reversed(self._patches):
            p.restore()
        self._patches = []
        if self._started:
            self._final.finish(self._params)  # theta_T: the model training released
        self._inputs.detach()  # last in, first out: the fold's patches cover the recorder's
        self._white_box.detach()
        del opt._dpaudit_hook
        self._attached = False
        _restore_warning_filter(getattr(self, "_quiet", None))
        if self.trace is not None and self._started:
            self.trace.flush()

    def __enter__(self) -> AuditHook:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    # ------------------------------------------------------------------ per-step machinery
    def _start(self) -> None:
        p0 = self._params[0]
        self._device, self._dtype = p0.device, p0.dtype
        self.view.to(self._device)
        self._score_view.to(self._device)
        self._insertion.start(self._device, self._dtype)
        self._independence.start(self._device)
        self._final.start(self._params)  # theta_0: the first private step starts
        # the black box's reference: the initial model's scores of the input canaries (never
        # in the way of training: a forward that cannot take them alone is reported, not raised)
        self._initial_scores = [final_model_scores(self.model, c, reason=True)
                                if isinstance(c, InputCanaries) else {} for c in self.canaries]
        self._score_vectors = self._insertion.score_vectors(self.routed, self.dirac_rows)
        self._fixed_canary_grads = self._canary_grads([]) if not self._inputs.active else None
        # the scores read input canaries' rows only through products and norms: the folded
        # rows may stay views of Opacus' per-sample gradients (fold.BatchFold.lazy)
        lazy = (self.trace is None and self.reference is None and self.coordinates is None
                and all(type(s) in _DIRAC_ROWS for s in self.score_fns))
        self._inputs.start(self.view, self._dtype, lazy=lazy)
        self._accumulator.start(self.scored_dim, self._device)
        self._white_box.start(self._device)
        if self.trace is not None:
            self.trace.start(
                self.dim,
                self._device,
                {
                    "param_names": self.param_names,
                    "num_canaries": self.num_canaries,
                    "coordinates": None if self.coordinates is None else self.coordinates.tolist(),
                },
            )
        # gradient canaries are checked finite once, in GradientCanaries
        self._started = True

    def _add_noise(self) -> None:
        """Before Opacus' noise: the batch size, the clipping check, and the included gradient
        canaries added to ``p.summed_grad``."""
        if not self._started:
            self._start()
        opt = self.optimizer
        self._final.observe(opt)
        self._white_box.before_noise(opt, self._steps)
        # the data's clipped sum on the gradient canaries' support, before they are added
        self._independence.observe(self._steps, clip_bound(opt))
        if self._insertion.active:
            row = self._insertion.draw()  # drawn on every rank: the same draws everywhere
            self._pending_inclusion = row
            if self.rank == 0:  # once in the applied gradient, like Opacus' noise
                # adaptive clipping: a canary of norm C_0 enters as one of norm C_t
                self._insertion.insert(row, self._steps,
                                       clip_bound(opt) / self.max_grad_norm)
        self._white_box.probe_noise(opt, self._steps, self._add_noise_patch.original)
        self._add_noise_patch.original()
        self._white_box.after_noise(opt)

    def _step_hook(self, opt: DPOptimizer) -> None:
        """Chained step hook: accountant first, then record this step."""
        if self._prev_step_hook is not None:
            self._prev_step_hook(opt)
        self._record(opt)

    def _reduce_gradients(self) -> None:
        """Distributed optimizers: Opacus' all-reduce, then record the reduced gradient."""
        self._patches[0].original()
        self._record(self.optimizer)

    def _canary_grads(self, per_set: list[torch.Tensor]) -> torch.Tensor:
        """The (K, dim) canary gradients in canary order: vectors and input-set gradients."""
        blocks, i = [], 0
        for vec in self._score_vectors:
            if vec is not None:
                blocks.append(vec)
            else:
                blocks.append(per_set[i])
                i += 1
        if len(blocks) == 1:
            return blocks[0]
        if not self.dirac_rows and all(isinstance(b, torch.Tensor) for b in blocks):
            return torch.cat(blocks)
        if all(isinstance(b, DiracRows) for b in blocks):
            return DiracRows.cat(blocks)
        return RowBlocks(blocks)

    def _record(self, opt: DPOptimizer) -> None:
        t = self._steps
        if not self._started:
            self._start()
        if self._pending_inclusion is None:  # no gradient canaries: nothing was drawn
            self._pending_inclusion = self._insertion.draw()
        self._inclusions.append(self._pending_inclusion)
        self._pending_inclusion = None
        self._inputs.check_forward(t)
        released = self._score_view.released()
        bound = clip_bound(opt)  # this step's C (adaptive clipping's C_t)
        frame = self.max_grad_norm / bound  # adaptive clipping: C_0 / C_t, else 1
        if self._fixed_canary_grads is not None:
            ref, canary_grads = None, self._fixed_canary_grads
        else:
            per_set, ref = self._inputs.compute(t)
            if frame != 1.0:
                per_set = [g * frame for g in per_set]
                ref = None if ref is None else ref * frame
            canary_grads = self._canary_grads(per_set)
        if frame != 1.0:  # scores see every step in units of C_0 (module doc)
            released = released * frame
        if self.check_finite:  # canary gradients: checked where computed
            finite = (
                all(bool(torch.isfinite(p.grad.sum())) for p in self._params)
                if self.routed  # the user asked for no view: check every coordinate
                else all_finite(released)
            )
            if not finite:
                raise ValueError(f"non-finite released gradient at optimizer step {t}"
                                 + _half_hint(self._params))
        if opt.loss_reduction == "mean":  # distributed: the all-reduce averages the ranks
            divisor = float(opt.expected_batch_size * opt.accumulated_iterations * self.world_size)
        else:
            divisor = 1.0
        sigma = gradient_noise_multiplier(opt)
        ctx = StepContext(
            step=t,
            noise_multiplier=sigma,
            max_grad_norm=self.max_grad_norm,
            divisor=divisor,
            sample_rate=self.sample_rate,
            reference_grads=ref,
        )
        self._accumulator.step(canary_grads, released, ctx)
        self._white_box.on_release(opt, t, sigma * bound, divisor,
                                   self._inclusions[-1])
        if self.trace is not None:
            context = {
                k: getattr(ctx, k)
                for k in ("noise_multiplier", "max_grad_norm", "sample_rate", "divisor")
            }
            self.trace.write(released, canary_grads, context)
        self._steps += 1

    # ------------------------------------------------------------------ results
    @property
    def steps(self) -> int:
        """Number of real optimizer steps recorded so far."""
        return self._steps

    @property
    def dataset_size(self) -> int | None:
        """The size of the training loader's data set (None when no loader was given)."""
        return self._white_box.dataset_size

    def record_bytes(self) -> dict[str, int]:
        """Bytes held by the records of which examples each step used (O(n + T)) and by the
        copy of the model the integrity check compares with (one model)."""
        return self._white_box.nbytes()

    @property
    def scored_dim(self) -> int:
        """Columns of the vectors scores see: ``dim``, or |S| when ``routed``."""
        return self._score_view.dim

    @property
    def folded_steps(self) -> int:
        """Steps whose input-canary gradients came from the batch's own pass (the rest, if any
        input canaries or references exist, used the separate pass)."""
        return self._inputs.folded_steps

    def _require_steps(self) -> None:
        if self._steps == 0:
            raise RuntimeError("no optimizer step has been recorded yet")

    def scores(self) -> dict[str, np.ndarray]:
        """Score name -> (K,) float64 array of accumulated scores (sum or max over steps)."""
        self._require_steps()
        return self._accumulator.scores()

    def per_step(self) -> dict[str, np.ndarray]:
        """Score name -> (K, T) array of per-step values (needs ``keep_per_step=True``; with
        ``keep_per_step=k``, (k, T): the first k canaries')."""
        if not self.keep_per_step:
            raise RuntimeError("per-step values were not kept: pass keep_per_step=True")
        self._require_steps()
        return self._accumulator.per_step()

    def inclusions(self) -> np.ndarray:
        """(K, T) bool array: gradient canary k was added at step t (input canaries: False)."""
        self._require_steps()
        return np.stack(self._inclusions, axis=1)

    def white_box_records(self, *, sampling: dict | None = None,
                          accountant_history=None, accountant: str | None = None
                          ) -> WhiteBoxRecords:
        """The typed white-box records of the steps so far (``capture.records``), for
        ``experiment.judging.white_box``.

        Args:
            sampling: {"n": dataset size, "q": sample rate[, "loader": "poisson"]} when
                known: the Poisson sampling tests need them; by default the hook's sample
                rate and the size of the training loader's data set (when one was given).
            accountant_history: the accountant's ``history`` (the bookkeeping check).
            accountant: the name of the accountant whose epsilon the user reads (``rdp``,
                ``prv`` or ``gdp``: ``PrivacyEngine.accountant.mechanism()``), with which the
                training's epsilon is recomputed from what was measured.
        """
        self._require_steps()
        known = {"q": float(self.sample_rate), "loader": "poisson"}
        if self.dataset_size is not None:
            known["n"] = int(self.dataset_size)
        sampling = {**known, **{k: v for k, v in (sampling or {}).items() if v is not None}}
        return self._white_box.records(sampling=sampling, accountant_history=accountant_history,
                                       distributed=self.distributed, accountant=accountant,
                                       independence=self.canary_independence())

    def canary_independence(self):
        """The ``IndependenceRecord`` of the steps so far: per canary set, whether the data's
        clipped sum reached its gradient canaries' coordinates, where and when first."""
        return self._independence.record()

    def released_squared_norms(self) -> np.ndarray:
        """(J, T): squared norm of each optimizer tensor's released sum (the released
        gradient times its divisor: noise + clipped sum + canaries) at each step."""
        self._require_steps()
        return np.stack([s.released_sq for s in self._white_box.steps], axis=1)

    @property
    def tensor_dims(self) -> list[int]:
        """Number of coordinates of each optimizer tensor (the white-box records' order)."""
        return list(self._white_box.dims)

    @property
    def tensor_names(self) -> list[str]:
        """Names of the optimizer's tensors (the white-box records' order)."""
        return list(self._white_box.names)

    def noise_stds(self) -> np.ndarray:
        """(T,): the claimed noise std sigma C of each step (the optimizer's at that step)."""
        self._require_steps()
        return np.asarray([s.noise_std for s in self._white_box.steps], dtype=np.float64)

    def batch_sizes(self) -> list[int | None]:
        """Examples in each step's batch (None where unknown: BatchMemoryManager, ghost)."""
        self._require_steps()
        return [s.batch_size for s in self._white_box.steps]

    @property
    def has_noise_probes(self) -> bool:
        """Whether ``noise_probes`` were given (``probe_noise`` is recorded)."""
        return self._white_box.has_noise_probes

    def probe_noise(self) -> np.ndarray:
        """(n, T): the released sum at the ``noise_probes`` minus the canaries inserted there
        (under the claim, the noise itself); needs ``noise_probes``."""
        if not self.has_noise_probes:
            raise RuntimeError("no noise probes were recorded: pass noise_probes=")
        self._require_steps()
        return np.stack([s.probe_noise for s in self._white_box.steps], axis=1)

    def clipping_check(self) -> dict | None:
        """The clipping check's summary (``ClippingCheck.summary``), or None when off."""
        return self._white_box.clipping_summary()

    # ------------------------------------------------------------------ weaker rungs
    def hidden_state_scores(self) -> np.ndarray:
        """(K,) hidden-state scores in canary order, from theta_0 and the final parameters
        alone (``final_state.FinalState``: -<v_k, theta_T - theta_0> / ||v_k|| on each sparse
        gradient canary's support; theta_T the parameters at ``detach``, or now while
        attached); NaN for input and dense gradient canaries."""
        self._require_steps()
        return self._final.scores(self._params)

    def hidden_state_summary(self) -> dict:
        """What the hidden-state scores are (``FinalState.summary``): the base optimizer,
        whether it updates coordinates separately, whether theta_T - theta_0 is -lr x the sum
        of the releases (plain SGD, constant lr), the coordinates recorded."""
        return self._final.summary(self.optimizer, self._post_step)

    def final_model_scores(self) -> dict[str, np.ndarray]:
        """Score name -> (K,) black-box scores in canary order from the model as it is now
        (``final_state.final_model_scores``: negative loss, logit margin; and their gains
        over the initial model, scored when the first private step started:
        ``final_state.reference_gains``); NaN for gradient canaries. Call it after training."""
        self._require_steps()
        parts: list[dict[str, np.ndarray]] = []
        for c, initial in zip(self.canaries, self._initial_scores, strict=True):
            if isinstance(c, InputCanaries):
                parts.append(reference_gains(final_model_scores(self.model, c), initial))
            else:
                parts.append({})
        parts = [{k: v for k, v in p.items() if k != "reason"} for p in parts]
        names = sorted({k for p in parts for k in p})
        return {k: np.concatenate([p.get(k, np.full(len(c), np.nan))
                                   for p, c in zip(parts, self.canaries, strict=True)])
                for k in names}


# torch warns "Full backward hook is firing when gradients are computed with respect to module
# outputs since no inputs require gradients" on every backward through Opacus' hooks on a first
# layer (its inputs need no gradient): expected under Opacus, and it repeated in every user's
# loop. Silenced while a hook is attached, and only then.
_BACKWARD_HOOK_WARNING = "Full backward hook is firing"


def _silence_backward_hook_warning():
    """Add an ignore filter for that warning; returns the filter entry to remove later."""
    warnings.filterwarnings("ignore", message=_BACKWARD_HOOK_WARNING, category=UserWarning)
    return warnings.filters[0]


def _restore_warning_filter(entry) -> None:
    """Remove the filter ``_silence_backward_hook_warning`` added (if still there)."""
    if entry is None:
        return
    try:
        warnings.filters.remove(entry)
    except ValueError:  # already gone (someone reset the filters)
        return
    mutated = getattr(warnings, "_filters_mutated", None)  # what filterwarnings calls, so
    if mutated is not None:  # the per-module "already warned" caches see the change
        mutated()


def _half_hint(params) -> str:
    """Why a float16 training's release may be non-finite (empty for other dtypes)."""
    half = any(getattr(getattr(p, "grad_sample", None), "dtype", None) == torch.float16
               for p in params)
    if not half:
        return ""
    return (": the per-sample gradients are float16, whose range a scaled loss overflows; "
            "with a GradScaler, Opacus clips the scaled per-sample gradients (the scaler's "
            "unscale_ acts on p.grad, which DP-SGD then overwrites), so train float16 without "
            "a GradScaler, or under bfloat16 autocast")
