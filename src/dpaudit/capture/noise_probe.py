"""The noise ignores the data: the optimizer's own ``add_noise`` probed with its generators'
states saved and restored.

DP-SGD's claim is that the noise is independent of the data. A noise drawn from a generator
seeded by the batch ("reproducible noise per batch") is a fresh-looking Gaussian of the right
scale at every step, so the tests of its law pass, and it is a deterministic function of the
private batch. At the first step and a seeded twentieth of the others, just before the real
``add_noise``, ``NoiseProbe`` runs the optimizer's ``add_noise`` (whatever is installed: Opacus',
a patched one) three more times on fresh zero clipped sums:

* A, from the generators' saved state, and B, from the same state restored: A = B is the
  probe's premise (the noise is a function of the states the probe restores); when it fails the
  step is inconclusive (a state the probe cannot reach), never a finding;
* F, from the state B left (advanced): the noise must differ from A on every tensor (fresh);
  equal, the noise does not follow the generator at all;
* the real call, from the saved state restored again, on the real clipped sum: its noise
  (release minus clipped sum) must be A's, up to the release's rounding; different, the
  noise depends on the clipped sum, i.e. on the batch.

The generators restored are the optimizer's ``generator``, any ``torch.Generator`` among its
attributes, and torch's default generators of the CPU and of the parameters' accelerators.
The real call starts from the saved state, so it draws exactly the noise it would have drawn
without the probe and leaves the generators where it would have: training is bit for bit the
same (tested). Where the optimizer's generator cannot be saved and restored (Opacus'
``secure_mode`` draws from torchcsprng's ``/dev/urandom`` device, which has no state), the
probe does not run and says why. The comparisons stay on the parameters' device; under DPDDP
the probe runs on rank 0, which adds the noise, and its outcome is summed over the ranks at
every step (one small all-reduce), so every rank holds it.
"""

from __future__ import annotations

import numpy as np
import torch

from dpaudit import seeds
from dpaudit.capture.records import NoiseSourceRecord
from dpaudit.capture.support import (
    clip_bound,
    gradient_noise_multiplier,
    restore_counters,
    save_counters,
)

STEP_SHARE = 0.05  # the share of the steps after the first that are probed


def _generators(opt) -> list:
    """Every generator the noise could come from (module doc), once each."""
    found, seen = [], set()

    def add(g) -> None:
        if g is not None and id(g) not in seen:
            seen.add(id(g))
            found.append(g)

    add(getattr(opt, "generator", None))
    for value in vars(opt).values():
        if isinstance(value, torch.Generator):
            add(value)
    add(torch.default_generator)
    for p in opt.params:
        if p.device.type == "cuda":
            add(torch.cuda.default_generators[p.device.index or 0])
    return found


def unrestorable(opt) -> str | None:
    """Why the noise generator's state cannot be saved and restored, or None."""
    g = getattr(opt, "generator", None)
    if g is None:
        return None
    try:
        g.set_state(g.get_state())
    except (AttributeError, RuntimeError, NotImplementedError, TypeError) as err:
        return (f"the optimizer's noise generator ({type(g).__name__}) cannot be saved and "
                f"restored ({type(err).__name__}: {err}); Opacus' secure_mode draws from "
                "torchcsprng's /dev/urandom device, which has no state, so its noise cannot "
                "be replayed")
    return None


