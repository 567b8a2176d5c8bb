"""The arguments a preset gives its task (``task.KEY=VALUE``), checked against the task
function before any work: an unknown key, or a value of the wrong kind, is one line naming
``task.KEY`` and what was expected (the CLI's exit status 2), never a traceback from inside the
task. The kinds come from the function's signature: its annotations (int, float, bool, str),
and for an unannotated argument the kind of its default (a tuple default takes a list). Each
task checks its own ranges (``n > 0``, ...) first thing, with the same ``task.KEY`` names."""

from __future__ import annotations

import inspect
import numbers
import typing
from collections.abc import Callable, Mapping, Sequence

from dpaudit._validate import did_you_mean, require_positive, require_unit

# filled in by the CLI or the launcher, never by the user
_INJECTED = ("output_dir",)


def check_task_arguments(fn: Callable, arguments: Mapping, target: str | None = None) -> None:
    """Raise ValueError naming ``task.KEY`` for an argument ``fn`` does not take or a value of
    the wrong kind (module doc). ``target`` names the task in the message."""
    name = target or getattr(fn, "__qualname__", repr(fn))
    sig = inspect.signature(fn)
    params = sig.parameters
    open_ended = any(p.kind is p.VAR_KEYWORD for p in params.values())
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation that does not resolve: check names only
        hints = {}
    for key, value in arguments.items():
        if str(key).startswith("_") or key in _INJECTED:
            continue
        if key not in params:
            if open_ended:
                continue
            takes = [k for k in params if k not in _INJECTED]
            raise ValueError(f"task.{key} is not an argument of {name}"
                             f"{did_you_mean(key, takes)}; it takes: {', '.join(takes)}")
        want = _kind(hints.get(key), params[key].default)
        if want is not None and value is not None and not _is_kind(value, want):
            raise ValueError(f"task.{key} must be {_KIND_TEXT[want]}, got {value!r}")


_KIND_TEXT = {"int": "an integer", "float": "a number", "bool": "true or false",
              "str": "a string", "list": "a list, e.g. [1, 2]"}


def _kind(hint, default) -> str | None:
    """The kind an argument takes: from its annotation, else from its default."""
    for t in _plain_types(hint):
        if t is bool:
            return "bool"
        if t is int:
            return "int"
        if t is float:
            return "float"
        if t is str:
            return "str"
    if hint is None or hint is inspect.Parameter.empty:
        if isinstance(default, bool):
            return "bool"
        if isinstance(default, (tuple, list)):
            return "list"
    return None


def _plain_types(hint) -> list:
    """The classes a hint names: ``int`` -> [int], ``float | None`` -> [float]; anything
    richer (unions of several kinds, generics) -> [] (not checked)."""
    if hint is None:
        return []
    if isinstance(hint, type):
        return [hint]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args if len(args) == 1 and isinstance(args[0], type) else []


def _is_kind(value, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "list":
        return isinstance(value, Sequence) and not isinstance(value, str)
    return True


def positive(key: str, value, integer: bool = False) -> None:
    """Refuse ``task.key`` unless it is a positive finite number (an integer with ``integer``)."""
    require_positive(f"task.{key}", value, integer)


def in_unit_interval(key: str, value) -> None:
    """Refuse ``task.key`` unless it lies in (0, 1)."""
    require_unit(f"task.{key}", value)


def non_empty(key: str, values, each: Callable[[str, object], None] | None = None) -> None:
    """Refuse ``task.key`` unless it is a non-empty list (each item checked by ``each``)."""
    if isinstance(values, str) or not isinstance(values, Sequence) or len(values) == 0:
        raise ValueError(f"task.{key} must be a non-empty list, got {values!r}")
    if each is not None:
        for v in values:
            each(key, v)
