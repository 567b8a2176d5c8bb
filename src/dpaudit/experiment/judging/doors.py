"""The mechanism's other doors, judged (DESIGN 4.5): which examples each step used, what moved
the model between steps, and whether the noise ignored the data.

The per-step checks of ``white_box`` see each step's noise and clipping. These see what real
DP-SGD code breaks around them, from the hook's records (``capture.records``):

* ``sampling_by_example`` (statistical, ``stats.sampling``): the batches the training loader
  yielded are fresh Poisson samples at the claimed rate: participation counts and batch
  overlaps at every lag. When it refutes, the accountant's premise (Poisson sampling) is false;
  the sampling that ran is named, and for shuffled fixed-size batches a sound lower bound on the
  true epsilon (``stats.shuffle_bound``, Chua et al. 2024) is reported beside the claim. At
  q = 1 (full batches) Poisson sampling is every example in every batch, which the counts
  show exactly (``full_batch_check``: p 0 or 1);
* ``loader_fed_training`` (deterministic, a warning when it fails: a premise unseen, not a
  refutation): the loader given to the hook fed the training: its batches are the steps'
  batches (each step's rows are a run of consecutive recorded batches, in order). When it
  did not (0 batches recorded, fewer batches than steps, sizes that disagree), its batches say
  nothing about the training's: the tests by example are not run on them, and the report
  names the loader;
* ``sampling_duplicates`` (deterministic): no example is drawn twice into one batch (one
  example is one row, the unit the accountant counts);
* ``model_integrity`` (deterministic): every parameter changed only inside the private step
  (the base optimizer's step), parameters outside the DP optimizer and buffers never, except
  what a declared ``post_step`` reproduces exactly;
* ``noise_ignores_data`` (deterministic): with every generator state restored, the optimizer's
  own ``add_noise`` added the same noise to a zero clipped sum as to the real one, and a
  different noise once the generator advanced.
"""

from __future__ import annotations

import math

import numpy as np

from dpaudit.capture.integrity import KINDS
from dpaudit.capture.records import WhiteBoxRecords
from dpaudit.stats.checks import STATISTICAL, CheckResult, deterministic
from dpaudit.stats.sampling import SAMPLING_STATEMENT, sampling_by_example_test
from dpaudit.stats.shuffle_bound import shuffled_batches_epsilon_lower_bound

CHUA = ("Chua et al. 2024, 'How Private are DP-SGD Implementations?': one pair of neighbours "
        "(zeroing-out, which Opacus' Poisson claim covers), the event 'the largest released "
        "batch sum exceeds C' counted over the passes; a closed form, no statistics")


def loader_mismatch(records: WhiteBoxRecords) -> dict | None:
    """How the loader given to the hook failed to feed the training (None when its batches
    are the steps' batches, or no loader was given): the realised rows of each step must be a
    run of consecutive recorded batches, in order (several under manual accumulation, extra
    ones at the end from prefetching or a loop that stops early)."""
    by = records.by_example
    steps = records.num_steps
    if by is None or steps == 0:
        return None
    base = {"loader": by.source, "batches": by.batches, "steps": steps}
    if by.batches == 0:
        return {**base, "why": f"0 batches were recorded from it over {steps} optimizer steps"}
    realised = records.batch_sizes
    if by.ranks == 1 and all(b is not None for b in realised):
        ends = np.cumsum(np.asarray(realised, dtype=np.int64))
        cuts = set(np.cumsum(by.sizes.astype(np.int64)).tolist())
        off = [t for t, e in enumerate(ends.tolist()) if e not in cuts]
        if off:
            t = off[0]
            return {**base, "step": t, "rows": int(realised[t]),
                    "loader_sizes": by.sizes[max(0, t - 1): t + 2].astype(int).tolist(),
                    "why": f"step {t} trained on {int(realised[t])} rows, which no run of the "
                    "loader's consecutive batches gives (its batches are not the steps')"}
        return None
    if by.batches < steps:
        return {**base, "why": f"{by.batches} batches were recorded from it for {steps} "
                "optimizer steps"}
    return None


def loader_check(records: WhiteBoxRecords) -> CheckResult:
    """``loader_fed_training`` (module doc): a warning when the loader did not feed the
    training, never a refutation by itself."""
    miss = loader_mismatch(records)
    by = records.by_example
    return deterministic(
        "loader_fed_training", False,
        "the loader given to the hook fed the training: each step's rows are a run of its "
        "consecutive batches, in order",
        witness=miss or {}, warn=miss is not None,
        checked=[f"{by.batches} batches of {by.source} against {records.num_steps} steps' "
                 "rows"],
    )


