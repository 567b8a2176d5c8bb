"""White-box records compacted and as plain JSON: what a multi-run audit's run file keeps.

A multi-run audit trains R runs, each saved to its own run file (possibly by another worker)
and pooled later (``experiment.trainings.multirun``). Each run keeps its white-box records,
so that the premises of the training data's epsilon are judged on a training of the audit,
and a run file must stay small: ``compact`` keeps what the checks read in O(T J) numbers
(T steps, J tensors) plus O(J) per run, never a vector per step:

* per step: its scalars (noise std, divisor, batch size, clip bound, dtype, the noised sum's
  squared norm, DPDDP's ``RanksRelease``), the per-tensor squared norms of the release, and
  the noise sketch's per-tensor sums (||z||^2, the truncated fourth moment), rounding and
  alignment statistics;
* the noise sketch of each step folded to ``FRESHNESS_BUCKETS`` numbers (the freshness test
  across steps: folding sums disjoint sets of noise coordinates, so the test stays exact, with
  less power); the marginal counts per tensor over the run, not per step; the run's alignment
  statistic at its largest lag only (the test reads no other);
* the loader's batches: sizes, set hashes, the count sketches folded to ``SAMPLING_BUCKETS``
  buckets as the recorder folds them past its budget, and the participation counts as a
  histogram (the tests read their distribution, not which example had which: the compact
  counts are sorted);
* the clipping probes' summary, the integrity record, the noise probe's outcome, adaptive
  clipping's record, the canaries' independence and the accountant's history, as they are.

Left out where the noise itself was recorded: the released sum at the noise probes (a vector
per step, read only when it was not). Folding a sketch, pooling counts or keeping a maximum
loses power, never validity: every check run on the compact records keeps its level.

``records_to_dict`` / ``records_from_dict`` convert to and from plain JSON types, exactly:
every array (the per-step columns included) as one base64 string of its little-endian bytes,
floats as float64 (about half the characters of their decimal form, non-finite values
included), integers in the narrowest integer type that holds them, with its dtype and shape:
one line in an indented run file, whatever its length. A column whose entries may be missing
keeps NaN (floats) or -1 (counts, lags) there. ``records_from_dict`` raises a ValueError naming
what is missing or malformed.
"""

from __future__ import annotations

import base64
import math
from dataclasses import MISSING, fields, replace

import numpy as np

from dpaudit.capture.noise_record import _fold
from dpaudit.capture.records import (
    AdaptiveRecord,
    ExampleSampling,
    IndependenceRecord,
    IntegrityRecord,
    NoiseRun,
    NoiseSourceRecord,
    NoiseStep,
    RanksRelease,
    StepRecord,
    WhiteBoxRecords,
)

FRESHNESS_BUCKETS = 8  # numbers per step kept of the noise sketch (the freshness test)
SAMPLING_BUCKETS = 16  # count-sketch buckets kept per batch (the overlap test)
FORMAT = 1  # the version of ``records_to_dict``'s layout


# ---------------------------------------------------------------------------------- compact
def compact(records: WhiteBoxRecords) -> WhiteBoxRecords:
    """The records a run file keeps (module doc): the same checks run on them."""
    probes = records.noise is None  # the probes' noise is read only without the noise's
    steps = tuple(_compact_step(s, probes) for s in records.steps)
    noise = records.noise
    if noise is not None:
        run_z = {}
        for name, z in noise.run_z.items():
            z = np.asarray(z, dtype=np.float64)
            kept = np.zeros_like(z)
            if z.size:
                k = int(np.argmax(z))
                kept[k] = z[k]
            run_z[name] = kept
        noise = replace(noise, run_z=run_z, segments=[("all tensors", 0, FRESHNESS_BUCKETS)])
    by = records.by_example
    if by is not None:
        by = _compact_sampling(by)
    return replace(records, steps=steps, noise=noise, by_example=by)


def _compact_step(step: StepRecord, probes: bool) -> StepRecord:
    noise = step.noise
    if noise is not None:
        sketch, error = noise.sketch, noise.sketch_error
        if sketch is not None and sketch.size > FRESHNESS_BUCKETS:
            error = error * math.ceil(sketch.size / FRESHNESS_BUCKETS)
            sketch = _fold(np.asarray(sketch, dtype=np.float64).copy(), FRESHNESS_BUCKETS)
        noise = replace(noise, counts=None, sketch=sketch, sketch_error=float(error))
    return replace(step, probe_noise=step.probe_noise if probes else None, noise=noise)


