"""The bug zoo: realistic DP-SGD implementation bugs, planted on an Opacus optimizer.

An audit is only worth the bugs it can catch. Each entry of ``BUG_ZOO`` is a patch on one
``DPOptimizer`` instance (``plant_bug`` returns the function that removes it) that breaks the
guarantee while the accountant keeps reporting the nominal one. Every bug is named by its class,
says how it arises in real code (with the public report where one exists), and takes a
``severity`` (``dp.bug_factor``) whose meaning is bug-specific; ``catastrophic`` and ``mild``
are the two severities the zoo benchmark (``benchmarks/bug_zoo.py``) runs.

Classes:

* noise of the wrong scale: ``halved_noise``, ``scaled_noise``;
* noise missing on some steps: ``noise_skipped_steps``;
* noise reused / correlated across steps: ``noise_reused``, ``antithetic_noise``;
* noise missing on some parameter tensors: ``noise_partial_tensors``;
* noise of the wrong law (the right variance): ``laplace_noise``, ``rounded_noise``;
* noise shared within a step: ``broadcast_noise`` (between coordinates of a tensor),
  ``noise_shared_tensors`` (between tensors, at a shifted alignment);
* clipping broken: ``unclipped_example``, ``layer_clip_ignored`` (a layer left out of the
  per-example norm), ``microbatch_clipping`` (micro-batch sums clipped instead of examples);
* wrong normalisation: ``realised_batch_size``;
* sampling that is not Poisson (patches on the loader's sampler, ``plant_sampler_bug``):
  ``shuffled_batches``, ``shuffled_binomial_batches``, ``replayed_batches``,
  ``duplicated_examples`` (``dpaudit.sampler_bugs``);
* the model moved outside the private step: ``out_of_band_update``;
* noise that depends on the data: ``batch_seeded_noise``;
* the accountant told less than training did: ``accountant_sigma``, ``accountant_sample_rate``,
  ``accountant_steps``.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import (
    _check_processed_flag,
    _generate_noise,
    _mark_as_processed,
)

from dpaudit._validate import require_choice
from dpaudit.capture.patching import InstancePatch
from dpaudit.gradients.persample import clip_factor

Planter = Callable[[DPOptimizer, float], Callable[[], None]]


@dataclass(frozen=True)
class BugSpec:
    """One bug of the zoo.

    ``bug_class``: the class it belongs to; ``origin``: how it arises in real code;
    ``severity``: what ``dp.bug_factor`` means for it and its range; ``catastrophic`` /
    ``mild``: the severities of the zoo benchmark; ``target``: what the bug patches,
    ``"optimizer"`` (``plant_bug``) or ``"sampler"`` (the Poisson sampler of a DPDataLoader:
    ``plant_sampler_bug``).
    """

    name: str
    bug_class: str
    origin: str
    severity: str
    catastrophic: float
    mild: float
    plant: Planter | None
    valid: Callable[[float], bool] = lambda f: 0.0 < f <= 1.0
    target: str = "optimizer"

    @property
    def optimizer(self) -> bool:
        """Whether the bug is a patch on the optimizer (else on the loader's sampler)."""
        return self.target == "optimizer"


def _patch(opt: DPOptimizer, name: str, replacement: Callable) -> Callable[[], None]:
    """Install ``replacement`` as ``opt.<name>`` and return the exact restore."""
    return InstancePatch(opt, name, replacement, owner="plant_bug").apply().restore


def _noise_per_param(opt: DPOptimizer, stds: list[float], noises=None) -> None:
    """Opacus' ``add_noise`` with a per-parameter std (and optional given noise tensors)."""
    for i, p in enumerate(opt.params):
        _check_processed_flag(p.summed_grad)
        if noises is not None:
            noise = noises[i]
        else:
            noise = _generate_noise(
                std=stds[i], reference=p.summed_grad, generator=opt.generator,
                secure_mode=opt.secure_mode,
            )
        p.grad = (p.summed_grad + noise).view_as(p)
        _mark_as_processed(p.summed_grad)


def _scaled_noise(opt: DPOptimizer, factor: float) -> Callable[[], None]:
    original = opt.add_noise

    def add_noise() -> None:
        nominal = opt.noise_multiplier
        opt.noise_multiplier = nominal * factor
        try:
            original()
        finally:
            opt.noise_multiplier = nominal

    return _patch(opt, "add_noise", add_noise)


def _real_steps(opt: DPOptimizer) -> tuple[list[int], Callable[[], None]]:
    """A counter of the optimizer's real steps: read inside ``add_noise`` it is the step's
    index t (``pre_step`` wrapped, counting the calls that went on to a step); and its
    restore. A bug keyed to steps, not to ``add_noise`` calls, hits the same steps whatever
    else calls ``add_noise`` (an audit's noise probe does)."""
    count = [0]
    original = opt.pre_step

    def pre_step(closure=None):
        out = original(closure)
        if out:
            count[0] += 1
        return out

    return count, InstancePatch(opt, "pre_step", pre_step, owner="plant_bug:steps").apply().restore


def _on_steps(opt: DPOptimizer, add_noise_at) -> Callable[[], None]:
    """Patch ``add_noise`` with ``add_noise_at(t)`` (t: the real step's index); restore both."""
    count, restore_count = _real_steps(opt)
    restore_noise = _patch(opt, "add_noise", lambda: add_noise_at(count[0]))

    def restore() -> None:
        restore_noise()
        restore_count()

    return restore


def _noise_skipped_steps(opt: DPOptimizer, fraction: float) -> Callable[[], None]:
    """Step t is released without noise when floor((t + 1) f) > floor(t f): a fraction f of
    the steps, evenly spread (f = 0.1: every 10th step)."""
    original = opt.add_noise

    def add_noise(t: int) -> None:
        if _every(t, fraction):
            _noise_per_param(opt, [0.0] * len(opt.params))
        else:
            original()

    return _on_steps(opt, add_noise)


def _noise_reused(opt: DPOptimizer, rho: float) -> Callable[[], None]:
    """noise_t = rho n_0 + sqrt(1 - rho^2) fresh_t: every step's noise has correlation rho with
    the first step's (rho = 1: the very same tensor at every step)."""
    first: list[torch.Tensor] = []

    def add_noise() -> None:
        std = opt.noise_multiplier * opt.max_grad_norm
        fresh = [
            _generate_noise(std=std, reference=p.summed_grad, generator=opt.generator,
                            secure_mode=opt.secure_mode)
            for p in opt.params
        ]
        if not first:
            first.extend(f.clone() for f in fresh)
        keep = math.sqrt(max(0.0, 1.0 - rho * rho))
        _noise_per_param(opt, [], [rho * n0 + keep * f for n0, f in zip(first, fresh, strict=True)])

    return _patch(opt, "add_noise", add_noise)


def _every(t: int, fraction: float) -> bool:
    """Whether step t is one of a fraction of the steps, evenly spread (1: every step)."""
    return math.floor((t + 1) * fraction) > math.floor(t * fraction)


def _law_noise(opt: DPOptimizer, fraction: float, draw) -> Callable[[], None]:
    """Noise from ``draw(opt, std, reference)`` instead of Opacus' Gaussian on a fraction of
    the steps (evenly spread); Opacus' own noise on the others."""
    original = opt.add_noise

    def add_noise(t: int) -> None:
        if not _every(t, fraction):
            original()
            return
        std = opt.noise_multiplier * opt.max_grad_norm
        _noise_per_param(opt, [], [draw(opt, std, p.summed_grad) for p in opt.params])

    return _on_steps(opt, add_noise)


def _laplace(opt: DPOptimizer, std: float, reference: torch.Tensor) -> torch.Tensor:
    """Laplace noise of variance std^2 (scale std / sqrt 2), from the optimizer's generator."""
    def uniform():  # in [0, 1): 1 - u > 0, so the exponential below is finite
        return torch.rand(reference.shape, generator=opt.generator, device=reference.device,
                          dtype=reference.dtype)

    exponential = -torch.log1p(-uniform())
    sign = torch.where(uniform() < 0.5, -1.0, 1.0).to(reference.dtype)
    return (std / math.sqrt(2.0)) * sign * exponential


def _laplace_noise(opt: DPOptimizer, fraction: float) -> Callable[[], None]:
    return _law_noise(opt, fraction, _laplace)


def _rounded_noise(opt: DPOptimizer, grid: float) -> Callable[[], None]:
    """Opacus' Gaussian noise rounded to multiples of grid x sigma C."""

    def draw(o, std, reference):
        n = _generate_noise(std=std, reference=reference, generator=o.generator,
                            secure_mode=o.secure_mode)
        step = grid * std
        return torch.round(n / step) * step

    return _law_noise(opt, 1.0, draw)


def _broadcast_noise(opt: DPOptimizer, _severity: float) -> Callable[[], None]:
    """Every tensor with two or more dimensions gets noise drawn for its first dimension only
    and broadcast along the others (the right variance per coordinate, shared along rows)."""

    def draw(o, std, reference):
        if reference.dim() < 2:
            return _generate_noise(std=std, reference=reference, generator=o.generator,
                                   secure_mode=o.secure_mode)
        rows = reference.new_empty((reference.shape[0],) + (1,) * (reference.dim() - 1))
        n = _generate_noise(std=std, reference=rows, generator=o.generator,
                            secure_mode=o.secure_mode)
        return n.expand_as(reference).clone()

    return _law_noise(opt, 1.0, draw)


SHARED_SHIFT = 7  # the offset between the slices of the shared noise buffer


def _noise_shared_tensors(opt: DPOptimizer, fraction: float) -> Callable[[], None]:
    """The last tensors (``_last``) take their noise from the first tensor's noise buffer,
    each at an offset of ``SHARED_SHIFT`` more coordinates (wrapping around): one buffer
    sliced with overlapping offsets."""
    hit = _last(opt, fraction)

    def add_noise() -> None:
        std = opt.noise_multiplier * opt.max_grad_norm
        n = len(opt.params)
        first = _generate_noise(std=std, reference=opt.params[0].summed_grad,
                                generator=opt.generator, secure_mode=opt.secure_mode)
        flat = first.reshape(-1)
        noises = []
        for i, p in enumerate(opt.params):
            if i == 0:
                noises.append(first)
            elif i >= n - hit:
                idx = (torch.arange(p.summed_grad.numel(), device=flat.device)
                       + SHARED_SHIFT * i) % flat.numel()
                noises.append(flat[idx].view_as(p.summed_grad).clone())
            else:
                noises.append(_generate_noise(std=std, reference=p.summed_grad,
                                              generator=opt.generator,
                                              secure_mode=opt.secure_mode))
        _noise_per_param(opt, [], noises)

    return _patch(opt, "add_noise", add_noise)


def _antithetic_noise(opt: DPOptimizer, fraction: float) -> Callable[[], None]:
    """Steps come in pairs (2k, 2k + 1); in a fraction of the pairs (evenly spread) the
    second step's noise is minus the first's (antithetic draws, a sign-flipped buffer)."""
    state: dict = {"last": None}

    def add_noise(t: int) -> None:
        if t % 2 == 1 and state["last"] is not None and _every(t // 2, fraction):
            _noise_per_param(opt, [], [-n for n in state["last"]])
            return
        std = opt.noise_multiplier * opt.max_grad_norm
        noises = [_generate_noise(std=std, reference=p.summed_grad, generator=opt.generator,
                                  secure_mode=opt.secure_mode) for p in opt.params]
        state["last"] = [n.clone() for n in noises]
        _noise_per_param(opt, [], noises)

    return _on_steps(opt, add_noise)


def _last(opt: DPOptimizer, fraction: float) -> int:
    """How many parameter tensors, counted from the last, a tensor-level bug hits
    (``_hit_count`` of the optimizer's tensors)."""
    return _hit_count(len(opt.params), fraction)


def _hit_count(n: int, fraction: float) -> int:
    """How many of ``n`` tensors, counted from the last, a tensor-level bug hits: at least
    one and at most all but the first (fraction 1)."""
    if n < 2:
        raise ValueError("this bug needs a model with at least two parameter tensors")
    return min(n - 1, max(1, round(fraction * (n - 1))))


def _noise_partial_tensors(opt: DPOptimizer, fraction: float) -> Callable[[], None]:
    hit = _last(opt, fraction)

    def add_noise() -> None:
        std = opt.noise_multiplier * opt.max_grad_norm
        n = len(opt.params)
        _noise_per_param(opt, [0.0 if i >= n - hit else std for i in range(n)])

    return _patch(opt, "add_noise", add_noise)


def _clip_with(opt: DPOptimizer, factors: Callable[[list[torch.Tensor]], torch.Tensor]) -> None:
    """Opacus' ``clip_and_accumulate`` with the per-example factors computed by ``factors``
    from the flat per-sample gradients (one tensor per parameter)."""
    samples = opt.grad_samples
    factor = factors(samples) if len(samples[0]) else torch.zeros((0,), device=samples[0].device)
    _count_unclipped(opt, factor)
    for p in opt.params:
        _check_processed_flag(p.grad_sample)
        gs = opt._get_flat_grad_sample(p).to(p.dtype)
        grad = torch.einsum("i,i...", factor.to(gs.device, p.dtype), gs)
        p.summed_grad = grad if p.summed_grad is None else p.summed_grad + grad
        _mark_as_processed(p.grad_sample)


def _count_unclipped(opt: DPOptimizer, factor: torch.Tensor) -> None:
    """Adaptive clipping's counters, as its own ``clip_and_accumulate`` keeps them (the
    examples seen, those left unclipped), so that a clipping bug planted on an
    ``AdaClipDPOptimizer`` leaves its bound update working."""
    if hasattr(opt, "unclipped_num") and hasattr(opt, "sample_size"):
        opt.sample_size += len(factor)
        opt.unclipped_num += len(factor) - (factor < 1).sum()


def _norms(samples: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([g.reshape(len(g), -1).norm(2, dim=-1) for g in samples], dim=1)


def _unclipped_example(opt: DPOptimizer, fraction: float) -> Callable[[], None]:
    """In a fraction of the batches (every batch at 1), the example with the largest gradient
    norm is added unclipped (an off-by-one in a clipping loop). Batches are counted by the
    optimizer's ``pre_step`` (one per physical batch), so any clipping run during a buggy
    batch's step, an audit's probes included, has the bug, and the others none."""
    batch = [-1]
    original_pre_step = opt.pre_step

    def pre_step(closure=None):
        batch[0] += 1
        return original_pre_step(closure)

    def factors(samples):
        norms = _norms(samples).norm(2, dim=1)
        f = clip_factor(norms, opt.max_grad_norm)
        t = max(batch[0], 0)
        if math.floor((t + 1) * fraction) > math.floor(t * fraction):
            f[int(torch.argmax(norms))] = 1.0  # the bug: the largest one is not clipped
        return f

    restore_pre_step = _patch(opt, "pre_step", pre_step)
    restore_clip = _patch(opt, "clip_and_accumulate", lambda: _clip_with(opt, factors))

    def restore() -> None:
        restore_clip()
        restore_pre_step()

    return restore


def _layer_clip_ignored(opt: DPOptimizer, fraction: float) -> Callable[[], None]:
    """The per-example norm leaves out the last layers' gradients (their per-sample gradient
    is not counted), so those layers are scaled by a factor computed without them. The layers
    are the model's own: an audit's canary block (``add_canary_block``, no data gradient) is
    never among the left-out ones, so adding one does not make the bug harmless."""
    own = [i for i, p in enumerate(opt.params)
           if not getattr(p, "dpaudit_canary_block", False)]
    hit = _hit_count(len(own), fraction)
    counted = [i for i in range(len(opt.params)) if i not in set(own[len(own) - hit:])]

    def factors(samples):
        per = _norms(samples)
        return clip_factor(per[:, counted].norm(2, dim=1), opt.max_grad_norm)

    return _patch(opt, "clip_and_accumulate", lambda: _clip_with(opt, factors))


def _microbatch_clipping(opt: DPOptimizer, fraction: float) -> Callable[[], None]:
    """The batch is cut into consecutive micro-batches of g = round(1 / fraction) examples and
    each micro-batch's summed gradient is clipped to C, as if it were one example."""
    g = max(2, round(1.0 / fraction))

    def clip_and_accumulate() -> None:
        samples = opt.grad_samples
        b = len(samples[0])
        groups = torch.arange(b, device=samples[0].device) // g
        n_groups = int(groups.max()) + 1 if b else 0
        summed = []
        for s in samples:
            flat = s.reshape(b, -1).to(torch.float32)
            summed.append(torch.zeros(n_groups, flat.shape[1], device=flat.device).index_add_(
                0, groups, flat))
        norms = torch.stack([m.norm(2, dim=1) for m in summed], dim=1).norm(2, dim=1)
        f = clip_factor(norms, opt.max_grad_norm)
        _count_unclipped(opt, f[groups])  # each example by its micro-batch's factor
        for p, m in zip(opt.params, summed, strict=True):
            _check_processed_flag(p.grad_sample)
            grad = (f[:, None] * m).sum(0).view_as(p).to(p.dtype)
            p.summed_grad = grad if p.summed_grad is None else p.summed_grad + grad
            _mark_as_processed(p.grad_sample)

    return _patch(opt, "clip_and_accumulate", clip_and_accumulate)


def _realised_batch_size(opt: DPOptimizer, _severity: float) -> Callable[[], None]:
    if opt.loss_reduction != "mean":
        raise ValueError("bug 'realised_batch_size' needs loss_reduction='mean'")

    def scale_grad() -> None:
        realised = max(1, len(opt.grad_samples[0]))
        for p in opt.params:
            p.grad /= realised

    return _patch(opt, "scale_grad", scale_grad)


def _out_of_band_update(opt: DPOptimizer, fraction: float) -> Callable[[], None]:
    """On a fraction f of the steps (evenly spread), once ``optimizer.step()`` has made the
    private update, the last tensor is moved again by f^2 x its plain, non-private gradient
    step: lr x its clipped sum without noise over the expected batch size (f = 1: a full
    extra step every step; f = 0.1: 1% of a step, one step in ten). A second optimizer on a
    head, or a manual update after ``optimizer.step()``."""
    count, restore_count = _real_steps(opt)
    original = opt.step

    def step(self, closure=None):
        t = count[0]
        out = original(closure)
        p = self.params[-1]
        if count[0] > t and _every(t, fraction) and p.summed_grad is not None:
            lr = next(g["lr"] for g in self.param_groups
                      if any(q is p for q in g["params"]))
            scale = lr * fraction * fraction / (self.expected_batch_size
                                                * self.accumulated_iterations)
            with torch.no_grad():
                p.add_(p.summed_grad.view_as(p).to(p.dtype), alpha=-scale)
        return out

    # a bound method, as LR schedulers expect of ``optimizer.step`` (they rebind __func__)
    restore_step = _patch(opt, "step", types.MethodType(step, opt))

    def restore() -> None:
        restore_step()
        restore_count()

    return restore


def _batch_seed(opt: DPOptimizer) -> int:
    """A seed computed from the batch (its per-sample gradients): 'reproducible noise per
    batch'."""
    total = sum(float(g.double().abs().sum()) for g in opt.grad_samples)
    return int(total * 1e6) % (2**62)


def _batch_seeded_noise(opt: DPOptimizer, fraction: float) -> Callable[[], None]:
    """The noise of the last tensors (all of them at f = 1; only the last for small f) is
    drawn from a generator seeded by the batch: a fresh-looking Gaussian of the right scale
    at every step, and a deterministic function of the private batch."""
    n = len(opt.params)
    hit = n if fraction >= 1.0 else min(n, max(1, round(fraction * n)))

    def add_noise() -> None:
        std = opt.noise_multiplier * opt.max_grad_norm
        device = opt.params[0].summed_grad.device
        seeded = torch.Generator(device=device).manual_seed(_batch_seed(opt))
        noises = [_generate_noise(std=std, reference=p.summed_grad,
                                  generator=seeded if i >= n - hit else opt.generator,
                                  secure_mode=opt.secure_mode)
                  for i, p in enumerate(opt.params)]
        _noise_per_param(opt, [], noises)

    return _patch(opt, "add_noise", add_noise)


def _accountant_hook(opt: DPOptimizer):
    """(the accountant, the sample rate) behind Opacus' step hook (its closure)."""
    hook = opt.step_hook
    code, cells = getattr(hook, "__code__", None), getattr(hook, "__closure__", None)
    if code is None or cells is None or "sample_rate" not in code.co_freevars:
        raise ValueError("the optimizer has no Opacus accountant hook to misreport to")
    values = dict(zip(code.co_freevars, (c.cell_contents for c in cells), strict=True))
    return values["self"], float(values["sample_rate"])


def _accountant_sigma(opt: DPOptimizer, factor: float) -> Callable[[], None]:
    """The accountant records sigma / factor while the noise uses sigma (a config read twice,
    or the accountant fed the value of another run)."""
    original = opt.step_hook

    def step_hook(optim) -> None:
        nominal = optim.noise_multiplier
        optim.noise_multiplier = nominal / factor
        try:
            original(optim)
        finally:
            optim.noise_multiplier = nominal

    return _patch(opt, "step_hook", step_hook)


def _accountant_sample_rate(opt: DPOptimizer, factor: float) -> Callable[[], None]:
    """The accountant is told factor x q (the batch size divided by the wrong dataset size)."""
    accountant, rate = _accountant_hook(opt)
    return _patch(opt, "step_hook", accountant.get_optimizer_hook_fn(rate * factor))


def _accountant_steps(opt: DPOptimizer, fraction: float) -> Callable[[], None]:
    """A fraction of the steps never reaches the accountant (steps taken outside the hooked
    optimizer, e.g. after a restart or in a warm-up loop)."""
    original = opt.step_hook
    step = [0]

    def step_hook(optim) -> None:
        t = step[0]
        step[0] += 1
        if not math.floor((t + 1) * fraction) > math.floor(t * fraction):
            original(optim)

    return _patch(opt, "step_hook", step_hook)


BUG_ZOO: dict[str, BugSpec] = {
    s.name: s
    for s in (
        BugSpec(
            "halved_noise", "noise of the wrong scale",
            "the noise std computed from the wrong variable (e.g. sigma C / 2 from a std / "
            "variance mix-up); the accountant still sees sigma",
            "none (the noise is sigma / 2)", 1.0, 1.0, lambda o, f: _scaled_noise(o, 0.5),
            valid=lambda f: True,
        ),
        BugSpec(
            "scaled_noise", "noise of the wrong scale",
            "the noise multiplier overridden or rescaled after the accountant read it",
            "the noise is factor x sigma, factor in (0, 1]", 0.5, 0.9, _scaled_noise,
        ),
        BugSpec(
            "noise_skipped_steps", "noise missing on some steps",
            "noise added only on some code path: after a retried step, on the last "
            "micro-batch of an accumulation window, or when a flag is set (TF Privacy #106, "
            "#134: the private gradient path silently skipped)",
            "fraction of steps released without noise, in (0, 1] (0.1: every 10th step)",
            0.1, 0.02, _noise_skipped_steps,
        ),
        BugSpec(
            "noise_reused", "noise reused or correlated across steps",
            "a noise generator re-seeded at every step, or a noise buffer reused (per-sample "
            "state reused across virtual steps: Opacus PR #219)",
            "correlation rho of every step's noise with the first step's, in (0, 1] (1: the "
            "same tensor every step)", 1.0, 0.5, _noise_reused,
        ),
        BugSpec(
            "antithetic_noise", "noise reused or correlated across steps",
            "antithetic sampling borrowed from variance reduction, or a noise buffer reused "
            "with its sign flipped: two releases whose noises cancel when added",
            "fraction of the step pairs (2k, 2k + 1) whose second noise is minus the first's, "
            "in (0, 1]", 1.0, 0.1, _antithetic_noise,
        ),
        BugSpec(
            "laplace_noise", "noise of the wrong law",
            "noise drawn from a Laplace law of the right variance (a generic 'add noise' "
            "helper shared with a Laplace mechanism, a sampler swapped for a faster one): "
            "heavier tails and a sharper centre than the Gaussian the accountant assumes",
            "fraction of the steps with Laplace noise, in (0, 1]", 1.0, 0.1, _laplace_noise,
        ),
        BugSpec(
            "rounded_noise", "noise of the wrong law",
            "the noise (or the noisy update) quantised to a grid: fixed-point arithmetic, "
            "compressed communication before an all-reduce or secure aggregation; a lattice "
            "shows the clipped sum's residue (cf. floating-point attacks, Mironov 2012)",
            "the grid step in units of sigma C, in (0, 1] (0.25: multiples of sigma C / 4)",
            0.25, 0.05, _rounded_noise,
        ),
        BugSpec(
            "broadcast_noise", "noise shared within a step",
            "noise drawn with the shape of a weight's first dimension and broadcast over the "
            "rest (a shape bug: summed_grad + noise of shape (out, 1)); every coordinate has "
            "the right variance but the differences along a row are noiseless",
            "none", 1.0, 1.0, _broadcast_noise, valid=lambda f: True,
        ),
        BugSpec(
            "noise_shared_tensors", "noise shared within a step",
            "one noise buffer sliced per parameter with overlapping offsets, or a generator "
            "state restored before each tensor: a tensor's noise repeats another's at a "
            "shifted alignment, and their difference is noiseless",
            "fraction of the tensors after the first whose noise is the first tensor's, "
            f"shifted by {SHARED_SHIFT} x their index (from the last; 1: all of them)",
            1.0, 0.01, _noise_shared_tensors,
        ),
        BugSpec(
            "noise_partial_tensors", "noise missing on some parameter tensors",
            "noise added in a loop over parameter groups that misses some (biases, a new "
            "head, parameters registered after the optimizer was built)",
            "fraction of the tensors after the first released without noise, counted from "
            "the last (1: only the first tensor is noised; small: only the last is not)",
            1.0, 0.01, _noise_partial_tensors,
        ),
        BugSpec(
            "unclipped_example", "clipping broken",
            "an off-by-one in a clipping loop leaves one example unclipped (Tramer et al. "
            "2022, 'Debugging differential privacy': sensitivity off in DP code)",
            "fraction of batches whose largest-norm example is not clipped, in (0, 1]",
            1.0, 0.1, _unclipped_example,
        ),
        BugSpec(
            "layer_clip_ignored", "clipping broken",
            "a layer's per-sample gradient left out of the per-example norm (a layer without "
            "a grad sampler, a parameter excluded from the norm; Opacus #664: a fast "
            "clipping path that ignored the norm)",
            "fraction of the tensors after the first left out of the norm, from the last "
            "(mild: half of them; the last bias alone adds about 0.7% to the default MLP's "
            "contribution, +0.8% epsilon: a warning by the clipping rule, not a bug)", 1.0, 0.5,
            _layer_clip_ignored,
        ),
        BugSpec(
            "microbatch_clipping", "clipping broken",
            "micro-batches clipped as if each were one example, doubling the sensitivity "
            "(TF Privacy #620)",
            "1 / micro-batch size, in (0, 0.5] (0.5: micro-batches of 2, the largest change "
            "one example can make; 0.25: of 4)", 0.5, 0.25,
            _microbatch_clipping, valid=lambda f: 0.0 < f <= 0.5,
        ),
        BugSpec(
            "realised_batch_size", "wrong normalisation",
            "the noisy sum divided by the realised batch size instead of the expected one, "
            "which reveals how many examples were drawn (Opacus #571, #819)",
            "none", 1.0, 1.0, _realised_batch_size, valid=lambda f: True,
        ),
        BugSpec(
            "shuffled_batches", "sampling that is not Poisson",
            "fixed-size shuffled batches while the accountant assumes Poisson sampling "
            "(Opacus #80; shuffling audits, arXiv 2411.10614)",
            "none (each pass a permutation cut into batches of the expected size)", 1.0, 1.0,
            None, valid=lambda f: True, target="sampler",
        ),
        BugSpec(
            "shuffled_binomial_batches", "sampling that is not Poisson",
            "shuffling accounted as Poisson with the sizes Poisson sampling would draw: each "
            "pass a random permutation cut into Binomial(n, q)-sized batches (every size "
            "exactly Poisson's; each example used once per pass; Chua et al. 2024)",
            "fraction of the passes so drawn (Poisson sampling on the others), in (0, 1] "
            "(0.5: every second pass)", 1.0, 0.5, None, target="sampler",
        ),
        BugSpec(
            "replayed_batches", "sampling that is not Poisson",
            "a sampler whose generator is re-seeded at each epoch replays the previous pass's "
            "batches: every size still Binomial(n, q), amplification by sampling holds once, "
            "not at every pass",
            "fraction of the passes after the first that replay the previous one, in (0, 1] "
            "(1: every pass the first; 0.2: one pass in five)", 1.0, 0.2, None,
            target="sampler",
        ),
        BugSpec(
            "duplicated_examples", "sampling that is not Poisson",
            "rows duplicated in a batch (an example sampled at q / 2 and put in twice, a join "
            "or augmentation that repeats rows): one example, two rows, twice the sensitivity "
            "the accountant counts",
            "fraction of the steps whose batch is drawn at q / 2 with every example twice, "
            "in (0, 1]", 1.0, 0.1, None, target="sampler",
        ),
        BugSpec(
            "out_of_band_update", "the model moved outside the private step",
            "a second optimizer on a head, or a manual update, moves a tensor after "
            "optimizer.step() by its plain (unclipped-noise-free) gradient: the released "
            "noisy gradient is exactly Opacus', the published model is not",
            "fraction f of the steps (evenly spread) after which the last tensor moves by "
            "f^2 x its plain gradient step, in (0, 1] (1: a full step every step; 0.1: 1% of "
            "a step, one step in ten)", 1.0, 0.1, _out_of_band_update,
        ),
        BugSpec(
            "batch_seeded_noise", "noise that depends on the data",
            "'reproducible noise per batch': the noise generator seeded from the batch (here a "
            "hash of its per-sample gradients): a fresh-looking Gaussian of the right scale "
            "at every step, and a deterministic function of the private batch",
            "fraction of the tensors, from the last, whose noise is so seeded, in (0, 1] (1: "
            "all; small: only the last)", 1.0, 0.01, _batch_seeded_noise,
        ),
        BugSpec(
            "accountant_sigma", "the accountant told less than training did",
            "the accountant fed a larger noise multiplier than the optimizer uses (a config "
            "read twice, or sigma rescaled after make_private)",
            "the accountant records sigma / factor, factor in (0, 1]", 0.5, 0.9,
            _accountant_sigma,
        ),
        BugSpec(
            "accountant_sample_rate", "the accountant told less than training did",
            "the accountant given a smaller sample rate than the sampler uses (batch size over "
            "the wrong dataset size; Opacus #813)",
            "the accountant records factor x q, factor in (0, 1]", 0.5, 0.9,
            _accountant_sample_rate,
        ),
        BugSpec(
            "accountant_steps", "the accountant told less than training did",
            "steps taken outside the accounted optimizer (a warm-up loop, a restart from a "
            "checkpoint whose history was lost)",
            "fraction of the steps the accountant never sees, in (0, 1]", 0.5, 0.1,
            _accountant_steps,
        ),
    )
}
"""Every bug of the zoo, by name (module doc)."""

BUGS = ("none", *BUG_ZOO)


def check_bug(bug: str, factor: float | None) -> BugSpec | None:
    """The ``BugSpec`` of ``bug`` (None for "none") after checking ``factor`` (its severity;
    None: the bug's catastrophic severity); a ValueError names ``bug`` or ``bug_factor`` and
    what was expected."""
    require_choice("bug", bug, BUGS)
    if bug == "none":
        return None
    spec = BUG_ZOO[bug]
    if factor is None:
        return spec
    if not (isinstance(factor, (int, float)) and not isinstance(factor, bool)
            and math.isfinite(factor) and spec.valid(float(factor))):
        raise ValueError(
            f"factor (dp.bug_factor) of bug {bug!r} is its severity: {spec.severity}; "
            f"got {factor!r}"
        )
    return spec


def plant_bug(
    optimizer: DPOptimizer, bug: str, factor: float | None = None
) -> Callable[[], None]:
    """Patch ``bug`` onto ``optimizer`` (plant it before attaching an ``AuditHook``).

    ``factor`` is the bug's severity (``BUG_ZOO[bug].severity`` says what it means; None: its
    ``catastrophic`` severity; ignored by the bugs without one). Returns a function that
    restores the correct optimizer.
    ``bug="none"`` changes nothing; the sampling bugs patch the loader, not the optimizer, and
    are refused here (``plant_sampler_bug``; ``run_audit`` plants them on its loader).
    """
    spec = check_bug(bug, factor)
    if not isinstance(optimizer, DPOptimizer):
        raise ValueError(f"optimizer must be an Opacus DPOptimizer, got {type(optimizer).__name__}")
    if spec is None:
        return lambda: None
    if not spec.optimizer:
        raise ValueError(
            f"bug {bug!r} is not a patch on the optimizer but on the loader's sampler: "
            "plant_sampler_bug(data_loader, bug) (run_audit(dp={'bug': ...}) does)"
        )
    return spec.plant(optimizer, spec.catastrophic if factor is None else float(factor))


def plant_sampler_bug(data_loader, bug: str, factor: float | None = None) -> Callable[[], None]:
    """Patch the sampling bug ``bug`` onto the Poisson sampler of ``data_loader`` (a
    ``DPDataLoader``; plant it before attaching an ``AuditHook`` that records the loader).

    ``factor`` is the bug's severity (None: its ``catastrophic`` severity). Returns a function
    that restores the correct sampler. ``bug="none"`` changes nothing; a bug that patches the
    optimizer is refused, naming ``plant_bug``.
    """
    from dpaudit.sampler_bugs import patch_sampler

    spec = check_bug(bug, factor)
    if spec is None:
        return lambda: None
    if spec.target != "sampler":
        raise ValueError(f"bug {bug!r} patches the optimizer, not the sampler: "
                         "plant_bug(optimizer, bug)")
    return patch_sampler(data_loader, bug, spec.catastrophic if factor is None else float(factor))