def by_example_runs(records: WhiteBoxRecords) -> bool:
    """Whether the sampling by example can be tested: a loader that fed the training, its
    batches and a claimed rate (1 included: full batches, ``full_batch_check``)."""
    by = records.by_example
    q = (records.sampling or {}).get("q")
    return bool(by is not None and by.batches >= 2 and q and 0.0 < float(q) <= 1.0
                and loader_mismatch(records) is None)


def full_batch_check(records: WhiteBoxRecords, level: float) -> CheckResult:
    """``sampling_by_example`` at q = 1: Poisson sampling at rate 1 puts every example in
    every batch exactly once, so the recorded batches are checked exactly (the participation
    counts all equal the number of batches, every batch holds n examples): p = 0 when one did
    not, else 1 (``stats.sampling.poisson_sampling_test`` does the same with the sizes)."""
    by = records.by_example
    counts = np.asarray(by.counts, dtype=np.int64)
    sizes = np.asarray(by.sizes, dtype=np.int64)
    missed = int((counts != by.batches).sum())
    short = int((sizes != by.n).sum())
    failed = missed > 0 or short > 0 or by.duplicate_batches > 0
    seen = (f"{missed} of {by.n} examples were not in every batch, {short} of {by.batches} "
            f"batches did not hold all {by.n} examples" if failed else
            f"every one of the {by.batches} batches held all {by.n} examples")
    return CheckResult(
        name="sampling_by_example", kind=STATISTICAL, rejected=failed,
        p_value=0.0 if failed else 1.0, level=level, statement=SAMPLING_STATEMENT,
        witness={"failed": "full batches" if failed else None,
                 "participation_sd": float(counts.std()), "expected_sd": 0.0,
                 "counts_range": [int(counts.min()), int(counts.max())] if counts.size
                 else [0, 0], "sampling_seen": seen},
        checked=[f"which of n = {by.n} examples each of {by.batches} batches used: at q = 1 "
                 f"every example in every batch (recorded from {by.source})"],
        details={"q": 1.0, "examples_missed": missed, "batches_not_full": short,
                 "sampling_seen": {"kind": "full batches" if not failed else "not full "
                                   "batches", "text": seen}},
    )


def sampling_check(records: WhiteBoxRecords, level: float, delta: float | None) -> CheckResult:
    """``sampling_by_example`` on the records (module doc); with ``delta``, the shuffled
    batches' lower bound when the sampling seen is shuffled fixed-size batches."""
    by = records.by_example
    q = float(records.sampling["q"])
    if q == 1.0:
        return full_batch_check(records, level)
    res = sampling_by_example_test(by.counts, by.sizes, by.signatures, by.bucket_sizes,
                                   by.bucket_signed, q, level=level, set_hashes=by.set_hashes,
                                   duplicate_batches=by.duplicate_batches,
                                   rank_sizes=by.rank_sizes, rank_examples=by.rank_examples)
    details = dict(res.details)
    seen = dict(details["sampling_seen"])
    if seen.get("kind") == "shuffled passes of fixed-size batches" and delta is not None:
        seen["lower_bound"] = shuffle_lower_bound(records, seen, delta)
    details["sampling_seen"] = seen
    checked = [*res.checked, f"recorded from {by.source}; {by.batches} batches for "
               f"{by.optimizer_steps} optimizer steps"]
    unchecked = []
    if by.out_of_range:
        unchecked.append(f"{by.out_of_range} indices outside the data set's 0..{by.n - 1} "
                         "(not counted)")
    return CheckResult(**{**res.__dict__, "details": details, "checked": checked,
                          "unchecked": unchecked})


def shuffle_lower_bound(records: WhiteBoxRecords, seen: dict, delta: float) -> dict | None:
    """Chua et al.'s lower bound on the true epsilon of the shuffled fixed-size batches seen
    (``stats.shuffle_bound``): passes of ceil(n / batch) batches, full passes only, the
    run's noise multiplier (the smallest over the steps)."""
    by = records.by_example
    size = seen.get("batch_size")
    stds = records.noise_stds
    if not size or not stds.size or not np.all(stds > 0):
        return None
    sigma = float(records.claimed_multipliers.min())
    per_pass = math.ceil(by.n / size)
    passes = by.batches // per_pass
    if passes < 1:
        return None
    eps = shuffled_batches_epsilon_lower_bound(sigma, per_pass, passes, delta)
    return {"epsilon": eps, "delta": delta, "noise_multiplier": sigma,
            "batches_per_pass": per_pass, "passes": passes, "kind": "certified (closed form)",
            "source": CHUA}


