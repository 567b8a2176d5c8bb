"""Every advertised combination has one of two outcomes, nothing else (issue 31's matrix).

An audit either runs and its report says what it could and could not certify (a positive
certified number, or a line that explains the zero: said before training, no certified method
applies, or fell short of what was expected), or it is refused before any training with one
line that names the setting. A crash, an error after training or an unexplained zero fails.

The axes are read from the settings' own lists, so a new value joins the matrix by itself:
canary kind, direction, placement, policy, view, source and selection; every attack score;
one-run and multi-run; every model; and every experiment preset (at two seeds, on a tiny
budget). Each value appears at least twice and each (canary kind, score) pair at least once.
The full matrix is the slow tier; ``FAST`` is a sample of it that runs by default.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter

import pytest
import yaml
from hydra import compose, initialize_config_module
from hydra.errors import InstantiationException
from hydra.utils import call

import dpaudit.experiment.trainings.run as run_module
from dpaudit.canaries import INPUT_SOURCES
from dpaudit.conf import option_text, preset_names
from dpaudit.data import MissingExtraError
from dpaudit.experiment import run_audit
from dpaudit.experiment.judging.outputs import console_table
from dpaudit.experiment.settings import (
    CANARY_SELECTIONS,
    DIRECTIONS,
    GRADIENT_POLICIES,
    PLACEMENTS,
    VIEWS,
)
from dpaudit.experiment.settings import _registry_names as registry_names

SCORES = registry_names("ATTACKS")
MODELS = registry_names("MODELS")
MODES = ("one_run", "multi_run")
# what the CLI's model=NAME composes (the cnn group's own width, not the mlp's default)
MODEL_GROUPS = {m: {"name": m, **(yaml.safe_load(option_text("model", m)) or {})} for m in MODELS}
SETTING = re.compile(r"\b(data|model|dp|canary|attack|audit|task)\.[a-z_]+")
EXPLAINED = ("as said before training", "no certified epsilon bound applies", "certified 0 where",
             "certified 0: these canaries are not independent")
TINY = {"dp": {"steps": 3}, "progress": False}


def axis_cases() -> list[tuple[str, dict]]:
    """(id, settings groups): every gradient design and every input design once, with the
    score, model and mode dealt round-robin so that each appears at least twice."""
    designs = [
        {"kind": "gradient", "direction": d, "placement": p, "policy": pol, "view": v}
        for d, p, pol, v in itertools.product(DIRECTIONS, PLACEMENTS, GRADIENT_POLICIES, VIEWS)
    ] + [
        {"kind": "input", "source": s, "selection": sel, "candidates": 40, "n_references": 16}
        for s, sel in itertools.product(INPUT_SOURCES, CANARY_SELECTIONS)
    ]
    cases = []
    for i, canary in enumerate(designs):
        score, model, mode = SCORES[i % len(SCORES)], MODELS[i % len(MODELS)], MODES[i // 2 % 2]
        multi = mode == "multi_run"
        dirac = canary["kind"] == "gradient" and canary["direction"] == "dirac"
        count = (4 if dirac else 1) if multi else (8 if canary["kind"] == "gradient" else 5)
        groups = {
            **TINY,
            "model": MODEL_GROUPS[model],
            "canary": {**canary, "count": count},
            "attack": {"scores": [score]},
            "audit": {"mode": mode, **({"runs": 4} if multi else {})},
        }
        shown = {k: v for k, v in canary.items() if k not in ("candidates", "n_references")}
        name = "-".join(str(v) for v in shown.values())
        cases.append((f"{name}-{score}-{model}-{mode}", groups))
    return cases


CASES = axis_cases()
# A sample for the default run: both kinds, every mode, a refusal and the covariance score.
FAST = {"gradient-dirac-least_active-every_step-auto-covariance-mlp-one_run",
        "input-mislabeled-hard-scalar-mlp-one_run",
        "gradient-dirac-random_live-bernoulli-full-covariance-logreg-multi_run",
        "input-blank-easy-batch_size-cnn-one_run"}


def classify(groups: dict, out) -> tuple[str, str]:
    """(outcome, detail) of one audit through the Python API (the CLI's path). Allowed:
    "ran" (a positive certified number or a report line explaining the zero) and "refused"
    (before training, one line naming a setting). Anything else is a finding: "refused after
    training", "refused unclearly", "crash", "unexplained zero"."""
    trained = []
    real = run_module.train_audited

    def watched(*args, **kwargs):
        trained.append(True)
        return real(*args, **kwargs)

    run_module.train_audited = watched
    try:
        # one-run audits need no directory (plots and files are not what is checked here)
        multi = groups.get("audit", {}).get("mode") == "multi_run"
        result = run_audit(output_dir=out if multi else None, **groups)
    except (ValueError, MissingExtraError) as err:
        message = str(err)
        if trained:
            return "refused after training", message
        if "\n" in message or not SETTING.search(message):
            return "refused unclearly", message
        return "refused", message
    except Exception as err:
        return "crash", f"{type(err).__name__}: {err}"
    finally:
        run_module.train_audited = real
    report = console_table(result)
    v = result["verdict"]
    certified = v["best_lower_bound"] > 0 or any(
        c["certified"] and c["mu_lower"] > 0 for c in result["claim"].values()
    )
    if certified:
        return "ran", f"certified epsilon {v['best_lower_bound']:.3f}"
    line = next((e for e in EXPLAINED if e in report), None)
    return ("ran", f"0, explained: {line}") if line else ("unexplained zero", v["message"])


def test_the_matrix_covers_every_axis_twice_and_every_kind_score_pair():
    seen = Counter()
    pairs = set()
    for _, g in CASES:
        c = g["canary"]
        seen.update(f"canary.{k}={v}" for k, v in c.items() if k not in ("count", "candidates"))
        seen.update((f"attack.scores={g['attack']['scores'][0]}", f"model={g['model']['name']}",
                     f"audit.mode={g['audit']['mode']}"))
        pairs.add((c["kind"], g["attack"]["scores"][0]))
    wanted = (
        [f"canary.direction={d}" for d in DIRECTIONS]
        + [f"canary.placement={p}" for p in PLACEMENTS]
        + [f"canary.policy={p}" for p in GRADIENT_POLICIES]
        + [f"canary.view={v}" for v in VIEWS]
        + [f"canary.source={s}" for s in INPUT_SOURCES]
        + [f"canary.selection={s}" for s in CANARY_SELECTIONS]
        + [f"attack.scores={s}" for s in SCORES]
        + [f"model={m}" for m in MODELS]
        + [f"audit.mode={m}" for m in MODES]
        + ["canary.kind=gradient", "canary.kind=input"]
    )
    assert {w: seen[w] for w in wanted if seen[w] < 2} == {}
    assert pairs == {(k, s) for k in ("gradient", "input") for s in SCORES}
    assert FAST <= {name for name, _ in CASES}


@pytest.mark.parametrize(
    "groups",
    [pytest.param(g, id=n, marks=() if n in FAST else pytest.mark.slow) for n, g in CASES],
)
def test_every_combination_runs_and_explains_itself_or_is_refused_before_training(
    groups, tmp_path
):
    outcome, detail = classify(groups, tmp_path)
    assert outcome in ("ran", "refused"), detail


# ------------------------------------------------------------------------------ presets
PRESET_TINY = {  # each preset's own knobs turned down; the audits take a tiny budget
    "meanlab": ["task.n=50", "task.d=100", "task.rounds=20"],
    "meanlab_linreg": ["task.n=20", "task.D=60", "task.rounds=20", "task.gammas=[2.0]"],
    "stats_demo": ["task.n=200", "task.mus=[1.0]"],
    "fig3": ["task.runs=4", "task.canaries_per_class=2", "task.n_references=20",
             "task.candidates=20", "progress=false"],
    "audit": ["dp.steps=3", "model.width=50", "progress=false"],
}
MULTI_RUN_PRESETS = {"bug_realised_batch_size", "bug_unclipped_example"}  # one canary a run


def preset_overrides(name: str) -> list[str]:
    """The overrides that make preset ``name`` tiny (its kind's ``PRESET_TINY``)."""
    if name == "meanlab_linreg":
        return PRESET_TINY["meanlab_linreg"]
    for prefix in ("meanlab", "stats_demo", "fig3"):
        if name.startswith(prefix):
            return PRESET_TINY[prefix]
    if name in MULTI_RUN_PRESETS:
        return [*PRESET_TINY["audit"], "audit.runs=4"]
    return [*PRESET_TINY["audit"], "canary.count=4", "canary.candidates=20"]


def classify_preset(name: str, seed: int, out) -> tuple[str, str]:
    """A preset on a tiny budget through Hydra's compose and the task call the CLI makes:
    audits as ``classify``; other tasks "ran" when they return their results, "refused"
    with one line naming the setting (the GPU presets here, without torchvision)."""
    with initialize_config_module("dpaudit.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={name}", f"seed={seed}",
                                           *preset_overrides(name)])
    if cfg.task._target_ == "dpaudit.tasks.audit.audit_task":
        groups = {k: v for k, v in call(cfg.task, _partial_=True).keywords.items()
                  if k != "output_dir"}
        return classify(groups, out)
    try:
        result = call(cfg.task, output_dir=str(out))
    except InstantiationException as exc:  # Hydra's wrapper; the CLI reports the cause
        err = exc.__cause__
        if not isinstance(err, ValueError | MissingExtraError):
            return "crash", f"{type(err).__name__}: {err}"
        ok = "\n" not in str(err) and SETTING.search(str(err))
        return ("refused" if ok else "refused unclearly"), str(err)
    except Exception as err:
        return "crash", f"{type(err).__name__}: {err}"
    return ("ran", "results returned") if isinstance(result, dict) and result else ("crash", "")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", preset_names("experiment"))
def test_every_preset_runs_or_is_refused_with_one_line(name, seed, tmp_path):
    """Each preset at two seeds on a tiny budget (``classify_preset``)."""
    outcome, detail = classify_preset(name, seed, tmp_path)
    assert outcome in ("ran", "refused"), detail
