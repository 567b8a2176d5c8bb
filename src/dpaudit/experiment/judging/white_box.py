"""Per-step white-box evidence of an audit (DESIGN 4.5, "What the audit can see").

A summed score per canary only sees bugs that keep DP-SGD's structure. The audit hook sees
every step, so five checks test the mechanism itself, each certified on its own terms:

* ``noise_floor`` (statistical, exact null): every parameter tensor carries at least the
  claimed noise at every step (``stats.noise.noise_floor_test``). Catches noise missing on
  some steps or some tensors and noise of the wrong scale, wherever the tensor is big enough
  for the noise to dominate what the data could contribute.
* ``noise_independence`` (statistical, exact null): at the coordinates no example touches
  (the Dirac canaries on always-blank pixels), the noise is fresh at every step
  (``stats.noise.noise_independence_test``). Catches noise reused or correlated across steps.
* ``poisson_sampling`` (statistical, exact null): the realised batch sizes are those of
  Poisson sampling at the claimed rate (``stats.noise.poisson_sampling_test``). Catches
  fixed-size shuffled batches accounted as Poisson and a wrong sample rate.
* ``clipping`` (deterministic): no example changed the optimizer's clipped sum by more than C
  (``capture.clip_check``). Catches an unclipped example, a layer left out of the norm,
  micro-batches clipped as one example.
* ``bookkeeping`` (deterministic): the accountant was told at least the steps, at most the
  noise multiplier and at least the sample rate that training used.

The statistical ones share the audit's failure probability with its other statements
(Bonferroni: ``count_tests`` says how many there are); the deterministic ones are facts about
what the optimizer did. Each check says what it examined and what it could not.
"""

from __future__ import annotations

import numpy as np

from dpaudit.stats.noise import (
    noise_floor_test,
    noise_independence_test,
    poisson_sampling_test,
)

STATISTICAL = ("noise_floor", "noise_independence", "poisson_sampling")
_REL = 1e-9  # float rounding of recorded rates and multipliers


def _sampling_known(records: dict) -> bool:
    s = records.get("sampling") or {}
    sizes = records.get("batch_sizes") or []
    return bool(s.get("n")) and len(sizes) >= 2 and all(b is not None for b in sizes)


def count_tests(records: dict | None) -> int:
    """How many statistical white-box tests ``white_box_evidence`` will run on ``records``."""
    if not records:
        return 0
    n = 1 if records.get("released_sq") is not None else 0
    n += 1 if records.get("probe_noise") is not None else 0
    n += 1 if _sampling_known(records) else 0
    return n


def bookkeeping_check(history, noise_multipliers, sample_rate: float, steps: int) -> dict:
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
    return {
        "name": "bookkeeping",
        "kind": "certified (deterministic)",
        "rejected": bool(problems),
        "statement": (
            "the accountant was told at least the steps, at most the noise multiplier and at "
            "least the sample rate that training used"
        ),
        "witness": {"problems": problems},
        "checked": [f"{len(hist)} accountant history entries against {steps} steps"],
        "unchecked": [],
        "history": [list(h) for h in hist],
    }


def clipping_verdict(summary: dict) -> dict:
    """The clipping check's summary as a check (deterministic)."""
    worst = summary.get("worst")
    unchecked = [summary["unchecked"]] if summary.get("unchecked") else []
    return {
        "name": "clipping",
        "kind": "certified (deterministic)",
        "rejected": bool(summary.get("violations")),
        "statement": (
            "no probed example changed the optimizer's clipped sum by more than C (its own "
            "clipping, run on the example alone and on the batch without it)"
        ),
        "witness": worst or {},
        "checked": [
            f"{summary.get('probes', 0)} probes on {summary.get('steps_checked', 0)} of "
            f"{summary.get('steps_seen', 0)} steps ({summary.get('leave_one_out_steps', 0)} "
            "with leave-one-out; the first step and a seeded random share of the others)"
        ],
        "unchecked": unchecked,
        "details": summary,
    }


