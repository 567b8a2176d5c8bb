"""Which examples each step used (``capture.sampling_record``): the hook records exactly the
batches the loop trains on (Opacus' DPDataLoader, BatchMemoryManager's logical batches, a
shuffled DataLoader, a loader with worker processes), in O(n + T), leaves training bit for bit
unchanged and the sampler as it was; folding the sketches keeps them the sketches of fewer
buckets; loaders it cannot read are named, with the reason."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from opacus.utils.batch_memory_manager import BatchMemoryManager
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit.capture import AuditHook, GradientCanaries
from dpaudit.capture import sampling_record as sr
from dpaudit.experiment.judging.white_box import not_checked

warnings.filterwarnings("ignore", module="opacus")
N, BATCH, STEPS = 400, 20, 25


def _data():
    """Examples whose first feature is their own index: the loop can read what it trains on."""
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.arange(N, dtype=torch.float32)[:, None], torch.randn(N, 7, generator=g)],
                  dim=1)
    return TensorDataset(x, torch.randint(0, 3, (N,), generator=g))


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(7, 3)

    def forward(self, x):
        return self.fc(x[:, 1:])


def _train(physical=None, poisson=True, give_loader=True, workers=0, hook=True, seed=0,
           policy="never"):
    """An ordinary Opacus loop; returns (hook, the indices each optimizer step trained on,
    the final parameters, the loader)."""
    torch.manual_seed(seed)
    model = _Model()
    engine = PrivacyEngine()
    loader = DataLoader(_data(), batch_size=BATCH, shuffle=not poisson, num_workers=workers,
                        generator=torch.Generator().manual_seed(seed))
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader, noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=poisson,
        noise_generator=torch.Generator().manual_seed(seed + 1))
    can = GradientCanaries.dirac([0, 1], norm=1.0, dim=24, policy=policy)  # never: as is
    h = AuditHook(opt, model, [can], data_loader=loader if give_loader else None) if hook \
        else None
    steps, current = [], []
    done = 0
    with h if h else contextlib.nullcontext():
        while done < STEPS:
            batches = (BatchMemoryManager(data_loader=loader, max_physical_batch_size=physical,
                                          optimizer=opt) if physical
                       else contextlib.nullcontext(loader))
            with batches as it:
                for xb, yb in it:
                    current += xb[:, 0].long().tolist()
                    opt.zero_grad()
                    nn.functional.cross_entropy(model(xb), yb).backward()
                    opt.step()
                    if not opt._is_last_step_skipped:
                        steps.append(current)
                        current, done = [], done + 1
                    if done >= STEPS:
                        break
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return h, steps, params, loader


@pytest.mark.parametrize("physical", [None, 6])
def test_the_records_are_the_batches_trained_on(physical):
    hook, steps, _, loader = _train(physical=physical)
    rec = hook.white_box_records().by_example
    assert rec.n == N and rec.optimizer_steps == STEPS and rec.batches == STEPS
    assert rec.sizes.tolist() == [len(s) for s in steps]
    counts = np.bincount(np.concatenate([np.asarray(s, int) for s in steps]), minlength=N)
    assert np.array_equal(rec.counts, counts)
    assert rec.duplicate_batches == 0 and rec.out_of_range == 0
    assert rec.signatures.shape == (STEPS, sr.BUCKETS)
    assert "Poisson sampler" in rec.source
    # detached: the sampler is Opacus' own class again
    assert type(loader.batch_sampler) is UniformWithReplacementSampler


def test_batch_memory_managers_loader_is_read_as_its_logical_batches():
    from opacus.utils.batch_memory_manager import wrap_data_loader

    _, _, _, loader = _train(hook=False)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    split = wrap_data_loader(data_loader=loader, max_batch_size=6, optimizer=opt)
    sampler, n, what = sr.resolve_batch_sampler(split)
    assert sampler is loader.batch_sampler and n == N
    assert "BatchMemoryManager" in what and "Poisson sampler" in what


def test_the_sketch_is_the_signed_bucket_sum():
    hook, steps, _, _ = _train()
    rec = hook.white_box_records().by_example
    # recompute each step's sketch from the hook's own bucket and sign of every example
    recorder = hook._white_box._sampling
    for t, s in enumerate(steps):
        idx = np.asarray(s)
        want = np.bincount(recorder._bucket[idx], weights=recorder._sign[idx],
                           minlength=rec.signatures.shape[1])
        assert np.array_equal(rec.signatures[t], want)
    assert rec.bucket_sizes.sum() == N and np.abs(rec.bucket_signed).sum() <= N
    # equal batches have equal set hashes, different ones (here) different
    assert len(set(rec.set_hashes.tolist())) == len({tuple(sorted(s)) for s in steps})


def test_recording_leaves_training_bit_for_bit_unchanged():
    _, _, with_loader, _ = _train()
    _, _, without, _ = _train(give_loader=False)
    _, _, plain, _ = _train(hook=False)
    assert torch.equal(with_loader, without) and torch.equal(with_loader, plain)


def test_a_shuffled_loader_is_recorded_and_found_too_regular():
    hook, _steps, _, _ = _train(poisson=False)
    rec = hook.white_box_records().by_example
    assert "BatchSampler" in rec.source and rec.batches == STEPS
    assert set(rec.sizes.tolist()) == {BATCH}


def test_worker_processes_prefetch_but_every_trained_batch_is_recorded():
    hook, steps, _, _ = _train(workers=2)
    rec = hook.white_box_records().by_example
    counts = np.bincount(np.concatenate([np.asarray(s, int) for s in steps]), minlength=N)
    # the sampler may run ahead of the loop; every batch trained on is among those recorded
    assert rec.batches >= STEPS and np.all(rec.counts >= counts)


def test_folding_keeps_the_sketch_of_fewer_buckets(monkeypatch):
    full, _, _, _ = _train()
    big = full.white_box_records().by_example
    monkeypatch.setattr(sr, "SKETCH_BUDGET", 20 * 64)  # 20 batches of 64 buckets
    small_hook, _, _, _ = _train()
    small = small_hook.white_box_records().by_example
    m = small.signatures.shape[1]
    assert m < sr.BUCKETS and STEPS * m <= 20 * 64

    def fold(x):
        x = np.asarray(x, dtype=float)
        while x.shape[-1] > m:
            half = x.shape[-1] // 2
            x = x[..., :half] + x[..., half:]
        return x

    assert np.array_equal(small.signatures, fold(big.signatures))
    assert np.array_equal(small.bucket_sizes, fold(big.bucket_sizes))
    assert np.array_equal(small.bucket_signed, fold(big.bucket_signed))


def test_duplicates_and_indices_outside_the_data_are_counted():
    rec = sr.SamplingRecorder(DataLoader(_data(), batch_size=4), seed=0)
    for batch in ([1, 2, 3], [5, 5, 6], [7, N + 3]):
        rec._seen(batch)
    rec.step()
    out = rec.record()
    assert out.duplicate_batches == 1 and out.duplicate_witness == {"batch": 1, "example": 5,
                                                                    "times": 2}
    assert out.out_of_range == 1 and out.counts[5] == 2 and out.sizes.tolist() == [3, 3, 1]


def test_loaders_without_indices_are_named():
    with pytest.raises(ValueError, match="data_loader must be the torch DataLoader"):
        sr.SamplingRecorder([1, 2, 3], seed=0)
    single = sr.SamplingRecorder(DataLoader(_data(), batch_size=None), seed=0)
    assert not single.active and "batch_size=None" in single.reason


def test_without_a_loader_the_sampling_by_example_is_named_as_not_checked():
    hook, _, _, _ = _train(give_loader=False)
    rec = hook.white_box_records()
    assert rec.by_example is None
    assert any("sampling by example: the training loader was not given" in s
               for s in not_checked(rec, True))


def test_a_loader_given_to_audit_report_gives_the_size_and_names_the_records_missing():
    from dpaudit import audit_report
    from dpaudit.experiment.judging.loop_report import LOADER_TOO_LATE

    hook, _, _, loader = _train(give_loader=False, policy=["every_step", "never"])
    res = audit_report(hook, data_loader=loader, independent_canaries=True)
    wb = res["white_box"]
    assert "poisson_sampling" in wb["checks"]  # the size came from the loader
    assert f"sampling by example: {LOADER_TOO_LATE}" in wb["not_checked"]
    with pytest.raises(ValueError, match="dataset_size: the sizes given disagree"):
        audit_report(hook, data_loader=loader, dataset_size=N + 1)
    given, _, _, loader = _train(policy=["every_step", "never"])
    with pytest.raises(ValueError, match="disagree"):
        audit_report(given, dataset_size=N - 1)
