"""Hydra entry point (`dpaudit`): parse the config and call the task it names.

Every experiment preset sets ``task`` to a Hydra-callable config (``_target_`` plus keyword
arguments). The CLI adds ``output_dir`` (Hydra's run directory) and calls it; the task writes
its JSON and plots there and returns its results. Around that call the CLI

* refuses overrides of settings the preset's task never reads (``experiment=stats_demo
  dp.noise_multiplier=2`` would otherwise be silently ignored), naming the keys it does read;
* points to the ``launchers`` extra when ``hydra/launcher=...`` names a plugin that is not
  installed (before Hydra's bare "Could not load" error);
* keeps the console quiet: Opacus' "Secure RNG turned off" and RDP "optimal order" warnings
  are shown once per job, every warning goes to the job's log file (``<run dir>/cli.log``),
  which also records the config, the output directory, the time taken and the verdict;
* ends by printing where the outputs are.

An audit whose verdict is a PRIVACY BUG (certified evidence against the claim) exits with
status 3, so an audit can gate CI; ``fail_on_bug=false`` turns that off. With
``audit.require=verified`` an audit whose epsilon is not verified (a premise could not be
seen: verdict ``not_verified``, or a finding that leaves the upper side unverified) exits with
status 4. In a sweep (``-m``) every job runs and the status stays 0; read the jobs' verdicts
with ``dpaudit-aggregate``.
"""

from __future__ import annotations

import importlib.util
import io
import logging
import os
import re
import sys
import time
import warnings
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import call
from omegaconf import DictConfig, OmegaConf

import dpaudit.conf  # noqa: F401  (registers the config schema and the --help text)
from dpaudit._validate import did_you_mean
from dpaudit.conf import DpauditConfig, task_references
from dpaudit.experiment.settings import AuditSettings
from dpaudit.registry import load_plugins

EXIT_PRIVACY_BUG = 3
EXIT_NOT_VERIFIED = 4
EXIT_USAGE = 2

# hydra/launcher option -> (plugin module, pip package)
_JOBLIB = ("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher")
_SUBMITIT = ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher")
LAUNCHER_PLUGINS = {
    "joblib": _JOBLIB,
    "cpu_parallel": _JOBLIB,
    "submitit_slurm": _SUBMITIT,
    "submitit_local": _SUBMITIT,
    "slurm_gpu": _SUBMITIT,
}

# Third-party warnings that repeat on every training run: shown once per job, then logged.
ONCE = ("Secure RNG turned off", "Optimal order is the")

_SETTINGS = frozenset(f for f in AuditSettings.__dataclass_fields__)
_TOP_LEVEL = frozenset(f for f in DpauditConfig.__dataclass_fields__)

log = logging.getLogger("dpaudit.cli")


def privacy_bug(result) -> bool:
    """Whether a task's result carries a PRIVACY BUG verdict."""
    return isinstance(result, dict) and bool(result.get("verdict", {}).get("privacy_bug"))


def not_verified(result) -> bool:
    """Whether a task's result carries a verdict about a claim that is not verified (an
    audit without a verdict about training data is not gated)."""
    if not isinstance(result, dict) or not isinstance(result.get("verdict"), dict):
        return False
    return result["verdict"].get("verified") is False


def missing_launcher(argv: list[str]) -> str | None:
    """A hint when ``hydra/launcher=NAME`` in ``argv`` needs a plugin that is not installed."""
    for arg in argv:
        if not arg.startswith("hydra/launcher="):
            continue
        name = arg.split("=", 1)[1]
        if name not in LAUNCHER_PLUGINS:
            continue
        module, package = LAUNCHER_PLUGINS[name]
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:
            found = False
        if not found:
            return (
                f"hydra/launcher={name} needs the Hydra launcher plugin {package}, which is not "
                "installed: pip install -c requirements/dev.txt -e '.[launchers]' in the dpaudit "
                "checkout (the versions CI tests), or pip install " + package
            )
    return None


