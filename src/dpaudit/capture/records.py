"""Typed white-box records: what the hook keeps of each step, and of a whole training.

``StepRecord`` is one optimizer step as the white-box checks read it; ``NoiseStep`` its sketch
of the noise the optimizer really added (``capture.noise_record``); ``NoiseRun`` what that
sketch accumulated over the run; ``WhiteBoxRecords`` a training's records with what the hook
cannot know by itself (the data set's size and rate, the accountant's history). The hook builds
them (``AuditHook.white_box_records``); ``run_audit``, the CLI and the own loop's
``audit_report`` all judge them with ``experiment.judging.white_box``. Plain numpy, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NoiseStep:
    """One step's sketch of the noise z = release - clipped sum, in units of the claimed
    sigma C (every optimizer tensor, all coordinates unless said).

    Attributes:
        sq: (J,) ||z_j||^2 per tensor.
        m4: (J,) sum over each tensor's coordinates of min(z^2, 9)^2 (a truncated fourth
            moment: every term is bounded, so its sum has an exact Bernstein tail).
        counts: (B,) counts of the step's sampled coordinates in
            ``stats.noise_law.marginal_edges()``'s bins, pooled over tensors (``NoiseRun``
            keeps them per tensor, summed over the steps).
        rounding: the largest error of one recovered coordinate (the release is rounded to
            the parameters' dtype before the sum is subtracted).
        lag_z: vector name -> the largest Hoeffding statistic over its lags this step.
        lag_at: vector name -> the lag where it was found.
        sketch: (K,) every tensor folded to at most 256 buckets, concatenated (long runs
            fold every stored sketch further to keep T x K bounded: ``NoiseRun.segments``
            gives the final layout).
        sketch_error: the largest error of one sketch entry.
    """

    sq: np.ndarray
    m4: np.ndarray
    counts: np.ndarray
    rounding: float
    lag_z: dict[str, float]
    lag_at: dict[str, int]
    sketch: np.ndarray
    sketch_error: float


@dataclass(frozen=True)
class NoiseRun:
    """The noise sketch's layout and what it accumulated over the run.

    ``names`` / ``dims``: the optimizer's tensors (all of them: the noise is checked
    wherever it is released); ``source``: how the noise was read; ``vectors``: the alignment
    test's vectors (name -> what it is), ``lags`` how many lags each examined and ``run_z``
    (name -> (lags,)) the Hoeffding statistic at every lag of the Q and V sums over the run;
    ``heads``: (tensor, start, length) of each tensor's head in the "heads" vector;
    ``fold``: buckets of the "folded" vector; ``tensor_counts``: (J, B) the marginal
    counts per tensor over the run; ``segments``: (name, start, stop) columns of the
    sketches tested on their own.
    """

    names: list[str]
    dims: list[int]
    source: str
    vectors: dict[str, str]
    lags: dict[str, int]
    run_z: dict[str, np.ndarray]
    heads: list[tuple[str, int, int]]
    fold: int
    tensor_counts: np.ndarray
    segments: list[tuple[str, int, int]]


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step as the white-box checks read it.

    Attributes:
        step: its index among the real optimizer steps.
        noise_std: the claimed noise std sigma C at that step (the optimizer's own).
        divisor: what the released gradient was divided by (released sum = gradient x it).
        batch_size: examples in the step's batch (None when unknown: BatchMemoryManager,
            ghost clipping).
        released_sq: (J,) squared norms of each tensor's released sum.
        probe_noise: (n,) the released sum at the noise probes minus the canaries inserted
            there, or None.
        noise: the sketch of the noise the optimizer added, or None when not recorded.
        noised_sq: the squared norm of the noised clipped sum right after ``add_noise`` (all
            tensors; the release times the divisor must equal it), or None (DPDDP).
        dtype_eps: the parameters' machine epsilon (the release's rounding).
    """

    step: int
    noise_std: float
    divisor: float
    batch_size: int | None
    released_sq: np.ndarray
    probe_noise: np.ndarray | None = None
    noise: NoiseStep | None = None
    noised_sq: float | None = None
    dtype_eps: float = float(np.finfo(np.float32).eps)


@dataclass(frozen=True)
class WhiteBoxRecords:
    """A training's white-box records: its steps, the run-level noise sketch, the clipping
    probes' summary, and what the caller adds (``sampling``: {"n", "q", "loader"};
    ``accountant_history``: the accountant's (sigma, q, steps) entries). ``names`` /
    ``dims``: the optimizer's tensors, in the order of every (J,) array."""

    names: list[str]
    dims: list[int]
    max_grad_norm: float
    steps: tuple[StepRecord, ...]
    noise: NoiseRun | None = None
    clipping: dict | None = None
    sampling: dict | None = None
    accountant_history: list | None = None

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def released_sq(self) -> np.ndarray:
        """(J, T) squared norms of the released sums."""
        return np.stack([s.released_sq for s in self.steps], axis=1)

    @property
    def noise_stds(self) -> np.ndarray:
        """(T,) the claimed sigma C of each step."""
        return np.asarray([s.noise_std for s in self.steps], dtype=np.float64)

    @property
    def batch_sizes(self) -> list[int | None]:
        return [s.batch_size for s in self.steps]

    @property
    def probe_noise(self) -> np.ndarray | None:
        """(n, T) the noise at the probes, or None when no probes were recorded."""
        if not self.steps or self.steps[0].probe_noise is None:
            return None
        return np.stack([s.probe_noise for s in self.steps], axis=1)

    @property
    def noise_steps(self) -> list[NoiseStep]:
        """The steps' noise sketches (steps without one, e.g. sigma = 0, are left out)."""
        return [s.noise for s in self.steps if s.noise is not None]
