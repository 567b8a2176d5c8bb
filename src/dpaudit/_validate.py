"""Input checks shared across the package (statistics, estimators, canaries, the lab): clear
errors naming the parameter. A leaf: imports nothing from dpaudit.

An unknown name (a misspelt key, a value outside a closed set, a registry name) is refused in
one way everywhere: ``require_choice`` / ``require_known``, whose message names the parameter,
what was given, the closest valid names (``did_you_mean``) and the allowed ones."""

from __future__ import annotations

import difflib
import numbers

import numpy as np


def check_real(value, name: str) -> float:
    """``value`` as a float when it is a real number (not a string, bool, None or complex)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    return float(value)


def check_scores(x, name: str) -> np.ndarray:
    """Return ``x`` as a 1-d float64 array; reject empty, non-real or non-finite input."""
    raw = np.asarray(x)
    if raw.dtype.kind not in "biuf":  # complex, strings, objects, dates: not real scores
        what = "complex" if raw.dtype.kind == "c" else f"dtype {raw.dtype}"
        raise ValueError(f"{name} must be real numbers, got {what} values")
    arr = raw.astype(np.float64, copy=False)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    if arr.size == 0:
        raise ValueError(f"{name} is empty: expected at least one score")
    if not np.all(np.isfinite(arr)):
        bad = int(np.sum(~np.isfinite(arr)))
        raise ValueError(
            f"{name} contains {bad} non-finite value(s) (NaN or inf): scores must be finite"
        )
    return arr


def check_open_unit(value: float, name: str) -> float:
    """Require a real ``0 < value < 1`` (probabilities such as delta, confidence, FPR targets)."""
    v = check_real(value, name)
    if not np.isfinite(v) or not 0.0 < v < 1.0:
        raise ValueError(f"{name} must lie in the open interval (0, 1), got {value!r}")
    return v


def check_positive(value: float, name: str) -> float:
    """Require a real, finite ``value > 0``."""
    v = check_real(value, name)
    if not np.isfinite(v) or v <= 0.0:
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")
    return v


def check_nonnegative(value: float, name: str) -> float:
    """Require a real, finite ``value >= 0``."""
    v = check_real(value, name)
    if not np.isfinite(v) or v < 0.0:
        raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")
    return v


def check_seed(seed, name: str = "seed") -> int:
    """Require an integer seed (not a bool); returns it as an ``int``."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"{name} must be an integer seed, got {seed!r}")
    return int(seed)


def check_real_array(x, name: str) -> np.ndarray:
    """``x`` (scalar or array) as a finite float64 array; reject strings, complex, NaN, inf."""
    if x is None or isinstance(x, (str, bytes)):
        raise ValueError(f"{name} must be real numbers, got {x!r}")
    raw = np.asarray(x)
    if raw.dtype.kind not in "biuf":
        what = "complex" if raw.dtype.kind == "c" else f"dtype {raw.dtype}"
        raise ValueError(f"{name} must be real numbers, got {what} values")
    arr = raw.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {x!r}")
    return arr


def check_rates(x, name: str) -> np.ndarray:
    """``x`` (scalar or array) as float64 rates in [0, 1]."""
    arr = check_real_array(x, name)
    if np.any((arr < 0.0) | (arr > 1.0)):
        raise ValueError(f"{name} must lie in [0, 1], got {x!r}")
    return arr


def check_count(value, name: str, minimum: int = 0) -> int:
    """Require an integer (not a bool, not a float) ``>= minimum``; returns it as an ``int``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def quoted(values, limit: int = 5) -> str:
    """At most ``limit`` of ``values`` for an error message, and how many more there are:
    ``[6000, 6001, 6002, 6003, 6004, ... and 395 more]``."""
    items = list(values)
    shown = ", ".join(repr(v) for v in items[:limit])
    more = f", ... and {len(items) - limit} more" if len(items) > limit else ""
    return f"[{shown}{more}]"


def is_finite_number(v) -> bool:
    """A finite Python int or float (not a bool): what a config or a keyword argument gives."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and bool(np.isfinite(v))


def require_positive(key: str, v, integer: bool = False) -> None:
    """Refuse ``key`` unless it is a positive finite number (an integer with ``integer``)."""
    ok = is_finite_number(v) and v > 0 and (not integer or int(v) == v)
    if not ok:
        raise ValueError(f"{key} must be a positive finite {'integer' if integer else 'number'}"
                         f", got {v!r}")


