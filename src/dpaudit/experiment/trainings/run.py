"""Preparing and training one audited run, and its typed record (DESIGN 3, steps 1-4).

``prepare_run`` loads the data, builds the model at theta_0, sets up the canaries, derives
the run's plan once (``plan.derive``: q, T, the threat model) and builds the attack scores;
``audit_run`` trains a copy of the prepared state and returns a ``RunRecord``. Both take the
audit's ``plan.AuditPlan``, never its settings. The record is what a multi-run audit writes
to ``runs/run_<r>.json`` (``to_dict`` / ``from_dict``; its white-box records compacted,
``capture.records_io``) and what the evaluation reads, for one run or for runs pooled by
``multirun.aggregate``.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import numpy as np
from torch import nn
from torch.utils.data import Dataset

from dpaudit.attacks import StepScore
from dpaudit.canaries import predicted_leakage
from dpaudit.capture.records import WhiteBoxRecords
from dpaudit.capture.records_io import compact, records_from_dict, records_to_dict
from dpaudit.experiment.canary_designs import Realisation
from dpaudit.experiment.plan import (
    AuditPlan,
    RunPlan,
    derive,
    membership_counts,
    planned_threat_model,
)
from dpaudit.experiment.trainings.canary_setup import CanarySetup, setup_canaries
from dpaudit.experiment.trainings.data_rate import DataRateRecord, data_rate_design
from dpaudit.experiment.trainings.pretrain import pretrain
from dpaudit.experiment.trainings.scores import build_scores
from dpaudit.experiment.trainings.training import train_audited
from dpaudit.forecast import (
    ceiling_sentence,
    certifiable_ceiling,
    expected_certified_bound,
    ideal_scores,
)
from dpaudit.gradients import per_sample_clipped_grads
from dpaudit.models import build_model
from dpaudit.papers import cite
from dpaudit.threat_model import ThreatModel


def warn_if_bounds_vanish(
    plan: AuditPlan, counts, threat: ThreatModel, info: dict, warn: bool = True
) -> None:
    """Say before training, naming what to change, when this audit's certified bounds are
    expected to be 0: too few canaries, or too little leakage per canary, for the scores of
    seed 001's predicted mu of input canaries, of the most powerful attack on gradient
    canaries of a correct run (``ideal_scores``), or of perfect separation otherwise. The
    expectation is kept in ``info["expected_certified_epsilon"]`` (the report prints it);
    ``warn=False`` records it without warning again."""
    mu, scores, source = None, None, "perfectly separated scores"
    pred = info.get("predicted_leakage")
    n_in, n_out = counts
    if pred is not None:
        mu = float(np.mean(pred["mu_composed"]))
        source = f"the predicted mean mu={mu:.3g} of these input canaries ({cite('001')})"
    elif threat.canary_kind == "gradient":
        scores = ideal_scores(threat, n_in, n_out, plan.seed)
        source = (
            f"the exact mu={threat.mu():.3g} of every-step gradient canaries"
            if threat.mu() is not None
            else "the most powerful attack on Poisson gradient canaries (q_c = "
            f"{threat.sample_rate:.3g}) of a correct run"
        )
    a = plan.judging
    expected = expected_certified_bound(
        n_in, n_out, mu, a.confidence, threat.delta, plan.seed, scores=scores
    )
    info["expected_certified_epsilon"] = {"epsilon": expected, "for": source}
    claimed = threat.claimed_epsilon()
    ceiling = certifiable_ceiling(n_in, n_out, claimed, a.confidence, threat.delta)
    info["certifiable_ceiling"] = ceiling
    # said once, before training; not of a stress test beside canaries inserted like an
    # example (their claim is not the user's epsilon: the report says it in its section)
    if (warn and expected > 0 and ceiling["needed_per_side"] is None
            and plan.canary.lower_side == 0):
        warnings.warn(ceiling_sentence(ceiling), stacklevel=3)
    if expected > 0 or not warn:
        return
    more = "audit.runs" if a.mode == "multi_run" else "canary.count"
    leak = (
        "lower dp.noise_multiplier, raise dp.steps or canary.inclusion_prob"
        if threat.canary_kind == "gradient"
        else "use canaries that leak more"
    )
    message = (
        f"expect epsilon bounds of 0: canary.count={plan.canary.count} gives {n_in} "
        f"member and {n_out} non-member scores, too few to certify a positive epsilon at "
        f"{a.confidence:.0%} confidence for {source} (a simulated Clopper-Pearson bound is "
        f"0); raise {more}, or {leak}"
    )
    info["expected_certified_epsilon"]["advice"] = message
    warnings.warn(message, stacklevel=3)


@dataclass
class RunRecord:
    """One audited training run, or the runs of a multi-run audit pooled (``runs`` set).

    Scores and membership are per canary (pooled: run after run). ``threat_model`` is the
    accountant's claim for one canary of this run (None for records written before it was
    stored). ``run`` / ``bit`` / ``fingerprint`` tag a multi-run audit's run file;
    ``candidate_scores`` (Algorithm 3's ranking, the same in every run) is left out of those.
    ``white_box``: the run's white-box records; a run file keeps them compacted
    (``capture.records_io``: O(T J) numbers, the same checks run on them; files written before
    they were kept have none), a pooled record those of one run (``white_box_source`` says
    which: ``multirun.aggregate``). Equality ignores them (they hold arrays). ``data_rate``:
    the canaries inserted like an example beside the audited ones (``canary.lower_side``; a
    ``trainings.data_rate.DataRateRecord``), None where there were none (run files written
    before dpaudit kept them, multi-run audits).
    """

    scores: dict[str, list[float]]
    membership: list[int]
    steps: int
    sample_rate: float  # the data's Poisson sample rate q
    engine_accountants: dict[str, dict]  # Opacus' epsilon per accountant (to_dict form)
    test_accuracy: float
    canary_info: dict
    threat_model: ThreatModel | None = None
    canary_norm: float | None = None  # gradient canaries' norm (None: input canaries)
    train_seconds: float | None = None
    candidate_scores: list[float] | None = None
    chosen: list[int] | None = None
    selection: str | None = None  # how ``chosen`` was chosen (the candidate plot's label)
    independent: bool | None = None  # each canary an independent experiment (plan.derive)
    run: int | None = None
    bit: int | None = None
    fingerprint: str | None = None
    runs: list[int] | None = None  # pooled record: the run numbers it holds
    # the weaker rungs of the threat-model ladder (capture.final_state.rung_scores): per rung
    # its scores by name, or why it has none; pooled runs: the scores run after run
    rungs: dict | None = None
    white_box: WhiteBoxRecords | None = field(default=None, compare=False)
    data_rate: DataRateRecord | None = None
    per_step: dict | None = None  # score name -> (K, T) per-step values (not saved)
    # a pooled record: {"run": whose white-box records it carries, "runs_with_records",
    # "runs"} (not saved)
    white_box_source: dict | None = None

    def to_dict(self) -> dict:
        """JSON-ready dictionary (the run file's keys); optional tags are left out when unset."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _RUNTIME_ONLY or (value is None and f.name in _OMITTED_WHEN_NONE):
                continue  # raw per-step arrays: evaluated, not stored
            out[f.name] = value
        if self.white_box is not None:  # compacted: a run file stays small
            out["white_box"] = records_to_dict(compact(self.white_box))
        if self.threat_model is not None:
            out["threat_model"] = self.threat_model.to_dict()
        if self.data_rate is not None:
            out["data_rate"] = self.data_rate.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: dict, source: str | None = None) -> RunRecord:
        """Rebuild from ``to_dict()`` output or an older run file (no ``threat_model``, no
        ``data_rate``).

        Raises a ValueError naming ``source`` (e.g. the file) and the missing keys.
        """
        where = f"{source}: " if source else ""
        if not isinstance(d, dict):
            raise ValueError(f"{where}run record must be a JSON object, got {type(d).__name__}")
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ValueError(f"{where}run record lacks {missing}")
        values = {k: v for k, v in d.items() if k in _FIELDS}
        wb = values.get("white_box")
        if isinstance(wb, dict):
            try:
                values["white_box"] = records_from_dict(wb)
            except ValueError as err:
                raise ValueError(f"{where}run record's {err}") from err
        elif wb is not None and not isinstance(wb, WhiteBoxRecords):
            raise ValueError(f"{where}run record's white_box must be an object, got "
                             f"{type(wb).__name__}")
        if values.get("data_rate") is not None:
            values["data_rate"] = DataRateRecord.from_dict(values["data_rate"], where)
        tm = values.get("threat_model")
        if isinstance(tm, dict):
            try:
                values["threat_model"] = ThreatModel.from_dict(tm)
            except (TypeError, ValueError) as err:
                raise ValueError(f"{where}run record's threat_model: {err}") from err
        return cls(**values)


_FIELDS = frozenset(f.name for f in fields(RunRecord))
_REQUIRED = tuple(f.name for f in fields(RunRecord) if f.default is MISSING)
_RUNTIME_ONLY = frozenset({"white_box", "per_step", "white_box_source"})  # white_box: below
_OMITTED_WHEN_NONE = frozenset(
    {"threat_model", "candidate_scores", "selection", "independent", "run", "bit",
     "fingerprint", "runs", "rungs", "data_rate"}
)


@dataclass
class PreparedRun:
    """What every run with the same membership shares: it depends on the plan's seed only.

    The data split, the initial model (after the canaries were chosen at theta_0), the canary
    setup, the attack scores before their first step and what the run derives from the plan
    (``plan.RunPlan``: q, T, the expected batch size, the threat model). Preparing them once
    lets a multi-run audit train R runs without reloading data, re-ranking canaries or
    re-estimating precisions; ``audit_run`` trains a deep copy, so the prepared objects are
    never modified.
    """

    model: nn.Module
    test: Dataset
    setup: CanarySetup
    derived: RunPlan
    scores: list[StepScore]

    @property
    def sample_rate(self) -> float:
        return self.derived.sample_rate

    @property
    def threat(self) -> ThreatModel:
        return self.derived.threat


def prepare_run(
    plan: AuditPlan, membership: np.ndarray | None = None, warn: bool = True
) -> PreparedRun:
    """Load the data, build the model at theta_0, set up the canaries, derive the run's
    plan (``plan.derive``: q, T, the threat model) and build the attack scores.

    Refused before anything is loaded: an audit without members or non-members
    (``plan.membership_counts``); a warning names canary.count when the bounds are expected to
    be 0 (``warn=False``: not again, for the second membership bit of a multi-run audit).
    """
    seed = plan.seed
    counts = membership_counts(plan)  # refuses an audit without members or non-members
    train, test, info = plan.data.load(seed)
    m = plan.model
    model = build_model(m.name, info.input_shape, info.num_classes, m.width, seed=seed)
    model = model.to(plan.device)
    pretrained = pretrain_model(plan, model, info)
    setup = setup_canaries(plan, model, train, membership)
    if pretrained is not None:
        setup.info["pretrained"] = pretrained
    derived = derive(plan, setup)
    setup.info["lower_side"] = lower_side_info(plan, derived)
    scores = build_scores(plan.scores, plan.attack, model, setup, derived.expected_batch_size,
                          derived.threat)
    if setup.precision is not None:
        setup.info["predicted_leakage"] = predict_input_leakage(plan, model, setup, derived)
    warn_if_bounds_vanish(plan, counts, derived.threat, setup.info, warn=warn)
    return PreparedRun(model, test, setup, derived, scores)


def lower_side_info(plan: AuditPlan, derived: RunPlan) -> dict:
    """What the report says about the canaries inserted like an example beside the audited
    ones (``canary.lower_side``): how many per side, where and at which rate; or why none."""
    n = plan.canary.lower_side
    if n <= 0:
        return {"per_side": 0, "why": plan.canary.lower_side_note}
    return {"per_side": n, "block": f"{2 * n} coordinates of a canary block no data gradient "
            "reaches", "inclusion_prob": derived.sample_rate, "norm": plan.dp.max_grad_norm,
            "score": "mixture_lr"}


def pretrain_model(plan: AuditPlan, model, info) -> dict | None:
    """``model.init=pretrained``: pre-train ``model`` in place on the data set's records
    outside the audited subset (``pretrain``), seeded by the plan; None for a random init."""
    m = plan.model
    if m.init != "pretrained":
        return None
    rest = info.extra.get("unused_train")
    if rest is None:
        raise ValueError(f"model.init=pretrained: data set {plan.data.name!r} keeps no "
                         "records outside data.n_train to pre-train on (digits and mnist5k "
                         "do; set data.n_train below the training split's size)")
    return pretrain(model, rest, epochs=m.pretrain_epochs, lr=m.pretrain_lr,
                    batch_size=m.pretrain_batch_size, seed=plan.seed)


def predict_input_leakage(plan: AuditPlan, model, setup, derived: RunPlan) -> dict:
    """Seed 001's prediction for the chosen input canaries, so reports put it next to the
    measurement: noise-aware Mahalanobis score at theta_0 -> per-step and composed GDP mu
    (over the expected q T inclusions), epsilon, and the AUC of the epoch-summed covariance
    score (``dpaudit.canaries.predicted_leakage``)."""
    dp = plan.dp
    grads = per_sample_clipped_grads(
        model,
        setup.canaries.inputs,
        setup.canaries.targets,
        setup.canaries.loss_fn,
        dp.max_grad_norm,
        param_names=setup.param_names,
    )
    steps = derived.steps
    pred = predicted_leakage(
        grads,
        setup.precision,
        dp.noise_multiplier,
        dp.max_grad_norm,
        derived.expected_batch_size,
        inclusions=max(1, round(derived.sample_rate * steps)),
        delta=dp.delta,
        total_steps=steps,
    )
    out = pred.as_dict()
    out["mean_auc_summed_score"] = float(np.mean(pred.auc_summed_score))
    return out


def audit_run(
    plan: AuditPlan,
    run_seed: int | None = None,
    membership: np.ndarray | None = None,
    prepared: PreparedRun | None = None,
    white_box: bool = True,
    per_step: bool = True,
) -> RunRecord:
    """Train once with the audit hook; return scores, membership and the run's bookkeeping.

    The data split, the initial model and the canaries depend on the plan's seed only (a
    fixed target across the runs of a multi-run audit); sampling and noise on ``run_seed``.
    ``prepared`` (from ``prepare_run`` with the same plan and membership) skips the setup;
    the result is the same as without it. ``white_box=False`` skips the per-step white-box
    records (``train_audited``); ``per_step=False`` keeps them but not the canaries' per-step
    scores (a multi-run audit's runs: their scores are pooled, their records judged).
    """
    run_seed = plan.seed if run_seed is None else run_seed
    if prepared is None:
        prepared = prepare_run(plan, membership)
    elif membership is not None and not np.array_equal(
        np.asarray(membership, dtype=bool), prepared.setup.membership
    ):
        raise ValueError("membership differs from the membership the run was prepared with")
    setup, derived = prepared.setup, prepared.derived
    model, scores = copy.deepcopy((prepared.model, prepared.scores))
    rate = data_rate_design(plan.canary.lower_side, plan.seed, derived.sample_rate,
                            plan.dp.max_grad_norm)
    outcome = train_audited(
        model,
        setup.train_set,
        prepared.test,
        plan.dp,
        derived.sample_rate,
        setup.canaries,
        scores,
        params=setup.param_names,
        seed=run_seed,
        steps=derived.steps,
        progress=plan.progress,
        coordinates=setup.coordinates,
        noise_probes=setup.noise_probes,
        white_box=white_box,
        keep_per_step=white_box and per_step,
        data_rate=rate,
    )
    return RunRecord(
        scores={k: v.tolist() for k, v in outcome.scores.items()},
        membership=setup.membership.astype(int).tolist(),
        steps=outcome.steps,
        sample_rate=outcome.sample_rate,
        engine_accountants={k: v.to_dict() for k, v in outcome.accountants.items()},
        test_accuracy=outcome.test_accuracy,
        canary_info=setup.info,
        threat_model=derived.threat,
        canary_norm=derived.realised.norm,
        train_seconds=outcome.seconds,
        candidate_scores=None
        if setup.candidate_scores is None
        else setup.candidate_scores.tolist(),
        chosen=None if setup.chosen is None else setup.chosen.tolist(),
        selection=setup.selection or None,
        independent=derived.independent,
        white_box=outcome.white_box,
        per_step=outcome.per_step,
        rungs=outcome.rungs,
        data_rate=data_rate_record(plan, rate, outcome),
    )


def data_rate_record(plan: AuditPlan, design, outcome) -> DataRateRecord | None:
    """The run's ``DataRateRecord`` (None without canaries inserted like an example): their
    scores, membership, whether the hook saw them independent, and their threat model (Dirac
    canaries of norm C entering at the data's q: the training data's)."""
    if design is None or outcome.data_rate is None:
        return None
    realised = Realisation(kind="gradient", member_rate=design.sample_rate, norm=design.norm,
                           shares_a_run=True, on_dead_coordinates=True)
    threat = planned_threat_model(plan, realised, outcome.sample_rate, outcome.steps)
    rate = outcome.data_rate
    return DataRateRecord(scores=np.asarray(rate["scores"], dtype=np.float64).tolist(),
                          membership=design.membership.astype(int).tolist(),
                          threat_model=threat, independent=bool(rate["independent"]),
                          independence=str(rate["independence"]))
