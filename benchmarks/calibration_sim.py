"""The noise checks' tail where a whole audit is not needed: the records' path simulated at
>= 10^5 draws (the sibling of ``calibration.py``).

Three parts, each printing the fraction of p-values below 1e-2 / 1e-3 / 1e-4 (and per cell
below 1e-5 / 1e-6) with its exact Clopper-Pearson 95% interval and whether it lies within 3
standard errors of a valid p-value's rate:

* ``exact``: ``stats.noise.chi2_floor`` (``noise_floor_test``) on exact chi-square inputs
  (numpy's) with the default audit's dims (1.weight 25,600, 1.bias 400, 3.weight 4,000,
  3.bias 10) and T steps, ``--exact`` audits. Under this null every cell is exact, so the
  rate of p < a lies in [1 - (1 - a / K)^(J T), a] (K = J T + J cells; printed).
* ``records``: the records' path itself, ``--records`` steps: at every step Opacus' own
  ``_generate_noise`` draws each tensor's noise (torch's CPU generator, seeded once, in the
  default audit's order and std sigma C = 6), the release is p.grad = summed_grad + noise in
  float32 (a fixed clipped sum of norm 64 = B C), and dpaudit's ``NoiseRecorder`` recovers and
  sketches it exactly as in an audit; every T steps the audit's own ``_noise_law`` (noise_scale,
  noise_marginal, noise_alignment, noise_freshness) and ``noise_floor_test`` (on the release
  divided by B in float32, as ``scale_grad`` does) give one audit's p-values. Every cell's
  chi-square p-value is also counted, from the drawn noise and from the records.
* ``cells``: ``--cells`` cells of 25,600 coordinates (the witness of issue 61's default seed
  732) from ``_generate_noise``, drawn k at a time (bit for bit the draws of k calls: checked),
  each cell's chi-square lower-tail p-value counted down to 1e-6.

Run (the table in docs/evidence.md, "The noise checks' tail"; one core, about 25 minutes):

    OMP_NUM_THREADS=1 python benchmarks/calibration_sim.py --exact 100000 --records 200000 \\
        --cells 4000000
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from scipy.stats import chi2

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration import LEVELS, clopper_pearson, tail_rows, within_valid

DIMS = {"1.weight": (400, 64), "1.bias": (400,), "3.weight": (10, 400), "3.bias": (10,)}
STD = 6.0  # the default audit's sigma C
BATCH = 64  # its expected batch (the release is divided by it)
CELL_LEVELS = (1e-3, 1e-4, 1e-5, 1e-6)
LEVEL = 1e-6  # any level: the p-values do not depend on it


def cell_rows(name: str, log_p: np.ndarray) -> str:
    """One row of per-cell counts below ``CELL_LEVELS``."""
    n = log_p.size
    cells = []
    for a in CELL_LEVELS:
        k = int(np.sum(log_p < math.log(a)))
        lo, hi = clopper_pearson(k, n)
        cells.append(f"{k} ({n * a:.1f}) [{lo:.1e}, {hi:.1e}] "
                     f"({'ok' if within_valid(k, n, a) else 'EXCESS'})")
    return f"| {name} | {n} | " + " | ".join(cells) + " |"


def cell_header() -> list[str]:
    return ["| cells | n | " + " | ".join(
        f"p < {a:g}: count (expected) [95% CP] (3 SE ok)" for a in CELL_LEVELS) + " |",
        "|---|---|" + "---|" * len(CELL_LEVELS)]


def exact_part(audits: int, steps: int, seed: int) -> list[str]:
    """chi2_floor on exact chi-square inputs with the default dims (module doc)."""
    from dpaudit.stats.noise import noise_floor_test

    d = np.array([int(np.prod(s)) for s in DIMS.values()], dtype=float)
    rng = np.random.default_rng([seed, 1])
    ps = []
    for _ in range(audits):
        x = rng.chisquare(d[:, None], size=(d.size, steps))
        ps.append(noise_floor_test(x, d, 1.0, level=LEVEL).p_value)
    cells = d.size * steps + d.size
    lows = ", ".join(f"{a:g}: [{1 - (1 - a / cells) ** (d.size * steps):.4g}, {a:g}]"
                     for a in LEVELS)
    return [f"exact chi-square inputs, dims {d.astype(int).tolist()}, T = {steps}: {audits} "
            f"audits; a valid rate lies in ({lows})", *tail_rows({"chi2_floor": ps})]


def records_part(total: int, steps: int, seed: int) -> list[str]:
    """The records' path: Opacus' draws through dpaudit's NoiseRecorder (module doc)."""
    import torch
    from opacus.optimizers.optimizer import _generate_noise

    from dpaudit.capture.noise_record import NoiseRecorder
    from dpaudit.experiment.judging.white_box import _noise_law, _scale_rounding
    from dpaudit.stats.noise import noise_floor_test

    torch.set_num_threads(1)
    names = list(DIMS)
    d = np.array([int(np.prod(s)) for s in DIMS.values()])
    g = np.random.default_rng([seed, 2]).standard_normal(int(d.sum()))
    g *= BATCH / np.linalg.norm(g)  # the largest clipped sum: B examples of norm C, aligned
    parts = np.split(g.astype(np.float32), np.cumsum(d)[:-1])
    params = [torch.zeros(s) for s in DIMS.values()]
    sums = [torch.from_numpy(a.copy()).reshape(s) for a, s in zip(parts, DIMS.values(),
                                                                  strict=True)]
    torch.manual_seed(seed)
    pv: dict[str, list[float]] = {}
    drawn_lp, rec_lp = [], []
    audits = total // steps
    for a in range(audits):
        rec = NoiseRecorder(params, names, seed=seed + a)
        released = np.zeros((len(names), steps))
        drawn = np.zeros((len(names), steps))
        for t in range(steps):
            for j, (p, s) in enumerate(zip(params, sums, strict=True)):
                p.summed_grad = s
                noise = _generate_noise(std=STD, reference=p.summed_grad)
                p.grad = (p.summed_grad + noise).view_as(p)  # Opacus' add_noise
                nn = noise.reshape(-1).numpy()
                drawn[j, t] = np.einsum("i,i->", nn, nn, dtype=np.float64)
                r = p.grad / BATCH  # scale_grad, in float32
                released[j, t] = float(torch.linalg.vector_norm(r, dtype=torch.float64)
                                       ** 2) * BATCH * BATCH
            rec.record(None, STD)
        steps_ = rec.noise_steps()
        run = rec.run("release minus the clipped sum (simulated)")
        eps = float(torch.finfo(torch.float32).eps)
        ns = SimpleNamespace(noise=run, steps=[SimpleNamespace(step=t, noise=s, dtype_eps=eps)
                                               for t, s in enumerate(steps_)])
        out = _noise_law(ns, LEVEL)
        out["noise_floor"] = noise_floor_test(released, d, STD, level=LEVEL, names=names,
                                              scale_rounding=_scale_rounding(ns, 3))
        for k, res in out.items():
            pv.setdefault(k, []).append(res.p_value)
        sq = np.stack([s.sq for s in steps_], axis=1)
        r = np.array([s.rounding for s in steps_])
        upper = (np.sqrt(sq) + np.sqrt(d)[:, None] * r[None, :]) ** 2
        drawn_lp.append(chi2.logcdf(drawn / STD**2, d[:, None]))
        rec_lp.append(chi2.logcdf(upper, d[:, None]))
    drawn_lp, rec_lp = np.concatenate(drawn_lp, axis=1), np.concatenate(rec_lp, axis=1)
    out = [f"the records' path: {audits} audits of T = {steps} steps ({audits * steps} steps, "
           f"{audits * steps * len(names)} cells), Opacus' _generate_noise (torch "
           f"{torch.__version__}, CPU) through NoiseRecorder", *tail_rows(pv), "",
           "per cell (each tensor, each step), chi-square lower tail:", *cell_header()]
    for j, name in enumerate(names):
        out.append(cell_rows(f"{name} (d={d[j]}), drawn", drawn_lp[j]))
        out.append(cell_rows(f"{name} (d={d[j]}), recorded", rec_lp[j]))
    out.append(cell_rows("all, drawn", drawn_lp.ravel()))
    out.append(cell_rows("all, recorded", rec_lp.ravel()))
    gap = np.max(np.abs(rec_lp - drawn_lp)) / math.log(10)
    out.append(f"largest |log10 p recorded - log10 p drawn| over the cells: {gap:.2e}; "
               f"recorded >= drawn (conservative) in every cell: "
               f"{bool(np.all(rec_lp >= drawn_lp - 1e-12))}")
    return out