def require_unit(key: str, v, closed_right: bool = False) -> None:
    """Refuse ``key`` unless it lies in (0, 1) ((0, 1] with ``closed_right``)."""
    if not (is_finite_number(v) and (0 < v < 1 or (closed_right and v == 1))):
        raise ValueError(f"{key} must be {'in (0, 1]' if closed_right else 'in (0, 1)'}, "
                         f"got {v!r}")


def refuse(key: str, expected: str, got, hint: str = "") -> None:
    """Raise the ValueError every config check raises: ``key must be <expected>, got <got>``
    (then ``hint``, e.g. ``did_you_mean``'s suggestion)."""
    raise ValueError(f"{key} must be {expected}, got {got!r}{hint}")


def require_nonnegative(key: str, v) -> None:
    """Refuse ``key`` unless it is a non-negative finite number."""
    if not (is_finite_number(v) and v >= 0):
        refuse(key, "a non-negative finite number", v)


def did_you_mean(name, known, n: int = 3) -> str:
    """`` (did you mean 'a' or 'b'?)`` naming the (at most ``n``) entries of ``known`` closest
    to ``name`` (``difflib.get_close_matches``, cutoff 0.6), or "" when none is close or
    ``name`` is not a string. The suffix every unknown-name error ends its "got ..." with."""
    if not isinstance(name, str):
        return ""
    words = [str(k) for k in known]
    close = difflib.get_close_matches(name, words, n=n, cutoff=0.6)
    if not close:  # a case slip ("Scalar") is as close as it gets
        close = [w for w in words if w.lower() == name.lower()][:n]
    if not close:
        return ""
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)"


def require_choice(key: str, v, options) -> None:
    """Refuse ``key`` unless it is one of ``options``: ``key must be one of (...), got 'v'
    (did you mean ...?)``."""
    try:
        ok = v in options
    except TypeError:  # an unhashable value against a set or a dict's keys
        ok = False
    if not ok:
        refuse(key, f"one of {tuple(options)}", v, hint=did_you_mean(v, options))


def require_known(what: str, names, known, allowed: str | None = None) -> None:
    """Refuse the entries of ``names`` that are not in ``known`` (misspelt keys, unknown
    options): ``unknown <what> 'x' (did you mean 'y'?), 'z'; allowed: ...``. ``allowed``
    replaces the listing of ``known`` (e.g. when it is long or needs words)."""
    known = list(known)
    unknown = [n for n in names if n not in known]
    if not unknown:
        return
    each = ", ".join(f"{n!r}{did_you_mean(n, known)}" for n in unknown)
    listing = allowed if allowed is not None else ", ".join(map(str, sorted(map(str, known))))
    raise ValueError(f"unknown {what} {each}; allowed: {listing}")


def require_integer(key: str, v, low: int, high: int) -> None:
    """Refuse ``key`` unless it is an integer (not a bool) in [low, high)."""
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v < high:
        refuse(key, f"an integer in [{low}, {high})", v)


def require_level(key: str, v, confidence: float) -> float:
    """Refuse ``key`` (a PRIVACY BUG level) unless it lies in (0, 1 - confidence]: it may not
    be weaker than the bounds' own failure probability."""
    if not (is_finite_number(v) and 0.0 < v <= 1.0 - confidence + 1e-12):
        refuse(key, f"a number in (0, 1 - confidence] = (0, {1.0 - confidence:.3g}] (the "
               "PRIVACY BUG verdict's failure probability; default 1e-6)", v)
    return float(v)


def check_delta(value, name: str = "delta", *, zero_ok: bool = False, why: str = "") -> float:
    """``value`` as a float when it is a delta of (epsilon, delta)-DP: in (0, 1), or in [0, 1)
    with ``zero_ok`` (pure DP). ``why`` is added to the error (e.g. which method needs
    delta > 0 and which take 0)."""
    v = check_real(value, name)
    ok = np.isfinite(v) and (0.0 <= v < 1.0 if zero_ok else 0.0 < v < 1.0)
    if not ok:
        where = "[0, 1)" if zero_ok else "(0, 1)"
        raise ValueError(f"{name} must lie in {where}{' ' + why if why else ''}, got {value!r}")
    return v
