"""The user's epsilon, answered from what was measured (DESIGN 4.5, "the user's epsilon").

A user asks whether the epsilon Opacus reports for their training data is real. The
accountant composes a few numbers (the noise multiplier of each step, the sampling rate, the
clip bound, the steps) under a structure (Poisson sampling, one row per example, noise drawn
independently of the data, only the private step moves the model). The white-box records
measure the numbers and test the structure, so the question has two answers:

* the **upper side**: the user's own accountant (RDP / PRV / GDP) recomputed at the least
  favourable values of the measured premises' exact intervals (the noise's scale from the
  noise the optimizer added, the rate from the examples the batches held, the largest
  clipped contribution the probes saw, the steps training took): "the training's epsilon as
  measured is at most X". Its confidence covers the measured numbers (the two intervals split
  it); it is conditional on the structure the doors' checks test but cannot prove, which is
  named, never called a proof. A premise that was not observed makes it "not verified" (with
  the reason), a refuted one "refuted" (the PRIVACY BUG it already is);
* the **lower side**: the certified epsilon of canaries that realise the training data's
  threat model (inserted like an example: Poisson at the data's rate, norm C, the same noise).
  Canaries of another threat model (every-step gradient canaries) give none for the data, and
  the report forecasts how many such canaries it would take.

``training_data_block`` returns the plain-JSON block results.json keeps under
``verdict.training_data``; ``training_sentence`` is the verdict's first sentence.
"""

from __future__ import annotations

import numpy as np

from dpaudit.accounting import (
    history_epsilon,
    prv_history_bounds,
    rdp_history_epsilon,
)
from dpaudit.capture.records import WhiteBoxRecords
from dpaudit.experiment.judging.claim_words import bracket_words, claim_head, sentence_case
from dpaudit.experiment.judging.doors import loader_mismatch
from dpaudit.experiment.judging.noise_scale import (
    COUNT_SENSITIVITY,
    StepScales,
    count_lower,
    count_share,
    effective_history,
    layer_weights,
    measured_scales,
    noise_share,
    one_scale_steps,
    pooled_lower,
)
from dpaudit.experiment.judging.user_claim import UserClaim
from dpaudit.forecast import poisson_canaries_forecast
from dpaudit.stats.checks import CheckResult
from dpaudit.stats.premises import rate_interval, rate_upper, scale_interval

MEASURED, TESTED, WARNING, REFUTED, NOT_OBSERVED = (
    "measured", "tested", "warning", "refuted", "not observed")
VERIFIED, NOT_VERIFIED, UPPER_REFUTED, NOT_MEASURED = (
    "verified", "not verified", "refuted", "not measured")
# below this effective noise multiplier Opacus' PRV accountant's domain explodes (an unclipped
# example at 50 C: sigma / 50; gigabytes of grid): the upper side is then RDP's, also an upper
# bound, and says so
PRV_FLOOR = 0.5
ADAPTIVE_ASSUMES = ("the count of unclipped examples, released over the realised batch size, "
                    "leaks no more than a count of sensitivity 1 with the measured noise (the "
                    "realised divisor is not credited, as adaptive_accounting says)")

# the structure the accountant assumes and the checks that test it (name, words, checks)
STRUCTURE = (
    ("poisson_sampling", "each example enters each step independently with probability q "
     "(Poisson sampling)", ("poisson_sampling", "sampling_by_example", "loader_fed_training")),
    ("one_row_per_example", "one example is one row of one batch",
     ("sampling_duplicates",)),
    ("noise_law", "the noise is Gaussian, independent across coordinates, tensors and steps",
     ("noise_marginal", "noise_alignment", "noise_freshness")),
    ("noise_independent_of_data", "the noise is drawn independently of the data",
     ("noise_ignores_data",)),
    ("only_private_step_moves_model", "only the private step moves the published model",
     ("model_integrity",)),
    ("release_is_the_noised_sum", "the release is the noised clipped sum over a constant "
     "divisor", ("normalisation",)),
)


