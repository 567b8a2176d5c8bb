"""Which examples each step used, recorded from the loader the user trains with.

The accountant's premise is Poisson sampling at rate q (every example independently, fresh at
every step, once). ``SamplingRecorder`` watches the batch sampler of the training loader
(Opacus' ``DPDataLoader`` and its distributed sampler, any ``DataLoader`` whose
``batch_sampler`` yields indices, and under ``BatchMemoryManager`` the logical batches of the
sampler it splits) and keeps, in O(n + T) memory, what ``stats.sampling`` tests:

* each example's participation count (n integers);
* each batch's size, an exact 64-bit hash of its multiset of indices (replayed batches are
  equal batches) and a count sketch of its index set: example i adds a sign s(i) to bucket
  h(i) of m <= 256 buckets (the overlap of two batches is the inner product of their
  sketches, up to the collisions the test accounts for); when T x m passes a budget the
  buckets are folded in half, as the noise sketches are;
* the number of batches in which an example was drawn more than once (one example, one row:
  the unit the accountant counts), and indices outside the data set.

The batch sampler is given a subclass whose ``__iter__`` records each batch as it is yielded
(``patching.ClassPatch``; special methods are looked up on the type), undone on ``detach``.
Every batch the sampler yields while attached is recorded, in order: under the claim they are
all i.i.d. Poisson draws, whichever of them the loop trains on. Under DPDDP each rank's
batches are exchanged at every optimizer step (one all-gather) and the i-th batches of the
ranks are recorded as one batch, their union (each rank's own batch size is kept too: ranks
that draw the same masks, a sampler seeded alike on every rank, sample the examples at one
shard position together): every rank then holds the same records. The
hashes h, s and the set hash come from splitmix64 keyed by the hook's seed, never from the
training's random streams.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader

from dpaudit.capture.patching import ClassPatch
from dpaudit.capture.records import ExampleSampling

BUCKETS = 256  # sketch buckets per batch (a power of two)
CHUNK_BATCHES = 32  # batches recorded at once (vectorised; at most this many wait)
SKETCH_BUDGET = 1 << 22  # stored sketch entries (batches x buckets) before folding
_CHUNK = 1 << 20
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray, key: int) -> np.ndarray:
    """splitmix64 of ``x`` (indices) under ``key``: a uint64 per index."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) * _GOLDEN + np.uint64(key)
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def resolve_batch_sampler(data_loader) -> tuple[object | None, int | None, str]:
    """(the batch sampler whose batches are the steps' logical batches, the data set's size,
    what it is) of a training loader; the sampler is None, with the reason, when the loader
    yields no batches of indices. A ValueError names ``data_loader`` when it is not a
    ``DataLoader``."""
    from opacus.utils.batch_memory_manager import BatchSplittingSampler
    from opacus.utils.uniform_sampler import (
        DistributedUniformWithReplacementSampler,
        UniformWithReplacementSampler,
    )

    if not isinstance(data_loader, DataLoader):
        raise ValueError(
            "data_loader must be the torch DataLoader you train with (Opacus' DPDataLoader, "
            "a DataLoader whose batch_sampler yields indices, or BatchMemoryManager's), got "
            f"{type(data_loader).__name__}")
    try:
        n = len(data_loader.dataset)
    except TypeError:
        return None, None, ("the loader's data set has no length (an IterableDataset): its "
                            "examples have no indices to record")
    sampler = data_loader.batch_sampler
    if sampler is None:
        return None, n, ("the loader yields single examples (batch_size=None): it has no "
                         "batch sampler whose indices could be recorded")
    split = False
    while isinstance(sampler, BatchSplittingSampler):  # BatchMemoryManager: logical batches
        sampler, split = sampler.sampler, True
    if isinstance(sampler, DistributedUniformWithReplacementSampler):
        what = "Opacus' distributed Poisson sampler (the union over the ranks)"
    elif isinstance(sampler, UniformWithReplacementSampler):
        what = "Opacus' Poisson sampler (DPDataLoader)"
    elif isinstance(sampler, BatchSampler):
        what = (f"the loader's BatchSampler ({type(sampler.sampler).__name__}, batch_size "
                f"{sampler.batch_size})")
    else:
        what = f"the loader's batch sampler ({type(sampler).__name__})"
    if split:
        what += ", the logical batches BatchMemoryManager splits"
    return sampler, n, what


