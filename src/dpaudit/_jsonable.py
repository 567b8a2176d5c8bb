"""Plain-JSON conversion shared by every writer of results (one place for the rules)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def to_jsonable(obj: Any) -> Any:
    """Recursively convert to strict-JSON values.

    Objects with ``to_dict`` are expanded; numpy arrays become lists and numpy scalars Python
    numbers; non-finite floats become the strings "nan", "inf", "-inf" (strict JSON has no
    such numbers, and silently turning them into null would hide that a bound was undefined);
    paths become strings.
    """
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        return to_jsonable(obj.to_dict())
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, Path):
        return str(obj)
    return obj
