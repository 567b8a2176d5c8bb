"""The audit's entry points: the one-run audit, the hand-over to the multi-run audit, and the
evaluation of pooled scores (DESIGN 3).

``run_audit`` is the user-facing entry point: it resolves the settings once into a plan
(``plan.plan_audit``), runs the one-run audit (K canaries, each a member with probability 1/2,
one training, ``run.audit_run``) or the multi-run audit (``multirun.run_multi``), evaluates
the bounds against the theory into an ``AuditResult``, and writes the report. The Hydra task
over it is ``dpaudit.tasks.audit.audit_task``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from dpaudit.capture.records import WhiteBoxRecords
from dpaudit.experiment.judging.evaluation import (
    Evidence,
    LowerInput,
    evaluate_scores,
    split_scores,
)
from dpaudit.experiment.judging.ladder import (
    RungInput,
    ladder_block,
    rung_inputs,
    with_ladder_warnings,
)
from dpaudit.experiment.judging.outputs import audit_mode, write_audit_report
from dpaudit.experiment.judging.user_claim import UserClaim, claim_of_run
from dpaudit.experiment.plan import (
    AuditPlan,
    Judging,
    plan_audit,
    recorded_independence,
    recorded_threat_model,
)
from dpaudit.experiment.settings import AuditSettings
from dpaudit.experiment.trainings.multirun import WorkerDone, run_multi
from dpaudit.experiment.trainings.run import RunRecord, audit_run
from dpaudit.report.results import AuditResult
from dpaudit.threat_model import ThreatModel

__all__ = ["audit_split", "evaluate", "evaluate_audit", "run_audit", "write_report"]

MULTI_RUN_NO_RECORDS = (
    "a multi-run audit whose run files keep no per-step records (written before dpaudit kept "
    "them: rerun the audit into a fresh directory for the white-box checks)"
)


def run_split(run: RunRecord, rung: RungInput | None = None) -> dict:
    """Attack name -> (member scores, non-member scores) of a run's (or pooled runs')
    scores, or of ``rung``'s (the verdict's rung of the threat-model ladder): made once per
    evaluation, read by the evidence and by the report's plots."""
    scores = run.scores if rung is None else rung.scores
    return split_scores({k: np.asarray(v) for k, v in scores.items()}, run.membership)


def ladder_inputs(plan: AuditPlan, run: RunRecord, independent: bool) -> dict[str, RungInput]:
    """The threat-model ladder's rungs of a run (``judging.ladder.rung_inputs``)."""
    per_run = plan.judging.mode == "multi_run" and plan.canary.count == 1
    return rung_inputs(run.scores, run.rungs, independent=independent, per_run=per_run)


def verdict_rung(plan: AuditPlan, run: RunRecord, independent: bool) -> RungInput:
    """The rung ``audit.threat_model`` names, with its scores (a ValueError says why a run
    has none, e.g. run files written before the ladder)."""
    rung = plan.judging.threat_model
    chosen = ladder_inputs(plan, run, independent)[rung]
    if chosen.scores is None:
        raise ValueError(f"audit.threat_model={rung}: this training has no {rung} scores "
                         f"({chosen.reason})")
    return chosen


def audit_split(plan: AuditPlan, run: RunRecord) -> dict:
    """``run_split`` of the scores the verdict is about: the white-box attack scores, or
    those of the rung ``audit.threat_model`` names."""
    if plan.judging.threat_model == "white_box":
        return run_split(run)
    independent = (run.independent if run.independent is not None
                   else recorded_independence(plan, run.canary_info))
    return run_split(run, verdict_rung(plan, run, independent))