def white_box_evidence(records: dict | None, level: float) -> dict[str, dict]:
    """Every white-box check the records allow, as plain dicts (module doc).

    ``records`` (``TrainingOutcome.white_box``): ``released_sq`` (J, T), ``dims``, ``names``,
    ``noise_stds`` (T,), ``probe_noise`` (n, T) or None, ``batch_sizes``, ``sampling``
    ({"n", "q"}), ``clipping`` (the clipping check's summary) or None, ``accountant_history``,
    ``max_grad_norm`` and ``steps``. ``level``: each statistical test's share of the audit's
    failure probability.
    """
    if not records:
        return {}
    out: dict[str, dict] = {}
    stds = np.asarray(records["noise_stds"], dtype=np.float64)
    if records.get("released_sq") is not None:
        t = noise_floor_test(
            records["released_sq"], records["dims"], stds, level=level, names=records["names"]
        )
        out["noise_floor"] = {**t.to_dict(), "kind": "certified (statistical)"}
    if records.get("probe_noise") is not None:
        t = noise_independence_test(records["probe_noise"], stds, level=level)
        out["noise_independence"] = {**t.to_dict(), "kind": "certified (statistical)"}
    sampling = records.get("sampling") or {}
    if _sampling_known(records):
        t = poisson_sampling_test(
            records["batch_sizes"], int(sampling["n"]), float(sampling["q"]), level=level
        )
        out["poisson_sampling"] = {**t.to_dict(), "kind": "certified (statistical)"}
    if records.get("clipping") is not None:
        out["clipping"] = clipping_verdict(records["clipping"])
    if records.get("accountant_history") is not None and sampling.get("q"):
        out["bookkeeping"] = bookkeeping_check(
            records["accountant_history"],
            stds / float(records["max_grad_norm"]),
            float(sampling["q"]),
            int(records["steps"]),
        )
    return out


def not_checked(records: dict | None, independent: bool) -> list[str]:
    """What the white-box checks could not examine in this audit, in words."""
    if not records:
        return ["no per-step records (multi-run audit, or scores passed without a hook)"]
    out = []
    if records.get("probe_noise") is None:
        out.append(
            "noise independence across steps: no coordinates known to be untouched by the "
            "data (needs Dirac gradient canaries on dead coordinates"
            + ("" if independent else "; these canaries share live coordinates")
            + ")"
        )
    if not _sampling_known(records):
        out.append("Poisson sampling: batch sizes or the dataset size unknown")
    if records.get("clipping") is None:
        out.append("clipping: not probed")
    if records.get("accountant_history") is None:
        out.append("bookkeeping: no accountant history")
    small = [
        f"{n} (d={d})"
        for n, d in zip(records.get("names", []), records.get("dims", []), strict=True)
        if d < _SMALL_TENSOR
    ]
    if small:
        out.append(
            "noise floor on small tensors: a tensor of d coordinates shows missing noise only "
            f"when the data's clipped sum there is small next to d (sigma C)^2: {', '.join(small)}"
        )
    return out


_SMALL_TENSOR = 64


def fired(evidence: dict[str, dict]) -> list[str]:
    """Names of the checks that rejected the claim."""
    return [k for k, v in evidence.items() if v.get("rejected")]


def describe(check: dict) -> str:
    """One line for the verdict: which check fired and where."""
    w = check.get("witness") or {}
    name = check["name"]
    if name == "noise_floor":
        return (
            f"noise floor: tensor {w.get('tensor')} at step {w.get('step')} released "
            f"{w.get('noise_ratio', float('nan')):.3g} x the claimed noise std "
            f"(p = {check['p_value']:.2g})"
        )
    if name == "noise_independence":
        if "cosine" in w:
            return (
                f"noise independence: the noise of steps {w['steps'][0]} and {w['steps'][1]} "
                f"has cosine {w['cosine']:.3g} (p = {check['p_value']:.2g})"
            )
        return (
            f"noise independence: step {w.get('step')} carries {w.get('noise_ratio', 0):.3g} x "
            f"the claimed noise at untouched coordinates (p = {check['p_value']:.2g})"
        )
    if name == "poisson_sampling":
        return (
            f"Poisson sampling: batch sizes {w.get('mean_batch', 0):.1f} +- "
            f"{w.get('batch_sd', 0):.2f} against Binomial {w.get('expected_mean', 0):.1f} +- "
            f"{w.get('expected_sd', 0):.2f} ({w.get('failed')}, p = {check['p_value']:.2g})"
        )
    if name == "clipping":
        if not w:
            return "clipping: a probed example changed the clipped sum by more than C"
        return (
            f"clipping: example {w.get('example')} at step {w.get('step')} changed the clipped "
            f"sum by {w.get('ratio', float('nan')):.3g} C ({w.get('kind')})"
        )
    if name == "bookkeeping":
        return "bookkeeping: " + "; ".join(w.get("problems", []))
    return name

