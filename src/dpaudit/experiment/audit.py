"""One audited training run and the one-run audit (DESIGN 3).

``audit_run`` trains once with the canaries of the settings and returns the raw scores;
``run_audit`` is the user-facing entry point: it runs the one-run audit (K canaries, each a
member with probability 1/2, one training) or hands over to the multi-run audit, evaluates the
bounds against the theory, and writes the report. ``audit_task`` is the same for Hydra.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from dpaudit.attacks import StepScore
from dpaudit.canaries import predicted_leakage
from dpaudit.capture import per_sample_clipped_grads
from dpaudit.experiment.canary_setup import CanarySetup, setup_canaries
from dpaudit.experiment.evaluation import evaluate_audit
from dpaudit.experiment.report import write_report
from dpaudit.experiment.scores import build_scores
from dpaudit.experiment.settings import AuditSettings
from dpaudit.experiment.threat import threat_model_for
from dpaudit.experiment.training import poisson_sample_rate, total_steps, train_audited
from dpaudit.models import build_model


def resolve_device(settings: AuditSettings) -> torch.device:
    """``settings.device``, or CUDA when available, else CPU."""
    if settings.device:
        return torch.device(settings.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class PreparedRun:
    """What every run with the same membership shares: it depends on ``settings.seed`` only.

    The data split, the initial model (after the canaries were chosen at theta_0), the canary
    setup and the attack scores before their first step. Preparing them once lets a multi-run
    audit train R runs without reloading data, re-ranking canaries or re-estimating
    precisions; ``audit_run`` trains a deep copy, so the prepared objects are never modified.
    """

    model: nn.Module
    test: Dataset
    setup: CanarySetup
    sample_rate: float
    scores: list[StepScore]


def prepare_run(settings: AuditSettings, membership: np.ndarray | None = None) -> PreparedRun:
    """Load the data, build the model at theta_0, set up the canaries and the attack scores."""
    seed = settings.seed
    device = resolve_device(settings)
    train, test, info = settings.data.load(seed)
    m = settings.model
    model = build_model(m.name, info.input_shape, info.num_classes, m.width, seed=seed)
    model = model.to(device)
    setup = setup_canaries(
        settings, model, train, poisson_sample_rate(settings.dp, len(train)), membership
    )
    sample_rate = poisson_sample_rate(settings.dp, setup.n_base)
    expected_b = int(len(setup.train_set) * sample_rate)  # Opacus' expected batch size
    scores = build_scores(settings, model, setup, max(1, expected_b))
    if setup.precision is not None:
        setup.info["predicted_leakage"] = predict_input_leakage(
            settings, model, setup, sample_rate, max(1, expected_b)
        )
    return PreparedRun(model, test, setup, sample_rate, scores)


def predict_input_leakage(settings, model, setup, sample_rate: float, batch_size: int) -> dict:
    """Seed 001's prediction for the chosen input canaries, so reports put it next to the
    measurement: noise-aware Mahalanobis score at theta_0 -> per-step and composed GDP mu
    (over the expected q T inclusions), epsilon, and the AUC of the epoch-summed covariance
    score (``dpaudit.canaries.predicted_leakage``)."""
    dp = settings.dp
    grads = per_sample_clipped_grads(
        model,
        setup.canaries.inputs,
        setup.canaries.targets,
        setup.canaries.loss_fn,
        dp.max_grad_norm,
        param_names=setup.param_names,
    )
    steps = total_steps(dp, sample_rate)
    pred = predicted_leakage(
        grads,
        setup.precision,
        dp.noise_multiplier,
        dp.max_grad_norm,
        batch_size,
        inclusions=max(1, round(sample_rate * steps)),
        delta=dp.delta,
        total_steps=steps,
    )
    out = pred.as_dict()
    out["mean_auc_summed_score"] = float(np.mean(pred.auc_summed_score))
    return out


def audit_run(
    settings: AuditSettings,
    run_seed: int | None = None,
    membership: np.ndarray | None = None,
    prepared: PreparedRun | None = None,
) -> dict:
    """Train once with the audit hook; return scores, membership and the run's bookkeeping.

    The data split, the initial model and the canaries depend on ``settings.seed`` only (a
    fixed target across the runs of a multi-run audit); sampling and noise on ``run_seed``.
    ``prepared`` (from ``prepare_run`` with the same settings and membership) skips the setup;
    the result is the same as without it.
    """
    run_seed = settings.seed if run_seed is None else run_seed
    if prepared is None:
        prepared = prepare_run(settings, membership)
    elif membership is not None and not np.array_equal(
        np.asarray(membership, dtype=bool), prepared.setup.membership
    ):
        raise ValueError("membership differs from the membership the run was prepared with")
    setup = prepared.setup
    model, scores = copy.deepcopy((prepared.model, prepared.scores))
    outcome = train_audited(
        model,
        setup.train_set,
        prepared.test,
        settings.dp,
        prepared.sample_rate,
        setup.canaries,
        scores,
        params=setup.param_names,
        seed=run_seed,
        progress=settings.progress,
        coordinates=setup.coordinates,
    )
    return {
        "scores": {k: v.tolist() for k, v in outcome.scores.items()},
        "membership": setup.membership.astype(int).tolist(),
        "steps": outcome.steps,
        "sample_rate": outcome.sample_rate,
        "engine_accountants": {k: v.to_dict() for k, v in outcome.accountants.items()},
        "test_accuracy": outcome.test_accuracy,
        "train_seconds": outcome.seconds,
        "canary_info": setup.info,
        "candidate_scores": None
        if setup.candidate_scores is None
        else setup.candidate_scores.tolist(),
        "chosen": None if setup.chosen is None else setup.chosen.tolist(),
        "canary_norm": setup.info.get("norm"),
    }


def evaluate(settings: AuditSettings, run: dict, extra: dict | None = None) -> dict:
    """Evidence, theory and verdict for pooled scores (one run, or runs aggregated)."""
    threat = threat_model_for(
        settings, run["sample_rate"], run["steps"], run.get("canary_norm")
    )
    evidence = evaluate_audit(
        settings,
        run["scores"],
        run["membership"],
        threat,
        canary_info=run.get("canary_info"),
        engine_accountants=run.get("engine_accountants"),
    )
    result = {
        "settings": settings.to_dict(),
        "mode": settings.audit.mode,
        "steps": run["steps"],
        "sample_rate": run["sample_rate"],
        "test_accuracy": run.get("test_accuracy"),
        **evidence,
        "canary_info": run.get("canary_info"),
        "engine_accountants": run.get("engine_accountants"),
    }
    result.update(extra or {})
    return result


def run_audit(
    settings: AuditSettings | None = None, output_dir: str | Path | None = None, **groups
) -> dict:
    """Run the audit that ``settings`` (or Hydra-style group mappings) describe.

    Returns the result dictionary; with ``output_dir`` also writes ``results.json``, the plots
    and prints the console table.
    """
    if settings is None:
        settings = AuditSettings.from_mappings(**groups)
    elif groups:
        raise ValueError("pass either settings or group mappings, not both")
    else:
        settings.check()
    start = time.perf_counter()
    if settings.audit.mode == "multi_run":
        from dpaudit.experiment.multirun import run_multi

        if output_dir is None:
            raise ValueError("output_dir is required for audit.mode='multi_run' (runs are saved)")
        run = run_multi(settings, Path(output_dir))
    else:
        run = audit_run(settings)
    result = evaluate(settings, run, {"wall_seconds": time.perf_counter() - start})
    if output_dir is not None:
        write_report(result, run, Path(output_dir), settings)
    return result


def audit_task(output_dir: str | None = None, **groups) -> dict:
    """Hydra task (``experiment=audit_*``): group mappings in, report written to output_dir."""
    return run_audit(output_dir=output_dir, **groups)