def _compact_sampling(by: ExampleSampling) -> ExampleSampling:
    """The batches' records with the sketches folded in half down to ``SAMPLING_BUCKETS``
    buckets (bucket b and b + m / 2 joined, as ``sampling_record`` folds past its budget)
    and the participation counts sorted."""
    sig = np.asarray(by.signatures, dtype=np.float64)
    sizes = np.asarray(by.bucket_sizes, dtype=np.float64)
    signed = np.asarray(by.bucket_signed, dtype=np.float64)
    while sizes.size > SAMPLING_BUCKETS and sizes.size % 2 == 0:
        half = sizes.size // 2
        sig = sig[:, :half] + sig[:, half:]
        sizes = sizes[:half] + sizes[half:]
        signed = signed[:half] + signed[half:]
    # sums of +-1 and counts: integers, kept as such (a list of small integers is short)
    sig, sizes, signed = (x.astype(np.int64) if np.array_equal(x, np.rint(x)) else x
                          for x in (sig, sizes, signed))
    return replace(by, counts=np.sort(np.asarray(by.counts, dtype=np.int64)),
                   signatures=sig, bucket_sizes=sizes, bucket_signed=signed)


# ------------------------------------------------------------------------------ to / from
_INTS = ("<i1", "<i2", "<i4", "<i8")
_DTYPES = tuple(np.dtype(t) for t in ("|b1", "<u8", "<f8", *_INTS))


def _array(x) -> dict | None:
    """An array as JSON (module doc): its dtype, shape and bytes in base64."""
    if x is None:
        return None
    a = np.asarray(x)
    if a.dtype.kind == "b":
        dtype = "|b1"
    elif a.dtype.kind == "u" and a.dtype.itemsize == 8:
        dtype = "<u8"  # hashes: every bit matters
    elif a.dtype.kind in "iu":
        lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
        dtype = next(t for t in _INTS if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max)
    else:
        dtype = "<f8"
    raw = np.ascontiguousarray(a, dtype=dtype).tobytes()
    return {"dtype": np.dtype(dtype).str, "shape": list(a.shape),
            "base64": base64.b64encode(raw).decode("ascii")}


def _is_array(v) -> bool:
    return isinstance(v, dict) and set(v) == {"dtype", "shape", "base64"}


def _from_array(d, what: str) -> np.ndarray | None:
    if d is None:
        return None
    try:
        dtype = np.dtype(d["dtype"])
        if dtype not in _DTYPES:
            raise ValueError(f"dtype {d['dtype']!r}")
        raw = base64.b64decode(d["base64"].encode("ascii"), validate=True)
        a = np.frombuffer(raw, dtype=dtype).reshape([int(k) for k in d["shape"]])
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"white-box records: {what} is not an array record ({err})") from err
    kind = {"b": np.bool_, "u": np.uint64, "f": np.float64}.get(dtype.kind, np.int64)
    return a.astype(kind)


def _floats(values) -> dict:
    """A column of floats, NaN where one is missing (None)."""
    return _array(np.array([np.nan if v is None else float(v) for v in values],
                           dtype=np.float64))


def _from_floats(d, what: str) -> list[float | None]:
    return [None if np.isnan(v) else float(v) for v in _from_array(d, what).tolist()]


def _ints(values) -> dict:
    """A column of counts or indices (>= 0), -1 where one is missing (None)."""
    return _array(np.array([-1 if v is None else int(v) for v in values], dtype=np.int64))


def _from_ints(d, what: str) -> list[int | None]:
    return [None if v < 0 else int(v) for v in _from_array(d, what).tolist()]


def records_to_dict(records: WhiteBoxRecords) -> dict:
    """Plain JSON types of ``records`` (usually ``compact`` ones): the steps column by
    column, each nested record by its fields, arrays with their dtype and shape."""
    steps = records.steps
    noised = [i for i, s in enumerate(steps) if s.noise is not None]
    ranked = [i for i, s in enumerate(steps) if s.ranks_release is not None]
    probes = [i for i, s in enumerate(steps) if s.probe_noise is not None]
    table = {
        "step": _ints(s.step for s in steps),
        "noise_std": _floats(s.noise_std for s in steps),
        "divisor": _floats(s.divisor for s in steps),
        "batch_size": _ints(s.batch_size for s in steps),
        "released_sq": _array(np.stack([s.released_sq for s in steps]) if steps else
                              np.zeros((0, len(records.dims)))),
        "noised_sq": _floats(s.noised_sq for s in steps),
        "dtype_eps": _floats(s.dtype_eps for s in steps),
        "clip_bound": _floats(s.clip_bound for s in steps),
        "probe_noise": None if not probes else {
            "steps": _ints(probes), "values": _array(np.stack([steps[i].probe_noise
                                                               for i in probes]))},
        "ranks_release": None if not ranked else {
            "steps": _ints(ranked), **{f.name: _floats(getattr(steps[i].ranks_release, f.name)
                                                       for i in ranked)
                                       for f in fields(RanksRelease)}},
        "noise": None if not noised else _noise_steps([steps[i].noise for i in noised],
                                                      noised),
    }
    out = {"format": FORMAT, "names": list(records.names), "dims": list(records.dims),
           "max_grad_norm": records.max_grad_norm, "steps": table,
           "noise": None if records.noise is None else _noise_run(records.noise),
           "by_example": None if records.by_example is None else _sampling(
               records.by_example)}
    for name in ("clipping", "sampling", "accountant_history", "by_example_reason",
                 "accountant"):
        out[name] = getattr(records, name)
    out["integrity"] = _plain(records.integrity)
    out["noise_source"] = _plain(records.noise_source)
    out["adaptive"] = _plain(records.adaptive)
    out["independence"] = _plain(records.independence)
    return out