# each premise in plain words, for the verdict's sentence
PLAIN = {"noise_multiplier": "the noise's scale", "sample_rate": "the sampling rate",
         "clipping": "the clipping", "steps": "the steps", "poisson_sampling": "Poisson "
         "sampling", "one_row_per_example": "one row per example", "noise_law": "the noise's "
         "law", "noise_independent_of_data": "the noise's independence from the data",
         "only_private_step_moves_model": "nothing but the private step moving the model",
         "release_is_the_noised_sum": "the release's normalisation"}


def warning_words(premise: dict) -> str:
    """A premise at warning level, briefly, for the verdict's sentence ("the clipping reached
    1.008 C"); its evidence is in the premise table and the checks."""
    name = premise["name"]
    if name == "clipping" and premise.get("ratio"):
        return f"the clipping reached {premise['ratio']:.4g} C"
    if name == "sample_rate" and premise.get("interval"):
        lo, hi = premise["interval"]
        return (f"the sampling rate (measured in [{lo:.4g}, {hi:.4g}], configured "
                f"{premise.get('configured') or 0:.4g})")
    if name == "noise_multiplier" and premise.get("interval"):
        lo, hi = premise["interval"]
        return f"the noise's scale ([{lo:.4g}, {hi:.4g}] x the configured one)"
    return PLAIN.get(name, name)


def _status(checks: dict[str, CheckResult], names) -> tuple[str, list[str]]:
    """The status of a premise from the checks that test it: refuted, warning, tested, or
    not observed when none of them ran; and the checks that ran."""
    ran = [n for n in names if n in checks]
    if any(checks[n].rejected for n in ran):
        return REFUTED, ran
    if any(checks[n].warning for n in ran):
        return WARNING, ran
    return (TESTED if ran else NOT_OBSERVED), ran


def noise_premise(records: WhiteBoxRecords, checks: dict, confidence: float,
                  bound_confidence: float, scales: StepScales | None = None,
                  one_scale: float | None = None) -> dict:
    """The noise's scale r (true std over the claimed std of its step): its exact interval over
    every step and tensor at ``confidence``, per tensor too (``stats.premises``); the lower
    ends the upper side uses, at ``bound_confidence`` jointly: each step's (``scales``,
    ``judging.noise_scale``: the smallest over the tensors, each bounded over its runs of
    steps), their smallest as ``least_favourable``, the design and what bound each step as
    ``granularity``; and the one-scale figure's lower end (``one_scale``: every tensor and
    step pooled, which assumes one scale) as ``least_favourable_one_scale``."""
    out = {"name": "noise_multiplier", "what": "the noise's std over the claimed sigma C of "
           "each step (1: as claimed)"}
    steps = [s for s in records.steps if s.noise is not None]
    if records.noise is None or not steps:
        why = ("the noise the optimizer added was not recorded (AuditHook(record_noise=False))"
               if records.noise is None else "no step claims noise")
        return {**out, "status": NOT_OBSERVED, "reason": why}
    dims = np.asarray(records.noise.dims, dtype=np.float64)
    sq = np.stack([s.noise.sq for s in steps], axis=1)  # (J, T)
    rounding = np.array([s.noise.rounding for s in steps])
    total = float(sq.sum())
    dof = float(dims.sum() * len(steps))
    err = float(np.sqrt(dims.sum() * np.sum(rounding**2)))
    lo, hi = scale_interval(total, dof, confidence, err)
    tensors = []
    granular = {} if scales is None else {t["tensor"]: t for t in scales.tensors}
    for j, name in enumerate(records.noise.names):
        e = float(np.sqrt(dims[j] * np.sum(rounding**2)))
        tlo, thi = scale_interval(float(sq[j].sum()), dims[j] * len(steps), confidence, e)
        extra = {k: v for k, v in granular.get(name, {}).items() if k != "tensor"}
        tensors.append({"tensor": name, "ratio": float(np.sqrt(sq[j].sum()
                                                             / (dims[j] * len(steps)))),
                        "interval": [tlo, thi], "coordinates": int(dims[j] * len(steps)),
                        **extra})
    status, ran = _status(checks, ("noise_scale",))
    noised = [i for i, s in enumerate(records.steps) if s.noise is not None]
    multipliers = records.claimed_multipliers[noised]
    configured = float(multipliers[0]) if np.allclose(multipliers, multipliers[0]) else None
    if records.adaptive is not None:  # the scale is the gradient's noise's, sigma_g C_t
        configured = float(records.adaptive.sigma_gradient)
    used = scales.scales[np.isfinite(scales.scales)] if scales is not None else None
    least = float(used.min()) if used is not None and used.size else one_scale
    entry = {**out, "status": MEASURED if status in (TESTED, NOT_OBSERVED) else status,
             "ratio": float(np.sqrt(total / dof)), "interval": [lo, hi],
             "configured": configured,
             "sigma_interval": None if configured is None else [configured * lo,
                                                                configured * hi],
             "least_favourable": least, "least_favourable_one_scale": one_scale,
             "bound_confidence": float(bound_confidence),
             "draws": int(dof), "steps": len(steps), "tensors": tensors,
             "confidence": float(confidence), "checks": ran}
    if scales is None:
        entry["assumes"] = "one noise scale for every tensor and step"
        return entry
    g = scales.summary()
    g.pop("tensors")
    few = g["too_few_draws"]
    entry["granularity"] = g
    entry["too_few_draws"] = few
    entry["assumes"] = (g["assumes"] + (f"; too few draws to bound tightly: {', '.join(few)}"
                                        if few else ""))
    return entry


