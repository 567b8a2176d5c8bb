"""Per-step white-box evidence of an audit (DESIGN 4.5, "What the audit can see").

A summed score per canary only sees bugs that keep DP-SGD's structure. The audit hook sees
every step, the optimizer's clipped sum and what it releases (``capture.records``), so these
checks test the mechanism itself, each certified on its own terms:

* ``noise_scale`` (statistical): the noise the optimizer added (release minus clipped sum) has
  at least the claimed scale on every tensor at every step (``stats.noise_law``).
* ``noise_marginal`` (statistical): that noise has the claimed Gaussian law: not bounded,
  heavy-tailed or discretised.
* ``noise_alignment`` (statistical): within a step, the noise of no coordinate or tensor
  repeats or cancels another's at any offset (broadcast noise, reused buffers or generator
  states).
* ``noise_freshness`` (statistical): the noise of every step is independent of every other
  step's (reused at any period, negated, correlated).
* ``noise_floor`` (statistical): every tensor's released sum carries at least the claimed
  noise (``stats.noise``): what the step released after ``add_noise``, so it also catches a sum
  rescaled after the noise (divided by the realised batch size).
* ``noise_independence`` (statistical): only where the noise was not recorded: at coordinates
  no example touches, the released noise is fresh at every step.
* ``poisson_sampling`` (statistical): the batch sizes are Poisson sampling's at the claimed rate.
* ``clipping`` (deterministic): no probed example changed the optimizer's clipped sum by more
  than C (``capture.clip_check``), beyond an excess whose epsilon cost is within a stated
  tolerance (``judging.clipping``: arithmetic precision is reported, not a bug by itself).
* ``bookkeeping`` (deterministic): the accountant was told at least the steps, at most the
  noise multiplier and at least the sample rate that training used.
* ``normalisation`` (deterministic): the release is the noised sum divided by the claimed
  divisor (expected batch size x accumulated iterations), up to one factor constant over the
  run: a divisor that changes from step to step (the realised batch size) is not the
  mechanism the accountant accounted, and reveals what it depends on. Under DPDDP the noised
  sum is the sum of the ranks' noised sums, compared through a sketch summed over the ranks
  (``capture.ranks_release``): a release that is not that sum (a step not all-reduced) is
  refuted too.
* the other doors (``doors``): ``sampling_by_example`` (statistical), ``sampling_duplicates``,
  ``model_integrity`` and ``noise_ignores_data`` (deterministic).
* adaptive clipping's own release (``adaptive``): ``count_noise`` (statistical),
  ``adaptive_bound`` (deterministic) and ``adaptive_accounting`` (a warning).

Every check is a ``stats.checks.CheckResult``. A statistical one is judged at two levels: its
share of the PRIVACY BUG verdict's failure probability (``rejected``) and its share of the
bounds' (``warning``); ``count_tests`` says how many share them. Each check says what it
examined; ``not_checked`` says, with the true reason, what none could.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from dpaudit.capture.records import WhiteBoxRecords
from dpaudit.experiment.judging.adaptive import (
    ADAPTIVE_TESTS,
    adaptive_checks,
    describe_adaptive,
)
from dpaudit.experiment.judging.clipping import clipping_check, describe_clipping
from dpaudit.experiment.judging.doors import (
    by_example_runs,
    describe_door,
    door_checks,
    door_not_checked,
    loader_mismatch,
)
from dpaudit.report.files import p_text
from dpaudit.stats.checks import CheckResult, deterministic
from dpaudit.stats.noise import noise_floor_test, noise_independence_test
from dpaudit.stats.noise_law import (
    noise_alignment_test,
    noise_freshness_test,
    noise_marginal_test,
    noise_scale_test,
)
from dpaudit.stats.sampling import poisson_sampling_test

_REL = 1e-9  # float rounding of recorded rates and multipliers
NOISE_LAW = ("noise_scale", "noise_marginal", "noise_alignment", "noise_freshness")


def _noised(records: WhiteBoxRecords) -> list[int]:
    """Indices of the steps that claim some noise (sigma C > 0)."""
    return [i for i, s in enumerate(records.steps) if s.noise_std > 0]


def _noise_steps(records: WhiteBoxRecords):
    return [s for s in records.steps if s.noise is not None]


def _sketched(steps) -> bool:
    """Whether every noise step kept its sketch (compact records of a run file may not)."""
    return all(s.noise.sketch is not None for s in steps)


def batch_sizes(records: WhiteBoxRecords) -> tuple[list[int] | None, str]:
    """The batch sizes the Poisson sampling test reads, and where they come from: each step's
    clipped rows (the logical batch under BatchMemoryManager), or the loader's (union over
    the ranks) batches where those are unknown (ghost clipping) or rank-local (DPDDP) and the
    loader fed the training; None when neither."""
    steps = records.batch_sizes
    by = records.by_example
    loader = by is not None and by.batches >= 2 and loader_mismatch(records) is None
    if all(b is not None for b in steps) and not (loader and by.ranks > 1):
        return steps, "realised batch sizes"
    if loader:
        return by.sizes.tolist(), f"batch sizes of the loader's batches ({by.source})"
    return None, ""


def _sampling_known(records: WhiteBoxRecords) -> bool:
    s = records.sampling or {}
    sizes, _ = batch_sizes(records)
    return bool(s.get("n") or s.get("n_range")) and sizes is not None and len(sizes) >= 2


def statistical_tests(records: WhiteBoxRecords | None) -> list[str]:
    """The statistical checks ``white_box_evidence`` will run on ``records``, by name."""
    if records is None or not records.steps:
        return []
    out = []
    noised = _noised(records)
    if noised:
        out.append("noise_floor")
    steps = _noise_steps(records)
    if records.noise is not None and steps:
        out += ["noise_scale", "noise_marginal"]
        if records.noise.lags:
            out.append("noise_alignment")
        if len(steps) >= 2 and _sketched(steps):
            out.append("noise_freshness")
    elif records.probe_noise is not None and len(noised) >= 2:
        out.append("noise_independence")
    if _sampling_known(records):
        out.append("poisson_sampling")
    if by_example_runs(records):
        out.append("sampling_by_example")
    if records.adaptive is not None and records.adaptive.bounds.size:
        out += list(ADAPTIVE_TESTS)
    return out


def count_tests(records: WhiteBoxRecords | None) -> int:
    """How many statistical white-box tests ``white_box_evidence`` will run on ``records``."""
    return len(statistical_tests(records))


def bookkeeping_check(history, noise_multipliers, sample_rate: float, steps: int) -> CheckResult:
    """The accountant's history against what training did (deterministic).

    Args:
        history: the accountant's ``history``, a list of (noise multiplier, sample rate,
            number of steps).
        noise_multipliers: (T,) the optimizer's noise multiplier at each recorded step.
        sample_rate: the sample rate the data were drawn with.
        steps: the number of optimizer steps training took.
    """
    hist = [(float(s), float(q), int(k)) for s, q, k in history]
    recorded = sum(k for _, _, k in hist)
    sigmas = np.repeat([s for s, _, _ in hist], [k for _, _, k in hist]) if hist else []
    applied = np.asarray(noise_multipliers, dtype=np.float64)
    problems = []
    if recorded < steps:
        problems.append(f"the accountant counted {recorded} steps, training took {steps}")
    n = min(len(sigmas), applied.size)
    over = np.flatnonzero(np.asarray(sigmas[:n]) > applied[:n] * (1 + _REL))
    if over.size:
        t = int(over[0])
        problems.append(
            f"the accountant was told noise multiplier {sigmas[t]:g} at step {t}, the optimizer "
            f"used {applied[t]:g}"
        )
    low = [q for _, q, _ in hist if q < sample_rate * (1 - _REL)]
    if low:
        problems.append(
            f"the accountant was told sample rate {min(low):.6g}, the data were drawn at "
            f"{sample_rate:.6g}"
        )
    return deterministic(
        "bookkeeping", bool(problems),
        "the accountant was told at least the steps, at most the noise multiplier and at "
        "least the sample rate that training used",
        witness={"problems": problems},
        checked=[f"{len(hist)} accountant history entries against {steps} steps"],
        details={"history": [list(h) for h in hist]},
    )


NORMALISATION_TOLERANCE = 1e-4  # relative, plus 64 machine epsilons of the parameters' dtype
NORMALISATION_STATEMENT = (
    "every step releases the noised clipped sum divided by the claimed divisor (the expected "
    "batch size x accumulated iterations), up to one factor for the whole run")


def normalisation_check(records: WhiteBoxRecords) -> CheckResult | None:
    """The release against the noised sum (deterministic): r_t = ||release_t x divisor_t|| /
    ||noised sum_t|| must be one constant over the run (a constant != 1 is a learning rate;
    varying, the divisor depends on the step). Under DPDDP the noised sum is the ranks' sum S,
    seen through a linear sketch P (``records.RanksRelease``): release x divisor must be c S,
    so each step's P(release x divisor) must be parallel to P(S) (``_ranks_normalisation``).
    None when neither was recorded."""
    if any(s.ranks_release is not None for s in records.steps) and not any(
            s.noised_sq is not None for s in records.steps):
        return _ranks_normalisation(records)
    steps = [s for s in records.steps if s.noised_sq is not None and s.noised_sq > 0]
    if len(steps) < 2:
        return None
    ratio = np.sqrt(np.array([float(s.released_sq.sum()) for s in steps])
                    / np.array([s.noised_sq for s in steps]))
    tol = NORMALISATION_TOLERANCE + 64 * max(s.dtype_eps for s in steps)
    lo, hi = int(np.argmin(ratio)), int(np.argmax(ratio))
    spread = float(ratio[hi] / ratio[lo] - 1.0)
    witness = {}
    if spread > tol:
        witness = {"steps": [steps[lo].step, steps[hi].step],
                   "ratios": [float(ratio[lo]), float(ratio[hi])],
                   "batch_sizes": [steps[lo].batch_size, steps[hi].batch_size]}
    return deterministic(
        "normalisation", spread > tol, NORMALISATION_STATEMENT,
        witness=witness,
        checked=[f"the release against the noised sum at {len(steps)} steps (spread "
                 f"{spread:.2g}, tolerance {tol:.2g})"],
        details={"spread": spread, "tolerance": tol, "median_ratio": float(np.median(ratio))},
    )


def _ranks_normalisation(records: WhiteBoxRecords) -> CheckResult | None:
    """``normalisation`` under DPDDP. Each step's least-squares factor c_t = <P(R), P(S)> /
    ||P(S)||^2 (R: release x divisor, S: the ranks' noised sums) and its residual
    ||P(R) - c_t P(S)|| are read from ``RanksRelease``. Under the claim R = c (S + E), E the
    float rounding, with ||P(E)|| <= error_t, so |c_t / c - 1| and the residual over
    c_t ||P(S)|| are at most e_t = error_t / ||P(S)|| (over 1 - e_t): refuted when a residual
    exceeds that plus the tolerance (the release is not a multiple of the ranks' sum), or when
    the c_t spread beyond it (the divisor changed between steps). None below two steps."""
    steps = [s for s in records.steps if s.ranks_release is not None
             and s.ranks_release.noised > 0]
    if len(steps) < 2:
        return None
    rr = [s.ranks_release for s in steps]
    noised = np.array([r.noised for r in rr])
    ratio = np.array([r.cross for r in rr]) / noised
    resid = np.sqrt(np.maximum(np.array([r.released for r in rr]) - ratio * ratio * noised,
                               0.0))
    err = np.array([r.error for r in rr]) / np.sqrt(noised)
    usable = err < 0.5  # a step whose rounding's bound is half its sketch says nothing
    if usable.sum() < 2:
        return None
    steps = [s for s, u in zip(steps, usable, strict=True) if u]
    rr = [r for r, u in zip(rr, usable, strict=True) if u]
    ratio, resid, err, noised = ratio[usable], resid[usable], err[usable], noised[usable]
    tol = NORMALISATION_TOLERANCE + 64 * max(s.dtype_eps for s in steps)
    slack = err / (1.0 - err)
    with np.errstate(divide="ignore", invalid="ignore"):
        off = np.where(ratio > 0, resid / (ratio * np.sqrt(noised)), np.inf)
    excess = off - (tol + slack)
    lo, hi = int(np.argmin(ratio)), int(np.argmax(ratio))
    spread = float(ratio[hi] / ratio[lo] - 1.0) if ratio[lo] > 0 else float("inf")
    spread_tol = tol + 2.0 * float(slack.max())
    witness = {}
    worst = int(np.argmax(excess))
    ranks = rr[0].ranks
    if excess[worst] > 0:
        r = rr[worst]
        witness = {"kind": "not the ranks' sum", "step": steps[worst].step,
                   "residual": float(off[worst]), "ranks": ranks,
                   "cosine": float(r.cross / np.sqrt(max(r.released * r.noised, 1e-300))),
                   "batch_size": steps[worst].batch_size}
    elif spread > spread_tol:
        witness = {"steps": [steps[lo].step, steps[hi].step],
                   "ratios": [float(ratio[lo]), float(ratio[hi])],
                   "batch_sizes": [steps[lo].batch_size, steps[hi].batch_size],
                   "ranks": ranks}
    return deterministic(
        "normalisation", bool(witness), NORMALISATION_STATEMENT + (
            f"; under DPDDP the release is the sum of the {ranks} ranks' noised sums"),
        witness=witness,
        checked=[f"the release against the sum of the {ranks} ranks' noised sums at "
                 f"{len(steps)} steps, through a sketch of every tensor summed over the ranks "
                 f"(largest residual {float(np.max(off)):.2g}, spread {spread:.2g}; "
                 f"tolerances {float(np.max(tol + slack)):.2g} and {spread_tol:.2g})"],
        details={"spread": spread, "tolerance": spread_tol, "median_ratio":
                 float(np.median(ratio)), "largest_residual": float(np.max(off)),
                 "ranks": ranks},
    )


def _lag_words(noise):
    """(vector, lag) -> what the lag joins, for the report."""

    def words(vector: str, lag: int) -> str:
        if vector != "heads":
            return (f"coordinates {lag} apart in the flattened noise"
                    + ("" if noise.fold == sum(noise.dims) else f" (modulo {noise.fold})"))
        pairs = []
        for a, (na, sa, la) in enumerate(noise.heads):
            for nb, sb, lb in noise.heads[a:]:
                shift = lag - (sb - sa)  # position i of a's head meets i + shift of b's
                if -la < shift < lb and (nb != na or shift != 0):
                    pairs.append((abs(shift), na, nb, shift))
        if not pairs:
            return f"lag {lag} in the heads"
        _, na, nb, shift = min(pairs)
        if na == nb:
            return f"coordinates {shift} apart within the head of {na}"
        return (f"the head of {na} against the head of {nb}"
                + ("" if shift == 0 else f" shifted by {shift}"))

    return words


def _scale_rounding(records: WhiteBoxRecords, roundings: int) -> float:
    """What ``roundings`` roundings to the parameters' dtype may take off a norm, relatively:
    1 - (1 - u)^roundings with u half the dtype's epsilon. torch draws the noise with its std
    cast to the noise's dtype (one rounding: ``noise_scale``); the release is also rounded
    where the sum is added and where it is divided (three: ``noise_floor``)."""
    u = max(s.dtype_eps for s in records.steps) / 2.0
    return 1.0 - (1.0 - u) ** roundings


def _noise_law(records: WhiteBoxRecords, level: float) -> dict[str, CheckResult]:
    """The four tests of the recovered noise (``stats.noise_law``)."""
    noise = records.noise
    steps = _noise_steps(records)
    out: dict[str, CheckResult] = {}
    rounding = np.array([s.noise.rounding for s in steps])
    sq = np.stack([s.noise.sq for s in steps], axis=1)
    out["noise_scale"] = noise_scale_test(sq, noise.dims, 1.0, rounding, level=level,
                                          names=noise.names,
                                          scale_rounding=_scale_rounding(records, 1))
    per_step = all(s.noise.counts is not None for s in steps)
    out["noise_marginal"] = noise_marginal_test(
        np.stack([s.noise.counts for s in steps]) if per_step else None,
        noise.tensor_counts, rounding,
        level=level, names=noise.names, moments=np.stack([s.noise.m4 for s in steps]),
        dims=noise.dims)
    if noise.lags:
        out["noise_alignment"] = noise_alignment_test(
            {v: [(s.step, s.noise.lag_z[v], s.noise.lag_at[v]) for s in steps
                 if v in s.noise.lag_z] for v in noise.lags},
            noise.run_z, noise.lags, level=level, where=noise.vectors,
            describe_lag=_lag_words(noise))
    if len(steps) >= 2 and _sketched(steps):
        out["noise_freshness"] = noise_freshness_test(
            np.stack([s.noise.sketch for s in steps]),
            np.array([s.noise.sketch_error for s in steps]), noise.segments, level=level)
    return {name: replace(res, checked=[*res.checked, f"noise read as the {noise.source}"])
            for name, res in out.items()}


def white_box_evidence(
    records: WhiteBoxRecords | None, level: float, warning_level: float | None = None,
    delta: float | None = None,
) -> dict[str, CheckResult]:
    """Every white-box check the records allow (module doc).

    Args:
        records: the training's ``WhiteBoxRecords`` (None: none kept).
        level: each statistical check's share of the PRIVACY BUG verdict's failure
            probability (``rejected``).
        warning_level: each one's share of the bounds' failure probability (``warning``);
            defaults to ``level``.
        delta: the claim's delta, for the lower bound reported beside it when the sampling
            seen is shuffled fixed-size batches (``doors``) and for the epsilon a clipped
            contribution above C implies (``clipping``).
    """
    if records is None or not records.steps:
        return {}
    warning_level = level if warning_level is None else warning_level
    run = set(statistical_tests(records))
    out: dict[str, CheckResult] = {}
    noised = _noised(records)
    stds = records.noise_stds
    if "noise_floor" in run:
        out["noise_floor"] = noise_floor_test(
            records.released_sq[:, noised], records.dims, stds[noised], level=level,
            names=records.names, scale_rounding=_scale_rounding(records, 3))
    if records.noise is not None and "noise_scale" in run:
        out.update(_noise_law(records, level))
    if "noise_independence" in run:
        out["noise_independence"] = noise_independence_test(
            records.probe_noise[:, noised], stds[noised], level=level)
    sampling = records.sampling or {}
    if "poisson_sampling" in run:
        sizes, where = batch_sizes(records)
        if sampling.get("n"):
            res = poisson_sampling_test(sizes, int(sampling["n"]), float(sampling["q"]),
                                        level=level)
            checked = [f"{len(sizes)} {where}"]
        else:  # n inferred to a range: each test at its least favourable n, the rate's
            # test a warning at most (another data set at the claimed rate looks the same)
            lo, hi = (int(v) for v in sampling["n_range"])
            res = poisson_sampling_test(sizes, lo, float(sampling["q"]), level=level,
                                        n_high=hi, test_rate=False)
            checked = [f"{len(sizes)} {where}", f"n in [{lo}, {hi}] from "
                       f"{sampling.get('n_source') or 'the optimizer'}"]
        out["poisson_sampling"] = replace(res, checked=checked)
    out.update(door_checks(records, level, delta))
    out.update(adaptive_checks(records, level, delta))
    out = {k: v.at_levels(level, warning_level) for k, v in out.items()}
    claimed = records.claimed_multipliers
    if records.clipping is not None:
        out["clipping"] = clipping_check(records.clipping, claimed, sampling.get("q"), delta)
    if records.accountant_history is not None and sampling.get("q"):
        out["bookkeeping"] = bookkeeping_check(
            records.accountant_history, claimed, float(sampling["q"]), records.num_steps)
    norm = normalisation_check(records)
    if norm is not None:
        out["normalisation"] = norm
    return out


def not_checked(records: WhiteBoxRecords | None, independent: bool,
                reason: str | None = None) -> list[str]:
    """What the white-box checks could not examine in this audit, in words (each with the
    true reason; a check that ran is never listed here).

    Args:
        records: the training's records, or None.
        independent: whether the canaries are independent experiments (the probes' reason).
        reason: why there are no records, when ``records`` is None.
    """
    if records is None or not records.steps:
        return [reason or "no per-step records were kept"]
    out = []
    run = set(statistical_tests(records))
    if len(_noised(records)) < records.num_steps:
        out.append(f"{records.num_steps - len(_noised(records))} steps claim no noise "
                   "(noise multiplier 0): their noise is not tested")
    if records.noise is None:
        out.append(
            "the noise's scale, law, alignment and freshness: the noise the optimizer added "
            "was not recorded (AuditHook(record_noise=False))"
        )
        if "noise_independence" not in run:
            out.append(
                "noise independence across steps: no coordinates known to be untouched by the "
                "data (needs Dirac gradient canaries on dead coordinates"
                + ("" if independent else "; these canaries share live coordinates")
                + ")"
            )
    elif "noise_freshness" not in run:
        out.append("noise freshness across steps: " + (
            "a single step" if len(_noise_steps(records)) < 2 else
            "the records keep no sketch of each step's noise"))
    sampling = records.sampling or {}
    if "poisson_sampling" not in run:
        sizes, _ = batch_sizes(records)
        if sizes is None:
            out.append("Poisson sampling: the batch sizes are unknown (ghost clipping keeps "
                       "no per-sample gradients to count; AuditHook(data_loader=...) records "
                       "the loader's)")
        elif not (sampling.get("n") or sampling.get("n_range")):
            out.append("Poisson sampling: the dataset size is unknown (AuditHook(data_loader="
                       "...) or audit_report(..., dataset_size=len(train_set)))")
        else:
            out.append("Poisson sampling: a single step")
    if records.clipping is None:
        out.append("clipping: not probed (AuditHook(check_clipping=False))")
    if records.accountant_history is None:
        out.append("bookkeeping: no accountant history (audit_report(..., "
                   "privacy_engine=engine))")
    elif not sampling.get("q"):
        out.append("bookkeeping: the sample rate is unknown")
    if not any(s.noised_sq is not None or s.ranks_release is not None
               for s in records.steps):
        out.append("normalisation: under DPDDP the release is the ranks' all-reduced sum, and "
                   "these records keep no sketch of the ranks' noised sums (recorded before "
                   "dpaudit kept them); the release is checked against the claimed noise "
                   "floor only")
    elif normalisation_check(records) is None:
        out.append("normalisation: a single step")
    return out + door_not_checked(records)


def fired(evidence: dict[str, CheckResult]) -> list[str]:
    """Names of the checks that refuted the claim (at the PRIVACY BUG level)."""
    return [k for k, v in evidence.items() if v.rejected]


def warned(evidence: dict[str, CheckResult]) -> list[str]:
    """Names of the checks whose evidence is a warning (below the bounds' level only)."""
    return [k for k, v in evidence.items() if v.warning]


def describe(check: CheckResult) -> str:
    """One line for the verdict: which check fired (or warned) and where."""
    w = check.witness or {}
    name = check.name
    p = p_text(check.p_value)
    door = describe_door(check, p_text)
    if door is not None:
        return door
    adaptive = describe_adaptive(check)
    if adaptive is not None:
        return adaptive
    if name in ("noise_floor", "noise_scale"):
        what = "released" if name == "noise_floor" else "added noise of"
        return (
            f"{name.replace('_', ' ')}: tensor {w.get('tensor')} at step {w.get('step')} "
            f"{what} {w.get('noise_ratio', float('nan')):.3g} x the claimed noise std ({p})"
        )
    if name == "noise_marginal":
        where = (f"tensor {w['tensor']}" if "tensor" in w else
                 "the run" if w.get("step") == "all" else f"step {w.get('step')}")
        if "fourth_moment" in w:
            when = "" if w.get("step") in ("all", None) else f" at step {w['step']}"
            return (f"noise marginal: in {where}{when}, the noise's truncated fourth moment "
                    f"(mean of min(z^2, 9)^2) is {w['fourth_moment']:.3g} against "
                    f"{w['expected_moment']:.3g} for a Gaussian ({p})")
        lo, hi = w.get("bin", [float("nan")] * 2)
        return (f"noise marginal: in {where}, {w.get('observed')} noise values in "
                f"[{lo:.3g}, {hi:.3g}) sigma C against {w.get('expected', 0):.1f} expected of "
                f"a Gaussian ({p})")
    if name == "noise_alignment":
        when = "over the run" if w.get("step") == "all" else f"at step {w.get('step')}"
        return (f"noise alignment: {w.get('joins', 'lag ' + str(w.get('lag')))} carry "
                f"matching noise {when} (Hoeffding z = {w.get('z', 0):.3g}, {p})")
    if name == "noise_freshness":
        if "steps" in w:
            t, s = w["steps"]
            return (f"noise freshness: the noise of steps {t} and {s} ({w.get('tensors')}) "
                    f"has correlation {w.get('correlation', 0):.3g} ({p})")
        return (f"noise freshness: steps {w.get('lag')} apart ({w.get('tensors')}) have mean "
                f"correlation {w.get('correlation', 0):.3g} ({p})")
    if name == "noise_independence":
        if "cosine" in w:
            return (
                f"noise independence: the noise of steps {w['steps'][0]} and {w['steps'][1]} "
                f"has cosine {w['cosine']:.3g} ({p})"
            )
        return (
            f"noise independence: step {w.get('step')} carries {w.get('noise_ratio', 0):.3g} x "
            f"the claimed noise at untouched coordinates ({p})"
        )
    if name == "poisson_sampling":
        return (
            f"Poisson sampling: batch sizes {w.get('mean_batch', 0):.1f} +- "
            f"{w.get('batch_sd', 0):.2f} against Binomial {w.get('expected_mean', 0):.1f} +- "
            f"{w.get('expected_sd', 0):.2f} ({w.get('failed')}, {p})"
        )
    if name == "clipping":
        return describe_clipping(check)
    if name == "bookkeeping":
        return "bookkeeping: " + "; ".join(w.get("problems", []))
    if name == "normalisation" and w.get("kind") == "not the ranks' sum":
        return (f"normalisation: at step {w.get('step')} the release is not a multiple of the "
                f"sum of the {w.get('ranks')} ranks' noised sums (cosine "
                f"{w.get('cosine', 0):.6g} between their sketches, relative residual "
                f"{w.get('residual', 0):.3g}): the ranks' sums were divided differently or "
                "not all-reduced")
    if name == "normalisation":
        (t, s), (a, b) = w.get("steps", [0, 0]), w.get("ratios", [1.0, 1.0])
        sizes = w.get("batch_sizes") or [None, None]
        return (f"normalisation: the release is the noised sum divided by a divisor that "
                f"changed between steps {t} and {s} (release / claimed {a:.4g} and {b:.4g}; "
                f"batches of {sizes[0]} and {sizes[1]} examples)")
    return name
