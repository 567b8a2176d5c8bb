"""Open registries: name -> entry tables that user code extends (``register_*``).

Each extensible concept has one ``Registry``, next to its code: data sets
(``dpaudit.data.DATASETS``), models (``dpaudit.models.MODELS``), attack scores
(``dpaudit.experiment.trainings.scores.SCORES``) and bound methods
(``dpaudit.stats.bounds.METHOD_REGISTRY``). Their ``register_*`` functions
(``dpaudit.register_dataset`` ...) add an entry under a new name, from user code or, through
the CLI's ``plugins`` list, from a Hydra config; the settings accept a registered name
everywhere a built-in one is accepted. Registering a name that exists is an error unless
``replace=True``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from dpaudit._validate import did_you_mean, require_choice


class Registry(dict):
    """A ``dict`` of name -> entry, in registration order, that says what it holds.

    ``what`` names the kind of entry in error messages ("data set", "model", ...);
    ``check(name, entry)`` (optional) raises ``TypeError`` / ``ValueError`` for an entry of
    the wrong shape, before it is registered. ``builtin`` are the names the package ships.
    """

    def __init__(self, what: str, entries: Iterable[tuple[str, Any]] | dict = (),
                 check: Callable[[str, Any], None] | None = None):
        super().__init__(entries)
        self.what = what
        self._check = check
        self.builtin = tuple(self)

    def register(self, name: str, entry: Any = None, *, replace: bool = False):
        """Add ``entry`` under ``name``; without ``entry``, a decorator that registers the
        function it decorates. Returns the entry.

        Args:
            name: a new name (letters, digits, ``_``; not starting with a digit).
            entry: what the registry holds for it (its ``register_*`` function says what).
            replace: allow replacing an existing entry, built-in ones included.
        """
        if entry is None:
            return lambda fn: self.register(name, fn, replace=replace)
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"name of a {self.what} must be an identifier, got {name!r}")
        if name in self and not replace:
            raise ValueError(
                f"{self.what} {name!r} is already registered; pass replace=True to replace it"
            )
        if self._check is not None:
            self._check(name, entry)
        self[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove a registered entry (a built-in one cannot be removed)."""
        if name in self.builtin:
            raise ValueError(f"{self.what} {name!r} is built in and cannot be unregistered")
        if name not in self:
            raise ValueError(f"no {self.what} {name!r} is registered"
                             f"{did_you_mean(name, self)}")
        del self[name]

    def get_or_fail(self, name: str, param: str) -> Any:
        """The entry of ``name``, or a ValueError naming ``param`` and the registered names."""
        require_choice(param, name, tuple(self))
        return self[name]


def callable_entry(what: str) -> Callable[[str, Any], None]:
    """A ``check`` for registries of functions: the entry must be callable."""

    def check(name: str, entry: Any) -> None:
        if not callable(entry):
            raise TypeError(f"{what} {name!r} must be a callable, got {type(entry).__name__}")

    return check


def load_plugins(plugins: Iterable[Any]) -> None:
    """Run the ``plugins`` of a config: a module name is imported (its ``register_*`` calls
    run); a mapping with ``_target_`` is instantiated by Hydra (e.g. ``_target_:
    dpaudit.register_model``). A failure raises ValueError naming ``plugins`` and the entry."""
    import importlib

    for i, item in enumerate(plugins or ()):
        try:
            if isinstance(item, str):
                importlib.import_module(item)
            elif hasattr(item, "get") and item.get("_target_"):
                from hydra.utils import instantiate

                instantiate(item)
            else:
                raise TypeError("expected a module name or a mapping with _target_")
        except Exception as err:
            raise ValueError(f"plugins[{i}] ({item!r}) failed: {err}") from err