def _sizes(records: WhiteBoxRecords) -> tuple[np.ndarray | None, str]:
    """The examples each step's batch held, and where they were read; None when unknown."""
    steps = records.batch_sizes
    by = records.by_example
    if all(b is not None for b in steps) and not (by is not None and by.ranks > 1):
        return np.asarray(steps, dtype=np.int64), "the rows each step clipped"
    if by is not None and by.batches >= records.num_steps:
        return by.sizes[: records.num_steps].astype(np.int64), f"the batches of {by.source}"
    return None, ""


def rate_premise(records: WhiteBoxRecords, checks: dict, confidence: float,
                 bound_confidence: float) -> dict:
    """The sampling rate q: the exact interval of the examples the batches held over n T
    draws at ``confidence`` (``stats.premises``), and its one-sided upper bound at
    ``bound_confidence`` (``least_favourable``, what the upper side uses). Where n is known
    only to a range (``sampling["n_range"]``: inferred from the optimizer's expected batch
    size), each end takes the least favourable n. Judged on its own evidence: the rate's test
    inside ``poisson_sampling`` (the total of the batch sizes), never the sampling's law,
    which is the structural premise ``poisson_sampling``."""
    s = records.sampling or {}
    out = {"name": "sample_rate", "what": "the probability that an example enters a step",
           "configured": s.get("q")}
    sizes, where = _sizes(records)
    n, n_range = s.get("n"), s.get("n_range")
    if sizes is None:
        return {**out, "status": NOT_OBSERVED, "reason": "the batch sizes are unknown (ghost "
                "clipping under DPDDP without the loader given to the hook)"}
    if not n and not n_range:
        return {**out, "status": NOT_OBSERVED, "reason": "the data set's size is unknown "
                "(AuditHook(data_loader=...) or audit_report(..., dataset_size=...))"}
    lo_n, hi_n = (int(n), int(n)) if n else (int(n_range[0]), int(n_range[1]))
    k, steps = int(sizes.sum()), int(sizes.size)
    lo = rate_interval(k, hi_n * steps, confidence)[0]
    hi = rate_interval(k, lo_n * steps, confidence)[1]
    status = _rate_status(checks.get("poisson_sampling"))
    entry = {**out, "status": status,
             "measured": k / (0.5 * (lo_n + hi_n) * steps), "interval": [lo, hi],
             "examples": k, "draws": lo_n * steps,
             "least_favourable": rate_upper(k, lo_n * steps, bound_confidence),
             "bound_confidence": float(bound_confidence), "confidence": float(confidence),
             "source": where, "checks": ["poisson_sampling"] if "poisson_sampling" in checks
             else []}
    if not n:
        entry["dataset_size_range"] = [lo_n, hi_n]
        entry["assumes"] = (f"n in [{lo_n}, {hi_n}], inferred from the optimizer's expected "
                            "batch size and the accountant's rate (Opacus sets it to int(n q)): "
                            "the training sampled from the data set make_private was given")
    return entry


