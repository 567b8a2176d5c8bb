"""Training hooks that record the white-box view of Opacus DP-SGD (DESIGN 3, 4.3)."""

from dpaudit.capture.persample import per_sample_clipped_grads, trainable_parameter_names

__all__ = ["per_sample_clipped_grads", "trainable_parameter_names"]
