"""One call from your own training loop to the audit's report (the CLI's result object).

After training with an ``AuditHook`` (or with any per-canary scores and membership), and
given the ``PrivacyEngine`` (or a ``ThreatModel``), ``audit_report`` returns the same result
dictionary the ``dpaudit`` CLI produces (claim evidence, bounds by kind, theory, white-box
checks, verdict) and, with ``output_dir``, writes the same results.json, plots and console
table. With a hook, every white-box check its records allow runs by default, with the same
rules as ``run_audit``: the noise's scale, law, alignment and freshness, the released noise
floor, the clipping probes, the accountant's bookkeeping (with ``privacy_engine``), Poisson
sampling (the data set's size comes from the loader given to the hook, or ``dataset_size``),
the sampling by example (with ``AuditHook(data_loader=...)``), the model's integrity and the
noise probe.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from dpaudit._validate import require_choice
from dpaudit.experiment.judging.evaluation import (
    DEFAULT_METHODS,
    LowerInput,
    evaluate_scores,
    split_scores,
)
from dpaudit.experiment.judging.ladder import (
    RUNGS,
    ladder_block,
    rung_inputs,
    with_ladder_warnings,
)
from dpaudit.experiment.judging.levels import REFUTATION_LEVEL
from dpaudit.experiment.judging.outputs import audit_mode, write_audit_report
from dpaudit.experiment.judging.user_claim import UserClaim, resolve_user_claim
from dpaudit.experiment.plan import Realisation, threat_model
from dpaudit.forecast import certifiable_ceiling
from dpaudit.stats.inclusion import check_inclusion
from dpaudit.threat_model import ThreatModel


def inserted_like_an_example(hook, index: int) -> bool:
    """Whether canary set ``index`` realises the training data's threat model: Dirac
    gradient canaries of norm C on distinct coordinates, every member inserted with
    probability q (``hook.data_sample_rate``: the rate real examples are drawn at) per step,
    the others never (the hook's default second set, ``canary_choice.default_canaries``):
    their evidence is the lower side of the user's epsilon."""
    from dpaudit.capture import GradientCanaries

    c = hook.canaries[index]
    if not isinstance(c, GradientCanaries) or not c.is_sparse or c.indices.shape[1] != 1:
        return False
    pols = set(c.policies)
    if "bernoulli" not in pols or not pols <= {"bernoulli", "never"}:
        return False
    q = float(c.inclusion_prob)
    norms = c.norms()
    rate = float(getattr(hook, "data_sample_rate", hook.sample_rate))
    return (abs(q - rate) <= 1e-12 * max(1.0, q)
            and bool(torch_allclose(norms, hook.max_grad_norm)))


def torch_allclose(values, target: float) -> bool:
    """Every value within float32 rounding of ``target``."""
    v = np.asarray(values.detach().cpu().numpy() if hasattr(values, "detach") else values,
                   dtype=np.float64)
    return bool(np.all(np.abs(v - target) <= 1e-6 * max(1.0, abs(target))))


def check_canaries_index(hook, canaries: int | None) -> int:
    """The index of the audited canary set: ``canaries``, or the hook's only set, or its only
    set that is not inserted like an example (the hook's default pair: the stress test is
    audited, the other gives the lower side); a bad index is refused, naming the argument."""
    sets = hook.canaries
    if canaries is None:
        if len(sets) == 1:
            return 0
        others = [i for i in range(len(sets)) if not inserted_like_an_example(hook, i)]
        if len(others) != 1:
            raise ValueError(
                f"canaries: the hook has {len(sets)} canary sets; pass canaries=<index> to say "
                "which one to audit (each set has its own threat model)"
            )
        return others[0]
    if (isinstance(canaries, bool) or not isinstance(canaries, (int, np.integer))
            or not 0 <= canaries < len(sets)):
        raise ValueError(f"canaries must be the index of one of the hook's {len(sets)} canary "
                         f"sets, an integer in [0, {len(sets)}), got {canaries!r}")
    return int(canaries)


def _canary_slice(hook, index: int) -> tuple[int, int, object]:
    sets = hook.canaries
    start = sum(len(c) for c in sets[:index])
    return start, start + len(sets[index]), sets[index]


def threat_model_from_hook(
    hook, canary_set, delta: float, membership: np.ndarray | None = None
) -> ThreatModel:
    """The threat model of one of a hook's canary sets, read from its DP optimizer.

    Gradient canaries: sample rate 1 when the members are inserted at every step, q_c when
    Bernoulli (members with different policies are refused); norm = the largest canary norm
    (the weakest claim, valid for every canary). Input canaries: the data's sample rate.
    """
    from dpaudit.capture import GradientCanaries

    if isinstance(canary_set, GradientCanaries):
        realised = Realisation(
            kind="gradient", member_rate=canary_set.member_sample_rate(membership),
            norm=float(canary_set.norms().max()),  # no dense (K, d) for sparse canaries
        )
    else:
        realised = Realisation(kind="input")  # with the data, at its rate
    return threat_model(realised, noise_multiplier=float(hook.optimizer.noise_multiplier),
                        max_grad_norm=float(hook.max_grad_norm), sample_rate=hook.sample_rate,
                        steps=int(hook.steps), delta=float(delta))


def auto_independence(hook, index: int) -> tuple[bool, str]:
    """Whether canary set ``index`` of ``hook`` was seen to be independent experiments, and
    why (not): ``capture.independence.seen_independent`` (Dirac gradient canaries on distinct
    coordinates, scores reading each canary's own coordinate only, the data's clipped sum
    exactly zero there at every step)."""
    from dpaudit.capture.independence import seen_independent

    return seen_independent(hook, index)


LOADER_TOO_LATE = (
    "the training loader was given to audit_report, after training: its batches were not "
    "recorded as they were drawn (give it to AuditHook(data_loader=...))"
)


def _loader_size(data_loader) -> int:
    from dpaudit.capture.sampling_record import resolve_batch_sampler

    _, n, why = resolve_batch_sampler(data_loader)
    if n is None:
        raise ValueError(f"data_loader: {why}")
    return int(n)


def dataset_size_from_optimizer(hook) -> tuple[tuple[int, int] | None, str]:
    """The data set's size as the optimizer knows it, when no loader or size was given:
    ``PrivacyEngine.make_private`` sets its expected batch size to int(n q) (per rank under
    DPDDP) with the accountant's rate q, so n is one of the integers that rounding maps
    there. (lo, hi) and where it was read; None when the rate was not read from the
    accountant (the optimizer may not come from make_private) or nothing fits."""
    from dpaudit.capture.hook import infer_sample_rate

    opt = hook.optimizer
    expected = getattr(opt, "expected_batch_size", None)
    q = infer_sample_rate(getattr(hook, "_prev_step_hook", None) or opt.step_hook)
    if expected is None or q is None or not 0.0 < q < 1.0:
        return None, ""
    per_rank = float(expected) * hook.world_size  # make_private divides it by the ranks
    b = round(per_rank)
    if abs(per_rank - b) > 1e-9 or b < 1:
        return None, ""
    fits = [n for n in range(max(1, int(b / q) - 2), int((b + 1) / q) + 3)
            if int(n * q) == b]
    if not fits:
        return None, ""
    return (min(fits), max(fits)), (
        f"the optimizer's expected batch size {b} and the accountant's rate {q:.4g} "
        "(make_private sets it to int(n q))")


def loop_records(hook, privacy_engine=None, dataset_size: int | None = None,
                 data_loader=None):
    """The hook's ``WhiteBoxRecords`` with what the own loop knows besides: the sample rate
    (the hook's), the dataset size (the hook's loader's, ``dataset_size`` or
    ``data_loader``'s; else the range the optimizer's expected batch size gives,
    ``dataset_size_from_optimizer``), the accountant's history when the engine is given."""
    if dataset_size is not None and (isinstance(dataset_size, bool) or not isinstance(
            dataset_size, (int, np.integer)) or dataset_size < 1):
        raise ValueError(f"dataset_size must be a positive integer (len(train_set)), got "
                         f"{dataset_size!r}")
    known = {k: v for k, v in (("the hook's data_loader", hook.dataset_size),
                               ("dataset_size", dataset_size),
                               ("data_loader", None if data_loader is None
                                else _loader_size(data_loader))) if v is not None}
    if len(set(known.values())) > 1:
        raise ValueError("dataset_size: the sizes given disagree: " + ", ".join(
            f"{k} {v}" for k, v in known.items()))
    dataset_size = next(iter(known.values()), None)
    history = None if privacy_engine is None else privacy_engine.accountant.history
    accountant = None if privacy_engine is None else privacy_engine.accountant.mechanism()
    sizes = [b for b in hook.batch_sizes() if b is not None]
    if dataset_size is not None and sizes and dataset_size < max(sizes):
        raise ValueError(f"dataset_size must be at least the largest batch ({max(sizes)}), got "
                         f"{dataset_size}: pass len(train_set)")
    sampling = {"n": None if dataset_size is None else int(dataset_size),
                "q": float(hook.sample_rate), "loader": "poisson"}
    if dataset_size is None:
        fits, where = dataset_size_from_optimizer(hook)
        if fits is not None and (not sizes or fits[1] >= max(sizes)):
            sampling.update(n_range=[int(fits[0]), int(fits[1])], n_source=where)
    records = hook.white_box_records(sampling=sampling, accountant_history=history,
                                     accountant=accountant)
    if records.by_example is None and hook.dataset_size is None and data_loader is not None:
        records = replace(records, by_example_reason=LOADER_TOO_LATE)
    return records


def audit_report(
    hook=None,
    *,
    scores: Mapping[str, Sequence[float]] | Sequence[float] | None = None,
    membership: Sequence[bool] | None = None,
    privacy_engine=None,
    threat_model: ThreatModel | None = None,
    canaries: int | None = None,
    delta: float | None = None,
    target_epsilon: float | None = None,
    methods: Sequence[str] = DEFAULT_METHODS,
    confidence: float = 0.95,
    independent_canaries: bool | str = "auto",
    inclusion: float = 0.5,
    dataset_size: int | None = None,
    data_loader=None,
    refutation_level: float = REFUTATION_LEVEL,
    white_box: bool = True,
    output_dir: str | Path | None = None,
    quiet: bool = False,
    rung: str = "white_box",
) -> dict:
    """Evidence, theory and verdict of an audit done in your own loop (module docstring).

    The verdict is about your claim: the epsilon your accountant (the engine's) computes at
    your ``delta``, bracketed by what was measured; its status is ``privacy_bug``,
    ``estimate_above_claim``, ``not_verified`` (a premise could not be seen: named) or
    ``consistent``.

    Args:
        hook: the ``AuditHook`` after training; its scores, steps, noise multiplier, clip
            norm and sample rate are read from it. Or pass ``scores`` instead.
        scores: per-canary scores, one array (K,) or a mapping attack name -> (K,) array;
            taken from the hook when omitted.
        membership: (K,) booleans, True for member canaries. Required for input canaries
            and raw scores; for gradient canaries it defaults to "policy is not 'never'".
        privacy_engine: the ``opacus.PrivacyEngine``: its accountant (RDP, PRV or GDP) and
            history are your claim; without it the verdict is ``not_verified`` (the steps the
            accountant counted are unknown).
        threat_model: the ``ThreatModel`` under test; derived from the hook when omitted
            (required with raw ``scores``).
        canaries: index of the hook's canary set to audit (needed when it has several).
        delta: your claim's delta (e.g. ``make_private_with_epsilon``'s ``target_delta``:
            Opacus does not keep it). None: the ``threat_model``'s, else 1e-5, and the verdict
            says it is dpaudit's default, not yours. One that differs from a given
            ``threat_model``'s is refused.
        target_epsilon: the epsilon you aimed at, when you want it named beside your
            accountant's (the verdict says when your accountant exceeds it).
        methods: ``epsilon_lower_bound`` methods to report.
        confidence: confidence of all certified bounds together.
        independent_canaries: True when every canary's (score, membership) is an independent
            one-canary experiment (e.g. Dirac gradient canaries on coordinates no data
            gradient reaches, or one canary per training run). Otherwise only the one_run
            method certifies and threshold-based numbers are estimates. ``"auto"`` (the
            default): True exactly when the hook saw it (``auto_independence``): Dirac
            gradient canaries on distinct coordinates, scores that read each canary's own
            coordinate only, and the data's clipped sum exactly zero on every one of them at
            every step; False for raw scores and input canaries. True is withdrawn anyway
            when the hook saw the data reach the canaries.
        inclusion: the probability with which each canary was made a member, independently
            (default 1/2). The one-run methods' theorems assume this random design; a
            membership split implausible under it (e.g. members chosen by a fixed rule such as
            "every other canary" with unequal counts) makes their rows "not applicable".
        dataset_size: the number of training examples the loader samples from (e.g.
            ``len(train_set)``): the Poisson sampling check and the rate need it; taken from
            the loader given to ``AuditHook(data_loader=...)`` when there is one; else
            inferred to within rounding from the optimizer's expected batch size (int(n q)
            under ``make_private``), and said so.
        data_loader: the training loader, when it was not given to the hook: its data set's
            size serves the Poisson sampling check (its batches were not recorded, so the
            sampling by example is named as not checked, with that reason).
        refutation_level: the PRIVACY BUG verdict's failure probability (default 1e-6),
            split over the statements that can refute the claim; evidence at ``confidence``
            only is a warning.
        white_box: run the white-box checks on the hook's records (default); False leaves
            them out of the report, which says so (the claim is then not verified).
        output_dir: where to write results.json, plots and print the table (optional).
        quiet: do not print the table when writing.
        rung: the threat-model ladder's rung the verdict is about (``judging.ladder``):
            ``"white_box"`` (the hook's scores of every release, the default),
            ``"hidden_state"`` (sparse gradient canaries scored from theta_0 and the final
            parameters alone) or ``"black_box"`` (input canaries scored by the final model:
            negative loss, logit margin); below white box the result adds
            ``threat_model_ladder``, every rung's evidence side by side on this training.
            Needs the hook (and no ``scores``).
    """
    check_inclusion(inclusion)
    require_choice("rung", rung, RUNGS)
    if rung != "white_box" and (hook is None or scores is not None):
        raise ValueError(f"rung={rung!r} reads the hook's records of the final model: pass "
                         "the AuditHook and no scores")
    index = None if hook is None else check_canaries_index(hook, canaries)
    claim = resolve_user_claim(privacy_engine=privacy_engine, delta=delta,
                               target_epsilon=target_epsilon, threat_model=threat_model)
    if independent_canaries == "auto":
        independent_canaries = hook is not None and auto_independence(hook, index)[0]
    elif not isinstance(independent_canaries, bool):
        raise ValueError(f"independent_canaries must be True, False or 'auto', got "
                         f"{independent_canaries!r}")
    claim_delta = claim.delta
    loop = _loop_scores(hook, index, scores, membership, threat_model, claim_delta, rung,
                        independent_canaries)
    records, reason = None, "scores passed without a hook: no per-step records"
    if hook is not None and not white_box:
        reason = "white-box checks turned off (audit_report(..., white_box=False))"
    elif hook is not None:
        records = loop_records(hook, privacy_engine, dataset_size, data_loader)
        claim = _with_dataset_size(claim, records)
    if hook is None and privacy_engine is None:
        claim = None  # raw scores and a threat model: no claim about training data
    split = split_scores(loop.scores, loop.membership)
    lower, lower_why = ((None, "") if hook is None else
                        lower_input(hook, index, claim_delta, claim.history))
    notes = [] if hook is None else dropped_notes(hook)
    notes += [n for n in (lower_why, getattr(hook, "canary_note", "")) if n]
    evidence = evaluate_scores(
        split, loop.threat, methods=methods, confidence=confidence,
        independent=loop.independent, claim=claim, inclusion=inclusion, white_box=records,
        white_box_reason=reason, refutation_level=refutation_level, canary_set=index,
        canary_notes=notes, lower=lower)
    context = {}
    if loop.rungs is not None:  # below white box: every rung side by side on this training
        block = ladder_block(loop.rungs, loop.membership, loop.threat, methods=methods,
                             confidence=confidence, inclusion=inclusion,
                             refutation_level=refutation_level, selected=rung, records=records,
                             canary_set=index)
        evidence = dataclasses.replace(evidence,
                                       verdict=with_ladder_warnings(evidence.verdict, block))
        context["threat_model_ladder"] = block
    n_in, n_out = int(loop.membership.sum()), int((~loop.membership).sum())
    result = evidence.result(
        settings=None,
        audit_mode=audit_mode("own_loop"),
        steps=loop.threat.steps,
        sample_rate=loop.threat.training_sample_rate,
        engine_accountants=None if claim is None else claim.engine_epsilons,
        canary_info={"certifiable_ceiling": certifiable_ceiling(
            n_in, n_out, loop.threat.claimed_epsilon(), confidence, loop.threat.delta)},
        **context,
    ).to_dict()
    if output_dir is not None:
        device = None
        if hook is not None:
            device = str(next(iter(hook.model.parameters())).device)
        write_audit_report(result, split, output_dir, quiet=quiet, device=device)
    return result


def lower_input(hook, index: int, delta: float, history=None
                ) -> tuple[LowerInput | None, str]:
    """The lower side's input: the scores of the hook's set inserted like an example beside
    the audited one (``inserted_like_an_example``), members and non-members of the mixture
    likelihood ratio, and their threat model; None and why when there is none, or when its
    canaries were not seen to stay independent (the certified statements need that)."""
    sets = [i for i in range(len(hook.canaries))
            if i != index and inserted_like_an_example(hook, i)]
    if not sets:
        return None, ""
    i = sets[0]
    scores = hook.scores()
    if "mixture_lr" not in scores:
        return None, ("the canaries inserted like an example were not scored by the mixture "
                      "likelihood ratio (AuditHook(scores=...) without MixtureLR)")
    ok, why = auto_independence(hook, i)
    if not ok:
        return None, f"the canaries inserted like an example are not independent: {why}"
    start, stop, c = _canary_slice(hook, i)
    member = np.asarray(c.policies) != "never"
    s = np.asarray(scores["mixture_lr"][start:stop], dtype=np.float64)
    threat = threat_model_from_hook(hook, c, delta, member)
    return LowerInput(s[member], s[~member], threat,
                      None if history is None else tuple(tuple(h) for h in history)), ""


def dropped_notes(hook) -> list[str]:
    """The hook's dropped canaries, in words (``AuditHook.dropped_canaries``)."""
    return [f"{d['count']} of {d['of']} gradient canaries were dropped: they touch "
            f"{d['parameters']}, which {d['why']}" for d in getattr(hook, "dropped_canaries", [])]


@dataclasses.dataclass(frozen=True)
class _LoopScores:
    """What ``audit_report`` audits: the scores by attack, the membership, the threat model,
    whether the canaries are independent, and (below white box) every rung's inputs."""

    scores: dict[str, np.ndarray]
    membership: np.ndarray
    threat: ThreatModel
    independent: bool
    rungs: dict | None


def _loop_scores(hook, index, scores, membership, threat, delta, rung,
                 independent) -> _LoopScores:
    """The audited canary set's scores, membership and threat model, from the hook (or the
    raw ``scores``), checked against each other."""
    member = None if membership is None else np.asarray(membership, dtype=bool)
    inputs = None
    if hook is not None:
        start, stop, canary_set = _canary_slice(hook, index)
        if scores is None:
            scores = {k: v[start:stop] for k, v in hook.scores().items()}
            if "scalar" in scores and "bernoulli" not in getattr(canary_set, "policies", ()):
                # the mixture LR at the data's rate is the test of canaries inserted like an
                # example; for every-step canaries the scalar product is the same test
                scores.pop("mixture_lr", None)
        if rung != "white_box":
            from dpaudit.capture.final_state import rung_scores

            rec = rung_scores(hook, index, start, stop)
            inputs = rung_inputs(scores, rec, independent=independent, per_run=False)
            if inputs[rung].scores is None:
                raise ValueError(f"rung={rung!r}: {inputs[rung].reason}")
            scores, independent = inputs[rung].scores, inputs[rung].independent
        if member is None:
            pols = getattr(canary_set, "policies", None)
            if pols is None:
                raise ValueError(
                    "membership is required for input canaries: (K,) booleans, True for the "
                    "canaries you added to the training data"
                )
            member = np.asarray(pols) != "never"
        if threat is None:
            threat = threat_model_from_hook(hook, canary_set, delta, member)
    if scores is None:
        raise ValueError("scores: pass an AuditHook or per-canary scores")
    if threat is None:
        raise ValueError("threat_model is required with raw scores (a dpaudit.ThreatModel)")
    if member is None:
        raise ValueError("membership is required: (K,) booleans, True for member canaries")
    if not isinstance(scores, Mapping):
        scores = {"score": scores}
    arrays = {k: np.asarray(v, dtype=np.float64).reshape(-1) for k, v in scores.items()}
    for name, arr in arrays.items():
        if arr.size != member.size:
            raise ValueError(
                f"scores[{name!r}] has {arr.size} entries but membership has {member.size}"
            )
    return _LoopScores(arrays, member, threat, independent, inputs)


def _with_dataset_size(claim: UserClaim, records) -> UserClaim:
    """The claim with the data set's size the records know (exact, or its range)."""
    s = records.sampling or {}
    if s.get("n"):
        return dataclasses.replace(claim, dataset_size=int(s["n"]),
                                   dataset_size_source="the training loader's data set")
    if s.get("n_range"):
        return dataclasses.replace(claim, dataset_size_range=tuple(s["n_range"]),
                                   dataset_size_source=s.get("n_source"))
    return claim