def _plain(rec) -> dict | None:
    """A flat record dataclass: arrays as array records, tuples as lists, the rest as is."""
    if rec is None:
        return None
    return {f.name: _array(v) if isinstance(v, np.ndarray) else v
            for f in fields(rec) for v in (getattr(rec, f.name),)}


def _from_plain(cls, d, what: str):
    if d is None:
        return None
    if not isinstance(d, dict):
        raise ValueError(f"white-box records: {what} must be an object")
    names = {f.name for f in fields(cls)}
    missing = [f.name for f in fields(cls) if f.name not in d
               and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ValueError(f"white-box records: {what} lacks {missing}")
    values = {}
    for k, v in d.items():
        if k not in names:
            continue
        if _is_array(v):
            v = _from_array(v, f"{what}.{k}")
        values[k] = v
    for k in ("first_data_dependent", "first_stale"):  # tuples, as the probe writes them
        if values.get(k) is not None:
            values[k] = tuple(values[k])
    return cls(**values)


def _noise_steps(noise: list[NoiseStep], index: list[int]) -> dict:
    vectors = sorted({v for n in noise for v in n.lag_z})
    sketched = all(n.sketch is not None for n in noise)
    counted = all(n.counts is not None for n in noise)
    return {
        "steps": _ints(index),
        "sq": _array(np.stack([n.sq for n in noise])),
        "m4": _array(np.stack([n.m4 for n in noise])),
        "rounding": _floats(n.rounding for n in noise),
        "lag_z": {v: _floats(n.lag_z.get(v) for n in noise) for v in vectors},
        "lag_at": {v: _ints(n.lag_at.get(v) for n in noise) for v in vectors},
        "counts": _array(np.stack([n.counts for n in noise])) if counted else None,
        "sketch": _array(np.stack([n.sketch for n in noise])) if sketched else None,
        "sketch_error": _floats(n.sketch_error for n in noise),
    }


def _noise_run(run: NoiseRun) -> dict:
    peaks = {}
    for name, z in run.run_z.items():
        z = np.asarray(z, dtype=np.float64)
        nonzero = np.flatnonzero(z)
        peaks[name] = {"lags": int(z.size), "at": nonzero.tolist(),
                       "z": _floats(z[nonzero].tolist())}
    return {"names": list(run.names), "dims": list(run.dims), "source": run.source,
            "vectors": dict(run.vectors), "lags": dict(run.lags), "run_z": peaks,
            "heads": [list(h) for h in run.heads], "fold": run.fold,
            "tensor_counts": _array(run.tensor_counts),
            "segments": [list(s) for s in run.segments]}


def _sampling(by: ExampleSampling) -> dict:
    counts = np.asarray(by.counts, dtype=np.int64)
    values, times = np.unique(counts, return_counts=True)
    out = _plain(by)
    out["counts"] = {"values": _array(values), "times": _array(times)}  # a histogram
    out["set_hashes"] = _array(np.asarray(by.set_hashes, dtype=np.uint64))
    return out


def records_from_dict(d: dict) -> WhiteBoxRecords:
    """The ``WhiteBoxRecords`` that ``records_to_dict`` wrote (a ValueError names what is
    missing or malformed)."""
    if not isinstance(d, dict):
        raise ValueError(f"white-box records must be a JSON object, got {type(d).__name__}")
    if d.get("format") != FORMAT:
        raise ValueError(f"white-box records: format {d.get('format')!r}, this dpaudit reads "
                         f"format {FORMAT}")
    try:
        steps = _steps_from(d["steps"])
        return WhiteBoxRecords(
            names=list(d["names"]), dims=[int(x) for x in d["dims"]],
            max_grad_norm=float(d["max_grad_norm"]), steps=steps,
            noise=None if d.get("noise") is None else _noise_run_from(d["noise"]),
            clipping=d.get("clipping"), sampling=d.get("sampling"),
            accountant_history=d.get("accountant_history"),
            by_example=None if d.get("by_example") is None else _sampling_from(
                d["by_example"]),
            by_example_reason=d.get("by_example_reason"),
            integrity=_from_plain(IntegrityRecord, d.get("integrity"), "integrity"),
            noise_source=_from_plain(NoiseSourceRecord, d.get("noise_source"),
                                     "noise_source"),
            adaptive=_from_plain(AdaptiveRecord, d.get("adaptive"), "adaptive"),
            independence=_from_plain(IndependenceRecord, d.get("independence"),
                                     "independence"),
            accountant=d.get("accountant"),
        )
    except KeyError as err:
        raise ValueError(f"white-box records lack {err}") from err
    except TypeError as err:
        raise ValueError(f"white-box records are malformed ({err})") from err


def _steps_from(t: dict) -> tuple[StepRecord, ...]:
    index = _from_ints(t["step"], "steps.step")
    n = len(index)
    released = _from_array(t["released_sq"], "steps.released_sq")
    columns = {k: _from_floats(t[k], f"steps.{k}") for k in
               ("noise_std", "divisor", "noised_sq", "dtype_eps", "clip_bound")}
    sizes = _from_ints(t["batch_size"], "steps.batch_size")
    noise: list[NoiseStep | None] = [None] * n
    if t.get("noise") is not None:
        at = _from_ints(t["noise"]["steps"], "noise.steps")
        for i, ns in zip(at, _noise_steps_from(t["noise"]), strict=True):
            noise[i] = ns
    ranks: list[RanksRelease | None] = [None] * n
    if t.get("ranks_release") is not None:
        rr = t["ranks_release"]
        cols = {f.name: _from_floats(rr[f.name], f"ranks_release.{f.name}")
                for f in fields(RanksRelease)}
        for k, i in enumerate(_from_ints(rr["steps"], "ranks_release.steps")):
            row = {name: col[k] for name, col in cols.items()}
            ranks[i] = RanksRelease(**{**row, "ranks": int(row["ranks"])})
    probes: list[np.ndarray | None] = [None] * n
    if t.get("probe_noise") is not None:
        values = _from_array(t["probe_noise"]["values"], "steps.probe_noise")
        for k, i in enumerate(_from_ints(t["probe_noise"]["steps"], "probe_noise.steps")):
            probes[i] = values[k]
    return tuple(
        StepRecord(step=index[i], noise_std=columns["noise_std"][i],
                   divisor=columns["divisor"][i], batch_size=sizes[i],
                   released_sq=released[i], probe_noise=probes[i], noise=noise[i],
                   noised_sq=columns["noised_sq"][i], dtype_eps=columns["dtype_eps"][i],
                   clip_bound=columns["clip_bound"][i], ranks_release=ranks[i])
        for i in range(n))


def _noise_steps_from(t: dict) -> list[NoiseStep]:
    sq = _from_array(t["sq"], "noise.sq")
    m4 = _from_array(t["m4"], "noise.m4")
    counts = _from_array(t.get("counts"), "noise.counts")
    sketch = _from_array(t.get("sketch"), "noise.sketch")
    rounding = _from_floats(t["rounding"], "noise.rounding")
    sketch_error = _from_floats(t["sketch_error"], "noise.sketch_error")
    lag_z = {v: _from_floats(z, f"noise.lag_z.{v}") for v, z in t["lag_z"].items()}
    lag_at = {v: _from_ints(a, f"noise.lag_at.{v}") for v, a in t["lag_at"].items()}
    out = []
    for k in range(len(rounding)):
        out.append(NoiseStep(
            sq=sq[k], m4=m4[k], counts=None if counts is None else counts[k],
            rounding=float(rounding[k]),
            lag_z={v: z[k] for v, z in lag_z.items() if z[k] is not None},
            lag_at={v: a[k] for v, a in lag_at.items() if a[k] is not None},
            sketch=None if sketch is None else sketch[k],
            sketch_error=float(sketch_error[k])))
    return out


def _noise_run_from(t: dict) -> NoiseRun:
    run_z = {}
    for name, peak in t["run_z"].items():
        z = np.zeros(int(peak["lags"]))
        z[np.asarray(peak["at"], dtype=np.int64)] = _from_floats(peak["z"], "noise.run_z")
        run_z[name] = z
    return NoiseRun(names=list(t["names"]), dims=[int(x) for x in t["dims"]],
                    source=t["source"], vectors=dict(t["vectors"]), lags=dict(t["lags"]),
                    run_z=run_z, heads=[tuple(h) for h in t["heads"]], fold=int(t["fold"]),
                    tensor_counts=_from_array(t["tensor_counts"], "noise.tensor_counts"),
                    segments=[tuple(s) for s in t["segments"]])


def _sampling_from(t: dict) -> ExampleSampling:
    hist = t["counts"]
    values = dict(t)
    values["counts"] = np.repeat(_from_array(hist["values"], "by_example.counts"),
                                 _from_array(hist["times"], "by_example.counts"))
    values["set_hashes"] = _from_array(t["set_hashes"], "by_example.set_hashes")
    return _from_plain(ExampleSampling, values, "by_example")
