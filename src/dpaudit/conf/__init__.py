"""The `dpaudit` CLI's Hydra configs, and their schema.

Importing this package registers, in Hydra's ConfigStore:

* ``dpaudit_schema``: the structured-config schema of the top-level config, i.e. the settings
  dataclasses of ``dpaudit.experiment.settings`` (``AuditSettings`` and its groups) plus
  ``fail_on_bug`` and the preset's ``task``. ``config.yaml`` lists it first, so the dataclass
  defaults are the defaults, every group file lists only what differs from them, and a typo or
  a value of the wrong type is refused by Hydra with the key's name;
* ``hydra/help/dpaudit``: the ``--help`` text, generated when it is shown from the
  dataclasses' field metadata (one-line help, allowed values) and from the first sentence of
  each preset's / group option's leading comment.
"""

from __future__ import annotations

import re
import sys
import textwrap
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from importlib import resources
from typing import Any, get_type_hints

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from dpaudit.experiment.settings import GROUPS, AuditSettings, choices_of
from dpaudit.papers import humanize

SCHEMA_NAME = "dpaudit_schema"


def _composable(cls: type) -> type:
    """A mutable twin of the frozen settings dataclass ``cls`` (its groups twinned too), for
    Hydra's schema: OmegaConf makes a frozen dataclass's node read-only, and Hydra composes the
    defaults and the command line onto the schema's nodes. The fields, defaults and metadata
    (help, choices) are ``cls``'s own; the audit itself still gets the frozen settings."""
    specs, hints = [], get_type_hints(cls)
    for f in fields(cls):
        kind = _composable(GROUPS[f.name]) if f.name in GROUPS else hints[f.name]
        if f.default_factory is not MISSING:
            factory = kind if f.name in GROUPS else f.default_factory
            spec = field(default_factory=factory, metadata=f.metadata)
        else:
            spec = field(default=f.default, metadata=f.metadata)
        specs.append((f.name, kind, spec))
    twin = make_dataclass(cls.__name__, specs, namespace={"__doc__": cls.__doc__})
    twin.__module__ = __name__
    return twin


@dataclass
class DpauditConfig(_composable(AuditSettings)):
    """The top-level config of the CLI: the audit's settings, plus ``fail_on_bug``, the
    preset's ``task`` (a Hydra ``_target_`` callable and its arguments) and ``plugins``
    (``dpaudit.registry.load_plugins``: extensions registered before anything is checked)."""

    fail_on_bug: bool = True
    task: Any = None
    # modules to import (their register_* calls run) or {_target_: ...} calls, before the
    # settings are checked: data sets, models, scores and bound methods of your own
    plugins: list[Any] = field(default_factory=list)


def _conf_dir():
    return resources.files(__name__)


def preset_names(group: str) -> list[str]:
    """The options of a config group (``experiment`` lists the presets)."""
    return sorted(p.name[:-5] for p in (_conf_dir() / group).iterdir() if p.name.endswith(".yaml"))


def option_text(group: str, name: str) -> str:
    return (_conf_dir() / group / f"{name}.yaml").read_text()


def summary(text: str) -> str:
    """The first sentence of a YAML file's leading comment block (``@package`` lines skipped),
    whole, with the source papers named by authors and title (``papers.humanize``)."""
    words = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        line = line.lstrip("#").strip()
        if line.startswith("@package"):
            continue
        words.append(line)
    first = re.split(r"(?<=[.!?])\s+(?=[A-Z(`])", " ".join(words), maxsplit=1)[0].strip()
    return humanize(first)


def _entry(head: str, text: str, indent: int = 6, width: int = 96) -> list[str]:
    """``head: text`` wrapped to ``width`` columns, continuation lines indented."""
    return textwrap.wrap(f"{head}: {text}", width=width, subsequent_indent=" " * indent,
                         break_on_hyphens=False)


def task_references(task: Any) -> set[str]:
    """Top-level keys and dotted keys (``dp``, ``dp.delta``) a preset's task interpolates."""
    refs: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
        elif isinstance(node, str):
            refs.update(m.group(1) for m in re.finditer(r"\$\{([A-Za-z_][\w.]*)\}", node))

    walk(task)
    return refs


def preset_task(name: str) -> dict:
    """A preset's task, unresolved: the ``task`` group option its defaults name (``/task:
    audit``, the one definition of the audit task) under the preset's own ``task`` keys."""
    preset = yaml.safe_load(option_text("experiment", name)) or {}
    task = {}
    for entry in preset.get("defaults") or ():
        if isinstance(entry, dict) and "/task" in entry:
            task = yaml.safe_load(option_text("task", entry["/task"])) or {}
    return {**task, **(preset.get("task") or {})}


def preset_groups(name: str) -> list[str]:
    """The settings groups / keys a preset's task reads (e.g. ``['dp.delta', 'seed']``)."""
    return sorted(task_references(preset_task(name)))


def task_keys(name: str) -> list[str]:
    """A preset's own task arguments that are not interpolated from the audit settings."""
    task = preset_task(name)
    return [k for k, v in task.items() if not k.startswith("_") and not
            (isinstance(v, str) and v.startswith("${"))]