def unused_overrides(task, overrides: list[str]) -> list[str]:
    """The command-line overrides of audit settings that ``task`` (a preset's task config,
    unresolved) never reads; ``task.*``, ``hydra*``, ``experiment`` and ``fail_on_bug`` are
    always used."""
    refs = task_references(task)
    unused = []
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        top = key.split(".", 1)[0]
        if top not in _SETTINGS:
            continue
        used = top in refs or key in refs or any(r.startswith(key + ".") for r in refs)
        if not used:
            unused.append(item)
    return unused


def _check_overrides(cfg: DictConfig, hc) -> None:
    unknown = [k for k in cfg if k not in _TOP_LEVEL]
    if unknown:  # only a `+key=value` can add a key the schema does not know
        added = [o for o in hc.overrides.task if o.lstrip("+").split("=", 1)[0] in unknown]
        raise ValueError(
            f"unknown setting {unknown[0]!r}{did_you_mean(unknown[0], _TOP_LEVEL)} "
            f"({added[0] if added else 'in the config'}): the top-level settings are "
            f"{', '.join(sorted(_TOP_LEVEL))}; `+` adds nothing that dpaudit reads (use "
            "`dpaudit --help` for every key)")
    task = OmegaConf.to_container(cfg.task, resolve=False) if cfg.task is not None else {}
    unused = unused_overrides(task, list(hc.overrides.task))
    if unused:
        preset = hc.runtime.choices.get("experiment", "?")
        reads = sorted(task_references(task)) or ["no audit settings"]
        params = sorted(k for k in task if not str(k).startswith("_"))
        raise ValueError(
            f"experiment={preset} does not use {', '.join(unused)}: its task "
            f"({task.get('_target_', '?')}) reads only {', '.join(reads)}, so the override "
            f"would be silently ignored. Set the task's own arguments instead (task.KEY=VALUE; "
            f"its keys: {', '.join(params)})."
        )


def _file_logger() -> logging.Logger:
    """A logger that writes only to the job's log file(s) set up by Hydra (none: silent)."""
    out = logging.getLogger("dpaudit.job")
    out.handlers = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    out.propagate = False
    out.setLevel(logging.INFO)
    return out


class _WarningRouter:
    """``warnings.showwarning`` for one job: every warning to the log file; the repeating
    third-party ones (``ONCE``) to the console only the first time."""

    def __init__(self, file_log: logging.Logger, log_path: str | None):
        self.file_log, self.log_path = file_log, log_path
        self.seen: set[str] = set()
        self.show = warnings.showwarning

    def __call__(self, message, category, filename, lineno, file=None, line=None):
        text = str(message)
        self.file_log.warning("%s: %s (%s:%s)", category.__name__, text, filename, lineno)
        key = next((k for k in ONCE if k in text), None)
        if key is None:
            return self.show(message, category, filename, lineno, file, line)
        if key not in self.seen:
            self.seen.add(key)
            self.show(message, category, filename, lineno, file, line)
            where = f" ({self.log_path})" if self.log_path else ""
            print(f"(later '{key}...' warnings go to the log{where})", file=sys.stderr)


def _log_path(file_log: logging.Logger) -> str | None:
    for h in file_log.handlers:
        return getattr(h, "baseFilename", None)
    return None


def _outputs(out: Path, since: float) -> list[str]:
    """Files the task wrote under ``out`` (not Hydra's own .hydra/ and log files)."""
    if not out.is_dir():
        return []
    files = []
    for p in sorted(out.rglob("*")):
        rel = p.relative_to(out)
        hidden = any(part.startswith(".") for part in rel.parts)  # .hydra/, locks, claims
        if p.is_file() and not hidden and p.suffix != ".log":
            if p.stat().st_mtime >= since - 1:
                files.append(str(rel))
    return files


