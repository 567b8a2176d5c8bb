"""dpaudit 0.1's canary-design interface, kept working for one release (deprecated).

In dpaudit 0.1 a design's hooks received the whole audit settings: ``check(settings)``,
``sample_rate(settings, data_rate)``, ``canary_norm(settings, measured)``,
``independent(settings, canary_info)``, ``shares_a_run(settings)``,
``default_scores(settings)``, and ``build`` read ``ctx.settings``. Renaming any settings
field broke such a design. ``adapt`` wraps a design that still implements one of these hooks
in ``LegacyDesign``, which answers the typed interface (``base.CanaryDesign``) by calling the
old hooks with a read-only view of the settings groups, and warns once per design class with
a ``DeprecationWarning`` naming what to port (docs/plugins.md, "Porting a 0.1 design").
The adapter and the view are removed in release 0.3.
"""

from __future__ import annotations

import dataclasses
import inspect

from dpaudit.experiment.canary_designs.base import (
    BuildContext,
    CanaryDesign,
    CanarySetup,
    DesignContext,
    Realisation,
    warn_legacy,
)

# hooks that only the 0.1 interface has, and hooks whose 0.1 form took (settings) alone
_OLD_ONLY = ("sample_rate", "canary_norm", "independent", "shares_a_run")
_ONE_ARGUMENT = ("check", "default_scores")
_WARNED: set[type] = set()


def legacy_hooks(design: CanaryDesign) -> list[str]:
    """The dpaudit-0.1 hooks ``design``'s class implements (empty for a current design)."""
    cls = type(design)
    old = [name for name in _OLD_ONLY if callable(getattr(cls, name, None))]
    for name in _ONE_ARGUMENT:
        method = getattr(cls, name, None)
        if method is None or method is getattr(CanaryDesign, name):
            continue
        params = [p for p in inspect.signature(method).parameters.values()
                  if p.kind is p.POSITIONAL_OR_KEYWORD][1:]  # without self
        if len(params) == 1 and params[0].name == "settings":
            old.append(name)
    return old


def adapt(design: CanaryDesign, settings_view) -> CanaryDesign:
    """``design`` itself when it implements the typed interface, else a ``LegacyDesign``
    calling its 0.1 hooks with ``settings_view`` (warned once per class)."""
    hooks = legacy_hooks(design)
    if not hooks:
        return design
    if type(design) not in _WARNED:
        _WARNED.add(type(design))
        warn_legacy(f"{type(design).__name__}.{', '.join(hooks)}(settings, ...)",
                    "check(options, ctx), realises(options, ctx, setup), "
                    "default_scores(options) and the BuildContext's typed fields")
    return LegacyDesign(design, settings_view, hooks)


class LegacyDesign(CanaryDesign):
    """A dpaudit-0.1 design seen through the typed interface (module doc)."""

    def __init__(self, old: CanaryDesign, settings_view, hooks: list[str]):
        self.old, self.view, self.hooks = old, settings_view, frozenset(hooks)
        self.threat_kind, self.Options = old.threat_kind, old.Options
        self.refused_scores = old.refused_scores

    def _has(self, name: str) -> bool:
        return name in self.hooks

    def options(self, canary):
        return self.old.options(canary)

    def check(self, options, ctx: DesignContext) -> None:
        if self._has("check"):
            self.old.check(self.view)
        elif type(self.old).check is not CanaryDesign.check:
            self.old.check(options, ctx)

    def build(self, ctx: BuildContext) -> CanarySetup:
        return self.old.build(dataclasses.replace(ctx, legacy_settings=self.view))

    def realises(self, options, ctx: DesignContext,
                 setup: CanarySetup | None = None) -> Realisation:
        view, old = self.view, self.old
        rate = None
        if self._has("sample_rate") and ctx.data_sample_rate is not None:
            rate = float(old.sample_rate(view, ctx.data_sample_rate))
        measured = None if setup is None else setup.info.get("norm")
        norm = old.canary_norm(view, measured) if self._has("canary_norm") else None
        dead = None
        if setup is not None:
            dead = bool(old.independent(view, setup.info)) if self._has("independent") else False
        return Realisation(
            kind=old.threat_kind, member_rate=rate, norm=norm,
            shares_a_run=bool(old.shares_a_run(view)) if self._has("shares_a_run") else False,
            on_dead_coordinates=dead,
        )

    def default_scores(self, options) -> list[str]:
        if self._has("default_scores"):
            return list(self.old.default_scores(self.view))
        return list(self.old.default_scores(options))
