"""One save/restore helper for the optimizer attributes dpaudit patches on an instance.

The audit hook wraps ``add_noise``, chains ``step_hook`` and wraps the base optimizer's
``step`` (the integrity check), the batch fold wraps ``clip_and_accumulate``, the planted bugs
replace ``add_noise`` / ``clip_and_accumulate`` / ``scale_grad`` / ``step``. Each does it on one
optimizer *instance* (never the class), and each must put back exactly what was there: a
previous instance attribute (e.g. another patch, or the accountant's ``step_hook``) is set
back, a class method is uncovered by removing the instance attribute. ``InstancePatch`` does
this once for all of them:

* ``original`` is the attribute in force when the patch was applied (a bound method, a previous
  wrapper, a hook function): the replacement calls through it;
* patches stack (a planted bug, then the hook), and are undone last-in first-out: restoring one
  that something else has since covered raises instead of silently dropping the other patch;
* the same ``owner`` cannot patch the same attribute of the same object twice at once (two
  audit hooks on one optimizer, a fold attached twice): ``apply`` raises.

A batch sampler's ``__iter__`` is a special method, looked up on the type: ``ClassPatch``
gives that one object a subclass instead (the hook's recording of the loader's batches, the
zoo's sampling bugs), with the same last-in first-out rule.
"""

from __future__ import annotations

from typing import Any

_REGISTRY = "_dpaudit_patches"  # instance attribute: list of (name, owner) currently applied
_MISSING = object()


class InstancePatch:
    """Replace attribute ``name`` of ``obj`` (an instance) by ``replacement``, restorably.

    Args:
        obj: the object patched on its instance dict (e.g. a ``DPOptimizer``).
        name: the attribute, e.g. ``"add_noise"`` or ``"step_hook"``.
        replacement: the new value (usually a function calling ``patch.original``).
        owner: a short label of who patches (``"AuditHook"``, ``"BatchFold"``, ``"plant_bug"``);
            one owner may hold one patch per (object, attribute) at a time.

    ``apply()`` installs it and returns self, ``restore()`` puts back exactly what was there;
    also a context manager. ``original`` is the value in force before ``apply()``.
    """

    def __init__(self, obj: Any, name: str, replacement: Any, owner: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty attribute name, got {name!r}")
        if not isinstance(owner, str) or not owner:
            raise ValueError(f"owner must be a non-empty label, got {owner!r}")
        self.obj, self.name, self.replacement, self.owner = obj, name, replacement, owner
        self.original: Any = None
        self._saved: Any = _MISSING
        self.applied = False

    def apply(self) -> InstancePatch:
        """Install the replacement; raises RuntimeError on double patching."""
        if self.applied:
            raise RuntimeError(f"{self.owner}: {self.name} is already patched by this patch")
        registry = self.obj.__dict__.setdefault(_REGISTRY, [])
        if (self.name, self.owner) in registry:
            raise RuntimeError(
                f"{self.owner} has already patched {self.name} on this "
                f"{type(self.obj).__name__}; detach it first"
            )
        self.original = getattr(self.obj, self.name)
        self._saved = self.obj.__dict__.get(self.name, _MISSING)
        setattr(self.obj, self.name, self.replacement)
        registry.append((self.name, self.owner))
        self.applied = True
        return self

    def restore(self) -> None:
        """Put back exactly what ``apply()`` found (no-op if not applied)."""
        if not self.applied:
            return
        current = self.obj.__dict__.get(self.name, _MISSING)
        if current is not self.replacement:
            raise RuntimeError(
                f"{self.owner}: {type(self.obj).__name__}.{self.name} was replaced by something "
                "else after it was patched; undo that first (patches are undone last-in "
                "first-out)"
            )
        if self._saved is _MISSING:
            del self.obj.__dict__[self.name]
        else:
            setattr(self.obj, self.name, self._saved)
        registry = self.obj.__dict__.get(_REGISTRY, [])
        registry.remove((self.name, self.owner))
        if not registry:
            self.obj.__dict__.pop(_REGISTRY, None)
        self.original, self._saved, self.applied = None, _MISSING, False

    def __enter__(self) -> InstancePatch:
        return self.apply()

    def __exit__(self, *exc: object) -> None:
        self.restore()


class ClassPatch:
    """Give one object (a batch sampler) a subclass of its class that overrides some
    methods, restorably: ``__iter__`` and other special methods are looked up on the type,
    so an instance attribute cannot replace them.

    Args:
        obj: the object whose ``__class__`` is swapped.
        methods: name -> function (taking ``self``) defined on the subclass; a function can
            reach the class it overrides as ``patch.base``.
        owner: a short label of who patches (``"AuditHook"``, ``"plant_sampler_bug"``).

    ``apply()`` swaps the class and returns self; ``restore()`` puts the original class back
    and raises if something swapped it again since (undo last-in first-out).
    """

    def __init__(self, obj: Any, methods: dict, owner: str) -> None:
        if not isinstance(owner, str) or not owner:
            raise ValueError(f"owner must be a non-empty label, got {owner!r}")
        self.obj, self.methods, self.owner = obj, dict(methods), owner
        self.base: type | None = None
        self.patched: type | None = None

    def apply(self) -> ClassPatch:
        """Swap in the subclass; raises RuntimeError when this patch is already applied."""
        if self.patched is not None:
            raise RuntimeError(f"{self.owner}: {type(self.obj).__name__} is already patched")
        base = type(self.obj)
        if any(getattr(c, "_dpaudit_owner", None) == self.owner for c in base.__mro__):
            raise RuntimeError(
                f"{self.owner} has already patched this {base.__name__}; detach it first")
        self.base = base
        self.patched = type(base.__name__, (base,), {
            **self.methods, "_dpaudit_owner": self.owner, "__module__": base.__module__,
            "__qualname__": base.__qualname__})
        self.obj.__class__ = self.patched
        return self

    def restore(self) -> None:
        """Put the original class back (no-op if not applied)."""
        if self.patched is None:
            return
        if type(self.obj) is not self.patched:
            raise RuntimeError(
                f"{self.owner}: the class of this {self.base.__name__} was swapped by something "
                "else after it was patched; undo that first (patches are undone last-in "
                "first-out)")
        self.obj.__class__ = self.base
        self.base = self.patched = None