def _rate_status(check: CheckResult | None) -> str:
    """The rate's own evidence: the rate test inside ``poisson_sampling`` (its p-value times
    the check's own Bonferroni factor) at the check's levels; measured when it holds. Where
    n was inferred (the rate's test is not part of the check) it can only warn."""
    if check is None or not check.statistical:
        return MEASURED
    d = check.details or {}
    if "p_rate" not in d:
        return MEASURED
    p = min(1.0, float(d["p_rate"]) * int(d.get("tests", 4)))
    if d.get("rate_tested", True) and check.level is not None and p < check.level:
        return REFUTED
    if check.warning_level is not None and p < check.warning_level:
        return WARNING
    return MEASURED


def clipping_premise(records: WhiteBoxRecords, checks: dict) -> dict:
    """The largest clipped contribution the probes saw, as a ratio to C (1: as claimed)."""
    out = {"name": "clipping", "what": "the largest change of the clipped sum by one example, "
           "over C (1: as claimed)"}
    c = records.clipping
    if c is None or not c.get("probes"):
        why = ("not probed (AuditHook(check_clipping=False))" if c is None
               else c.get("unchecked") or "no example was probed")
        return {**out, "status": NOT_OBSERVED, "reason": why, "ratio": 1.0}
    ratio = max(r for r in (c.get("max_ratio_single"), c.get("max_ratio_leave_one_out"))
                if r is not None)
    status, ran = _status(checks, ("clipping",))
    entry = {**out, "status": MEASURED if status in (TESTED, NOT_OBSERVED) else status,
             "ratio": float(ratio), "probes": int(c["probes"]),
             "steps_probed": int(c.get("steps_checked", 0)), "steps": records.num_steps,
             "checks": ran, "assumes": "the examples not probed clip as the probed ones do "
             "(the largest ratio the probes saw, not a confidence bound)"}
    if c.get("max_group_ratio") is not None:  # per-layer clipping: each part over its C_p
        entry["group_ratio"] = float(c["max_group_ratio"])
    return entry


def steps_premise(records: WhiteBoxRecords, checks: dict) -> dict:
    """The steps training took against those the accountant counted."""
    hist = records.accountant_history
    counted = None if hist is None else int(sum(int(h[2]) for h in hist))
    status, ran = _status(checks, ("bookkeeping",))
    if hist is None:
        return {"name": "steps", "what": "the optimizer steps training took",
                "measured": records.num_steps, "accountant_steps": None,
                "status": NOT_OBSERVED, "reason": "no PrivacyEngine given, so the steps its "
                "accountant counted are unknown (audit_report(..., privacy_engine=engine))"}
    return {"name": "steps", "what": "the optimizer steps training took",
            "measured": records.num_steps, "accountant_steps": counted,
            "status": MEASURED if status in (TESTED, NOT_OBSERVED) else status, "checks": ran}


# the report's "not checked" lines that say why a structural premise's checks did not run,
# by the words that lead them
UNCHECKED_LEADS = {
    "one_row_per_example": ("sampling by example",),
    "noise_law": ("the noise's scale, law", "noise freshness"),
    "noise_independent_of_data": ("the noise's independence from the data",),
    "only_private_step_moves_model": ("model integrity",),
    "release_is_the_noised_sum": ("normalisation",),
}


def _sampling_unseen(records: WhiteBoxRecords) -> str:
    """Why which examples each step used is unknown."""
    if records.by_example is None:
        return records.by_example_reason or ("the training loader was not given "
                                             "(AuditHook(data_loader=...))")
    return ("the loader given to the hook did not feed the training, so which examples each "
            "step used is unknown")


