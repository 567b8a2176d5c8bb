"""Watch the training forward so that input canaries are computed as its examples are.

Input canaries need their gradients computed exactly as the training examples' are: with the
same kind of forward call, under the same autocast state. ``ForwardWatcher`` (a forward
pre-hook on the model) notes, for every grad-enabled training-mode forward outside
``per_sample_clipped_grads``, what the separate pass must replay:

* the keyword arguments the canaries do not carry (``need_weights=False``, ``None`` masks, a
  mask shared by the whole batch such as a causal ``(S, S)`` mask), passed unchanged;
* the autocast state (device type and dtype) the forward ran under.

And it refuses, at the next optimizer step and before any score is accumulated, what cannot be
replayed: a call whose positional tensor inputs differ in number from the canaries'
(``inputs`` plus ``args``) or include a non-tensor (pass it by keyword), a keyword tensor the
canaries carry that the call lacks (or the other way round for a tensor with one row per batch
example, i.e. per-example data the canaries would be computed without), a tensor argument of
another kind than the canaries' (bool mask vs float mask, token ids vs features), or keyword
values / autocast states that differ between the training forwards of one step (the separate
pass can replay only one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from dpaudit.capture.input_canaries import argument_kind
from dpaudit.gradients.persample import in_per_sample_pass


@dataclass
class Replay:
    """What the separate pass replays of the training forward (module doc)."""

    shared_kwargs: dict[str, Any] = field(default_factory=dict)
    autocast: tuple[str, torch.dtype] | None = None  # (device type, dtype) when enabled


def _same_value(a: object, b: object) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool(torch.equal(a, b.to(a.device)))
        )
    try:
        return bool(a == b)
    except Exception:  # values without a boolean equality count as different
        return False


class ForwardWatcher:
    """Notes what input canaries must replay of the training forward, refuses what they cannot.

    Args:
        model: the model whose forward is watched.
        signature: the canaries' ``(number of positional tensors, keyword names)``.
        kinds: the canaries' argument kind (``argument_kind``) per position / keyword name.
    """

    def __init__(
        self,
        model: nn.Module,
        signature: tuple[int, tuple[str, ...]] = (1, ()),
        kinds: dict[int | str, str] | None = None,
    ) -> None:
        self.model = model
        self.signature = signature
        self.kinds = dict(kinds or {})
        self._handle = None
        self.problem: str | None = None
        self.replay = Replay()
        self._step_replay: Replay | None = None  # seen in the current step

    def attach(self) -> None:
        self._handle = self.model.register_forward_pre_hook(self._pre, with_kwargs=True)

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _pre(self, module, args, kwargs):
        if self.problem or in_per_sample_pass() or not module.training:
            return None
        if not torch.is_grad_enabled():
            return None
        self.problem = self._inspect(args, kwargs)
        return None

    def _inspect(self, args: tuple, kwargs: dict) -> str | None:
        """The reason this call cannot be replayed, or None (then its replay is recorded)."""
        npos, names = self.signature
        if len(args) != npos or not all(isinstance(a, torch.Tensor) for a in args):
            kinds = [type(a).__name__ for a in args]
            return (
                f"the training forward was called with positional arguments {kinds}, the "
                f"canaries carry {npos} positional tensor(s) (inputs plus args=); give every "
                "canary its own tensors with InputCanaries(args=...), and pass non-tensor "
                "arguments by keyword"
            )
        missing = [n for n in names if not isinstance(kwargs.get(n), torch.Tensor)]
        if missing:
            return (
                f"the canaries carry keyword tensors {missing} that the training forward did "
                "not pass as tensors"
            )
        b = args[0].shape[0] if args[0].ndim else None
        shared = {}
        for n, v in kwargs.items():
            if n in names:
                continue
            if isinstance(v, torch.Tensor) and v.ndim and v.shape[0] == b:
                return (
                    f"the training forward was called with keyword tensor {n!r} with one row "
                    f"per batch example (shape {tuple(v.shape)}), which the canaries do not "
                    f"carry: give each canary its own with InputCanaries(kwargs={{{n!r}: "
                    "(K, ...) tensor}})"
                )
            shared[n] = v
        call = dict(enumerate(args))
        call.update({n: kwargs[n] for n in names})
        for key, value in call.items():
            want = self.kinds.get(key)
            if want is not None and argument_kind(value.dtype) != want:
                label = f"positional argument {key}" if isinstance(key, int) else repr(key)
                return (
                    f"the training forward's {label} is {value.dtype}, the canaries' is of "
                    f"kind {want}: give the canaries tensors of the same kind"
                )
        device_type = args[0].device.type
        autocast = (
            (device_type, torch.get_autocast_dtype(device_type))
            if torch.is_autocast_enabled(device_type)
            else None
        )
        replay = Replay(shared, autocast)
        prev = self._step_replay
        if prev is not None:
            if prev.autocast != replay.autocast:
                return (
                    "the training forwards of one step ran under different autocast states "
                    f"({prev.autocast} and {replay.autocast}); the canaries can replay only one"
                )
            changed = sorted(
                n
                for n in set(prev.shared_kwargs) | set(shared)
                if n not in prev.shared_kwargs
                or n not in shared
                or not _same_value(prev.shared_kwargs[n], shared[n])
            )
            if changed:
                return (
                    f"keyword arguments {changed} differ between the training forwards of one "
                    "step; the canaries can replay only one value"
                )
        self._step_replay = replay
        return None

    def check(self, step: int) -> Replay:
        """Raise ValueError if a training forward could not be replayed for input canaries;
        else return what to replay (the last step's, if this step had no training forward)."""
        if self.problem:
            raise ValueError(
                f"input canaries: {self.problem} (before optimizer step {step}); their "
                "gradients could not be computed as the training examples' are"
            )
        if self._step_replay is not None:
            self.replay, self._step_replay = self._step_replay, None
        return self.replay