def _listed(files: list[str], most: int = 5) -> list[str]:
    """The output list as printed: a folder with more than ``most`` new files is one line
    (a multi-run audit's 200 run files: 'runs/ (200 files: run_00000.json ... run_00199.json)')."""
    by_dir: dict[str, list[str]] = {}
    for f in files:
        by_dir.setdefault(str(Path(f).parent), []).append(f)
    lines, said = [], set()
    for f in files:
        d = str(Path(f).parent)
        group = by_dir[d]
        if d == "." or len(group) <= most:
            lines.append(f)
        elif d not in said:
            said.add(d)
            first, last = Path(group[0]).name, Path(group[-1]).name
            lines.append(f"{d}/ ({len(group)} files: {first} ... {last})")
    return lines


AUDIT_TASK = "dpaudit.tasks.audit.audit_task"
# errors shown as one line besides ValueError: (module, class); such an error exists only if
# its module was imported, so a config error never imports them (data: torch; report: plots)
_ONE_LINE = (("dpaudit.data", "MissingExtraError"), ("dpaudit.report.lock", "DirectoryBusyError"),
             ("dpaudit.experiment.trainings.engine", "SharingError"))


def _one_line_errors() -> tuple[type, ...]:
    return tuple(getattr(sys.modules[m], c) for m, c in _ONE_LINE if m in sys.modules)


def _check_audit_settings(cfg: DictConfig) -> None:
    """Validate an audit's settings before its task is imported: a config error costs the
    light settings module, not torch and Opacus (``run_audit`` checks them again). Another
    task's arguments are checked against its function (``tasks.arguments``)."""
    task = OmegaConf.to_container(cfg.task, resolve=True)
    if cfg.task.get("_target_") != AUDIT_TASK:
        from hydra.utils import get_method

        from dpaudit.tasks.arguments import check_task_arguments

        target = str(task.get("_target_"))
        check_task_arguments(get_method(target), task, target.rsplit(".", 1)[-1])
        return
    AuditSettings.from_mappings(**{k: v for k, v in task.items() if not k.startswith("_")})


def check_command(overrides: list[str]) -> None:
    """Compose the config of ``dpaudit OVERRIDES`` and run every check the CLI runs before the
    task starts (unknown, unread or bad settings), without running it: a parse-only path (the
    documentation's commands are tested with it). Raises Hydra's error for what it refuses
    itself (``hydra_error_line`` condenses its text), ValueError for dpaudit's checks.

    Args:
        overrides: the command's arguments after ``dpaudit`` (no ``-m`` sweep: one value
            each; ``hydra/...`` and ``hydra.*`` overrides are Hydra's, passed through).
    """
    from hydra import compose, initialize_config_module
    from omegaconf import open_dict

    with initialize_config_module(config_module="dpaudit.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides),
                      return_hydra_config=True)
    hc = cfg.hydra
    with open_dict(cfg):
        del cfg["hydra"]
    _check_overrides(cfg, hc)
    if cfg.get("plugins"):
        load_plugins(OmegaConf.to_container(cfg.plugins, resolve=True))
    _check_audit_settings(cfg)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def _hydra_main(cfg: DictConfig):
    if _HELD is not None:
        _HELD.release()  # the config composed: the task's own stderr is the terminal's
    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    file_log = _file_logger()
    preset = hc.runtime.choices.get("experiment", "?")
    file_log.info("dpaudit experiment=%s, overrides: %s", preset, list(hc.overrides.task))
    file_log.info("output directory: %s", out)
    cfg_text = OmegaConf.to_yaml({k: v for k, v in cfg.items() if k != "task"}, resolve=True)
    file_log.info("settings:\n%s", cfg_text)
    router = _WarningRouter(file_log, _log_path(file_log))
    start, wall = time.time(), time.perf_counter()
    try:
        _check_overrides(cfg, hc)
        if cfg.get("plugins"):
            load_plugins(OmegaConf.to_container(cfg.plugins, resolve=True))
        _check_audit_settings(cfg)
        with warnings.catch_warnings():
            warnings.showwarning = router
            result = call(cfg.task, output_dir=str(out))
    except (ValueError, RuntimeError, ImportError, InstantiationException) as exc:  # one line
        err = exc.__cause__ if isinstance(exc, InstantiationException) else exc
        if not isinstance(err, (ValueError, *_one_line_errors())):
            raise
        file_log.error("error: %s", err)
        if hc.mode != RunMode.RUN or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"dpaudit: error: {err}\n(HYDRA_FULL_ERROR=1 shows the traceback)",
              file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    seconds = time.perf_counter() - wall
    file_log.info("task %s finished in %.1f s", cfg.task.get("_target_"), seconds)
    if isinstance(result, dict) and isinstance(result.get("verdict"), dict):
        v = result["verdict"]
        file_log.info("verdict: %s (%s)", v.get("status"), v.get("message"))
    files = _listed(_outputs(out, start))
    file_log.info("outputs in %s: %s", out, ", ".join(files) or "none")
    print(f"\noutputs ({seconds:.1f} s): {out}/" + "".join(f"\n  {f}" for f in files))
    if _log_path(file_log):
        print(f"log: {_log_path(file_log)}")
    if privacy_bug(result) and cfg.get("fail_on_bug", True) and hc.mode == RunMode.RUN:
        raise SystemExit(EXIT_PRIVACY_BUG)
    required = (cfg.get("audit") or {}).get("require", "none")
    if required == "verified" and not_verified(result) and hc.mode == RunMode.RUN:
        print("dpaudit: audit.require=verified: your epsilon is not verified (exit status "
              f"{EXIT_NOT_VERIFIED})", file=sys.stderr)
        raise SystemExit(EXIT_NOT_VERIFIED)
    return result


