"""Typed white-box records: what the hook keeps of each step, and of a whole training.

``StepRecord`` is one optimizer step as the white-box checks read it; ``NoiseStep`` its sketch
of the noise the optimizer really added (``capture.noise_record``); ``NoiseRun`` what that
sketch accumulated over the run; ``ExampleSampling`` which examples each batch used,
``IntegrityRecord`` whether the model moved only inside the private step, ``NoiseSourceRecord``
whether the noise ignored the data, ``IndependenceRecord`` whether the gradient canaries stayed
out of the data's reach; ``WhiteBoxRecords`` a training's records with what the hook
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
            keeps them per tensor, summed over the steps); None in compact records
            (``records_io.compact``: only the run's counts per tensor are kept).
        rounding: the largest error of one recovered coordinate (the release is rounded to
            the parameters' dtype before the sum is subtracted).
        lag_z: vector name -> the largest Hoeffding statistic over its lags this step.
        lag_at: vector name -> the lag where it was found.
        sketch: (K,) every tensor folded to at most 256 buckets, concatenated (long runs
            fold every stored sketch further to keep T x K bounded: ``NoiseRun.segments``
            gives the final layout; compact records fold it to a few numbers), or None.
        sketch_error: the largest error of one sketch entry.
    """

    sq: np.ndarray
    m4: np.ndarray
    counts: np.ndarray | None
    rounding: float
    lag_z: dict[str, float]
    lag_at: dict[str, int]
    sketch: np.ndarray | None
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
class RanksRelease:
    """Under DPDDP, one step's release against the ranks' noised sums, through a linear sketch
    (``capture.ranks_release``): P folds every tensor to at most ``ranks_release.BUCKETS``
    buckets (bucket i mod K, K prime), so P(sum over ranks of x_r) = sum over ranks of
    P(x_r): the ranks' sketches are summed by one all-reduce of O(tensors x K) numbers.

    Attributes:
        released: ||P(release x divisor)||^2 (the all-reduced release each rank applies).
        noised: ||P(S)||^2, S the sum over the ranks of their noised clipped sums (each read
            right after its ``add_noise``).
        cross: <P(release x divisor), P(S)>.
        error: a bound on ||P(release x divisor) / c - P(S)|| when release x divisor = c S
            up to the float rounding of the division and the all-reduce: (ranks + 2) x the
            dtype's epsilon / 2 (plus float64's) times sqrt(sum_j m_j N_j^2), N_j the sum over
            the ranks of their tensor j's norm and m_j its coordinates per bucket.
        ranks: the processes whose noised sums were summed.
    """

    released: float
    noised: float
    cross: float
    error: float
    ranks: int


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step as the white-box checks read it.

    Attributes:
        step: its index among the real optimizer steps.
        noise_std: the claimed noise std sigma C at that step (the optimizer's own).
        divisor: what the released gradient was divided by (released sum = gradient x it).
        batch_size: examples in the step's batch, the logical batch under
            BatchMemoryManager (the rows clipped since the previous step; None when unknown:
            ghost clipping keeps no per-sample gradients).
        released_sq: (J,) squared norms of each tensor's released sum.
        probe_noise: (n,) the released sum at the noise probes minus the canaries inserted
            there, or None.
        noise: the sketch of the noise the optimizer added, or None when not recorded.
        noised_sq: the squared norm of the noised clipped sum right after ``add_noise`` (all
            tensors; the release times the divisor must equal it), or None (DPDDP: the
            release is the ranks' sum, compared through ``ranks_release``).
        dtype_eps: the coarsest machine epsilon of the optimizer's parameters (the release's
            rounding).
        clip_bound: the clip bound C the step's noise is scaled by (adaptive clipping: C_t;
            None: the run's one ``max_grad_norm``).
        ranks_release: under DPDDP, the release against the sum of the ranks' noised sums
            (``RanksRelease``), or None.
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
    clip_bound: float | None = None
    ranks_release: RanksRelease | None = None


@dataclass(frozen=True)
class AdaptiveRecord:
    """Adaptive clipping's own release (Opacus' ``AdaClipDPOptimizer``), step by step.

    Attributes:
        sigma: the noise multiplier the accountant is told (``noise_multiplier``).
        sigma_gradient: the multiplier of the noise added to the clipped gradient sum,
            (sigma^-2 - (2 sigma_u)^-2)^(-1/2) (Andrew et al. 2021, Theorem 1).
        sigma_count: the std sigma_u of the noise added to the count of unclipped examples.
        target_quantile / learning_rate / min_bound / max_bound: the bound's update rule,
            C_{t+1} = clamp(C_t exp(-learning_rate (noisy count / batch size - target)), min,
            max).
        bounds: (T,) the clip bound C_t each step clipped and noised with.
        counts: (T,) the true count of unclipped examples (read before the noise).
        noisy_counts: (T,) the count the optimizer released (after its noise).
        sizes: (T,) the number of examples the optimizer counted (its ``sample_size``).
        next_bound: the bound after the last step (what its update produced).
    """

    sigma: float
    sigma_gradient: float
    sigma_count: float
    target_quantile: float
    learning_rate: float
    min_bound: float
    max_bound: float
    bounds: np.ndarray
    counts: np.ndarray
    noisy_counts: np.ndarray
    sizes: np.ndarray
    next_bound: float


@dataclass(frozen=True)
class ExampleSampling:
    """Which examples each batch the training loader yielded used, in O(n + T) memory
    (``capture.sampling_record``; tested by ``stats.sampling.sampling_by_example_test``).

    Attributes:
        n: the data set's size (indices 0..n-1).
        source: what was recorded (the sampler, BatchMemoryManager's logical batches, the
            union over the ranks).
        counts: (n,) how many recorded batches each example was in.
        sizes: (T,) the batches' sizes (with repetitions).
        signatures: (T, m) each batch's count sketch (example i adds its sign to its bucket).
        bucket_sizes / bucket_signed: (m,) the examples per bucket and their sign sums.
        set_hashes: (T,) uint64, an exact hash of each batch's multiset of indices.
        duplicate_batches: batches in which an example appears more than once.
        duplicate_witness: the first such batch, example and count.
        out_of_range: indices outside 0..n-1 (not counted).
        optimizer_steps: optimizer steps taken while recording.
        ranks: processes whose batches were joined (DPDDP), 1 otherwise.
        rank_sizes: (T, ranks) each rank's own batch size in each joined batch (DPDDP), or
            None.
        rank_examples: each rank's share of the data set (its sampler's examples), or None.
    """

    n: int
    source: str
    counts: np.ndarray
    sizes: np.ndarray
    signatures: np.ndarray
    bucket_sizes: np.ndarray
    bucket_signed: np.ndarray
    set_hashes: np.ndarray
    duplicate_batches: int
    duplicate_witness: dict
    out_of_range: int
    optimizer_steps: int
    ranks: int = 1
    rank_sizes: np.ndarray | None = None
    rank_examples: list[int] | None = None

    @property
    def batches(self) -> int:
        return int(self.sizes.size)


@dataclass(frozen=True)
class IntegrityRecord:
    """Whether the model moved only inside the private step (``capture.integrity``).

    Attributes:
        names / kinds: the tensors watched, each "dp" (a parameter the DP optimizer updates),
            "other" (a model parameter outside its groups, trainable or frozen) or "buffer".
        steps: the private steps (the base optimizer's) seen.
        changed_between: (J,) how many times each tensor changed between the end of one
            private step and the start of the next (not explained by ``post_step``).
        first_between: (J,) the private step after which it first did (-1: never).
        changed_inside: (J,) how many times a non-"dp" tensor changed during a private step.
        first_inside: (J,) the first such step (-1: never).
        explained: changes between steps that the declared ``post_step`` reproduced exactly.
        largest_change: tensor name -> the largest |difference| from what the declared
            ``post_step`` gives (only where one was declared and did not explain a change).
        post_step: whether a post-processing was declared.
    """

    names: list[str]
    kinds: list[str]
    steps: int
    changed_between: np.ndarray
    first_between: np.ndarray
    changed_inside: np.ndarray
    first_inside: np.ndarray
    explained: int = 0
    largest_change: dict | None = None
    post_step: bool = False


@dataclass(frozen=True)
class NoiseSourceRecord:
    """The noise probe's outcome (``capture.noise_probe``): at seeded steps, the optimizer's
    own ``add_noise`` was run on zero clipped sums with the generators' states saved.

    Attributes:
        names: the optimizer's tensors.
        steps_probed: the steps probed (conclusively or not).
        conclusive: the probed steps where the same zero sums, with every state restored, gave
            the same noise twice (the probe's premise).
        inconclusive: the probed steps where they did not (a state the probe cannot restore).
        data_dependent: (J,) per tensor, the probed conclusive steps where the real clipped sum
            got a different noise than the zero sum from the same state.
        stale: (J,) per tensor, the conclusive steps where the noise did not change when the
            generator advanced.
        first_data_dependent / first_stale: (step, tensor, size in units of sigma C) of the
            first of each, or None.
        reason: why the probe did not run at all (None when it did).
        failures / failure: probed steps where the probe's own calls of ``add_noise`` raised
            (training went on; the real call is untouched), and the first error.
    """

    names: list[str]
    steps_probed: int
    conclusive: int
    inconclusive: int
    data_dependent: np.ndarray
    stale: np.ndarray
    first_data_dependent: tuple | None = None
    first_stale: tuple | None = None
    reason: str | None = None
    failures: int = 0
    failure: str | None = None


@dataclass(frozen=True)
class IndependenceRecord:
    """Whether the sparse gradient canaries stayed out of the data's reach
    (``capture.independence``): the data's clipped sum on their support, read before each
    insertion, must be exactly zero at every step.

    Attributes:
        steps: the steps watched.
        sets: per canary set of the hook, a dict: ``set`` (its index), ``watched`` (False for
            input and dense gradient canaries), ``canaries``; when watched also
            ``coordinates`` (its support's size), ``live_canaries`` / ``live_coordinates``
            (reached by the data at some step), ``first_step`` (-1: never), ``largest`` (the
            largest |data's clipped sum| seen there, in units of the step's C),
            ``first_live`` (up to 8 reached coordinates: ``coordinate``, ``parameter``,
            ``position``, ``step``, ``largest``) and ``live_rows`` (the reached canaries'
            indices in the set).
    """

    steps: int
    sets: list[dict]

    def of_set(self, index: int) -> dict | None:
        """The entry of canary set ``index`` (None when there is none)."""
        return next((s for s in self.sets if s["set"] == index), None)


@dataclass(frozen=True)
class WhiteBoxRecords:
    """A training's white-box records: its steps, the run-level noise sketch, the clipping
    probes' summary, and what the caller adds (``sampling``: {"n", "q", "loader"};
    ``accountant_history``: the accountant's (sigma, q, steps) entries); ``by_example`` the
    loader's batches (or ``by_example_reason``, why not), ``integrity`` and ``noise_source``
    the other doors' records (None: not recorded), ``independence`` whether the sparse
    gradient canaries stayed out of the data's reach, ``accountant`` the name of the
    accountant whose epsilon the user reads (``rdp`` / ``prv`` / ``gdp``; None: unknown).
    ``names`` / ``dims``: the optimizer's tensors, in the order of every (J,) array;
    ``layer_bounds``: per-layer clipping's bound C_p of each tensor, in that order (None:
    flat or adaptive clipping)."""

    names: list[str]
    dims: list[int]
    max_grad_norm: float
    steps: tuple[StepRecord, ...]
    noise: NoiseRun | None = None
    clipping: dict | None = None
    sampling: dict | None = None
    accountant_history: list | None = None
    by_example: ExampleSampling | None = None
    by_example_reason: str | None = None
    integrity: IntegrityRecord | None = None
    noise_source: NoiseSourceRecord | None = None
    adaptive: AdaptiveRecord | None = None
    independence: IndependenceRecord | None = None
    accountant: str | None = None
    layer_bounds: tuple[float, ...] | None = None

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def clip_bounds(self) -> np.ndarray:
        """(T,) the clip bound C of each step (adaptive clipping's C_t, else C)."""
        return np.asarray([self.max_grad_norm if s.clip_bound is None else s.clip_bound
                           for s in self.steps], dtype=np.float64)

    @property
    def noise_multipliers(self) -> np.ndarray:
        """(T,) the multiplier of the noise each step added to its clipped sum (std / C_t)."""
        return self.noise_stds / self.clip_bounds

    @property
    def claimed_multipliers(self) -> np.ndarray:
        """(T,) the noise multiplier the claim composes: the optimizer's ``noise_multiplier``
        (under adaptive clipping the accountant's sigma, smaller than the gradient's)."""
        if self.adaptive is not None:
            return np.full(self.num_steps, float(self.adaptive.sigma))
        return self.noise_multipliers

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