def structure_premises(checks: dict, records: WhiteBoxRecords,
                       unchecked: list[str] | None = None) -> list[dict]:
    """The structure the accountant assumes, each with the checks that test it; ``unchecked``
    (the report's "not checked" lines, each led by what it names) gives the reason of a
    premise none of whose checks ran."""
    out = []
    for name, words, tests in STRUCTURE:
        status, ran = _status(checks, tests)
        entry = {"name": name, "what": words, "status": status, "checks": ran}
        if name == "poisson_sampling" and "sampling_by_example" not in ran:
            entry["status"] = REFUTED if status == REFUTED else NOT_OBSERVED
            said = [u.split(":", 1)[1].strip() for u in unchecked or []
                    if u.startswith("sampling by example:")]
            entry["reason"] = (said[0] if said and records.by_example is not None
                               and loader_mismatch(records) is None
                               else _sampling_unseen(records))
        elif status == NOT_OBSERVED:
            leads = UNCHECKED_LEADS.get(name, ())
            said = [u.split(":", 1)[1].strip() for u in unchecked or []
                    if u.split(":", 1)[0].strip() in tests or u.startswith(leads)]
            if name == "one_row_per_example" and not said:
                said = [_sampling_unseen(records)]
            entry["reason"] = ("; ".join(said) if said else
                               "not checked in this audit (the report's 'not checked' says why)")
        out.append(entry)
    return out


def _history(records: WhiteBoxRecords, noise_factor: float, rate: float) -> list:
    """The steps as executed, as an accountant history: each step's claimed multiplier times
    ``noise_factor``, at ``rate``, consecutive equal entries merged."""
    sigmas = records.claimed_multipliers * noise_factor
    if sigmas.size == 0:
        return []
    starts = np.flatnonzero(np.r_[True, ~np.isclose(sigmas[1:], sigmas[:-1], rtol=1e-12,
                                                    atol=0.0)])
    counts = np.diff(np.r_[starts, sigmas.size])
    return [(float(sigmas[i]), float(rate), int(k)) for i, k in zip(starts, counts, strict=True)]


def claimed_epsilon(records: WhiteBoxRecords | None, claim: UserClaim
                    ) -> tuple[float | None, str]:
    """The user's epsilon: their accountant on its history (the engine given), or, without
    the engine, the same accountant on the optimizer's settings as recorded."""
    eps = claim.epsilon()
    if eps is not None:
        return eps, f"Opacus' {claim.accountant.upper()} accountant on its history"
    if records is None or not (records.sampling or {}).get("q"):
        return None, "unknown"
    hist = _history(records, 1.0, float(records.sampling["q"]))
    res = history_epsilon(hist, claim.delta, claim.accountant)
    if not np.isfinite(res.epsilon):
        return None, res.note
    return float(res.epsilon), (f"the {claim.accountant.upper()} accountant on the "
                                "optimizer's settings as recorded (no PrivacyEngine given)")


def clip_factor(records: WhiteBoxRecords, clip: dict) -> float:
    """The factor k >= 1 on every example's contribution the upper side assumes: the largest
    the probes saw over C (``clipping_premise``), each part over its own C_p under per-layer
    clipping combined per layer (``group_ratio``: ||g_p|| <= k C_p for every part)."""
    ratio = clip.get("ratio") or 1.0
    if layer_weights(records) is not None and clip.get("group_ratio") is not None:
        ratio = clip["group_ratio"]
    return max(1.0, float(ratio))


def effective_multipliers(records: WhiteBoxRecords, scales: np.ndarray, clip: dict,
                          count: float | None = None) -> np.ndarray:
    """(T,) each step's noise multiplier as the accountant must compose it, at the measured
    lower ends: the claimed multiplier times the step's scale (``scales``, (T,)) over the
    clipping factor k (``clip_factor``: a contribution k C with noise sigma C is the claim at
    sigma / k). Under adaptive clipping the step releases the clipped sum with noise sigma_g
    C_t and the count of unclipped examples with noise sigma_u: a Gaussian pair whose
    sensitivity vector is (k C_t, ``COUNT_SENSITIVITY``), so the step is the Gaussian step at
    (k^2 / (sigma_g r)^2 + s^2 / (sigma_u r_u)^2)^(-1/2), r_u the count's measured lower end
    (``count``). Steps without noise keep their claimed multiplier."""
    k = clip_factor(records, clip)
    rho = np.asarray(scales, dtype=np.float64)
    noised = np.isfinite(rho)
    rec = records.adaptive
    if rec is None:
        out = records.claimed_multipliers.astype(np.float64).copy()
        out[noised] = out[noised] * rho[noised] / k
        return out
    grad = records.noise_multipliers.astype(np.float64)  # sigma_g: the gradient's own
    out = np.full(rho.size, float(rec.sigma))
    with np.errstate(divide="ignore"):
        count_term = (COUNT_SENSITIVITY / (rec.sigma_count * count)) ** 2 if count else np.inf
        out[noised] = (k**2 / (grad[noised] * rho[noised]) ** 2 + count_term) ** -0.5
    return out