class SamplingRecorder:
    """Record which examples each batch of a training loader used (module doc).

    Args:
        data_loader: the loader the training iterates (or the one BatchMemoryManager wraps).
        seed: keys the sketch's hashes.
        distributed: Opacus' DPDDP: exchange the ranks' batches at every optimizer step.
    """

    def __init__(self, data_loader, seed: int, *, distributed: bool = False) -> None:
        self.sampler, self.n, self.source = resolve_batch_sampler(data_loader)
        self.reason = None if self.sampler is not None else self.source
        self.distributed = bool(distributed)
        self._keys = (int(_mix(np.array([seed, 1]), 0x5A5A)[0]),
                      int(_mix(np.array([seed, 2]), 0xA5A5)[0]))
        self._patch: ClassPatch | None = None
        self._pending: list[np.ndarray] = []  # DPDDP: yielded, awaiting the step's exchange
        self._ready: list[np.ndarray] = []  # queued for ``_process``
        self._remote: list[list[np.ndarray]] = []
        self._rank_sizes: list[list[int]] = []  # DPDDP: each rank's batch size, per batch
        self._shards: list[int] | None = None  # DPDDP: each rank's share of the data
        self.buckets = BUCKETS
        self._steps = 0
        if self.sampler is not None:
            self._counts = np.zeros(self.n, dtype=np.int64)
            self._sizes: list[int] = []
            self._hashes: list[int] = []
            self._sketches: list[np.ndarray] = []
            self._duplicates = 0
            self._duplicate_witness: dict = {}
            self._out_of_range = 0
            self._example_hashes()

    @property
    def active(self) -> bool:
        return self.sampler is not None

    def _example_hashes(self) -> None:
        """Every example's bucket, sign and set-hash key (20 bytes an example, made once),
        and every bucket's size and sign sum."""
        self._bucket = np.empty(self.n, dtype=np.int32)
        self._sign = np.empty(self.n, dtype=np.float64)
        self._key = np.empty(self.n, dtype=np.uint64)
        for start in range(0, self.n, _CHUNK):
            idx = np.arange(start, min(self.n, start + _CHUNK))
            k = _mix(idx, self._keys[0])
            self._bucket[idx] = k & np.uint64(self.buckets - 1)
            self._sign[idx] = 1.0 - 2.0 * ((k >> np.uint64(40)) & np.uint64(1))
            self._key[idx] = _mix(idx, self._keys[1])
        self._bucket_sizes = np.bincount(self._bucket, minlength=self.buckets).astype(float)
        self._bucket_signed = np.bincount(self._bucket, weights=self._sign,
                                          minlength=self.buckets)

    # ------------------------------------------------------------------ attach / detach
    def attach(self) -> None:
        """Record every batch the sampler yields from now on."""
        if self.sampler is None or self._patch is not None:
            return
        recorder = self

        def __iter__(sampler):
            for batch in patch.base.__iter__(sampler):
                recorder._seen(batch)
                yield batch

        patch = ClassPatch(self.sampler, {"__iter__": __iter__}, owner="AuditHook")
        self._patch = patch.apply()

    def detach(self) -> None:
        """Stop recording (the batches yielded so far are kept)."""
        if self._patch is None:
            return
        self._patch.restore()
        self._patch = None

    def _seen(self, batch) -> None:
        """One batch the sampler yielded: recorded (queued for ``_process``) at once in one
        process; under DPDDP held until the step's exchange with the other ranks."""
        if isinstance(batch, torch.Tensor):
            batch = batch.detach().cpu().numpy()
        idx = np.asarray(batch, dtype=np.int64).reshape(-1)
        if self.distributed:
            self._pending.append(idx)
        else:
            self._add(idx)

    # ------------------------------------------------------------------ per step
    def step(self) -> None:
        """At every optimizer step: count it; under DPDDP, exchange the batches yielded since
        the last one with the other ranks and record their unions."""
        if self.sampler is None:
            return
        self._steps += 1
        if self.distributed:
            self._exchange()

    def _exchange(self) -> None:
        """One all-gather of every rank's pending batches; the i-th batches of all ranks are
        recorded as one batch, the rest wait for the next step."""
        dist = torch.distributed
        world = dist.get_world_size()
        device = (torch.device("cuda", torch.cuda.current_device())
                  if dist.get_backend() == "nccl" else torch.device("cpu"))
        local, self._pending = self._pending, []
        shard = int(getattr(self.sampler, "num_samples", -1))  # this rank's share of the data
        pack = np.concatenate([np.array([shard, len(local)], dtype=np.int64),
                               np.array([b.size for b in local], dtype=np.int64), *local])
        size = torch.tensor([pack.size], dtype=torch.int64, device=device)
        sizes = [torch.zeros_like(size) for _ in range(world)]
        dist.all_gather(sizes, size)
        longest = int(max(int(s) for s in sizes))
        mine = torch.zeros(longest, dtype=torch.int64, device=device)
        mine[: pack.size] = torch.from_numpy(pack).to(device)
        packs = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(packs, mine)
        if not self._remote:
            self._remote = [[] for _ in range(world)]
        shards = []
        for r, t in enumerate(packs):
            arr = t.cpu().numpy()
            shards.append(int(arr[0]))
            k = int(arr[1])
            lengths = arr[2 : 2 + k]
            cuts = np.cumsum(np.concatenate([[2 + k], lengths]))
            self._remote[r] += [arr[a:b] for a, b in itertools.pairwise(cuts)]
        self._shards = shards if min(shards) > 0 else None
        while all(self._remote):
            parts = [q.pop(0) for q in self._remote]
            self._rank_sizes.append([p.size for p in parts])  # each rank's own batch
            self._add(np.concatenate(parts))

    def _add(self, idx: np.ndarray) -> None:
        """Queue one batch's indices; they are recorded ``CHUNK_BATCHES`` at a time."""
        self._ready.append(idx)
        if len(self._ready) >= CHUNK_BATCHES:
            self._process()

    def _process(self) -> None:
        """Record the queued batches at once: counts, sizes, duplicates, sketches, hashes."""
        batches, self._ready = self._ready, []
        if not batches:
            return
        first = len(self._sizes)
        lengths = np.array([b.size for b in batches], dtype=np.int64)
        flat = np.concatenate(batches) if lengths.sum() else np.zeros(0, dtype=np.int64)
        owner = np.repeat(np.arange(len(batches)), lengths)
        bad = (flat < 0) | (flat >= self.n)
        if bad.any():
            self._out_of_range += int(bad.sum())
            flat, owner = flat[~bad], owner[~bad]
        sizes = np.bincount(owner, minlength=len(batches))
        self._sizes += sizes.tolist()
        keyed = np.sort(owner * self.n + flat)
        repeat = np.flatnonzero(keyed[1:] == keyed[:-1])
        if repeat.size:
            hit = np.unique(keyed[repeat] // self.n)
            if not self._duplicates:
                b = int(hit[0])
                uniq, cnt = np.unique(flat[owner == b], return_counts=True)
                j = int(np.argmax(cnt))
                self._duplicate_witness = {"batch": first + b, "example": int(uniq[j]),
                                           "times": int(cnt[j])}
            self._duplicates += int(hit.size)
        self._counts += np.bincount(flat, minlength=self.n)
        m = self.buckets
        sketch = np.bincount(owner * m + self._bucket[flat], weights=self._sign[flat],
                             minlength=len(batches) * m).reshape(len(batches), m)
        self._sketches += list(sketch.astype(np.float32))
        keys = np.zeros(len(batches), dtype=np.uint64)
        full = np.flatnonzero(sizes)
        if full.size:  # the owners are in order: one reduceat over the nonempty batches
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])[full]
            keys[full] = np.add.reduceat(self._key[flat], starts, dtype=np.uint64)
        self._hashes += [int(k) for k in keys]
        self._bound_sketches()

    def _bound_sketches(self) -> None:
        """Fold every stored sketch (and the bucket totals) in half past ``SKETCH_BUDGET``:
        bucket j and j + m/2 merge, which is the sketch of m/2 buckets."""
        while len(self._sketches) * self.buckets > SKETCH_BUDGET and self.buckets > 1:
            half = self.buckets // 2
            self._sketches = [s[:half] + s[half:] for s in self._sketches]
            self._bucket_sizes = self._bucket_sizes[:half] + self._bucket_sizes[half:]
            self._bucket_signed = self._bucket_signed[:half] + self._bucket_signed[half:]
            self._bucket &= half - 1
            self.buckets = half

    # ------------------------------------------------------------------ results
    def nbytes(self) -> int:
        """Bytes the records hold: O(n) for the counts and per-example hashes, O(T) for the
        sizes, set hashes and sketches (T x at most 256 buckets, folded past the budget)."""
        if self.sampler is None:
            return 0
        per_example = sum(a.nbytes for a in (self._counts, self._bucket, self._sign, self._key))
        per_batch = (sum(s.nbytes for s in self._sketches) + 16 * len(self._sizes)
                     + sum(b.nbytes for b in self._ready))
        return int(per_example + per_batch)

    def record(self) -> ExampleSampling | None:
        """The records so far (None when the loader could not be recorded: ``reason``)."""
        if self.sampler is None:
            return None
        self._process()
        t_n = len(self._sizes)
        return ExampleSampling(
            n=int(self.n), source=self.source,
            counts=self._counts.copy(),
            sizes=np.asarray(self._sizes, dtype=np.int64),
            signatures=(np.stack(self._sketches).astype(np.float64) if t_n
                        else np.zeros((0, self.buckets))),
            bucket_sizes=self._bucket_sizes.copy(), bucket_signed=self._bucket_signed.copy(),
            set_hashes=np.asarray(self._hashes, dtype=np.uint64),
            duplicate_batches=self._duplicates,
            duplicate_witness=dict(self._duplicate_witness),
            out_of_range=self._out_of_range, optimizer_steps=self._steps,
            ranks=torch.distributed.get_world_size() if self.distributed else 1,
            rank_sizes=(np.asarray(self._rank_sizes, dtype=np.int64) if self._rank_sizes
                        else None),
            rank_examples=None if self._shards is None else list(self._shards),
        )
