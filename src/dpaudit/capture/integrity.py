"""The model moves only inside the private step: every parameter and buffer compared, bit for bit,
around each private step.

DP-SGD's claim covers the published model only if every change of it is the optimizer's
update from the released (noisy) gradient. Real code breaks that while every per-step check
passes: a second optimizer steps a head on its plain gradient after ``optimizer.step()``, a
manual update moves a tensor between steps, running statistics (buffers) are updated from the
private batch and published without noise. ``ModelIntegrity`` wraps the step of the optimizer
Opacus' ``DPOptimizer`` wraps (``original_optimizer.step``: the private update itself, whatever
the base optimizer: SGD, momentum, Adam, weight decay, a learning-rate schedule) and keeps a
copy of every tensor of the model as that step left it:

* a parameter the DP optimizer updates may change only inside the step: when the next step
  starts, a difference from the copy names the tensor and the step;
* a model parameter outside the DP optimizer's groups (trainable or frozen) and a buffer may
  not change at all, inside a step or between steps;
* post-processing that depends on the parameters alone (a projection, a clamp, a
  renormalisation) is legitimate when declared: ``post_step`` takes the tensors' values right
  after the private step (the copies, by name) and returns the values it sets; a change
  between steps that it reproduces exactly is explained, any other is the finding.

The comparison is of bit patterns (exact, not a tolerance: -0.0 against 0.0 differs, a NaN
equals itself). The copy costs one model's worth of memory and a copy of the updated
parameters per step (a memory copy; measured by ``benchmarks/bench_audit_cost.py``); the
comparisons stay on the tensors' device, so there is no host synchronisation per step unless
``post_step`` is declared. EMA copies of the weights, optimizer state, learning-rate schedules:
none is a tensor of the model, so none is flagged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch
from opacus.optimizers import DPOptimizer

from dpaudit._validate import did_you_mean
from dpaudit.capture.patching import InstancePatch
from dpaudit.capture.records import IntegrityRecord
from dpaudit.gradients.persample import unwrap_model

# what a watched tensor is: a parameter the DP optimizer updates, another parameter, a buffer
KINDS = ("dp", "other", "buffer")
_INT = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
_NUMPY = (torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` flattened and read as integers of its width (its bit pattern)."""
    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    if x.dtype == torch.bool:
        x = x.view(torch.uint8)
    x = x.reshape(-1)
    return x.view(_INT[x.element_size()]) if x.is_floating_point() else x


def _numpy_bits(t: torch.Tensor) -> np.ndarray | None:
    """A zero-copy numpy view of a CPU tensor's bit pattern, or None where numpy cannot view
    it (an accelerator, bfloat16)."""
    if t.device.type != "cpu" or t.dtype not in _NUMPY or not t.is_contiguous():
        return None
    return _bits(t).numpy()


def differs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | bool:
    """Whether two tensors of one shape and dtype differ in any bit: a Python bool on the CPU
    (numpy, the fastest compare there), a 0-d bool tensor on an accelerator (no
    synchronisation)."""
    x, y = _numpy_bits(a), _numpy_bits(b)
    if x is not None and y is not None:
        return not np.array_equal(x, y)
    return torch.ne(_bits(a), _bits(b)).any()