def _defaults() -> dict[str, str]:
    cfg = yaml.safe_load((_conf_dir() / "config.yaml").read_text())
    out = {}
    for item in cfg.get("defaults", []):
        if isinstance(item, dict):
            out.update({str(k): str(v) for k, v in item.items()})
    return out


def help_text() -> str:
    """The body of ``dpaudit --help``: where one's own loop is audited (the Python API and its
    quickstart), usage, presets, config groups, every setting."""
    chosen = _defaults()
    lines = [
        "dpaudit: audit DP-SGD (Opacus) for privacy bugs. Membership attacks on canaries give",
        "lower bounds on epsilon (certified, and estimates under a stated model), tested",
        "against the accountant's claim for the same threat model.",
        "",
        "Your own training loop: audit it from Python, not from this command. Call",
        "dpaudit.add_canary_block(model) before make_private, run your Opacus loop inside",
        "`with dpaudit.capture.AuditHook(optimizer, model, data_loader=loader) as hook:` and",
        "call dpaudit.audit_report(hook, privacy_engine=engine). The quickstart is the",
        "README's \"Audit your own training loop\" (README.md); the API is in",
        "docs/python_api.md.",
        "",
        "Usage:",
        "  dpaudit                                   the default audit (AuditSettings())",
        "  dpaudit experiment=PRESET                 a preset (below)",
        "  dpaudit GROUP=OPTION KEY=VALUE ...        e.g. canary=input dp.noise_multiplier=2",
        "  dpaudit -m dp.noise_multiplier=2,4        a sweep (hydra/launcher=cpu_parallel or",
        "                                            slurm_gpu: pip install -e '.[launchers]')",
        "  dpaudit --cfg job [overrides]             print the composed config, run nothing",
        "Outputs go to Hydra's run directory (hydra.run.dir=DIR), log in <dir>/cli.log.",
        "Exit status 3: the verdict is a PRIVACY BUG (fail_on_bug=false: 0); 4 with "
        "audit.require=verified: your epsilon is not verified.",
        "",
        "== Presets (experiment=NAME) ==",
    ]
    for name in preset_names("experiment"):
        mark = " (default)" if chosen.get("experiment") == name else ""
        lines += _entry(f"  {name}{mark}", summary(option_text("experiment", name)))
        uses = preset_groups(name)
        lines.append(f"      reads: {', '.join(uses) if uses else 'nothing'}"
                     " (overrides of other settings are refused)")
        own = task_keys(name)
        if own:
            lines.append(f"      task.KEY=VALUE: {', '.join(own)}")
    lines += ["", "== Config groups (GROUP=OPTION; each option overrides some defaults) =="]
    for group in GROUPS:
        lines.append(f"{group}:")
        for name in preset_names(group):
            mark = " (default)" if chosen.get(group) == name else ""
            lines += _entry(f"  {name}{mark}", summary(option_text(group, name)))
    lines += [
        "hydra/launcher: cpu_parallel (joblib) | slurm_gpu (submitit); needs the launchers extra",
        "",
        "== Settings (KEY=VALUE; defaults of the settings dataclasses) ==",
        describe_settings(),
        "  fail_on_bug                    bool = true",
        "                                 exit with status 3 when the verdict is a PRIVACY BUG",
        "",
        "Hydra's own options: dpaudit --hydra-help",
    ]
    return "\n".join(lines).replace("$", "$$")


def _help_when_asked() -> str:
    """``help_text()`` when ``--help`` was asked for. Hydra resolves its own config on every
    run, and the allowed names come from registries that import torch: an ordinary run or
    ``--cfg job`` should not pay for that."""
    if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
        return help_text()
    return "dpaudit --help (the full text is generated only when asked for)"


def register() -> None:
    """Store the schema and the help config in Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name=SCHEMA_NAME, node=DpauditConfig)
    if not OmegaConf.has_resolver("dpaudit_help"):
        OmegaConf.register_new_resolver("dpaudit_help", _help_when_asked)
    cs.store(
        group="hydra/help",
        name="dpaudit",
        node={"app_name": "dpaudit", "header": "", "footer": "", "template": "${dpaudit_help:}"},
    )


register()

__all__ = ["DpauditConfig", "help_text", "preset_groups", "register", "task_references"]


def describe_settings(width: int = 30) -> str:
    """Every setting as ``group.key  type = default  help [allowed values]``, one line each
    (the body of the CLI's ``--help``), generated from the dataclasses' metadata."""
    lines = []

    def one(prefix: str, f) -> None:
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        head = f"  {prefix}{f.name}"
        text = f"{head:<{width}} {kind} = {_show(default)}"
        lines.append(text)
        help_text = f.metadata.get("help", "")
        allowed = choices_of(f)
        if allowed:
            help_text += f"; allowed: {' | '.join(allowed)}"
        lines.append(f"{'':<{width}}   {help_text}")

    for group, kind in GROUPS.items():
        lines.append(f"{group}: {(kind.__doc__ or '').strip().splitlines()[0]}")
        for f in fields(kind):
            one(f"{group}.", f)
    lines.append("top level:")
    for f in fields(AuditSettings):
        if f.name not in GROUPS:
            one("", f)
    return "\n".join(lines)


def _show(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, list):
        return "[" + ", ".join(map(str, v)) + "]"
    if isinstance(v, dict):
        return "{}" if not v else str(v)
    return str(v)