class NoiseProbe:
    """Probe the optimizer's ``add_noise`` at seeded steps (module doc).

    Args:
        optimizer: the DP optimizer.
        names: its tensors' names, in its order.
        seed: seeds which steps are probed (the probe's own stream).
        rank / distributed: under DPDDP only rank 0 adds noise; every rank receives the
            outcome.
    """

    def __init__(self, optimizer, names: list[str], seed: int, *, rank: int = 0,
                 distributed: bool = False) -> None:
        self.optimizer = optimizer
        self.names = list(names)
        self.reason = unrestorable(optimizer)
        self.distributed = bool(distributed)
        self.rank = int(rank)
        self._rng = seeds.stream(seed, seeds.NOISE_PROBE)
        self._pending = None  # (step, A, flags) between the probe and the real call
        self.failures = 0  # probed steps where the probe's own add_noise calls raised
        self.failure: str | None = None
        self._steps: list[tuple[int, torch.Tensor]] = []  # (step, (4, J) outcome)

    def _probe_now(self, first: bool) -> bool:
        return first or float(self._rng.random()) < STEP_SHARE

    @torch.no_grad()
    def before(self, opt, step: int, add_noise) -> None:
        """Right before the real ``add_noise`` (the clipped sum final, canaries included):
        run the probe calls if this step is probed, leaving every state as it was."""
        self._pending = None
        probe = self._probe_now(step == 0)
        if self.reason is not None or not probe:
            return
        std = gradient_noise_multiplier(opt) * clip_bound(opt)
        if not std > 0:
            return
        if self.distributed and self.rank != 0:
            self._pending = (step, None, None)
            return
        params = list(opt.params)
        gens = _generators(opt)
        states = [g.get_state() for g in gens]
        saved = [(p.summed_grad, p.grad) for p in params]
        counters = save_counters(opt)  # adaptive clipping's add_noise also noises its count

        def call() -> list[torch.Tensor]:
            restore_counters(opt, counters)
            for p, (summed, _) in zip(params, saved, strict=True):
                p.summed_grad = torch.zeros_like(summed)
            add_noise()
            return [p.grad.detach().reshape(-1) for p in params]

        def restore() -> None:
            for g, s in zip(gens, states, strict=True):
                g.set_state(s)
            restore_counters(opt, counters)

        try:
            a = call()
            restore()
            b = call()
            f = call()
        except Exception as err:
            self.failures += 1
            self.failure = f"{type(err).__name__}: {err}"
            a = None
        finally:
            restore()
            for p, (summed, grad) in zip(params, saved, strict=True):
                p.summed_grad, p.grad = summed, grad
        if a is None:
            self._pending = (step, None, None) if self.distributed else None
            return
        device = params[0].device
        not_repeated = torch.stack([(x != y).any() for x, y in zip(a, b, strict=True)])
        stale = torch.stack([(x == y).all() if x.numel() else torch.tensor(False, device=x.device)
                             for x, y in zip(a, f, strict=True)])
        self._pending = (step, a, torch.stack([not_repeated.to(device), stale.to(device)]), std)

    @torch.no_grad()
    def after(self, opt) -> None:
        """Right after the real ``add_noise``: its noise against the probe's zero-sum noise."""
        pending, self._pending = self._pending, None
        if pending is None:
            if self.distributed:  # every rank takes part in every step's exchange
                self._exchange(None)
            return
        step, a = pending[0], pending[1]
        outcome = None
        if a is not None:
            flags, std = pending[2], pending[3]
            rows = []
            for p, noise in zip(opt.params, a, strict=True):
                g = p.grad.detach().reshape(-1)
                r = g.double() - p.summed_grad.detach().reshape(-1).double()
                eps = torch.finfo(g.dtype).eps if g.is_floating_point() else 0.0
                tol = (eps / 2.0 + 2.0**-52) * g.double().abs() + 1e-300
                gap = (r - noise.double()).abs()
                rows.append(torch.stack([(gap > tol).any().double(),
                                         gap.max().double() / std if gap.numel()
                                         else torch.zeros((), dtype=torch.float64,
                                                          device=g.device)]))
            dep = torch.stack(rows).T  # (2, J): differs, largest gap / sigma C
            outcome = torch.cat([flags.double(), dep.to(flags.device)])  # (4, J)
        if self.distributed:
            outcome = self._exchange(outcome)
        if outcome is not None:
            self._steps.append((step, outcome))

    def _exchange(self, outcome):
        """Sum the (4, J) outcome over the ranks (rank 0 holds it; a leading 1 says a probe
        ran); returns it on every rank, or None when no rank probed this step."""
        device = self.optimizer.params[0].device
        if torch.distributed.get_backend() != "nccl":
            device = torch.device("cpu")
        j = len(self.names)
        buf = torch.zeros(1 + 4 * j, dtype=torch.float64, device=device)
        if outcome is not None:
            buf[0] = 1.0
            buf[1:] = outcome.reshape(-1).to(device)
        torch.distributed.all_reduce(buf)
        if buf[0].item() < 0.5:
            return None
        return buf[1:].reshape(4, j)

    def record(self) -> NoiseSourceRecord:
        """The outcome so far (``NoiseSourceRecord``)."""
        j = len(self.names)
        zero = np.zeros(j, dtype=np.int64)
        if not self._steps:
            return NoiseSourceRecord(names=list(self.names), steps_probed=0, conclusive=0,
                                     inconclusive=0, data_dependent=zero, stale=zero,
                                     reason=self.reason, failures=self.failures,
                                     failure=self.failure)
        steps = [s for s, _ in self._steps]
        out = torch.stack([o.double().cpu() for _, o in self._steps]).numpy()  # (P, 4, J)
        inconclusive = out[:, 0, :].any(axis=1)
        ok = ~inconclusive
        stale = (out[:, 1, :] > 0.5) & ok[:, None]
        dep = (out[:, 2, :] > 0.5) & ok[:, None]

        def first(mask, size=None):
            hits = np.argwhere(mask)
            if not hits.size:
                return None
            i, jj = (int(x) for x in hits[0])
            return (steps[i], self.names[jj]) + (() if size is None else (float(size[i, jj]),))

        return NoiseSourceRecord(
            names=list(self.names), steps_probed=len(steps), conclusive=int(ok.sum()),
            inconclusive=int(inconclusive.sum()), data_dependent=dep.sum(axis=0),
            stale=stale.sum(axis=0), first_data_dependent=first(dep, out[:, 3, :]),
            first_stale=first(stale), reason=self.reason,
            failures=self.failures, failure=self.failure,
        )
