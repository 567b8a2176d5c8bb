"""Tests of AuditHook's coordinate view (``coordinates=``) on real small Opacus runs.

A view run and a full run with the same seeds train identically (the canaries are scattered
into the same full vector), so released gradients, input-canary gradients and traces of the
view run equal the full run's restricted to the view exactly; scores agree to float rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from capture_support import digits_flat, dirac_coords, logreg, private_run

from dpaudit.attacks import MixtureLR, ScalarProduct, StepScore
from dpaudit.capture import AuditHook, GradientCanaries, InputCanaries, Trace, load_trace

DATA, ZERO = digits_flat(pad=8, n_train=300)  # 72 features
NF = 72
D = NF * 10 + 10


class Keep(StepScore):
    """Test score: keeps every step's canary and reference gradients; returns the inner product."""

    name = "keep"
    requires_reference_grads = True

    def __init__(self):
        self.grads: list[torch.Tensor] = []
        self.refs: list[torch.Tensor] = []

    def step(self, canary_grads, released, ctx):
        self.grads.append(canary_grads.clone())
        self.refs.append(ctx.reference_grads.clone())
        return canary_grads @ released


def _view_and_canaries():
    """View = 20 Dirac coordinates on zero features + 30 coordinates the data touch; canaries:
    Dirac (every step / never), random directions supported on the view (Bernoulli)."""
    rng = np.random.default_rng(0)
    dirac = dirac_coords(ZERO, NF)[:20]
    touched = rng.choice(np.setdiff1d(np.arange(D), dirac), size=30, replace=False)
    view = np.concatenate([dirac, touched])
    rng.shuffle(view)  # view order is the caller's, not sorted
    k_dirac = 8
    v_dirac = torch.zeros(k_dirac, len(view))
    pos = [int(np.flatnonzero(view == c)[0]) for c in dirac[:k_dirac]]
    v_dirac[torch.arange(k_dirac), torch.tensor(pos)] = 1.2
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(4, len(view), generator=gen)
    v_rand = z / z.norm(dim=1, keepdim=True) * 0.9
    pol_dirac = ["every_step", "never"] * (k_dirac // 2)
    return view, v_dirac, pol_dirac, v_rand


def _full(vectors_view: torch.Tensor, view: np.ndarray) -> torch.Tensor:
    out = torch.zeros(vectors_view.shape[0], D)
    out[:, torch.as_tensor(view)] = vectors_view
    return out


def _run(tmp_path, sub: str, view: np.ndarray | None):
    v, v_dirac, pol, v_rand = _view_and_canaries()
    x, y = DATA.tensors
    if view is None:
        v_dirac, v_rand = _full(v_dirac, v), _full(v_rand, v)
    canaries = [
        InputCanaries(x[:3], y[:3]),
        GradientCanaries(v_dirac, policy=pol),
        GradientCanaries(v_rand, policy="bernoulli", inclusion_prob=0.4, seed=5),
    ]
    keep = Keep()
    trace = Trace(tmp_path / sub, include_canaries=True, chunk_steps=4)
    run = private_run(
        DATA,
        logreg(NF),
        lambda o, m: AuditHook(
            o,
            m,
            canaries,
            scores=(ScalarProduct(), MixtureLR(0.4), keep),
            keep_per_step=True,
            trace=trace,
            reference=(x[10:14], y[10:14]),
            coordinates=view,
        ),
        clip=1.5,
        sigma=0.8,
    )
    return run, keep, load_trace(tmp_path / sub)


def test_view_run_equals_full_run_restricted(tmp_path):
    view = _view_and_canaries()[0]
    full, keep_f, tr_f = _run(tmp_path, "full", None)
    part, keep_v, tr_v = _run(tmp_path, "view", view)
    assert part.hook.dim == len(view) and part.hook.full_dim == full.hook.dim == D
    assert part.hook.steps == full.hook.steps > 0
    # identical training: same inclusion draws, same final parameters (exact)
    np.testing.assert_array_equal(part.hook.inclusions(), full.hook.inclusions())
    for a, b in zip(part.model.parameters(), full.model.parameters(), strict=True):
        assert torch.equal(a, b)
    # released gradients and canary gradients: the full run's, gathered at the view (exact)
    np.testing.assert_array_equal(tr_v["released"], tr_f["released"][:, view])
    np.testing.assert_array_equal(tr_v["canaries"], tr_f["canaries"][:, :, view])
    assert tr_v["meta"]["coordinates"] == view.tolist() and tr_v["meta"]["dim"] == len(view)
    for g_v, g_f, r_v, r_f in zip(
        keep_v.grads, keep_f.grads, keep_v.refs, keep_f.refs, strict=True
    ):
        assert torch.equal(g_v, g_f[:, view]) and torch.equal(r_v, r_f[:, view])
    # gradient canaries (indices 3:) are supported on the view: their scores agree up to float
    # rounding; the input canaries' scores see the view only (next test)
    s_v, s_f = part.hook.scores(), full.hook.scores()
    for name in ("scalar", "mixture_lr", "keep"):
        np.testing.assert_allclose(s_v[name][3:], s_f[name][3:], rtol=1e-5, atol=1e-6)


def test_view_restricts_what_scores_see(tmp_path):
    """An input canary's score in a view is the inner product over the view only: it equals
    the full run's per-step products restricted to the view (from the full trace)."""
    view = _view_and_canaries()[0]
    _, _, tr_f = _run(tmp_path, "full", None)
    part, _, _ = _run(tmp_path, "view", view)
    restricted = np.einsum("tkd,td->kt", tr_f["canaries"][:, :3, view], tr_f["released"][:, view])
    np.testing.assert_allclose(part.hook.per_step()["scalar"][:3], restricted, rtol=1e-5, atol=1e-7)
    unrestricted = np.einsum("tkd,td->kt", tr_f["canaries"][:, :3], tr_f["released"])
    assert np.abs(restricted - unrestricted).max() > 1e-4  # the view did drop coordinates


def test_bad_coordinates():
    run = private_run(DATA, logreg(NF), None)
    can = GradientCanaries.dirac([0, 1], 1.0, 3)
    for bad in ([], [[0, 1]], [0.0, 1.0], [0, D], [-1, 2], [3, 3, 4]):
        with pytest.raises(ValueError, match="coordinates"):
            AuditHook(run.optimizer, run.model, can, coordinates=bad)
    with pytest.raises(ValueError, match=r"d = 4 columns .*in view coordinates"):
        AuditHook(run.optimizer, run.model, can, coordinates=[0, 1, 2, 3])
    hook = AuditHook(run.optimizer, run.model, can, coordinates=torch.tensor([5, 0, 9]))
    assert hook.dim == 3 and hook.coordinates.tolist() == [5, 0, 9]