def evaluate(settings: AuditSettings, run: RunRecord, extra: dict | None = None,
             plan: AuditPlan | None = None, split: dict | None = None) -> AuditResult:
    """Evidence, theory and verdict for pooled scores (one run, or runs aggregated), as the
    ``AuditResult`` results.json holds (``extra``: keys of other origins, e.g. a multi-run
    audit's ``runs_done``); ``plan``: the settings' ``AuditPlan`` and ``split``: the run's
    ``run_split`` (each made here when not given)."""
    plan = plan_audit(settings) if plan is None else plan
    threat = run.threat_model or recorded_threat_model(
        plan, run.sample_rate, run.steps, run.canary_norm
    )
    independent = (run.independent if run.independent is not None
                   else recorded_independence(plan, run.canary_info))
    j = plan.judging
    rung = verdict_rung(plan, run, independent) if j.threat_model != "white_box" else None
    if run.white_box_source is not None:  # pooled runs: whose records are judged, and why
        extra = {**(extra or {}), "white_box_records": dict(run.white_box_source)}
    claim = run_claim(settings, run)
    lower, lower_why = lower_input(run, claim.history)
    evidence = evaluate_audit(
        j,
        run_split(run, rung) if split is None else split,
        run.membership,
        threat,
        independent=independent if rung is None else rung.independent,
        claim=claim,
        white_box=run.white_box,
        white_box_reason=(MULTI_RUN_NO_RECORDS if j.mode == "multi_run"
                          and run.white_box is None else None),
        per_step=run.per_step if rung is None else None,  # per-step scores: white-box ones
        lower=lower,
        canary_notes=[lower_why] if lower_why else None,
    )
    if lower is None and not lower_why:  # none added: the report says why
        evidence = with_lower_note(evidence, plan.canary.lower_side_note)
    if rung is not None:  # below white box: every rung side by side on the same training
        block = ladder_block(ladder_inputs(plan, run, independent), run.membership, threat,
                             methods=j.methods, confidence=j.confidence,
                             inclusion=j.inclusion, refutation_level=j.refutation_level,
                             selected=j.threat_model, records=run.white_box, canary_set=0)
        evidence = dataclasses.replace(evidence,
                                       verdict=with_ladder_warnings(evidence.verdict, block))
        extra = {**(extra or {}), "threat_model_ladder": block}
    return evidence.result(
        settings=settings.to_dict(),
        audit_mode=audit_mode(plan.judging.mode),
        steps=run.steps,
        sample_rate=run.sample_rate,
        test_accuracy=run.test_accuracy,
        canary_info=run.canary_info,
        engine_accountants=run.engine_accountants,
        **(extra or {}),
    )


def lower_input(run: RunRecord, history=None) -> tuple[LowerInput | None, str]:
    """The lower side's input from a run's canaries inserted like an example
    (``RunRecord.data_rate``): their members' and non-members' mixture log-LR scores and
    threat model, the claim tested being the engine's accountant ``history`` (as in the own
    loop) where there is one; None and "" when the run has none, None and why when the hook
    did not see them stay independent experiments (their certified statements need it)."""
    rate = run.data_rate
    if rate is None:
        return None, ""
    if not rate.independent:
        return None, ("the canaries inserted like an example are not independent: "
                      f"{rate.independence}; their lower side is withdrawn")
    s_in, s_out = rate.split()
    return LowerInput(s_in, s_out, rate.threat_model, history), ""


def with_lower_note(evidence: Evidence, note: str) -> Evidence:
    """``evidence`` whose training-data lower side says why this audit added no canaries
    inserted like an example (``AuditSettings.lower_side_absent``, or turned off)."""
    td = evidence.verdict.training_data
    if not note or not td:
        return evidence
    lower = {**(td.get("lower") or {}), "data_rate_canaries": f"none added: {note}"}
    verdict = dataclasses.replace(evidence.verdict, training_data={**td, "lower": lower})
    return dataclasses.replace(evidence, verdict=verdict)


def run_audit(
    settings: AuditSettings | None = None, output_dir: str | Path | None = None, **groups
) -> dict:
    """Run one audit end to end: train with DP-SGD (Opacus) with canaries, score them, bound
    epsilon and test the accountant's claim. The same function the ``dpaudit`` CLI calls.

    Args:
        settings: the whole audit as an ``AuditSettings``; ``None`` (default) builds one from
            ``groups`` on top of the defaults (``AuditSettings()`` is the CLI's default audit).
            Checked before any training; a bad value raises ``ValueError`` naming it.
        output_dir: directory for ``results.json``, the plots and (multi-run) the saved
            ``runs/``; the console table is printed too. ``None``: nothing is written or
            printed. Required when ``audit.mode == "multi_run"``; rerunning into the same
            directory resumes the finished runs.
        **groups: instead of ``settings``, partial settings by group name, as plain dicts with
            the CLI's keys: ``data``, ``model``, ``dp``, ``canary``, ``attack``, ``audit``
            (e.g. ``dp={"noise_multiplier": 4.0, "steps": 200}``), and the scalars ``seed``,
            ``device`` and ``progress``. Unknown groups or keys raise ``ValueError``; passing
            both ``settings`` and groups too.

    Returns:
        The result dictionary that ``results.json`` holds: ``attacks`` (score summaries),
        ``claim`` (the claim test per attack), ``bounds`` (every epsilon bound with its
        method, kind ``certified`` / ``estimate``, confidence and operating point), ``theory``
        (the threat model and its accountants), ``verdict`` (``status``, ``privacy_bug``,
        ``message``, best certified and estimated epsilon next to the claimed one), and the
        run's settings and timing. How to read it: ``docs/evidence.md``.
    """
    if settings is None:
        settings = AuditSettings.from_mappings(**groups)
    elif groups:
        raise ValueError("pass either settings or group mappings, not both")
    else:
        settings.check()
    start = time.perf_counter()
    plan = plan_audit(settings)  # the settings resolved once: below here, typed records only

    def judge(run: RunRecord) -> dict:  # evaluate the run(s) and write the report
        ran = time.perf_counter()
        split = audit_split(plan, run)
        typed = evaluate(settings, run, {"wall_seconds": ran - start}, plan, split)
        timing = audit_timing(run, ran - start, time.perf_counter() - ran)
        result = dataclasses.replace(typed, timing=timing).to_dict()  # what results.json holds
        if output_dir is not None:
            write_report(result, split, run, Path(output_dir), plan)
        return result

    if plan.judging.mode != "multi_run":
        return judge(audit_run(plan))
    if output_dir is None:
        raise ValueError("output_dir is required for audit.mode='multi_run' (runs are saved)")
    # judged under the evaluation's claim: no other worker writes this report meanwhile
    done = run_multi(settings, Path(output_dir), finish=judge, plan=plan)
    if isinstance(done, WorkerDone):  # other workers still train runs, or evaluate them
        return worker_summary(settings, Path(output_dir), done, time.perf_counter() - start)
    return done


