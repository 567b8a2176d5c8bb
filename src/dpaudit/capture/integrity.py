"""The model moves only inside the private step: fingerprints of every parameter and buffer.

DP-SGD's claim covers the published model only if every change of it is the optimizer's
update from the released (noisy) gradient. Real code breaks that while every per-step check
passes: a second optimizer steps a head on its plain gradient after ``optimizer.step()``, a
manual update moves a tensor between steps, running statistics (buffers) are updated from the
private batch and published without noise. ``ModelIntegrity`` wraps the step of the optimizer
Opacus' ``DPOptimizer`` wraps (``original_optimizer.step``: the private update itself, whatever
the base optimizer: SGD, momentum, Adam, weight decay, a learning-rate schedule) and
fingerprints every tensor of the model when that step starts and when it returns:

* a parameter the DP optimizer updates may change only inside the step: a difference between
  the end of step t and the start of step t + 1 names the tensor and the step;
* a model parameter outside the DP optimizer's groups (trainable or frozen) and a buffer may
  not change at all, inside a step or between steps;
* post-processing that depends on the parameters alone (a projection, a clamp, a
  renormalisation) is legitimate when declared: ``post_step`` takes the tensors' values right
  after the private step (copies, by name) and returns the values it sets; a change between
  steps that it reproduces exactly is explained, any other is the finding.

The fingerprint of a tensor is three integer sums of its bit pattern (read as integers of its
width): sum x_i, sum x_i^2 and sum x_i x_(i+1), modulo 2^64, so it is exact (bit for bit, not
a tolerance) and blind only to a change that keeps all three sums. It is computed where the
tensor lives, and the comparisons are kept on that device: no host synchronisation per step
unless ``post_step`` is declared. Copies of the model exist only with ``post_step`` (to replay
it). EMA copies of the weights, optimizer state, learning-rate schedules: none is a tensor of
the model, so none is flagged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from opacus.optimizers import DPOptimizer

from dpaudit.capture.patching import InstancePatch
from dpaudit.capture.records import IntegrityRecord
from dpaudit.gradients.persample import unwrap_model

KINDS = ("dp", "other", "buffer")
_INT = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
_BLOCK = 1 << 22  # elements per block of the fingerprint's integer temporaries


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """(3,) int64 on ``t``'s device: sum x, sum x^2, sum x_i x_(i+1) of ``t``'s bit pattern
    read as integers of its width (module doc)."""
    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    if x.dtype == torch.bool:
        x = x.to(torch.int8)
    x = x.reshape(-1)
    if x.is_floating_point():
        x = x.view(_INT[x.element_size()])
    out = torch.zeros(3, dtype=torch.int64, device=x.device)
    n = x.numel()
    for a in range(0, n, _BLOCK):
        w = x[a : min(n, a + _BLOCK + 1)].to(torch.int64)  # one more: the pair across blocks
        head = w[: min(_BLOCK, n - a)]
        out[0] += head.sum()
        out[1] += (head * head).sum()
        if w.numel() > 1:
            out[2] += (w[:-1] * w[1:]).sum()
    return out


def _named_tensors(model, optimizer: DPOptimizer) -> list[tuple[str, torch.Tensor, str]]:
    """(name, tensor, kind) of every parameter and buffer of the model, and of any parameter
    the optimizer updates that the model does not name."""
    module = unwrap_model(model)
    base = optimizer.original_optimizer
    updated = {id(p) for g in base.param_groups for p in g["params"]}
    out, seen = [], set()
    for name, p in module.named_parameters():
        seen.add(id(p))
        out.append((name, p, "dp" if id(p) in updated else "other"))
    for i, p in enumerate(optimizer.params):
        if id(p) not in seen:
            seen.add(id(p))
            out.append((f"param {i}", p, "dp"))
    for name, b in module.named_buffers():
        if id(b) not in seen:
            seen.add(id(b))
            out.append((name, b, "buffer"))
    return out


class ModelIntegrity:
    """Fingerprint the model when the private step starts and returns (module doc).

    Args:
        optimizer: the DP optimizer (its ``original_optimizer.step`` is the private step).
        model: the model (its parameters and buffers are watched).
        post_step: the declared post-processing: a function of {name: tensor} (copies of
            every watched tensor right after the private step) returning {name: new value}
            for the tensors it changes; None: nothing may change between steps.
    """

    def __init__(self, optimizer: DPOptimizer, model,
                 post_step: Callable[[dict], Mapping] | None = None) -> None:
        if post_step is not None and not callable(post_step):
            raise ValueError(
                "post_step must be a function of {name: tensor} returning {name: new value} "
                f"(the post-processing applied after optimizer.step()), got {post_step!r}")
        self.optimizer = optimizer
        watched = _named_tensors(model, optimizer)
        self.names = [n for n, _, _ in watched]
        self.tensors = [t for _, t, _ in watched]
        self.kinds = [k for _, _, k in watched]
        self.post_step = post_step
        self._patch: InstancePatch | None = None
        self._steps = 0
        self._end: torch.Tensor | None = None
        self._snapshot: dict | None = None
        self._explained = 0
        self._largest: dict[str, float] = {}
        self._state: dict[str, torch.Tensor] | None = None

    # ------------------------------------------------------------------ attach / detach
    def attach(self) -> None:
        """Wrap the base optimizer's ``step``; a declared ``post_step`` is tried once here on
        the current values, so a mistake in it is reported before training."""
        if self.post_step is not None:
            self._check_post_step()
        base = self.optimizer.original_optimizer
        self._patch = InstancePatch(base, "step", self._step, "AuditHook").apply()

    def detach(self) -> None:
        if self._patch is not None:
            self._patch.restore()
            self._patch = None

    def _check_post_step(self) -> None:
        values = self._copies()
        try:
            out = self._apply_post_step(values)
        except Exception as err:
            raise ValueError(f"post_step raised {type(err).__name__}: {err} (it takes "
                             "{name: tensor} and returns {name: new value})") from err
        for name, value in out.items():
            old = values[name]
            if not isinstance(value, torch.Tensor) or value.shape != old.shape:
                raise ValueError(
                    f"post_step returned {name!r} as "
                    f"{getattr(value, 'shape', type(value).__name__)}, expected a tensor of "
                    f"shape {tuple(old.shape)}")

    def _apply_post_step(self, values: dict) -> dict:
        with torch.no_grad():
            out = self.post_step(values)
        if not isinstance(out, Mapping):
            raise ValueError("post_step must return a mapping {name: new value}, got "
                             f"{type(out).__name__}")
        unknown = [k for k in out if k not in values]
        if unknown:
            raise ValueError(f"post_step returned tensors the model does not have: "
                             f"{unknown[:5]} (names: {self.names[:5]}...)")
        return dict(out)

    def _copies(self) -> dict[str, torch.Tensor]:
        return {n: t.detach().clone() for n, t in zip(self.names, self.tensors, strict=True)}

    # ------------------------------------------------------------------ the private step
    @torch.no_grad()
    def _fingerprints(self) -> torch.Tensor:
        device = self.tensors[0].device if self.tensors else torch.device("cpu")
        return torch.stack([fingerprint(t).to(device) for t in self.tensors])

    def _start_state(self, device) -> None:
        j = len(self.tensors)
        self._state = {
            k: torch.full((j,), -1 if k.startswith("first") else 0, dtype=torch.int64,
                          device=device)
            for k in ("first_between", "changed_between", "first_inside", "changed_inside")
        }
        self._movable = torch.tensor([k == "dp" for k in self.kinds], device=device)

    def _mark(self, which: str, changed: torch.Tensor) -> None:
        """Count ``changed`` (J,) bools under ``which``, on device: "between" (after private
        step t = steps - 1, before the next) or "inside" (during private step t = steps)."""
        s = self._state
        s[f"changed_{which}"] += changed.long()
        first = s[f"first_{which}"]
        t = self._steps - 1 if which == "between" else self._steps
        s[f"first_{which}"] = torch.where((first < 0) & changed, torch.full_like(first, t),
                                          first)

    def _step(self, *args, **kwargs):
        """The base optimizer's step, fingerprinted before and after."""
        start = self._fingerprints()
        if self._state is None:
            self._start_state(start.device)
        if self._end is not None:
            changed = (start != self._end).any(dim=1)
            if self.post_step is not None:
                changed = self._explain(changed)
            self._mark("between", changed)
        out = self._patch.original(*args, **kwargs)
        end = self._fingerprints()
        self._mark("inside", (start != end).any(dim=1) & ~self._movable)
        self._end = end
        if self.post_step is not None:
            self._snapshot = self._copies()
        self._steps += 1
        return out

    @torch.no_grad()
    def _explain(self, changed: torch.Tensor) -> torch.Tensor:
        """The changes between steps that the declared post_step does not reproduce."""
        idx = changed.nonzero().flatten().tolist()  # a synchronisation, with post_step only
        if not idx or self._snapshot is None:
            return changed
        expected = self._apply_post_step(self._snapshot)
        left = changed.clone()
        for j in idx:
            name = self.names[j]
            want = expected.get(name, self._snapshot[name])
            now = self.tensors[j].detach()
            if want.shape == now.shape and torch.equal(want.to(now.device, now.dtype), now):
                left[j] = False
                self._explained += 1
            else:
                diff = (now.double() - want.to(now.device).double()).abs().max()
                self._largest[name] = max(self._largest.get(name, 0.0), float(diff))
        return left

    # ------------------------------------------------------------------ results
    @property
    def steps(self) -> int:
        return self._steps

    def record(self) -> IntegrityRecord:
        """What was seen so far (``IntegrityRecord``)."""
        j = len(self.tensors)
        if self._state is None:
            zeros, minus = torch.zeros(j, dtype=torch.int64), torch.full((j,), -1)
            state = {"changed_between": zeros, "first_between": minus,
                     "changed_inside": zeros, "first_inside": minus}
        else:
            state = self._state
        host = {k: v.cpu().numpy() for k, v in state.items()}
        return IntegrityRecord(
            names=list(self.names), kinds=list(self.kinds), steps=self._steps,
            changed_between=host["changed_between"], first_between=host["first_between"],
            changed_inside=host["changed_inside"], first_inside=host["first_inside"],
            explained=self._explained, largest_change=dict(self._largest) or None,
            post_step=self.post_step is not None,
        )
