"""The DPDDP release's sketch (``capture.ranks_release``): each tensor folded to at most 61
buckets in float64, exactly the bucket sums of a float64 reference, on the CPU's numpy path
and torch's (bfloat16, non-contiguous tensors). The two-process checks are in test_ddp.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpaudit.capture.ranks_release import BUCKETS, fold64


@pytest.mark.parametrize("shape", [(7,), (61,), (400, 25), (3, 5, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fold64_is_the_bucket_sum_in_float64(shape, dtype):
    g = torch.Generator().manual_seed(sum(shape))
    t = (torch.randn(shape, generator=g) * 1e3).to(dtype)
    k = min(t.numel(), BUCKETS)
    x = t.to(torch.float64).reshape(-1).numpy()
    ref = np.bincount(np.arange(x.size) % k, weights=x, minlength=k)
    got = fold64(t, k).numpy()
    assert got.dtype == np.float64 and got.shape == (k,)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9 * np.abs(x).sum())


def test_fold64_reads_a_non_contiguous_tensor_in_its_logical_order():
    t = torch.arange(12.0).reshape(3, 4).T  # logical order 0, 4, 8, 1, 5, 9, ...
    np.testing.assert_array_equal(fold64(t, 5).numpy(),
                                  np.bincount(np.arange(12) % 5,
                                              weights=t.reshape(-1).numpy().astype(float)))