def duplicates_check(records: WhiteBoxRecords) -> CheckResult:
    """``sampling_duplicates``: no example twice in one batch (deterministic)."""
    by = records.by_example
    return deterministic(
        "sampling_duplicates", by.duplicate_batches > 0,
        "no example was drawn more than once into one batch (one example is one row: the "
        "unit the accountant counts)",
        witness=({**by.duplicate_witness, "batches": by.duplicate_batches}
                 if by.duplicate_batches else {}),
        checked=[f"{by.batches} batches of {by.source}"],
    )


def integrity_check(records: WhiteBoxRecords) -> CheckResult:
    """``model_integrity``: the model moved only inside the private step (deterministic)."""
    rec = records.integrity
    moved = []
    for j, (name, kind) in enumerate(zip(rec.names, rec.kinds, strict=True)):
        if rec.changed_between[j]:
            moved.append({"tensor": name, "kind": kind, "when": "between steps",
                          "step": int(rec.first_between[j]),
                          "times": int(rec.changed_between[j])})
        if kind != "dp" and rec.changed_inside[j]:
            moved.append({"tensor": name, "kind": kind, "when": "inside the private step",
                          "step": int(rec.first_inside[j]),
                          "times": int(rec.changed_inside[j])})
    moved.sort(key=lambda m: m["step"])
    witness = {}
    if moved:
        witness = {**moved[0], "tensors": [m["tensor"] for m in moved][:8],
                   "largest_change": (rec.largest_change or {}).get(moved[0]["tensor"])}
    counts = {k: rec.kinds.count(k) for k in KINDS}
    checked = [f"{counts['dp']} parameters the DP optimizer updates, {counts['other']} other "
               f"parameters and {counts['buffer']} buffers, compared bit for bit with their copy "
               f"when each of {rec.steps} private steps started and returned"]
    if rec.post_step:
        checked.append(f"the declared post_step explained {rec.explained} changes between "
                       "steps exactly")
    return deterministic(
        "model_integrity", bool(moved),
        "the model moved only inside the private step: every parameter the DP optimizer "
        "updates changed only during the optimizer's step (or as the declared post_step "
        "says), other parameters and buffers never",
        witness=witness, checked=checked, details={"moved": moved[:50]},
    )


def noise_source_check(records: WhiteBoxRecords) -> CheckResult:
    """``noise_ignores_data``: the noise probe's outcome (deterministic)."""
    rec = records.noise_source
    dep, stale = rec.first_data_dependent, rec.first_stale
    witness: dict = {}
    if dep is not None:
        step, tensor, size = dep
        witness = {"kind": "depends on the clipped sum", "step": step, "tensor": tensor,
                   "difference": size, "tensors": [n for n, c in zip(
                       rec.names, rec.data_dependent, strict=True) if c][:8]}
    elif stale is not None:
        step, tensor = stale
        witness = {"kind": "did not change when the generator advanced", "step": step,
                   "tensor": tensor, "tensors": [n for n, c in zip(
                       rec.names, rec.stale, strict=True) if c][:8]}
    unchecked = []
    if rec.inconclusive:
        unchecked.append(f"{rec.inconclusive} probed steps where the same zero sums with every "
                         "state restored gave different noise (a state the probe cannot "
                         "restore): not judged")
    if rec.failures:
        unchecked.append(f"{rec.failures} probed steps where the probe's add_noise calls "
                         f"raised ({rec.failure}): not judged")
    return deterministic(
        "noise_ignores_data", bool(witness),
        "the noise ignores the data: with every generator state restored, the optimizer's "
        "add_noise added the same noise to a zero clipped sum as to the real one, and a "
        "different noise once the generator advanced",
        witness=witness,
        checked=[f"{rec.conclusive} of {rec.steps_probed} probed steps (the first and a seeded "
                 f"twentieth of the others), every tensor"],
        unchecked=unchecked,
    )