def worker_summary(settings: AuditSettings, out: Path, done: WorkerDone, seconds: float) -> dict:
    """What a worker that leaves the evaluation to another one returns (and prints)."""
    message = (f"worker {settings.audit.worker}: trained {done.trained} of "
               f"{settings.audit.runs} runs in {seconds:.1f} s; " + (
                   f"{done.waiting} runs of other workers' shares are not done yet: the last "
                   f"worker to finish writes {out / 'results.json'}" if done.waiting else
                   f"every run is done and another worker writes {out / 'results.json'}"))
    if done.note:
        message += f" ({done.note})"
    print(message)
    return {"task": "multi_run_worker", "runs_trained": done.trained,
            "runs": settings.audit.runs, "runs_waiting": done.waiting, "message": message,
            "wall_seconds": seconds}


def run_claim(settings: AuditSettings, run: RunRecord) -> UserClaim:
    """The claim of a training dpaudit ran: its engine's accountant (PRV, as the CLI's
    trainings use) and history, at ``dp.delta``, on the training's data set."""
    rec = run.white_box
    sampling = (rec.sampling or {}) if rec is not None else {}
    return claim_of_run(
        run.engine_accountants, delta=settings.dp.delta,
        accountant=(rec.accountant if rec is not None and rec.accountant else "prv"),
        history=None if rec is None else rec.accountant_history,
        dataset_size=sampling.get("n"))


def audit_timing(run: RunRecord, run_seconds: float, evaluation_seconds: float) -> dict:
    """Where an audit's time went (``benchmarks/presets.py`` reads it): the trainings with the
    capture hook (``training_seconds``; a multi-run audit: the runs trained now), the rest of
    the run (canary set-up, scoring: ``setup_seconds``) and the evaluation (statistics and
    accounting). The report adds ``report_seconds`` (plots) when it is written."""
    train = run.train_seconds
    return {
        "run_seconds": run_seconds,
        "training_seconds": train,
        "setup_seconds": None if train is None else max(run_seconds - train, 0.0),
        "evaluation_seconds": evaluation_seconds,
    }


def evaluate_audit(
    judging: Judging,
    split: dict,
    membership,
    threat: ThreatModel,
    *,
    independent: bool,
    claim: UserClaim | None = None,
    white_box: WhiteBoxRecords | None = None,
    white_box_reason: str | None = None,
    per_step: dict | None = None,
    lower: LowerInput | None = None,
    canary_notes: list[str] | None = None,
) -> Evidence:
    """``evaluate_scores`` for an audit's ``Judging`` record (methods, confidence, the PRIVACY
    BUG level, the membership design) on ``split`` (``run_split``; ``membership`` splits the
    per-step scores alike); ``independent``: each canary an independent experiment,
    ``plan.independent_canaries``; ``claim``: the training's claim (``run_claim``);
    ``white_box``: the run's records, or ``white_box_reason`` why there are none; ``lower``:
    the canaries inserted like an example beside the audited ones (``lower_input``), the
    lower side of the user's epsilon; ``canary_notes``: warnings about the canaries). The
    audited canaries are the hook's set 0: its independence record is theirs."""
    steps_split = None if per_step is None else split_scores(per_step, membership)
    return evaluate_scores(
        split,
        threat,
        methods=judging.methods,
        confidence=judging.confidence,
        independent=independent,
        claim=claim,
        inclusion=judging.inclusion,
        white_box=white_box,
        white_box_reason=white_box_reason,
        per_step=steps_split,
        refutation_level=judging.refutation_level,
        canary_set=0,
        canary_notes=canary_notes,
        lower=lower,
    )


def write_report(result: dict, split: dict, run, out: Path, plan: AuditPlan) -> None:
    """``write_audit_report`` for an audit's ``RunRecord`` (``split``: its ``run_split``) on
    its plan's device."""
    write_audit_report(
        result,
        split,
        out,
        candidate_scores=run.candidate_scores,
        chosen=run.chosen,
        selection=run.selection or "",
        device=str(plan.device),
    )
