"""Membership scores computed from the white-box view of DP-SGD (DESIGN 4.3)."""

from dpaudit.attacks.base import StepContext, StepScore
from dpaudit.attacks.scalar import ScalarProduct

__all__ = ["ScalarProduct", "StepContext", "StepScore"]
