"""Sparse gradient canaries (``GradientCanaries.dirac`` / ``sparse``): same run, O(K x |support|).

A sparse canary set and the same vectors given densely are inserted into the same clipped sum,
so two seeded runs end at the same parameters and give the same inclusions and scores; scoring
on the union of the supports (``routed``) equals scoring on the full vector.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from capture_support import digits_flat, dirac_coords, flat_params, logreg, private_run

from dpaudit.attacks import BatchSizeScore, MixtureLR, ScalarProduct
from dpaudit.capture import AuditHook, GradientCanaries

DATA, ZERO = digits_flat(pad=4, n_train=256)
NF = 68
D = NF * 10 + 10


def _run(canaries, scores=None):
    scores = (ScalarProduct(), MixtureLR()) if scores is None else scores
    return private_run(
        DATA,
        logreg(NF),
        lambda o, m: AuditHook(o, m, canaries, scores=scores, keep_per_step=True),
        batch_size=64,
    )


def _policies(k):
    return ["every_step", "bernoulli", "never"] * (k // 3) + ["never"] * (k % 3)


def test_dirac_is_sparse_and_runs_like_the_dense_vectors():
    coords = [*dirac_coords(ZERO, NF)[:10], 3, 200, 500]  # dead and live coordinates
    pols = _policies(len(coords))
    sparse = GradientCanaries.dirac(coords, 1.0, D, policy=pols, inclusion_prob=0.5, seed=4)
    assert sparse.is_sparse and sparse.indices.shape == (13, 1)
    dense = GradientCanaries(sparse.vectors, policy=pols, inclusion_prob=0.5, seed=4)
    assert float(dense.vectors.sum()) == 13.0 and not dense.is_sparse
    a, b = _run(sparse), _run(dense)
    assert a.hook.routed and a.hook.scored_dim == 13 and not b.hook.routed
    assert torch.equal(flat_params(a.model), flat_params(b.model))
    np.testing.assert_array_equal(a.hook.inclusions(), b.hook.inclusions())
    assert a.hook.inclusions()[1::3].any() and not a.hook.inclusions()[1::3].all()
    for name in ("scalar", "mixture_lr"):
        np.testing.assert_allclose(a.hook.scores()[name], b.hook.scores()[name], rtol=1e-6)


def test_sparse_rows_with_several_entries_match_dense_and_routing_changes_nothing():
    g = torch.Generator().manual_seed(0)
    idx = torch.stack([torch.randperm(D, generator=g)[:5] for _ in range(6)])
    vals = torch.randn(6, 5, generator=g)
    vals = vals / vals.norm(dim=1, keepdim=True) * 0.9
    sparse = GradientCanaries.sparse(idx, vals, D, policy="every_step")
    np.testing.assert_allclose(sparse.norms().numpy(), 0.9, rtol=1e-6)
    dense = GradientCanaries(sparse.vectors)
    routed = _run(sparse)
    full = _run(sparse, scores=(ScalarProduct(), MixtureLR(), BatchSizeScore()))  # not local
    ref = _run(dense)
    assert routed.hook.routed and not full.hook.routed
    assert routed.hook.scored_dim == int(torch.unique(idx).numel())
    pr, pf, pd = (flat_params(r.model) for r in (routed, full, ref))
    assert torch.equal(pr, pf)
    torch.testing.assert_close(pr, pd, rtol=0, atol=1e-6)  # sum order of overlapping rows
    for r in (full, ref):
        np.testing.assert_allclose(
            routed.hook.per_step()["scalar"], r.hook.per_step()["scalar"], rtol=1e-5, atol=1e-7
        )


def test_sparse_validation():
    with pytest.raises(ValueError, match="indices must lie in"):
        GradientCanaries.sparse(torch.tensor([[D]]), torch.ones(1, 1), D)
    with pytest.raises(ValueError, match="distinct within each row"):
        GradientCanaries.sparse(torch.tensor([[1, 1]]), torch.ones(1, 2), D)
    with pytest.raises(ValueError, match="values must be a floating-point"):
        GradientCanaries.sparse(torch.tensor([[1, 2]]), torch.ones(1, 3), D)
    with pytest.raises(ValueError, match="finite"):
        GradientCanaries.sparse(torch.tensor([[1]]), torch.tensor([[float("nan")]]), D)
    with pytest.raises(ValueError, match="not both"):
        GradientCanaries(torch.ones(1, D), indices=torch.tensor([[1]]))
    late = torch.zeros(70, 3)
    late[66, 1] = float("inf")  # past the first 64-row chunk
    with pytest.raises(ValueError, match="finite"):
        GradientCanaries(late)
    big = GradientCanaries.dirac(range(100), 1.0, 10**9)  # never (100, 1e9) dense
    assert big.dim == 10**9 and big.norms().max() == 1.0 and big.support().numel() == 100


def test_sparse_canaries_in_view_coordinates_match_dense_ones():
    view = [*dirac_coords(ZERO, NF)[:6], 5, 77, 300, 401]  # Dirac slots and live weights
    sparse = GradientCanaries.dirac([0, 2, 4, 7], 1.0, len(view), policy="every_step")
    dense = GradientCanaries(sparse.vectors)

    def run(c):
        return private_run(
            DATA,
            logreg(NF),
            lambda o, m: AuditHook(o, m, c, coordinates=view, keep_per_step=True),
            batch_size=64,
        )

    a, b = run(sparse), run(dense)
    assert not a.hook.routed and a.hook.scored_dim == len(view)
    assert torch.equal(flat_params(a.model), flat_params(b.model))
    np.testing.assert_allclose(a.hook.per_step()["scalar"], b.hook.per_step()["scalar"], rtol=1e-6)


def test_norm_rule_accepts_float32_canaries_built_at_c_and_refuses_larger_ones():
    """One slack (NORM_SLACK, shared with the settings' canary.norm check): float32 rows scaled
    to norm C have computed norms a few 1e-9 above C, which a 1e-9 slack would refuse."""
    from dpaudit.capture.gradient_canaries import NORM_SLACK
    from dpaudit.capture.insertion import check_gradient_canaries

    c = GradientCanaries.random_directions(64, 1000, norm=3.0, seed=0)
    assert bool((c.norms() > 3.0 * (1 + 1e-9)).any())
    check_gradient_canaries([c], 1000, 3.0, "all parameters")  # accepted
    big = GradientCanaries.random_directions(4, 1000, norm=3.0 * (1 + 10 * NORM_SLACK), seed=0)
    with pytest.raises(ValueError, match="norm <= C"):
        check_gradient_canaries([big], 1000, 3.0, "all parameters")


def test_the_members_sample_rate_is_one_rule():

    from dpaudit.capture.gradient_canaries import policy_sample_rate

    assert [policy_sample_rate(p, 0.2) for p in ("every_step", "bernoulli", "never")] == [
        1.0, 0.2, 0.0]
    with pytest.raises(ValueError, match="needs inclusion_prob"):
        policy_sample_rate("bernoulli", None)
    mixed = GradientCanaries(torch.eye(3), policy=["bernoulli", "never", "every_step"],
                             inclusion_prob=0.3, seed=0)
    assert mixed.member_sample_rate(np.array([True, False, False])) == 0.3
    assert mixed.member_sample_rate(np.array([False, False, True])) == 1.0
    with pytest.raises(ValueError, match="several policies"):
        mixed.member_sample_rate()


@pytest.mark.parametrize("norm", [1.0, 0.7])
@pytest.mark.parametrize("in_view", [False, True])
def test_dirac_rows_fast_path_equals_the_dense_rows_exactly(in_view, norm):
    """Dirac canaries reach ``ScalarProduct`` and ``MixtureLR`` as ``DiracRows`` (O(K) a step,
    never (K, columns)): per-step scores, inclusions and the trained model are bit-identical
    to the same canaries given as dense rows (the old path), routed on their support and in
    their own coordinate view (``canary.view=auto``: e_1 ... e_K, K = 80 here)."""
    from dpaudit.capture.insertion import DiracRows

    dead, live = dirac_coords(ZERO, NF), [3, 17, 200, 333, 500, 601]
    coords = sorted(set(dead[:34]) | set(live) | set(range(20, 100)))[:80]  # dead and live
    k = len(coords)
    pols = ["every_step", "bernoulli", "never", "every_step"] * (k // 4)
    if in_view:  # the design's view auto: canary k is e_k of the view of the coordinates
        sparse = GradientCanaries.dirac(range(k), norm, k, policy=pols, inclusion_prob=0.5,
                                        seed=3)
        kw = {"coordinates": coords}
    else:
        sparse = GradientCanaries.dirac(coords, norm, D, policy=pols, inclusion_prob=0.5,
                                        seed=3)
        kw = {}
    dense = GradientCanaries(sparse.vectors, policy=pols, inclusion_prob=0.5, seed=3)

    def run(c):
        return private_run(DATA, logreg(NF), lambda o, m: AuditHook(
            o, m, c, scores=(ScalarProduct(), MixtureLR()), keep_per_step=True, **kw),
            batch_size=64, sigma=2.0)

    fast, old = run(sparse), run(dense)
    assert fast.hook.dirac_rows and not old.hook.dirac_rows
    assert fast.hook.routed is (not in_view)
    assert isinstance(fast.hook._fixed_canary_grads, DiracRows)
    assert torch.equal(flat_params(fast.model), flat_params(old.model))
    np.testing.assert_array_equal(fast.hook.inclusions(), old.hook.inclusions())
    for name in ("scalar", "mixture_lr"):
        np.testing.assert_array_equal(fast.hook.per_step()[name], old.hook.per_step()[name])
        np.testing.assert_array_equal(fast.hook.scores()[name], old.hook.scores()[name])
    # another score (not known to read canaries through products only): the dense rows
    other = private_run(DATA, logreg(NF), lambda o, m: AuditHook(
        o, m, sparse, scores=(ScalarProduct(), BatchSizeScore()), **kw), batch_size=64)
    assert not other.hook.dirac_rows


def test_dirac_rows_match_the_dense_matrix():
    """``DiracRows`` @ v, its row norms and ``cat`` equal the dense matrix's, bit for bit."""
    from dpaudit.capture.insertion import DiracRows

    g = torch.Generator().manual_seed(1)
    idx = torch.randperm(50, generator=g)[:30]
    vals = torch.rand(30, generator=g) * 3 - 1.5
    rows, v = DiracRows(idx, vals, 50), torch.randn(50, generator=g)
    dense = rows.to_dense()
    assert rows.shape == dense.shape == (30, 50) and rows.dtype == dense.dtype
    assert torch.equal(rows @ v, dense @ v)
    assert torch.equal(rows.norm(dim=1), dense.norm(dim=1))
    both = DiracRows.cat([rows, DiracRows(idx[:5], vals[:5] * 2, 50)])
    assert torch.equal(both @ v, torch.cat([dense, dense[:5] * 2]) @ v)
    with pytest.raises(ValueError, match=r"need a \(50,\) tensor"):
        rows @ torch.ones(49)
    with pytest.raises(NotImplementedError):
        rows.norm(dim=0)


@pytest.mark.parametrize("input_pass", ["auto", "separate"])
def test_dirac_rows_beside_input_canaries_equal_the_concatenated_rows(input_pass):
    """Dirac canaries beside input canaries keep their own blocks (``RowBlocks``: the Dirac
    set as ``DiracRows``, the input set's per-sample gradients as they are), never one
    concatenated (K, dim) matrix: scores, inclusions and the model are bit-identical to the
    same canaries as dense rows (concatenated every step) up to the rounding of a product
    computed on a block instead of the whole matrix (BLAS may sum a row's terms in another
    order for another matrix shape)."""
    from dpaudit.capture import InputCanaries
    from dpaudit.capture.insertion import RowBlocks

    coords = sorted({*list(dirac_coords(ZERO, NF))[:20], 3, 17, 200, 333})
    pols = ["every_step", "never"] * (len(coords) // 2)
    sparse = GradientCanaries.dirac(coords, 1.0, D, policy=pols)
    dense = GradientCanaries(sparse.vectors, policy=pols)
    x, y = DATA.tensors[0][:12].clone(), DATA.tensors[1][:12].clone()

    def run(c):
        return private_run(DATA, logreg(NF), lambda o, m: AuditHook(
            o, m, [InputCanaries(x, y), c], scores=(ScalarProduct(), MixtureLR()),
            keep_per_step=True, input_pass=input_pass), batch_size=64, sigma=2.0)

    fast, old = run(sparse), run(dense)
    assert fast.hook.dirac_rows and not old.hook.dirac_rows
    blocks = fast.hook._canary_grads([torch.zeros(12, D)])
    assert isinstance(blocks, RowBlocks) and blocks.shape == (12 + len(coords), D)
    assert torch.equal(flat_params(fast.model), flat_params(old.model))
    np.testing.assert_array_equal(fast.hook.inclusions(), old.hook.inclusions())
    for name in ("scalar", "mixture_lr"):
        np.testing.assert_allclose(fast.hook.per_step()[name], old.hook.per_step()[name],
                                   rtol=1e-5, atol=1e-6)


def test_row_blocks_match_the_concatenated_matrix():
    from dpaudit.capture.insertion import DiracRows, RowBlocks

    g = torch.Generator().manual_seed(2)
    rows = DiracRows(torch.randperm(40, generator=g)[:7], torch.rand(7, generator=g), 40)
    dense = torch.randn(5, 40, generator=g)
    blocks, v = RowBlocks([dense, rows]), torch.randn(40, generator=g)
    full = torch.cat([dense, rows.to_dense()])
    assert blocks.shape == full.shape and len(blocks) == 12
    assert torch.equal(blocks.to_dense(), full)
    # each block's own product and norms, in row order (exact), and the whole matrix's up to
    # the rounding of another BLAS shape
    assert torch.equal(blocks @ v, torch.cat([dense @ v, rows @ v]))
    assert torch.allclose(blocks @ v, full @ v, rtol=1e-6, atol=1e-6)
    assert torch.equal(blocks.norm(dim=1), torch.cat([dense.norm(dim=1), rows.norm(dim=1)]))
    assert torch.allclose(blocks.norm(dim=1), full.norm(dim=1), rtol=1e-6)
    with pytest.raises(ValueError, match="one cols"):
        RowBlocks([dense, torch.zeros(2, 41)])
    with pytest.raises(NotImplementedError):
        blocks.norm(dim=0)


def test_clipped_rows_match_the_clipped_matrix():
    """``ClippedRows`` (per-parameter row views and their clip factors) answers products,
    norms, splits and scaling as the (K, d) clipped matrix would, flat or per-layer."""
    from dpaudit.capture.insertion import ClippedRows
    from dpaudit.gradients.persample import clip_factors, clip_rows

    g = torch.Generator().manual_seed(3)
    per_param = [torch.randn(6, 4, 3, generator=g), torch.randn(6, 5, generator=g)]
    v = torch.randn(17, generator=g)
    for bound in (1.0, [0.5, 0.7]):
        dense, _ = clip_rows(per_param, per_param, bound)
        parts = [x.reshape(6, -1) for x in per_param]
        part_norms, _, factors = clip_factors(per_param, per_param, bound)
        torch.testing.assert_close(part_norms, torch.stack([x.norm(dim=1) for x in parts], 1))
        rows = ClippedRows(parts, factors, part_norms, torch.float32)
        assert rows.shape == dense.shape and len(rows) == 6
        torch.testing.assert_close(rows.to_dense(), dense)
        torch.testing.assert_close(rows @ v, dense @ v)
        torch.testing.assert_close(rows.norm(dim=1), dense.norm(dim=1))
        torch.testing.assert_close((rows * 0.5) @ v, (dense * 0.5) @ v)
        a, b = rows.split([2, 4])
        torch.testing.assert_close(torch.cat([a @ v, b @ v]), dense @ v)


@pytest.mark.parametrize("physical", [None, 16])
def test_folded_input_canaries_scored_without_the_clipped_matrix(physical):
    """The default hook keeps folded input canaries as ``ClippedRows`` (no K x d buffer,
    except on steps BatchMemoryManager skips) and scores them as the eager buffer would."""
    from dpaudit.capture import InputCanaries
    from dpaudit.capture.input_grads import InputGradients
    from dpaudit.capture.insertion import ClippedRows

    x, y = DATA.tensors[0][:12].clone(), DATA.tensors[1][:12].clone()
    import unittest.mock as mock

    kinds = []
    folded = InputGradients.folded

    def spy(self, t):
        out = folded(self, t)
        kinds.extend(type(r).__name__ for r in (out or []))
        return out

    def run(lazy):
        def make(o, m):
            hook = AuditHook(o, m, [InputCanaries(x, y)], scores=(ScalarProduct(), MixtureLR()),
                             keep_per_step=True, input_pass="batch")
            start = hook._inputs.start
            hook._inputs.start = lambda view, dtype, lazy=False, _force=lazy: start(
                view, dtype, _force)
            return hook
        return private_run(DATA, logreg(NF), make, batch_size=64, sigma=2.0,
                           physical_batch=physical)

    with mock.patch.object(InputGradients, "folded", spy):
        lazy = run(True)
    # under BatchMemoryManager the folded physical batch is a skipped step: the eager buffer
    assert (ClippedRows.__name__ in kinds) == (physical is None), kinds
    eager = run(False)
    assert torch.equal(flat_params(lazy.model), flat_params(eager.model))
    for name in ("scalar", "mixture_lr"):
        np.testing.assert_allclose(lazy.hook.per_step()[name], eager.hook.per_step()[name],
                                   rtol=1e-5, atol=1e-6)