_FILE_ERRORS = {"PermissionError", "FileNotFoundError", "NotADirectoryError", "OSError",
                "FileExistsError", "IsADirectoryError"}
_HELP_LINE = "(dpaudit --help lists every preset, option and setting; HYDRA_FULL_ERROR=1 shows " \
    "Hydra's own message)"


def hydra_error_line(text: str) -> str:
    """Hydra's message for a mistake on the command line (a misspelt key, a value of the wrong
    type, an unknown option, a missing list's brackets), condensed to one line."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("Set the environment variable HYDRA_FULL")
             and not ln.startswith("To append to your config use")
             and not ln.startswith("usage:") and not ln.startswith("  ")]
    options, listing = [], False
    for ln in text.splitlines():  # the tab-indented names under "Available options in ..."
        if ln.startswith("Available options in"):
            listing = True
        elif listing and ln.startswith("\t"):
            options.append(ln.strip())
        elif listing:
            listing = False
    main = [ln for ln in lines if not ln.startswith("\t") and not ln.startswith("    ")]
    if not main:
        return "the command line could not be parsed"
    if main[0].startswith("Traceback"):  # an exception Hydra did not format: its last line
        msg = main[-1]
        if msg.split(":", 1)[0] in _FILE_ERRORS:
            msg += ": choose a writable output directory with hydra.run.dir=DIR"
        return msg
    msg = re.sub(r"^[\w.-]+: error: ", "", main[0]).rstrip(".")
    for extra in main[1:3]:
        if extra.startswith("Available options in"):
            missing = re.search(r"Could not find '[^']*/([^'/]+)'", msg)
            msg += did_you_mean(missing.group(1), options) if missing else ""
            msg += f" (options: {', '.join(options)})"
            break
        if extra.startswith(("Key ", "Value ", "Invalid value", "Could not", "mismatched",
                             "extraneous", "no viable")):
            msg += f": {extra}"
            misspelt = re.match(r"Key '([^']+)' not in '", extra)
            full_key = re.search(r"^\s*full_key: (\S+)", text, flags=re.M)
            if misspelt and full_key:
                msg += did_you_mean(misspelt.group(1), schema_keys(full_key.group(1)))
            break
    if "is not a ListConfig" in msg and "override " in msg:
        key, _, value = msg.split("override ", 1)[1].split(":", 1)[0].partition("=")
        msg += f" ({key} takes a list: {key}=[{value}])"
    return msg.removeprefix("dpaudit: error: ").removeprefix("error: ")


def schema_keys(full_key: str) -> list[str]:
    """The keys the config schema allows beside ``full_key`` (``dp.noise_multipler``: the
    ``dp`` group's fields; ``hydra.run.dri``: Hydra's ``run`` node's; a top-level key: the
    top-level settings and every ``group.key``, so ``noise_multiplier=2`` finds
    ``dp.noise_multiplier``), [] where the schema does not say (an open mapping such as
    ``data.options``)."""
    parent = full_key.rpartition(".")[0]
    root, _, rest = parent.partition(".")
    try:
        if root == "hydra":
            from hydra.conf import HydraConf

            node, path = OmegaConf.structured(HydraConf), rest
        else:
            node, path = OmegaConf.structured(DpauditConfig), parent
        sub = OmegaConf.select(node, path) if path else node
    except Exception:  # a path the schema cannot follow: no suggestion, the message stands
        return []
    if not isinstance(sub, DictConfig):
        return []
    keys = [str(k) for k in sub]
    if not parent:
        keys += [f"{k}.{f}" for k in keys if isinstance(sub.get(k), DictConfig) for f in sub[k]]
    return keys


class _HeldStderr:
    """Hydra reports a mistake on the command line in 5-12 lines and exits 1. Until the task
    starts, stderr is held here; if Hydra exits with an error before that, the message is
    condensed to one line (``hydra_error_line``) and the exit status is 2, like every other
    user error. The task's start (``release``) hands stderr back with whatever it held."""

    def __init__(self):
        self.real, self.buffer = sys.stderr, io.StringIO()

    def hold(self) -> None:
        sys.stderr = self.buffer

    def release(self) -> None:
        if sys.stderr is self.buffer:
            sys.stderr = self.real
            self.real.write(self.buffer.getvalue())
            self.buffer = io.StringIO()

    @property
    def holding(self) -> bool:
        return sys.stderr is self.buffer