def door_checks(records: WhiteBoxRecords, level: float, delta: float | None) -> dict:
    """Every check of the other doors the records allow, by name."""
    out: dict[str, CheckResult] = {}
    if records.by_example is not None:
        out["loader_fed_training"] = loader_check(records)
    if by_example_runs(records):
        out["sampling_by_example"] = sampling_check(records, level, delta)
    if (records.by_example is not None and records.by_example.batches
            and loader_mismatch(records) is None):
        out["sampling_duplicates"] = duplicates_check(records)
    if records.integrity is not None and records.integrity.steps >= 2:
        out["model_integrity"] = integrity_check(records)
    src = records.noise_source
    if src is not None and src.reason is None and src.conclusive:
        out["noise_ignores_data"] = noise_source_check(records)
    return out


def door_not_checked(records: WhiteBoxRecords) -> list[str]:
    """What the other doors' checks could not examine, with the reason."""
    out = []
    by = records.by_example
    miss = loader_mismatch(records)
    if by is None:
        out.append(f"sampling by example: {records.by_example_reason or 'not recorded'}")
    elif miss is not None:
        out.append(f"sampling by example: the loader given to the hook ({by.source}) did not "
                   f"feed the training: {miss['why']} (the rows each step clipped are tested "
                   "by poisson_sampling instead)")
    elif by.batches < 2:
        out.append(f"sampling by example: {by.batches} batch recorded from {by.source}")
    elif not by_example_runs(records):
        out.append("sampling by example: the claimed sample rate is unknown")
    rec = records.integrity
    if rec is None:
        out.append("model integrity: not checked (AuditHook(check_integrity=False))")
    elif rec.steps < 2:
        out.append("model integrity: fewer than two private steps")
    src = records.noise_source
    if src is None:
        out.append("the noise's independence from the data: not probed "
                   "(AuditHook(check_noise_data=False))")
    elif src.reason is not None:
        out.append(f"the noise's independence from the data: {src.reason}")
    elif not src.conclusive:
        why = ("the probe's add_noise calls raised: " + str(src.failure) if src.failures else
               "the same zero sums with every state restored never gave the same noise (a "
               "state the probe cannot restore)" if src.inconclusive else "no step was probed "
               "(no noise claimed)")
        out.append(f"the noise's independence from the data: {why}")
    return out


def describe_door(check: CheckResult, p_text) -> str | None:
    """One line for the verdict, or None when ``check`` is not one of these."""
    w = check.witness or {}
    if check.name == "sampling_by_example":
        lag = ("" if w.get("failed") != "overlap" else
               f", batches {w.get('lag')} steps apart share {w.get('overlap_sign')} "
               f"(z = {w.get('overlap_z', 0):.3g})")
        return (f"sampling by example: {w.get('failed')} (participation counts "
                f"{w.get('counts_range')}, sd {w.get('participation_sd', 0):.3g} against "
                f"{w.get('expected_sd', 0):.3g} for Poisson sampling{lag}; "
                f"{p_text(check.p_value)}): the accountant's premise, Poisson sampling at q, "
                f"is false; sampling seen: {w.get('sampling_seen')}")
    if check.name == "loader_fed_training":
        return (f"loader: the loader given to the hook ({w.get('loader')}) did not feed the "
                f"training: {w.get('why')}; which examples each step used is unknown")
    if check.name == "sampling_duplicates":
        return (f"sampling duplicates: example {w.get('example')} is {w.get('times')} times in "
                f"batch {w.get('batch')} ({w.get('batches')} batches with repeated examples)")
    if check.name == "model_integrity":
        extra = (f"; differs from the declared post_step by {w['largest_change']:.3g}"
                 if w.get("largest_change") else "")
        step = w.get("step")
        when = (f"between private steps {step} and {step + 1}" if w.get("when") ==
                "between steps" else f"inside private step {step}")
        kind = {"dp": "a parameter of the DP optimizer", "other": "a parameter outside the "
                "DP optimizer", "buffer": "a buffer"}.get(w.get("kind"), "")
        return (f"model integrity: {w.get('tensor')} ({kind}) changed {when} ({w.get('times')} "
                f"times; moved: {', '.join(w.get('tensors', []))}){extra}")
    if check.name == "noise_ignores_data":
        if w.get("kind") == "depends on the clipped sum":
            return (f"noise ignores data: at step {w.get('step')} the noise of {w.get('tensor')} "
                    f"changed with the clipped sum, every generator state restored (by "
                    f"{w.get('difference', 0):.3g} sigma C): the noise depends on the batch")
        return (f"noise ignores data: at step {w.get('step')} the noise of {w.get('tensor')} did "
                "not change when the generator advanced: it is not drawn from the generator")
    return None