def upper_side(records: WhiteBoxRecords, noise: dict, rate: dict, clip: dict,
               accountant: str, delta: float, scales: np.ndarray | None = None,
               count: float | None = None) -> dict:
    """The accountant at the least favourable measured values, step by step: each step's
    effective multiplier (``effective_multipliers``: its noise scale's lower end, ``scales``,
    (T,); by default the noise premise's ``least_favourable`` at every step), the rate's
    upper end, the steps as taken, composed noise by noise (``noise_scale.
    effective_history``: rounded down onto a 0.1% grid). The accountant is a sound one: the
    user's RDP or PRV (PRV's upper end with its error bounds), PRV where the user's is GDP (a
    central-limit approximation that can underestimate), RDP where an effective multiplier
    is below ``PRV_FLOOR``. Returns {"epsilon" (None when the noise or the rate was not
    measured), "reason", "accountant", "history", "quantum"}."""
    used = accountant if accountant in ("rdp", "prv") else "prv"
    out = {"epsilon": None, "reason": None, "accountant": used, "history": None,
           "quantum": None}
    if noise["status"] == NOT_OBSERVED:
        return {**out, "reason": "the noise's scale was not measured: " + noise["reason"]}
    if rate["status"] == NOT_OBSERVED:
        return {**out, "reason": "the sampling rate was not measured: " + rate["reason"]}
    if scales is None:
        scales = np.where([s.noise is not None for s in records.steps],
                          float(noise["least_favourable"]), np.nan)
    sigmas = effective_multipliers(records, scales, clip, count)
    if sigmas.size == 0:
        return {**out, "epsilon": 0.0}
    if not np.all(np.isfinite(sigmas) & (sigmas > 0)):
        return {**out, "reason": "a step's noise multiplier at the measured lower ends is 0 "
                "(no noise claimed, or a lower end of 0)"}
    history, quantum = effective_history(sigmas, min(1.0, rate["least_favourable"]))
    if used == "prv" and min(h[0] for h in history) < PRV_FLOOR:
        used = "rdp"
    eps = (prv_history_bounds(history, delta)[2] if used == "prv"
           else rdp_history_epsilon(history, delta))
    out.update(accountant=used, history=[list(h) for h in history], quantum=quantum)
    if not np.isfinite(eps):
        return {**out, "reason": f"the {used.upper()} accountant could not compute it"}
    return {**out, "epsilon": float(eps)}


def claim_shortfall(records: WhiteBoxRecords | None, claimed: float | None,
                    accountant: str, delta: float, history=None) -> dict | None:
    """Where the user's accountant is GDP (a central-limit approximation Opacus itself flags
    as possibly underestimating): the sound PRV accountant on the same history (the
    engine's, or the optimizer's settings as recorded) at the same delta, and whether the
    claim lies below it: below PRV's lower end (Gopi et al.'s bracket: the true epsilon of that
    history is at least it), the claim is not an upper bound, by ``shortfall`` (``ratio``:
    PRV's lower end over the claim). None for RDP and PRV claims (upper bounds)."""
    if accountant != "gdp" or claimed is None or (records is None and not history):
        return None
    history = history or records.accountant_history
    source = "the engine's history"
    if not history:
        q = (records.sampling or {}).get("q")
        if not q:
            return None
        history = _history(records, 1.0, float(q))
        source = "the optimizer's settings as recorded"
    if not history:
        return None
    lower, estimate, upper = prv_history_bounds(history, delta)
    below = claimed < lower
    return {"accountant": "gdp", "sound_accountant": "prv", "history": source,
            "epsilon_claimed": float(claimed), "epsilon_sound_lower": lower,
            "epsilon_sound": upper, "epsilon_sound_estimate": estimate,
            "claim_is_upper_bound": (True if claimed >= upper else False if below else None),
            "shortfall": float(max(0.0, lower - claimed)),
            "ratio": float(lower / claimed) if claimed > 0 else None,
            "note": ("the GDP accountant's claim lies below the PRV accountant's lower end on "
                     "the same history: the claim itself is not an upper bound" if below else
                     "the GDP claim is within or above the PRV accountant's bracket")}


