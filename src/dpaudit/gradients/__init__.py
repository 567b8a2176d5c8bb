"""Per-sample gradient primitives shared by ``capture`` (the hook) and ``canaries`` (Algorithm
3's ranking): clipped per-sample gradients of a model in one batched pass (``persample``), the
loss-function type, the clip rule, and the parameter selection (``selection``). A leaf: it
imports nothing else from dpaudit, so both packages use it without importing each other.
"""

from dpaudit.gradients.persample import (
    LossFn,
    clip_factor,
    per_sample_clipped_grads,
    trainable_parameter_names,
    unwrap_model,
)
from dpaudit.gradients.selection import resolve_parameter_names

__all__ = [
    "LossFn",
    "clip_factor",
    "per_sample_clipped_grads",
    "resolve_parameter_names",
    "trainable_parameter_names",
    "unwrap_model",
]