class _Watched:
    """One watched tensor and its copy, with numpy views of both kept while the tensor's
    storage stays the same (a CPU tensor compares and copies at numpy's speed)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.copy = tensor.detach().clone()
        self._ptr, self._views = None, None

    def _pair(self):
        ptr = self.tensor.data_ptr()
        if ptr != self._ptr:  # a new storage (p.data = ...): new views
            x, y = _numpy_bits(self.tensor), _numpy_bits(self.copy)
            self._ptr = ptr
            self._views = None if x is None or y is None or x.shape != y.shape else (x, y)
        return self._views

    def differs(self):
        pair = self._pair()
        if pair is not None:
            return not np.array_equal(pair[0], pair[1])
        if self.tensor.shape != self.copy.shape or self.tensor.dtype != self.copy.dtype:
            return True
        return differs(self.tensor, self.copy)

    def refresh(self) -> None:
        pair = self._pair()
        if pair is not None:
            np.copyto(pair[1], pair[0])
        elif self.tensor.shape == self.copy.shape and self.tensor.dtype == self.copy.dtype:
            self.copy.copy_(self.tensor)
        else:  # the tensor was replaced by one of another shape: copy it anew
            self.copy, self._ptr = self.tensor.detach().clone(), None


class _Tally:
    """How often each of J tensors changed, and the first step it did: plain integers for
    flags that are Python bools (the CPU), counters on the flags' device for 0-d tensors (an
    accelerator: nothing is read back before ``read``)."""

    def __init__(self, j: int) -> None:
        self.count, self.first = [0] * j, [-1] * j
        self._device: dict = {}  # device -> (count (J,), first (J,)) tensors

    def add(self, indices, flags, step: int) -> None:
        on_device = []
        for j, f in zip(indices, flags, strict=True):
            if isinstance(f, torch.Tensor):
                on_device.append((j, f))
            elif f:
                self.count[j] += 1
                if self.first[j] < 0:
                    self.first[j] = step
        for j, f in on_device:
            count, first = self._device.setdefault(f.device, (
                torch.zeros(len(self.count), dtype=torch.int64, device=f.device),
                torch.full((len(self.count),), -1, dtype=torch.int64, device=f.device)))
            count[j] += f.long()
            first[j] = torch.where((first[j] < 0) & f, torch.full_like(first[j], step),
                                   first[j])

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        count, first = np.asarray(self.count), np.asarray(self.first)
        for c, f in self._device.values():
            c, f = c.cpu().numpy(), f.cpu().numpy()
            count = count + c
            first = np.where((f >= 0) & ((first < 0) | (f < first)), f, first)
        return count, first


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
    """Compare the model with its copy when each private step starts and returns (module doc).

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
        self._dp = [j for j, k in enumerate(self.kinds) if k == "dp"]
        self._fixed = [j for j, k in enumerate(self.kinds) if k != "dp"]
        self._patch: InstancePatch | None = None
        self._steps = 0
        self._watched: list[_Watched] | None = None  # every tensor and its copy
        self._explained = 0
        self._largest: dict[str, float] = {}
        self._tally = {k: _Tally(len(self.tensors)) for k in ("between", "inside")}

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
        values = self._named(self._clones())
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
            out = self.post_step(dict(values))
        if not isinstance(out, Mapping):
            raise ValueError("post_step must return a mapping {name: new value}, got "
                             f"{type(out).__name__}")
        unknown = [k for k in out if k not in values]
        if unknown:
            raise ValueError(f"post_step returned tensors the model does not have: "
                             f"{unknown[:5]}{did_you_mean(unknown[0], self.names)} (names: "
                             f"{self.names[:5]}...)")
        return dict(out)

    def _clones(self) -> list[torch.Tensor]:
        return [t.detach().clone() for t in self.tensors]

    def _named(self, tensors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, tensors, strict=True))

    # ------------------------------------------------------------------ the private step
    def _refresh(self, indices, flags) -> None:
        """Copy the tensors ``indices`` whose flag may be set (an accelerator's flag is not
        read: the copy is made)."""
        for j, f in zip(indices, flags, strict=True):
            if f is not False:
                self._watched[j].refresh()

    @torch.no_grad()
    def _step(self, *args, **kwargs):
        """The base optimizer's step, with every tensor compared to the copy before it and the
        copy refreshed after it."""
        if self._watched is None:
            self._watched = [_Watched(t) for t in self.tensors]
        else:
            self._between()
        out = self._patch.original(*args, **kwargs)
        fixed = [self._watched[j].differs() for j in self._fixed]
        self._tally["inside"].add(self._fixed, fixed, self._steps)  # never allowed, inside either
        self._refresh(self._fixed, fixed)
        self._refresh(self._dp, [True] * len(self._dp))
        self._steps += 1
        return out

    def _between(self) -> None:
        """The changes since the last step ended (after private step ``steps - 1``)."""
        every = range(len(self.tensors))
        changed = [w.differs() for w in self._watched]
        if not any(c is not False for c in changed):  # the CPU's usual case: nothing moved
            return
        if self.post_step is not None:
            changed = self._explain([bool(c) for c in changed])
        self._tally["between"].add(every, changed, self._steps - 1)
        self._refresh(every, changed)

    def _explain(self, changed: list[bool]) -> list[bool]:
        """The changes between steps that the declared post_step does not reproduce (reading
        the flags synchronises: with post_step only)."""
        if not any(changed):
            return changed
        copies = [w.copy for w in self._watched]
        expected = self._apply_post_step(self._named(copies))
        left = list(changed)
        for j in [j for j, c in enumerate(changed) if c]:
            name = self.names[j]
            want = expected.get(name, copies[j])
            now = self.tensors[j].detach()
            if (want.shape == now.shape
                    and not bool(differs(want.to(now.device, now.dtype), now))):
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

    def nbytes(self) -> int:
        """Bytes of the copy of the model (one model's parameters and buffers, once)."""
        if self._watched is None:
            return 0
        return int(sum(w.copy.numel() * w.copy.element_size() for w in self._watched))

    def record(self) -> IntegrityRecord:
        """What was seen so far (``IntegrityRecord``)."""
        between, inside = self._tally["between"].read(), self._tally["inside"].read()
        return IntegrityRecord(
            names=list(self.names), kinds=list(self.kinds), steps=self._steps,
            changed_between=between[0], first_between=between[1],
            changed_inside=inside[0], first_inside=inside[1],
            explained=self._explained, largest_change=dict(self._largest) or None,
            post_step=self.post_step is not None,
        )
