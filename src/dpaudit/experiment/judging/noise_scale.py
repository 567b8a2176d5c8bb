"""The noise's scale at the granularity the accountant needs (issue 65; DESIGN 4.5, "the
user's epsilon, from both sides").

A worst-case example puts its whole clipped norm where the noise is smallest: under flat
clipping, step t is the claimed Gaussian step at sigma_t min_j r_{j,t} (r_{j,t} the true
scale of tensor j's noise over the claimed sigma C); under per-layer clipping, with bounds
C_g (sum C_g^2 = C^2) and one group per tensor, at sigma_t r_t with
1 / r_t^2 = sum_g (C_g^2 / C^2) / r_{g,t}^2. One scale pooled over every tensor and step (the
root-mean-square) lets a small tensor's deficit, or a few steps', be averaged away.

``measured_scales`` bounds every step's scale from below, jointly over the steps:

* **cells**: each tensor's steps are cut into runs whose number is fixed by its size alone
  (``stats.premises.run_counts``, at least ``MIN_DRAWS`` coordinates per run): a large
  tensor is bounded step by step, a small one over long runs, the smallest over the whole
  training. Each (tensor, run) cell has its exact one-sided chi-square lower end;
* **its failure probability** is split before the data over units
  (``stats.premises.equal_width_alphas``; ``cell_design``): under flat clipping a unit is a
  group of tensors cut into the same runs on one run, each of its tensors' cells getting the
  unit's probability (the smallest scale of a step is one tensor's: intersection-union,
  ``stats.premises`` module doc), the budget the sum of the atoms' largest; under per-layer
  clipping a unit is a cell and the budget their sum (every tensor's scale enters). Equal
  lower ends at the median, and ``FLOOR`` of the budget spread evenly;
* **each step's scale** is the smallest lower end over the tensors an example can reach
  (flat), or their per-layer combination; the audit's own canary block
  (``capture.canary_block``), whose per-example gradient is exactly zero for every input, is
  left out: its noise protects no example.

What it assumes, and names: each tensor's scale is constant within each of its runs. A
tensor with fewer than ``MIN_DRAWS`` noise coordinates over the whole training is bounded
over every step, loosely: it is named (``too_few_draws``), and where it sets a step's bound
the upper side says so (``binding``); it is not averaged away. The one-scale figure of
before (every tensor and step one scale: the pooled interval) is kept beside, named as such.

``effective_history`` turns the per-step multipliers into an accountant history, each
rounded down onto a relative grid (``QUANTUM``) so that equal values merge (composition does
not depend on the order of the steps) and the PRV composition stays cheap; rounding down
keeps the bound an upper bound.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.stats import beta

from dpaudit.accounting import rdp_history_epsilon
from dpaudit.capture.canary_block import NAME as CANARY_BLOCK
from dpaudit.capture.records import WhiteBoxRecords
from dpaudit.stats.premises import (
    equal_width_alphas,
    run_counts,
    run_edges,
    scale_lower,
    scale_lowers,
)

# the fewest noise coordinates a run of a tensor holds (the relative standard deviation of
# its scale's estimate is 1 / sqrt(2 D): 1% at 5,000): a tensor of d coordinates is bounded
# over runs of about MIN_DRAWS / d steps, step by step from d = 5,000
MIN_DRAWS = 5000
# the part of the noise's failure probability spread evenly over the cells (per atom), the rest
# equalising the cells' widths (``cell_design``)
FLOOR = 0.1
# the relative grid each step's effective multiplier is rounded down onto (0.1%), and the
# most distinct multipliers the composition gets (the grid doubles until it fits)
QUANTUM = 1e-3
MAX_ENTRIES = 32
# the noise's share of the upper side's failure probability is chosen before the data among
# these (``noise_share``), the rate taking the rest
SHARES = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# under adaptive clipping, the count's noise takes this range of the noise's share (its part
# of the step's precision, clipped)
COUNT_SHARE = (0.05, 0.5)
# adaptive clipping: the sensitivity of the count of unclipped examples the upper side composes
# (Opacus counts 0 or 1 per example; Theorem 1 of Andrew et al., which the claim's sigma
# assumes, takes 1/2: ``judging.adaptive``'s adaptive_accounting check)
COUNT_SENSITIVITY = 1.0
FLAT, PER_LAYER = "smallest tensor", "per-layer combination"
ASSUMES = ("each tensor's noise scale is constant within each of its runs of steps (a "
           "tensor of d coordinates pools about {draws:,} / d consecutive steps; one with too "
           "few draws, every step)")


def reached(names) -> np.ndarray:
    """(J,) whether an example's gradient can reach each tensor: all but the audit's own
    canary block (``capture.canary_block``: its per-example gradient is exactly zero for
    every input, whatever the parameters)."""
    return np.array([CANARY_BLOCK not in str(n).split(".") for n in names], dtype=bool)


def layer_weights(records: WhiteBoxRecords) -> np.ndarray | None:
    """(J,) C_g^2 / C^2 per tensor under per-layer clipping (one group per tensor, as Opacus'
    ``DPPerLayerOptimizer``), or None (flat or adaptive clipping, or bounds not recorded)."""
    bounds = getattr(records, "layer_bounds", None)
    if bounds is None or len(bounds) != len(records.dims):
        return None
    c = np.asarray(bounds, dtype=np.float64) ** 2
    total = float(c.sum())
    return c / total if total > 0 else None


@dataclass(frozen=True)
class StepScales:
    """Each noised step's lower bound on its effective noise scale (module doc).

    Attributes:
        scales: (T,) per real step: the lower end of its smallest scale over the reached
            tensors (flat) or of their per-layer combination; nan at steps without noise.
        rule: ``FLAT`` or ``PER_LAYER``.
        budget: the failure probability of all the bounds together.
        width: the lower end's distance below the truth at every cell's median sum (the
            design's common width w).
        atoms: the blocks whose cells the budget counts (flat), or None (every cell).
        tensors: per tensor, a plain-JSON summary (``tensor``, ``reached``, ``runs``,
            ``steps_per_run``, ``draws_per_run``, ``lower`` (the smallest of its cells),
            ``alpha`` (its cells' probabilities summed), ``too_few_draws``, ``binding_steps``:
            the steps whose bound it sets under flat clipping).
        too_few_draws: the reached tensors with fewer than ``MIN_DRAWS`` coordinates over the
            training (bounded over every step, loosely).
        binding: the tensors that set at least one step's bound (flat clipping), most steps
            first.
    """

    scales: np.ndarray
    rule: str
    budget: float
    width: float
    atoms: int | None
    tensors: list[dict] = field(default_factory=list)
    too_few_draws: list[str] = field(default_factory=list)
    binding: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        """Plain JSON: the design and what bound each step (not the (T,) array itself)."""
        s = self.scales[np.isfinite(self.scales)]
        return {"rule": self.rule, "budget": self.budget, "width": self.width,
                "atoms": self.atoms, "min_draws": MIN_DRAWS,
                "smallest": float(s.min()) if s.size else None,
                "median": float(np.median(s)) if s.size else None,
                "largest": float(s.max()) if s.size else None,
                "too_few_draws": list(self.too_few_draws), "binding": list(self.binding),
                "assumes": ASSUMES.format(draws=MIN_DRAWS), "tensors": self.tensors}


def _noised(records: WhiteBoxRecords) -> np.ndarray:
    return np.array([i for i, s in enumerate(records.steps) if s.noise is not None],
                    dtype=np.int64)


def cell_design(dims, reach, steps: int, budget: float, per_layer: bool
                ) -> tuple[list[np.ndarray], list[np.ndarray], float, int | None]:
    """The cells and their failure probabilities, from the sizes alone (before any data):
    per tensor its run edges and each run's probability (empty for unreached tensors), the
    common width w and the atoms counted (None: every cell). Memoised: a pure function of the
    design, the same at every audit of one set-up (and at every replicate of a study)."""
    return _cell_design(tuple(float(x) for x in np.asarray(dims).reshape(-1)),
                        tuple(bool(x) for x in np.asarray(reach).reshape(-1)), int(steps),
                        float(budget), bool(per_layer), FLOOR, MIN_DRAWS)


@functools.lru_cache(maxsize=64)
def _cell_design(dims: tuple, reach: tuple, steps: int, budget: float, per_layer: bool,
                 floor: float, min_draws: int):
    d = np.asarray(dims, dtype=np.float64)
    reach = np.asarray(reach, dtype=bool)
    runs = run_counts(d, steps, min_draws)
    edges = [run_edges(steps, int(m)) for m in runs]
    rows = np.flatnonzero(reach)
    if rows.size == 0:
        return edges, [np.zeros(0) for _ in d], 0.0, None
    # the units the budget is counted over (module doc): under flat clipping one per (group of
    # tensors cut into the same runs, run), every tensor of the group getting the unit's
    # probability (the smallest scale of a group on a run is one tensor's); under per-layer
    # clipping one per cell (every tensor's scale enters each step)
    if per_layer:
        keys = [(int(j),) for j in rows]
        atoms = None
    else:
        keys = sorted({int(runs[j]) for j in rows})
        cut = np.unique(np.concatenate([edges[j] for j in rows]))
        atoms = int(cut.size - 1)
    unit_dofs, unit_of = [], {}
    for key in keys:
        members = [j for j in rows if (int(j),) == key] if per_layer else [
            j for j in rows if int(runs[j]) == key]
        lengths = np.diff(edges[members[0]])
        unit_of[key] = (len(unit_dofs), members)
        # the group's smallest tensor sets the width of its units
        unit_dofs.append(min(d[j] for j in members) * lengths)
    sizes = [u.size for u in unit_dofs]
    alphas, width = equal_width_alphas(np.concatenate(unit_dofs), (1.0 - floor) * budget,
                                       atoms)
    # every unit gets at least its equal part of FLOOR x budget: the large tensors' units, which
    # equal widths leave at the small tensors' width with almost no probability, are then
    # bounded near their own precision (the sum of the atoms' largest stays within the
    # budget: each part's is within its own)
    alphas = np.maximum(alphas, floor * budget / (alphas.size if atoms is None else atoms))
    starts = np.cumsum([0, *sizes])
    per = [np.zeros(0) for _ in d]
    for index, members in unit_of.values():
        for j in members:
            per[j] = alphas[starts[index]:starts[index + 1]]
    return edges, per, width, atoms


def unit_budget(alphas: list[np.ndarray], dims, reach, steps: int, per_layer: bool) -> float:
    """What a design's probabilities spend (``stats.premises`` module doc): under flat clipping
    the sum of the atoms' largest among the units' (one per group of tensors with the same
    runs and run: the group's largest), under per-layer clipping the sum over every cell."""
    d = np.asarray(dims, dtype=np.float64)
    rows = np.flatnonzero(np.asarray(reach, dtype=bool))
    if per_layer:
        return float(sum(alphas[j].sum() for j in rows))
    runs = run_counts(d, steps, MIN_DRAWS)
    units = []
    for m in sorted({int(runs[j]) for j in rows}):
        units.append(np.max([alphas[j] for j in rows if int(runs[j]) == m], axis=0))
    atoms = np.unique(np.concatenate([run_edges(steps, int(runs[j])) for j in rows])).size - 1
    return float(np.sort(np.concatenate(units))[::-1][:atoms].sum())


def step_lower_bounds(sq, dims, rounding, reach, budget: float, weights=None,
                      names=None) -> StepScales:
    """``measured_scales`` on arrays: ``sq`` (J, T) the noise's squared norms per tensor and
    noised step in units of the claimed sigma C, ``dims`` (J,), ``rounding`` (T,) the largest
    recovery error of one coordinate, ``reach`` (J,) the tensors an example can reach,
    ``weights`` (J,) C_g^2 / C^2 under per-layer clipping (None: flat). ``scales`` has one
    entry per column of ``sq``."""
    sq = np.asarray(sq, dtype=np.float64)
    d = np.asarray(dims, dtype=np.float64)
    reach = np.asarray(reach, dtype=bool)
    if sq.ndim != 2 or sq.shape[0] != d.size or reach.size != d.size:
        raise ValueError(f"sq must be (J, T) with J = len(dims) = len(reach), got {sq.shape}, "
                         f"{d.size} dims, {reach.size} reach flags")
    if not reach.any():
        raise ValueError("reach: at least one tensor must be reachable by an example")
    names = [f"tensor {j}" for j in range(d.size)] if names is None else list(names)
    per_layer = weights is not None
    t_n = sq.shape[1]
    edges, alphas, width, atoms = cell_design(d, reach, t_n, budget, per_layer)
    rounding2 = np.broadcast_to(np.asarray(rounding, dtype=np.float64), (t_n,)) ** 2
    lower = np.full((d.size, t_n), np.inf)
    tensors = []
    for j, name in enumerate(names):
        e = edges[j]
        entry = {"tensor": name, "reached": bool(reach[j]), "runs": int(e.size - 1),
                 "steps_per_run": float(t_n / (e.size - 1)),
                 "draws_per_run": int(d[j] * (t_n // (e.size - 1)))}
        if reach[j]:
            sums = np.add.reduceat(sq[j], e[:-1])
            errs = np.sqrt(d[j] * np.add.reduceat(rounding2, e[:-1]))
            lbs = scale_lowers(sums, d[j] * np.diff(e), alphas[j], errs)
            lower[j] = np.repeat(lbs, np.diff(e))
            entry.update(lower=float(lbs.min()), alpha=float(alphas[j].sum()),
                         too_few_draws=bool(d[j] * t_n < MIN_DRAWS))
        tensors.append(entry)
    rows = np.flatnonzero(reach)
    if per_layer:
        w = np.asarray(weights, dtype=np.float64)[rows]
        scales = 1.0 / np.sqrt(np.sum(w[:, None] / lower[rows] ** 2, axis=0))
        binding: list[str] = []
    else:
        at = rows[np.argmin(lower[rows], axis=0)]
        scales = lower[at, np.arange(t_n)]
        counts = np.bincount(at, minlength=d.size)
        for j, entry in enumerate(tensors):
            if reach[j]:
                entry["binding_steps"] = int(counts[j])
        binding = [names[j] for j in np.argsort(-counts, kind="stable") if counts[j] > 0]
    too_few = [names[j] for j in rows if d[j] * t_n < MIN_DRAWS]
    return StepScales(scales=scales, rule=PER_LAYER if per_layer else FLAT,
                      budget=float(budget), width=float(width), atoms=atoms,
                      tensors=tensors, too_few_draws=too_few, binding=binding)


def measured_scales(records: WhiteBoxRecords, budget: float) -> StepScales | None:
    """Each step's lower bound on its effective scale, jointly at failure probability
    ``budget`` (module doc; ``step_lower_bounds``), nan at steps without noise; None without
    noise records or when no tensor is reached."""
    steps = _noised(records)
    if records.noise is None or steps.size == 0:
        return None
    names = list(records.noise.names)
    reach = reached(names)
    if not reach.any():
        return None
    sq = np.stack([records.steps[i].noise.sq for i in steps], axis=1)  # (J, T)
    rounding = np.array([records.steps[i].noise.rounding for i in steps])
    out = step_lower_bounds(sq, records.noise.dims, rounding, reach, budget,
                            layer_weights(records), names)
    full = np.full(records.num_steps, np.nan)
    full[steps] = out.scales
    return replace(out, scales=full)


def pooled_lower(records: WhiteBoxRecords, budget: float) -> float | None:
    """The one-scale figure's lower end: every tensor and step pooled (the root-mean-square
    scale), one-sided at failure probability ``budget``. It assumes one scale everywhere."""
    steps = _noised(records)
    if records.noise is None or steps.size == 0:
        return None
    dims = np.asarray(records.noise.dims, dtype=np.float64)
    total = float(sum(float(records.steps[i].noise.sq.sum()) for i in steps))
    rounding = np.array([records.steps[i].noise.rounding for i in steps])
    err = float(np.sqrt(dims.sum() * np.sum(rounding**2)))
    return scale_lower(total, float(dims.sum() * steps.size), 1.0 - budget, err)


def one_scale_steps(records: WhiteBoxRecords, pooled: float) -> np.ndarray:
    """(T,) the one-scale figure's step scales: ``pooled`` at every noised step (nan
    elsewhere), combined by the same rule as the verified figure's (under per-layer clipping
    the reached tensors' share of C^2: r / sqrt(sum of their w_g))."""
    noised = np.array([s.noise is not None for s in records.steps], dtype=bool)
    scale = float(pooled)
    weights = layer_weights(records)
    if weights is not None and records.noise is not None:
        share = float(weights[reached(records.noise.names)].sum())
        if share > 0:
            scale /= np.sqrt(share)
    return np.where(noised, scale, np.nan)


def count_lower(records: WhiteBoxRecords, budget: float) -> float | None:
    """Adaptive clipping: the one-sided lower end of the count's noise scale (its std over
    the claimed sigma_u) from the T released counts against the true ones, at failure
    probability ``budget``; None without adaptive records. The count's float32 rounding
    (half an ulp of each released count) bounds the recovery error."""
    rec = records.adaptive
    if rec is None or rec.bounds.size == 0 or rec.sigma_count <= 0:
        return None
    z = (rec.noisy_counts - rec.counts) / rec.sigma_count
    err = float(np.sqrt(np.sum((np.abs(rec.noisy_counts) * 2.0**-24 / rec.sigma_count) ** 2)))
    return scale_lower(float(np.sum(z * z)), float(z.size), 1.0 - budget, err)


def count_share(records: WhiteBoxRecords) -> float:
    """Adaptive clipping: the count's part of the noise's failure probability, before the
    data: its share of the step's precision as the upper side composes it
    ((s / sigma_u)^2 over that plus 1 / sigma_g^2, s = ``COUNT_SENSITIVITY``), within
    ``COUNT_SHARE``; 0 without adaptive clipping."""
    rec = records.adaptive
    if rec is None or rec.sigma_count <= 0 or rec.sigma_gradient <= 0:
        return 0.0
    count = (COUNT_SENSITIVITY / rec.sigma_count) ** 2
    part = count / (count + rec.sigma_gradient**-2)
    return float(np.clip(part, *COUNT_SHARE))


def effective_history(multipliers, sample_rate: float) -> tuple[list, float]:
    """An accountant history of the steps' effective multipliers at ``sample_rate``: each
    rounded down onto the relative grid (1 + quantum)^k, equal ones merged wherever they
    stand; the quantum is ``QUANTUM``, doubled until at most ``MAX_ENTRIES`` remain.
    Returns (history, quantum)."""
    m = np.asarray(multipliers, dtype=np.float64)
    if m.size == 0:
        return [], QUANTUM
    if np.any(~np.isfinite(m)) or np.any(m <= 0):
        raise ValueError("multipliers must be finite and positive")
    quantum = QUANTUM
    while True:
        step = np.log1p(quantum)
        k = np.floor(np.log(m) / step + 1e-12)
        down = np.exp(k * step)
        down = np.where(down > m, np.exp((k - 1) * step), down)  # exp's rounding: never up
        values, counts = np.unique(down, return_counts=True)
        if values.size <= MAX_ENTRIES:
            break
        quantum *= 2
    history = [(float(v), float(sample_rate), int(c))
               for v, c in zip(values, counts, strict=True)]
    return history, quantum


def noise_share(records: WhiteBoxRecords, alpha: float, delta: float) -> float:
    """The noise's share of the upper side's failure probability ``alpha`` (the rate takes
    the rest), chosen before the data from the design alone: the claimed multipliers, the
    sizes of the tensors, the steps, n and the configured q. Each share's expected cost is
    linearised: the design's common width w (``cell_design``) times the accountant's
    elasticity in sigma, plus the rate's Clopper-Pearson upper end at the expected count
    n T q over q times its elasticity in q (RDP, finite differences); the cheapest of
    ``SHARES`` is taken. Any pre-data choice keeps the bounds valid; 0.5 when a number is
    missing."""
    s = records.sampling or {}
    n, q = s.get("n"), s.get("q")
    steps = _noised(records)
    if not n or not q or records.noise is None or steps.size == 0:
        return 0.5
    sigma = float(np.median(records.claimed_multipliers[steps]))
    t_n = int(steps.size)
    if not sigma > 0:
        return 0.5
    base = rdp_history_epsilon([(sigma, float(q), t_n)], delta)
    if not (np.isfinite(base) and base > 0):
        return 0.5
    e_sigma = (np.log(rdp_history_epsilon([(sigma * 0.97, float(q), t_n)], delta) / base)
               / -np.log(0.97))
    e_rate = (np.log(rdp_history_epsilon([(sigma, min(1.0, float(q) * 1.03), t_n)], delta)
                     / base) / np.log(1.03))
    trials = int(n) * t_n
    expected = round(trials * float(q))
    reach = reached(records.noise.names)
    if not reach.any() or expected >= trials:
        return 0.5
    per_layer = layer_weights(records) is not None
    best, cost = 0.5, np.inf
    for share in SHARES:
        a_noise = share * alpha * (1.0 - count_share(records))
        _, _, width, _ = cell_design(records.noise.dims, reach, t_n, a_noise, per_layer)
        q_up = float(beta.isf((1.0 - share) * alpha, expected + 1, trials - expected))
        c = -e_sigma * np.log1p(-min(width, 0.99)) + e_rate * np.log(q_up / float(q))
        if c < cost:
            best, cost = share, c
    return float(best)