def cells_part(total: int, seed: int, batch: int = 16) -> list[str]:
    """Cells of 25,600 coordinates from Opacus' ``_generate_noise`` (module doc)."""
    import torch
    from opacus.optimizers.optimizer import _generate_noise

    torch.set_num_threads(1)
    dim = 25600
    # k cells in one call are bit for bit k calls of one cell (a multiple of 16 coordinates:
    # torch's Box-Muller blocks line up, and the uniforms are consumed in order)
    torch.manual_seed(seed)
    one_call = _generate_noise(STD, torch.empty(batch, dim))
    torch.manual_seed(seed)
    calls = torch.stack([_generate_noise(STD, torch.empty(dim)) for _ in range(batch)])
    if not torch.equal(one_call, calls):
        raise RuntimeError("batched draws differ from single calls: the batch is not the path")
    torch.manual_seed(seed + 1)
    ref = torch.empty(batch, dim)
    lp = np.empty(total)
    for i in range(0, total, batch):
        n = _generate_noise(STD, ref).numpy()
        k = min(batch, total - i)
        x = np.einsum("ij,ij->i", n[:k], n[:k], dtype=np.float64) / STD**2
        lp[i:i + k] = chi2.logcdf(x, dim)
    return [f"{total} cells of {dim} coordinates from _generate_noise (torch "
            f"{torch.__version__}, CPU), sigma C = {STD}", *cell_header(),
            cell_rows(f"d={dim}", lp)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--exact", type=int, default=100000, help="audits of exact chi-squares")
    p.add_argument("--records", type=int, default=100000, help="steps of the records' path")
    p.add_argument("--cells", type=int, default=0, help="cells of 25,600 from the generator")
    p.add_argument("--steps", type=int, default=100, help="steps per audit (T)")
    p.add_argument("--seed", type=int, default=61)
    args = p.parse_args()
    for name in ("exact", "records", "cells"):
        if getattr(args, name) < 0:
            p.error(f"--{name} must be >= 0")
    if args.steps < 2:
        p.error("--steps must be >= 2")
    warnings.simplefilter("ignore")
    for name, run in (("exact", lambda: exact_part(args.exact, args.steps, args.seed)),
                      ("records", lambda: records_part(args.records, args.steps, args.seed)),
                      ("cells", lambda: cells_part(args.cells, args.seed))):
        if getattr(args, name):
            t0 = time.perf_counter()
            lines = run()
            print("\n".join(lines))
            print(f"({name}: {time.perf_counter() - t0:.0f} s wall)\n", flush=True)


if __name__ == "__main__":
    main()
