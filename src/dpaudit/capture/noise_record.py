"""The noise DP-SGD really added, recovered at every step and kept as sketches.

Opacus' ``add_noise`` sets ``p.grad = p.summed_grad + noise`` for every parameter (flat, ghost
and distributed optimizers alike), so right after it the noise is ``p.grad - p.summed_grad``,
at every coordinate of every tensor: whatever produced it (Opacus' generator, a patched
function, a bug). ``NoiseRecorder.record`` reads it there into one float64 buffer (under DPDDP
the buffers of all ranks are summed: the noise of the step as released after the all-reduce),
divides by the claimed sigma C and keeps, per step, what ``stats.noise_law`` tests, never the
vector:

* per tensor, ||z||^2 (the scale) and sum min(z^2, 9)^2 (a tail moment: the law);
* counts of a sample of coordinates (every tensor's block at a seeded offset, about 1024 per
  step) in the marginal bins, per step and per tensor over the run (the law);
* the Hoeffding statistic of the products z_i z_{i+L} at every lag L of two vectors: the
  whole noise folded to at most 1024 buckets and the concatenated heads of every tensor: Q and
  V summed over the run (their spectra are summed, one FFT per vector and step), and the
  largest per step on the first step and a seeded quarter of the others (alignment within a
  step);
* every tensor folded to at most 256 buckets (a sketch: the freshness across steps). When the
  stored sketches pass ``SKETCH_BUDGET`` entries, every one is folded in half again, so memory
  and the final test's cost stay bounded however long training runs.

The release is rounded to the parameters' dtype after the sum is added, so a recovered
coordinate is within eps/2 |release| of the noise; that bound is carried with every statistic
and the tests stay conservative. The O(d) part (reading the noise, its norms, the folds, the
sample) runs as a few memory-bound passes on the parameters' device; what leaves it per step is
at most a few thousand numbers, tested on the CPU (FFTs of 2048 points). The sample's offsets come
from the recorder's own seeded generator (never the training's).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.fft
import torch

from dpaudit import seeds
from dpaudit.capture.records import NoiseRun, NoiseStep
from dpaudit.stats.noise_law import FFT_ERROR, TRUNCATE, marginal_bins, marginal_edges

FOLD = 1024  # the whole noise folded to at most this many buckets (alignment test)
HEAD_TOTAL = 1024  # coordinates of the concatenated tensor heads (alignment test)
MIN_HEAD = 32  # the shortest head a tensor gets
SAMPLE = 1024  # coordinates sampled per step for the marginal law
MIN_SAMPLE = 32  # per tensor (or all of a smaller one)
STEP_SHARE = 0.25  # share of the steps whose alignment is also tested on its own
CHUNK = 32  # steps whose small vectors are tested together (amortises the per-call cost)
SKETCH_PER_TENSOR = 256  # buckets per tensor in the step sketch (a power of two)
SKETCH_BUDGET = 1 << 22  # stored sketch entries (steps x columns) before folding them again
MIN_SEGMENT = 64  # sketch columns a tensor needs to be tested on its own across steps


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def _fold(x, k: int):
    """``x`` (n,) (a numpy array or a tensor) folded to k buckets: bucket b = sum of x[b],
    x[b + k], x[b + 2k], ..."""
    n = x.shape[0]
    if k >= n:
        return x
    whole = n - n % k
    out = x[:whole].reshape(-1, k).sum(0)
    if whole < n:
        out[: n - whole] += x[whole:]
    return out


def _spectra(vectors: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
    """For each (x (P, n): P steps' vectors, err (P,): their entries' error bound): |FFT|^2
    of x and of (|x| + err)^2, zero-padded for linear correlations, as (P, 2, size//2+1);
    their inverse FFTs are Q_L = sum_i x_i x_{i+L} and V_L = sum_i (|x_i| + err)^2
    (|x_{i+L}| + err)^2 at every lag L (``lags_from_spectra``). One FFT call for all."""
    size = 1 << (2 * max(x.shape[1] for x, _ in vectors) - 1).bit_length()
    out = []
    for x, err in vectors:
        rows = np.stack([x, (np.abs(x) + np.asarray(err)[:, None]) ** 2], axis=1)
        f = scipy.fft.rfft(rows, size, axis=-1, workers=1)  # zero-padded to size
        out.append(f.real**2 + f.imag**2)
    return out


def lags_from_spectra(power: np.ndarray, n: int, slack) -> np.ndarray:
    """The Hoeffding statistic max(|Q_L| - slack_Q, 0) / sqrt(V_L + slack_V) at every lag
    L = 1..n - 1, from (sums of) ``_spectra`` of vectors of length n, (..., 2, f) -> (...,
    lags); ``slack`` (..., 2) (``lag_slack``) bounds how far the computed Q and V can be from
    the true vector's (so the statistic is a lower bound on the true one)."""
    size = 2 * (power.shape[-1] - 1)
    qv = scipy.fft.irfft(power, size, axis=-1, workers=1)[..., 1:n]
    q, v = qv[..., 0, :], qv[..., 1, :]
    slack = np.asarray(slack, dtype=np.float64)
    sq, sv = slack[..., 0, None], slack[..., 1, None]
    return np.maximum(np.abs(q) - sq, 0.0) / np.sqrt(np.maximum(v + sv, 1e-300))


def lag_slack(x: np.ndarray, err) -> np.ndarray:
    """(P, 2): how far Q_L and V_L of each row of ``x`` (P, n), at any lag, can be from the
    true vector's when every entry is within ``err`` (P,) of it, FFT rounding included:
    |Q_L - true Q_L| <= 2 err ||x||_1 + n err^2 + the FFT's error on sum x^2, and the V of
    ``_spectra`` (already built on |x| + err) within the FFT's error on sum (|x| + err)^4."""
    err = np.asarray(err, dtype=np.float64)
    fft = FFT_ERROR * (2 * x.shape[-1]).bit_length()
    a = (np.abs(x) + err[..., None]) ** 2
    q = (2.0 * err * np.abs(x).sum(axis=-1) + x.shape[-1] * err * err
         + fft * (x * x).sum(axis=-1))
    return np.stack([q, fft * (a * a).sum(axis=-1)], axis=-1)


class NoiseRecorder:
    """Recover and sketch the noise of every step (module doc).

    Args:
        params: the optimizer's parameters, in its order.
        names: their names.
        seed: seeds the coordinate sample's own generator.
        distributed: sum the ranks' noise (Opacus' DPDDP: rank 0 adds it, the all-reduce
            releases the sum).
    """

    def __init__(self, params: list[torch.Tensor], names: list[str], seed: int,
                 distributed: bool = False) -> None:
        self.params = list(params)
        self.names = list(names)
        self.dims = [int(p.numel()) for p in self.params]
        self.offsets = np.concatenate([[0], np.cumsum(self.dims)]).astype(int)
        self.total = int(self.offsets[-1])
        self.distributed = bool(distributed)
        j_n = len(self.params)
        self.fold = min(self.total, FOLD)
        per_head = max(MIN_HEAD, HEAD_TOTAL // max(1, j_n))
        self.head_len = [min(d, per_head) for d in self.dims]
        # the heads add nothing when they are every coordinate and the fold is the identity
        self.vector_names = ("folded",) if (
            self.head_len == self.dims and self.fold == self.total) else ("folded", "heads")
        self.sample_len = [
            min(d, max(MIN_SAMPLE, math.ceil(SAMPLE * d / self.total))) for d in self.dims
        ]
        self.sketch_len = [_pow2_floor(min(d, SKETCH_PER_TENSOR)) for d in self.dims]
        self._rng = seeds.stream(seed, seeds.NOISE_SKETCH)
        self._buf: torch.Tensor | None = None
        self._sample_ids = np.repeat(np.arange(j_n), self.sample_len)
        self._sample_room = np.array(self.dims) - np.array(self.sample_len) + 1
        self._cuts = np.cumsum([j_n, j_n, sum(self.sample_len), self.fold,
                                sum(self.head_len) if "heads" in self.vector_names else 0])
        self._sketch_factor = max(math.ceil(d / k) for d, k in zip(self.dims, self.sketch_len,
                                                                   strict=True))
        self._stored = 0
        self._pending: list[tuple] = []  # (step index, small vectors, rounding, alone)
        self.steps: list[dict] = []  # per step: sq, counts, rounding, lag z / lag, sketch, err
        self._tensor_counts = np.zeros((j_n, len(marginal_edges()) + 1), dtype=np.int64)
        self._run: dict[str, list] = {}  # vector -> [spectra summed (2, f), slack sum, length]
        self._folds = 0  # times the stored sketches were folded in half

    # ------------------------------------------------------------------ per step
    def _start(self, device: torch.device) -> None:
        # on the CPU the O(d) part runs in numpy on zero-copy views (a fraction of torch's
        # per-call cost on small tensors); on an accelerator, and under DPDDP, in torch
        self._numpy = device.type == "cpu" and not self.distributed and all(
            p.dtype in (torch.float32, torch.float64) for p in self.params)  # numpy's dtypes
        # the release is rounded to its dtype (and the sum was, too): the coarsest one bounds
        self._eps = max(float(torch.finfo(p.dtype).eps) for p in self.params)
        self._buf = (np.empty(self.total) if self._numpy
                     else torch.empty(self.total, dtype=torch.float64, device=device))
        self._lengths = torch.tensor(self.dims, device=device)

    def _segment_sums(self, t):
        """Each tensor's sum of ``t`` (the whole buffer's layout), direct sums."""
        if self._numpy:
            return np.add.reduceat(t, self.offsets[:-1])
        return torch.segment_reduce(t, "sum", lengths=self._lengths)

    def _tensors(self):
        """(release, clipped sum) of every parameter, flat, as numpy views or tensors."""
        out = []
        for p in self.params:
            summed = getattr(p, "summed_grad", None)
            if p.grad is None or summed is None:
                raise RuntimeError(
                    "the noise could not be read: a parameter has no clipped sum or no gradient "
                    "after add_noise (pass record_noise=False to AuditHook to skip the noise law)"
                )
            g, c = p.grad.detach().reshape(-1), summed.detach().reshape(-1)
            out.append((g.numpy(), c.numpy()) if self._numpy else (g, c))
        return out

    @torch.no_grad()
    def _reduce(self, noise_std: float) -> tuple[np.ndarray, float]:
        """The O(d) part, where the parameters live: the noise of this step (all tensors, in
        one float64 buffer, summed over the ranks under DPDDP) reduced to the small vectors
        the tests need, on the CPU and divided by ``noise_std``: [sq (J), sample, folded,
        heads, sketch]; and the largest recovery error of one coordinate (same units)."""
        xp = np if self._numpy else torch
        h = self._buf
        tops = []
        for (g, c), o, d in zip(self._tensors(), self.offsets, self.dims, strict=False):
            if self._numpy:  # both read as float64 (exact), subtracted in one pass
                np.subtract(g, c, out=h[o : o + d], dtype=np.float64)
            else:
                h[o : o + d] = g  # exact: float32 (or 16) into float64
                h[o : o + d] -= c
            tops.append(xp.maximum(g.max(), -g.min()))  # |release|'s max, no temporary
        world = 1
        if self._numpy:
            worst = float(max(tops))
        else:  # one synchronisation, not one per tensor
            top = torch.stack(tops).max().double()
            if self.distributed:  # the released noise is the ranks' sum
                world = torch.distributed.get_world_size()
                torch.distributed.all_reduce(h)
                torch.distributed.all_reduce(top, op=torch.distributed.ReduceOp.MAX)
            worst = float(top)
        offs = self.offsets
        starts = self._rng.integers(0, self._sample_room)
        parts = [h[o : o + d] for o, d in zip(offs, self.dims, strict=False)]
        t = h * h  # one temporary for every tensor's sums
        sq = self._segment_sums(t) / noise_std
        cap = (TRUNCATE * noise_std) ** 2  # min(z^2, 9)^2: a tail moment with a bounded term
        xp.clip(t, None, cap, out=t)
        t *= t
        m4 = self._segment_sums(t) / noise_std**3
        sample = [h[o + s : o + s + m] for o, s, m in
                  zip(offs, starts.tolist(), self.sample_len, strict=False)]
        heads = ([h[o : o + n] for o, n in zip(offs, self.head_len, strict=False)]
                 if "heads" in self.vector_names else [])
        sketch = [_fold(x, k) for x, k in zip(parts, self.sketch_len, strict=True)]
        small = xp.concatenate([sq, m4, *sample, _fold(h, self.fold), *heads, *sketch])
        if not self._numpy:
            small = small.cpu().numpy()
        # a release rounded to the dtype (eps / 2 of it), then a float64 subtraction
        err = world * (self._eps / 2.0 + 2.0**-52) * worst / noise_std
        return small / noise_std, err

    def record(self, opt, noise_std: float) -> None:
        """Right after the optimizer's ``add_noise``: recover this step's noise and reduce it
        to its small vectors; they are tested in chunks of ``CHUNK`` steps (``_flush``)."""
        if self._buf is None:
            self._start(self.params[0].device)
        if not noise_std > 0:  # nothing claimed to test against: the step is not sketched
            self.steps.append({})
            return
        small, r = self._reduce(noise_std)
        # the first step, and a seeded share of the others, is also tested alone for alignment
        alone = not self.steps or float(self._rng.random()) < STEP_SHARE
        self._pending.append((len(self.steps), small, r, alone))
        self.steps.append({})
        if len(self._pending) >= CHUNK:
            self._flush()

    def _flush(self) -> None:
        """Sketch the pending steps at once: marginal counts, the alignment spectra (summed
        into the run's, and the lags of the steps tested alone), the freshness sketches."""
        if not self._pending:
            return
        index, smalls, rs, alone = zip(*self._pending, strict=True)
        self._pending = []
        rs, alone = np.asarray(rs), np.asarray(alone)
        sq, m4, sample, folded, heads, sketch = np.split(np.stack(smalls), self._cuts, axis=1)
        j_n, b_n = self._tensor_counts.shape
        rows = np.arange(len(index))[:, None] * j_n + self._sample_ids[None, :]
        counts = np.bincount((rows * b_n + marginal_bins(sample)).ravel(),
                             minlength=len(index) * j_n * b_n).reshape(len(index), j_n, b_n)
        self._tensor_counts += counts.sum(axis=0)
        vectors = {"folded": (folded, math.ceil(self.total / self.fold) * rs)}
        if "heads" in self.vector_names:
            vectors["heads"] = (heads, rs)
        vectors = {k: v for k, v in vectors.items() if v[0].shape[1] > 1}
        lag_z: list[dict] = [{} for _ in index]
        lag_at: list[dict] = [{} for _ in index]
        spectra = _spectra(list(vectors.values())) if vectors else []
        for (name, (x, e)), power in zip(vectors.items(), spectra, strict=True):
            slack = lag_slack(x, e)
            acc = self._run.setdefault(name, [0.0, 0.0, x.shape[1]])
            acc[0] = acc[0] + power.sum(axis=0)
            acc[1] = acc[1] + slack.sum(axis=0)
            picked = np.flatnonzero(alone)
            if picked.size:
                z = lags_from_spectra(power[picked], x.shape[1], slack[picked])
                for i, row in zip(picked, z, strict=True):
                    k = int(np.argmax(row))
                    lag_z[i][name], lag_at[i][name] = float(row[k]), k + 1
        factor = self._sketch_factor * (1 << self._folds)
        for i, t in enumerate(index):
            self.steps[t] = {
                "sq": sq[i], "m4": m4[i], "counts": counts[i].sum(axis=0),
                "rounding": float(rs[i]),
                "lag_z": lag_z[i], "lag_at": lag_at[i], "sketch": sketch[i],
                "sketch_error": factor * float(rs[i]),
            }
        self._stored += len(index)
        self._bound_sketches()

    def _bound_sketches(self) -> None:
        """Fold every stored sketch in half when they pass ``SKETCH_BUDGET`` entries."""
        if self._stored * sum(self.sketch_len) <= SKETCH_BUDGET or max(self.sketch_len) == 1:
            return
        stored = [s for s in self.steps if s]
        while len(stored) * sum(self.sketch_len) > SKETCH_BUDGET and max(
                self.sketch_len) > 1:
            new_len = [max(1, k // 2) for k in self.sketch_len]
            for s in stored:
                parts = np.split(s["sketch"], np.cumsum(self.sketch_len)[:-1])
                s["sketch"] = np.concatenate([
                    p if k == nk else p[:nk] + p[nk:] for p, k, nk in
                    zip(parts, self.sketch_len, new_len, strict=True)])
                s["sketch_error"] *= 2
            self.sketch_len = new_len
            self._folds += 1

    # ------------------------------------------------------------------ results
    def noise_steps(self) -> list[NoiseStep | None]:
        """Each step's ``NoiseStep`` (None for a step with no claimed noise)."""
        self._flush()
        return [
            NoiseStep(sq=s["sq"], m4=s["m4"], counts=s["counts"], rounding=s["rounding"],
                      lag_z=dict(s["lag_z"]), lag_at=dict(s["lag_at"]), sketch=s["sketch"],
                      sketch_error=s["sketch_error"]) if s else None
            for s in self.steps
        ]

    def run(self, source: str) -> NoiseRun:
        """The layout and the run's sums (``NoiseRun``)."""
        self._flush()
        run_z = {name: lags_from_spectra(power, n, slack)
                 for name, (power, slack, n) in self._run.items()}
        heads, start = [], 0
        for name, n in zip(self.names, self.head_len, strict=True):
            heads.append((name, start, n))
            start += n
        cols = np.concatenate([[0], np.cumsum(self.sketch_len)]).astype(int)
        segments = [(name, int(a), int(b)) for name, a, b in
                    zip(self.names, cols[:-1], cols[1:], strict=True) if b - a >= MIN_SEGMENT]
        segments.append(("all tensors", 0, int(cols[-1])))
        return NoiseRun(
            names=list(self.names), dims=list(self.dims), source=source,
            vectors={k: v for k, v in {
                "folded": (f"the whole noise ({self.total} coordinates)" if self.fold ==
                           self.total else f"the whole noise ({self.total} coordinates) "
                           f"folded to {self.fold} buckets"),
                "heads": f"the first {max(self.head_len)} coordinates (or all) of each of "
                         f"{len(self.dims)} tensors, concatenated ({sum(self.head_len)})",
            }.items() if k in self._run},
            lags={k: n - 1 for k, n in
                  (("folded", self.fold), ("heads", sum(self.head_len))) if k in self._run},
            run_z=run_z, heads=heads, fold=self.fold,
            tensor_counts=self._tensor_counts.copy(), segments=segments,
        )