def lower_side(threat, bounds, confidence: float, training_rate: float | None) -> dict:
    """The certified lower side on the training data's epsilon: the canaries' best certified
    bound when they realise the training data's threat model; else none, why, and a forecast
    of what canaries inserted like an example would certify."""
    same = (training_rate is not None and threat is not None
            and abs(threat.sample_rate - training_rate) <= 1e-12 * max(1.0, training_rate)
            and threat.sensitivity == 1.0)
    if same:
        cert = [b for b in bounds if b.kind == "certified" and b.valid
                and np.isfinite(b.epsilon)]
        best = max(cert, key=lambda b: b.epsilon, default=None)
        return {"epsilon": best.epsilon if best else 0.0,
                "by": None if best is None else f"{best.attack}/{best.method}",
                "note": "the canaries are inserted like a training example (Poisson at the "
                "data's rate, norm C, the same noise): their certified bound is one on the "
                "training data's epsilon"}
    out = {"epsilon": None}
    if threat is None or training_rate is None:
        out["note"] = "no canaries realise the training data's threat model"
        return out
    out["note"] = (f"the canaries realise another threat model ({threat.describe()}), not the "
                   f"training data's (Poisson at q = {training_rate:.4g}, norm C): their "
                   "evidence bounds that claim, not the training data's epsilon")
    forecast = poisson_canaries_forecast(threat.noise_multiplier, training_rate, threat.steps,
                                         confidence, threat.delta)
    out["forecast"] = forecast
    return out


