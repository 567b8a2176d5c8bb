"""One call from your own training loop to the audit's report (the CLI's result object).

After training with an ``AuditHook`` (or with any per-canary scores and membership), and
given the ``PrivacyEngine`` (or a ``ThreatModel``), ``audit_report`` returns the same result
dictionary the ``dpaudit`` CLI produces (claim evidence, bounds by kind, theory, verdict) and,
with ``output_dir``, writes the same results.json, plots and console table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dpaudit.experiment.judging.evaluation import DEFAULT_METHODS, evaluate_scores, split_scores
from dpaudit.experiment.judging.outputs import audit_mode, write_audit_report
from dpaudit.forecast import certifiable_ceiling
from dpaudit.stats.inclusion import check_inclusion
from dpaudit.threat_model import ThreatModel


def _canary_slice(hook, canaries: int | None) -> tuple[int, int, object]:
    sets = hook.canaries
    if canaries is None:
        if len(sets) != 1:
            raise ValueError(
                f"canaries: the hook has {len(sets)} canary sets; pass canaries=<index> to say "
                "which one to audit (each set has its own threat model)"
            )
        canaries = 0
    if not isinstance(canaries, int) or not 0 <= canaries < len(sets):
        raise ValueError(f"canaries must be an index in [0, {len(sets)}), got {canaries!r}")
    start = sum(len(c) for c in sets[:canaries])
    return start, start + len(sets[canaries]), sets[canaries]


def threat_model_from_hook(
    hook, canary_set, delta: float, membership: np.ndarray | None = None
) -> ThreatModel:
    """The threat model of one of a hook's canary sets, read from its DP optimizer.

    Gradient canaries: sample rate 1 when the members are inserted at every step, q_c when
    Bernoulli (members with different policies are refused); norm = the largest canary norm
    (the weakest claim, valid for every canary). Input canaries: the data's sample rate.
    """
    from dpaudit.capture import GradientCanaries

    opt = hook.optimizer
    common = {
        "noise_multiplier": float(opt.noise_multiplier),
        "max_grad_norm": float(hook.max_grad_norm),
        "steps": int(hook.steps),
        "delta": float(delta),
        "training_sample_rate": float(hook.sample_rate),
    }
    if not isinstance(canary_set, GradientCanaries):
        return ThreatModel(sample_rate=hook.sample_rate, canary_kind="input", **common)
    rate = canary_set.member_sample_rate(membership)
    norm = float(canary_set.norms().max())  # no dense (K, d) for sparse canaries
    return ThreatModel(sample_rate=rate, canary_kind="gradient", canary_norm=norm, **common)


def audit_report(
    hook=None,
    *,
    scores: Mapping[str, Sequence[float]] | Sequence[float] | None = None,
    membership: Sequence[bool] | None = None,
    privacy_engine=None,
    threat_model: ThreatModel | None = None,
    canaries: int | None = None,
    delta: float = 1e-5,
    methods: Sequence[str] = DEFAULT_METHODS,
    confidence: float = 0.95,
    independent_canaries: bool = False,
    inclusion: float = 0.5,
    output_dir: str | Path | None = None,
    quiet: bool = False,
) -> dict:
    """Evidence, theory and verdict of an audit done in your own loop (module docstring).

    Args:
        hook: the ``AuditHook`` after training; its scores, steps, noise multiplier, clip
            norm and sample rate are read from it. Or pass ``scores`` instead.
        scores: per-canary scores, one array (K,) or a mapping attack name -> (K,) array;
            taken from the hook when omitted.
        membership: (K,) booleans, True for member canaries. Required for input canaries
            and raw scores; for gradient canaries it defaults to "policy is not 'never'".
        privacy_engine: the ``opacus.PrivacyEngine``; its epsilons for the training data are
            reported beside the canaries' threat model.
        threat_model: the ``ThreatModel`` under test; derived from the hook when omitted
            (required with raw ``scores``).
        canaries: index of the hook's canary set to audit (needed when it has several).
        delta: the delta of the threat model and of every epsilon.
        methods: ``epsilon_lower_bound`` methods to report.
        confidence: confidence of all certified statements together.
        independent_canaries: True when every canary's (score, membership) is an independent
            one-canary experiment (e.g. Dirac gradient canaries on coordinates no data
            gradient reaches, or one canary per training run). Otherwise only the one_run
            method certifies and threshold-based numbers are estimates.
        inclusion: the probability with which each canary was made a member, independently
            (default 1/2). The one-run methods' theorems assume this random design; a
            membership split implausible under it (e.g. members chosen by a fixed rule such as
            "every other canary" with unequal counts) makes their rows "not applicable".
        output_dir: where to write results.json, plots and print the table (optional).
        quiet: do not print the table when writing.
    """
    check_inclusion(inclusion)
    member = None if membership is None else np.asarray(membership, dtype=bool)
    if hook is not None:
        start, stop, canary_set = _canary_slice(hook, canaries)
        if scores is None:
            scores = {k: v[start:stop] for k, v in hook.scores().items()}
        if member is None:
            pols = getattr(canary_set, "policies", None)
            if pols is None:
                raise ValueError(
                    "membership is required for input canaries: (K,) booleans, True for the "
                    "canaries you added to the training data"
                )
            member = np.asarray(pols) != "never"
        if threat_model is None:
            threat_model = threat_model_from_hook(hook, canary_set, delta, member)
    if scores is None:
        raise ValueError("scores: pass an AuditHook or per-canary scores")
    if threat_model is None:
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
    training = None
    if privacy_engine is not None:
        from dpaudit.accounting import engine_epsilons

        training = {k: v.to_dict() for k, v in engine_epsilons(privacy_engine, delta).items()}
    split = split_scores(arrays, member)
    result = {
        "settings": None,
        "audit_mode": audit_mode("own_loop"),
        "steps": threat_model.steps,
        "sample_rate": threat_model.training_sample_rate,
        **evaluate_scores(
            split,
            threat_model,
            methods=methods,
            confidence=confidence,
            independent=independent_canaries,
            training_accountants=training,
            inclusion=inclusion,
        ),
        "engine_accountants": training,
    }
    n_in, n_out = int(member.sum()), int((~member).sum())
    result["canary_info"] = {"certifiable_ceiling": certifiable_ceiling(
        n_in, n_out, threat_model.claimed_epsilon(), confidence, threat_model.delta)}
    if output_dir is not None:
        device = None
        if hook is not None:
            device = str(next(iter(hook.model.parameters())).device)
        write_audit_report(result, split, output_dir, quiet=quiet, device=device)
    return result