_HELD: _HeldStderr | None = None


def main() -> None:
    """Console-script entry point. ``dpaudit --help`` (alone) prints the help text without
    starting Hydra, whose help composes every config group several times (about 2 s); with
    overrides beside it, Hydra prints the same text. A mistake Hydra finds on the command line
    is one line on stderr and exit status 2 (``_HeldStderr``)."""
    global _HELD
    if sys.argv[1:] in (["--help"], ["-h"]):
        from dpaudit.conf import help_text

        print(help_text())
        return
    hint = missing_launcher(sys.argv[1:])
    if hint:
        print(f"dpaudit: {hint}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    multirun = any(a in ("-m", "--multirun") for a in sys.argv[1:])
    if os.environ.get("HYDRA_FULL_ERROR") == "1" or multirun:
        # a sweep's launcher (joblib, submitit) pickles the process state with its jobs, and
        # a held stderr cannot be pickled: a sweep's mistakes are reported by Hydra itself
        _hydra_main()
        return
    _HELD = _HeldStderr()
    _HELD.hold()
    try:
        _hydra_main()
    except SystemExit as done:
        if _HELD.holding and done.code not in (0, None):
            text = _HELD.buffer.getvalue()
            sys.stderr = _HELD.real
            print(f"dpaudit: error: {hydra_error_line(text)}\n{_HELP_LINE}", file=sys.stderr)
            raise SystemExit(EXIT_USAGE) from None
        raise
    except OSError as err:  # e.g. an output directory Hydra cannot create
        if not _HELD.holding:
            raise
        sys.stderr = _HELD.real
        where = f" ({err.filename})" if getattr(err, "filename", None) else ""
        print(f"dpaudit: error: {err.strerror or err}{where}: choose a writable output "
              f"directory with hydra.run.dir=DIR\n{_HELP_LINE}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    finally:
        _HELD.release()


if __name__ == "__main__":
    main()