def training_data_block(records: WhiteBoxRecords | None, checks: dict[str, CheckResult],
                        claim: UserClaim | None, *, threat=None, bounds=(),
                        confidence: float = 0.95, reason: str | None = None,
                        unchecked: list[str] | None = None,
                        lower: dict | None = None) -> dict | None:
    """``verdict.training_data``: the user's epsilon claimed, bracketed from above by the
    measured premises and from below by canaries of the data's threat model (module doc).

    Args:
        records: the training's white-box records (None: none kept, ``reason`` says why).
        checks: the white-box checks run on them, by name.
        claim: the user's claim (``user_claim.UserClaim``: accountant, history, delta);
            None: no claim about training data (scores passed without a hook or an engine).
        threat: the audited canaries' ``ThreatModel`` (its ``training_sample_rate`` is the
            data's rate).
        bounds: the audit's ``BoundRow`` s (the lower side's certified bound).
        confidence: the upper side's confidence (split over the noise and the rate).
        reason: why there are no records, when ``records`` is None.
        unchecked: the report's "not checked" lines (the reasons of unobserved premises).
        lower: the lower side of canaries inserted like an example beside the audited ones
            (``lower_side.data_rate_lower_side``); None: from the audited canaries when they
            realise the training data's threat model, else none and a forecast.
    """
    if claim is None or (records is None and claim.history is None
                         and not claim.engine_epsilons):
        return None
    accountant, delta = claim.accountant, claim.delta
    claimed, source = claimed_epsilon(records, claim)
    rate_q = None if threat is None else threat.training_sample_rate
    block = {"accountant": accountant, "delta": float(delta), "confidence": float(confidence),
             "epsilon_claimed": claimed, "epsilon_claimed_source": source,
             "epsilon_upper": None, "epsilon_lower": None, "claim": claim.to_dict(),
             "notes": [n for n in (claim.delta_note(), claim.target_note()) if n]}
    if lower is None:
        lower = lower_side(threat, bounds, confidence, rate_q)
    block["epsilon_lower"] = lower.get("epsilon")
    block["lower"] = lower
    shortfall = claim_shortfall(records, claimed, accountant, delta,
                                None if claim.history is None else list(claim.history))
    if shortfall is not None:
        block["claim_shortfall"] = shortfall
    if records is None or not records.steps:
        block.update(upper_status=NOT_MEASURED, upper_reasons=[
            reason or "no per-step records were kept"], premises=[], warnings=[], unseen=[])
        block["sentence"] = training_sentence(block)
        return block
    # the noise's and the rate's one-sided bounds share 1 - confidence, split before the
    # data by the design (``noise_scale.noise_share``); under adaptive clipping the count's
    # noise takes part of the noise's share (``count_share``)
    alpha = 1.0 - confidence
    share = noise_share(records, alpha, delta)
    a_noise, a_rate = share * alpha, (1.0 - share) * alpha
    a_count = a_noise * count_share(records)
    a_grad = a_noise - a_count
    scales = measured_scales(records, a_grad)
    one = pooled_lower(records, a_grad)
    count = count_lower(records, a_count) if records.adaptive is not None else None
    noise = noise_premise(records, checks, confidence, 1.0 - a_grad, scales, one)
    rate = rate_premise(records, checks, confidence, 1.0 - a_rate)
    clip = clipping_premise(records, checks)
    steps = steps_premise(records, checks)
    premises = [noise, rate, clip, steps, *structure_premises(checks, records, unchecked)]
    verified = upper_side(records, noise, rate, clip, accountant, delta,
                          None if scales is None else scales.scales, count)
    upper, why, used = verified["epsilon"], verified["reason"], verified["accountant"]
    single = (upper_side(records, noise, rate, clip, accountant, delta,
                         one_scale_steps(records, one), count) if one is not None else None)
    block["epsilon_upper_one_scale"] = None if single is None else single["epsilon"]
    block["upper_accountant"] = used
    block["upper_design"] = {
        "noise_share": share, "alpha_noise": a_grad, "alpha_count": a_count,
        "alpha_rate": a_rate, "history": verified["history"], "quantum": verified["quantum"],
        "one_scale": "epsilon_upper_one_scale: the same upper side with one noise scale for "
        "every tensor and step (the pooled interval's lower end); tighter, and valid only "
        "under that assumption"}
    if scales is not None:
        block["upper_noise"] = {k: v for k, v in scales.summary().items() if k != "tensors"}
    if records.adaptive is not None:
        rec = records.adaptive
        block["adaptive_upper"] = {
            "count_sensitivity": COUNT_SENSITIVITY, "sigma_gradient": rec.sigma_gradient,
            "sigma_count": rec.sigma_count, "count_noise_lower": count,
            "clip_factor": clip_factor(records, clip), "assumes": ADAPTIVE_ASSUMES}
    if used != accountant:
        block["upper_accountant_note"] = (
            "PRV, not GDP: the GDP accountant is a central-limit approximation that can "
            "underestimate epsilon (Opacus says so); the upper side is a sound accountant's"
            if used == "prv" else
            f"RDP, not {accountant.upper()}: the effective noise multiplier at the measured "
            f"values is below {PRV_FLOOR}, where the PRV accountant's grid explodes")
    refuted = [p["name"] for p in premises if p["status"] == REFUTED]
    unseen = [p for p in premises if p["status"] == NOT_OBSERVED]
    if refuted:
        status, reasons = UPPER_REFUTED, [f"refuted: {', '.join(refuted)}"]
    elif upper is None:
        status, reasons = NOT_MEASURED, [why]
    elif unseen:
        status, reasons = NOT_VERIFIED, [f"{p['name']}: {p['reason']}" for p in unseen]
    else:
        status, reasons = VERIFIED, []
    block.update(epsilon_upper=upper, upper_status=status, upper_reasons=reasons,
                 unseen=[{"name": p["name"], "plain": PLAIN.get(p["name"], p["name"]),
                          "reason": p["reason"]} for p in unseen],
                 premises=premises,
                 warnings=[warning_words(p) for p in premises if p["status"] == WARNING],
                 conditional_on=[p["what"] for p in premises if p["name"] in
                                 {n for n, _, _ in STRUCTURE}])
    block["sentence"] = training_sentence(block)
    return block


def training_sentence(block: dict) -> str:
    """The user's epsilon and its bracket in one sentence, before the verdict (which opens
    its message with its own, status-first version: ``verdict.claim_paragraph``)."""
    return f"{sentence_case(claim_head(block))}: {bracket_words(block)}."
