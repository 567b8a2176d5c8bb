"""Training hooks that record the white-box view of Opacus DP-SGD (DESIGN 3, 4.3).

``AuditHook`` attaches to the ``DPOptimizer`` of an unchanged
Opacus training loop and streams per-canary scores; ``InputCanaries`` / ``GradientCanaries``
describe what is audited; ``Trace`` writes released gradients to disk in chunks. Input canaries
are folded into the training batch's own forward/backward (``fold``) unless that is impossible
or ``input_pass="separate"`` asks for one extra per-sample pass per step (``dpaudit.gradients``).

The hook's phases live in their own modules: ``insertion`` (gradient canaries added to the
clipped sum before noise), ``view`` (the coordinate view and the released gradient),
``input_grads`` (input canaries' clipped gradients), ``accumulate`` (score accumulation);
the white-box records in ``recorder`` (``noise_record``, ``clip_check``, and the mechanism's
other doors: ``sampling_record``, which examples each step used; ``integrity``, the model
moving only inside the private step; ``noise_probe``, the noise ignoring the data);
``support`` lists the supported Opacus set-ups and refuses the others; ``patching`` is the one
save/restore helper for the attributes (and, for batch samplers, the classes) dpaudit patches;
``coordinates`` maps a user's parameters (the hook's ``params`` selection) to the flat
coordinates Dirac canaries take and finds the ones no data touch, of the kind asked for:
dead by the model's structure at every step (``structural`` proves them) or only at theta_0;
``canary_block`` gives any model a block of coordinates no data can reach, and
``independence`` checks at every step that the data's clipped sum stays zero there.
"""

from dpaudit.capture.canary_block import CanaryBlock, add_canary_block
from dpaudit.capture.canary_choice import pick_canaries
from dpaudit.capture.canary_kinds import GradientCanaries, InputCanaries
from dpaudit.capture.coordinates import (
    dead_coordinates,
    flat_coordinate,
    parameter_at,
    trainable_dim,
)
from dpaudit.capture.hook import AuditHook, infer_sample_rate
from dpaudit.capture.trace import Trace, load_trace

__all__ = [
    "AuditHook",
    "CanaryBlock",
    "GradientCanaries",
    "InputCanaries",
    "Trace",
    "add_canary_block",
    "dead_coordinates",
    "flat_coordinate",
    "infer_sample_rate",
    "load_trace",
    "parameter_at",
    "pick_canaries",
    "trainable_dim",
]
