"""The hook's records for the weaker rungs: theta_0 / theta_T on the canaries' support (the
hidden state) and the final model's scores of input canaries (the black box)."""

import copy

import numpy as np
import pytest
import torch
from capture_support import digits_flat, dirac_coords, private_run
from torch import nn

from dpaudit.capture import AuditHook, GradientCanaries, InputCanaries
from dpaudit.capture.final_state import final_model_scores, hidden_state_canaries, sums_releases

PAD = 6


@pytest.fixture(scope="module")
def data():
    return digits_flat(pad=PAD, n_train=400)


def _linear():
    return nn.Linear(64 + PAD, 10)


def _dirac_hook(coords, dim, sign=None):
    def make(opt, model):
        values = None if sign is None else torch.tensor(sign, dtype=torch.float32)
        canaries = GradientCanaries.dirac(coords, 1.0, dim, policy=["every_step", "never"]
                                          * (len(coords) // 2))
        if values is not None:
            canaries = GradientCanaries.sparse(canaries.indices, canaries.values * values[:, None],
                                               dim, policy=list(canaries.policies))
        return AuditHook(opt, model, canaries)
    return make


def test_plain_sgd_hidden_state_is_lr_times_the_scalar_sum(data):
    """theta_T - theta_0 = -lr x sum of releases: the score is lr x scalar / |v|, negative
    canary values included (the sign follows v)."""
    ds, zero = data
    coords = dirac_coords(zero, 64 + PAD)[:20]
    sign = [1.0, -1.0] * 10
    run = private_run(ds, _linear, _dirac_hook(coords, 10 * (64 + PAD) + 10, sign), lr=0.3,
                      epochs=1)
    hook = run.hook
    hidden = hook.hidden_state_scores()
    scalar = hook.scores()["scalar"]
    np.testing.assert_allclose(hidden, 0.3 * scalar, rtol=1e-5, atol=1e-7)
    # members (every step) score higher than non-members on average: the signal is there
    assert hidden[0::2].mean() > hidden[1::2].mean()
    summary = hook.hidden_state_summary()
    assert summary["sums_releases"] and summary["coordinatewise"] and summary["ended"]
    assert summary["coordinates"] == 20 and summary["steps"] == hook.steps


@pytest.mark.parametrize("optimizer,words", [("momentum", "momentum 0.9"), ("adam", "Adam")])
def test_other_optimizers_are_named_and_scored(data, optimizer, words):
    """Momentum and Adam: scores from the final parameters all the same (post-processing),
    named as not a sum of releases, still coordinate-wise."""
    ds, zero = data
    coords = dirac_coords(zero, 64 + PAD)[:20]
    run = private_run(ds, _linear, _dirac_hook(coords, 10 * (64 + PAD) + 10),
                      optimizer=optimizer, lr=0.05, epochs=1)
    hidden = run.hook.hidden_state_scores()
    assert np.isfinite(hidden).all() and hidden[0::2].mean() > hidden[1::2].mean()
    s = run.hook.hidden_state_summary()
    assert not s["sums_releases"] and words in s["sums_releases_reason"]
    assert s["coordinatewise"]


def test_hidden_state_reads_the_moved_coordinate_exactly(data):
    """The score is -(theta_T - theta_0) sign(v) at the canary's coordinate (Adam: no sum of
    releases), read from the model: checked against copies of the weight taken by hand."""
    ds, zero = data
    coords = dirac_coords(zero, 64 + PAD)[:4]
    before = {}

    def make(opt, model):
        before["w"] = model._module.weight.detach().clone()
        return AuditHook(opt, model, GradientCanaries.dirac(coords, 1.0, 10 * (64 + PAD) + 10,
                                                            policy="every_step"))
    run = private_run(ds, _linear, make, optimizer="adam", lr=0.05, epochs=1)
    after = run.model._module.weight.detach()
    # the difference of the two float32 values, exact in float64
    want = [-(after.reshape(-1)[i].double() - before["w"].reshape(-1)[i].double()).item()
            for i in coords]
    np.testing.assert_allclose(run.hook.hidden_state_scores(), want, rtol=0, atol=1e-12)


def test_canary_sets_without_hidden_state():
    x, y = torch.zeros(3, 4), torch.zeros(3, dtype=torch.long)
    assert not hidden_state_canaries(InputCanaries(x, y))[0]
    assert not hidden_state_canaries(GradientCanaries(torch.eye(3, 4)))[0]
    assert hidden_state_canaries(GradientCanaries.dirac([0, 1], 1.0, 4))[0]


def test_final_model_scores_against_a_direct_computation():
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    x, y = torch.randn(7, 5), torch.randint(0, 3, (7,))
    got = final_model_scores(model, InputCanaries(x, y), chunk=3)
    z = model(x).detach().double()
    loss = -torch.log_softmax(z, 1)[torch.arange(7), y]
    np.testing.assert_allclose(got["neg_loss"], -loss.numpy(), rtol=1e-6)
    other = z.clone()
    other[torch.arange(7), y] = -np.inf
    np.testing.assert_allclose(got["logit_margin"],
                               (z[torch.arange(7), y] - other.max(1).values).numpy(), rtol=1e-12)
    assert model.training  # restored


def test_black_box_scores_from_the_hook(data):
    """Input canaries beside Dirac ones: each kind gets its rung's scores, NaN for the other;
    the gains are over the initial model (a copy taken by hand before training)."""
    ds, zero = data
    coords = dirac_coords(zero, 64 + PAD)[:4]
    xs, ys = ds.tensors[0][:6], (ds.tensors[1][:6] + 1) % 10
    initial = {}

    def make(opt, model):
        initial["model"] = copy.deepcopy(model._module)
        return AuditHook(opt, model, [InputCanaries(xs, ys),
                                      GradientCanaries.dirac(coords, 1.0, 10 * (64 + PAD) + 10)])
    run = private_run(ds, _linear, make, epochs=1)
    bb = run.hook.final_model_scores()
    assert set(bb) == {"neg_loss", "logit_margin", "loss_gain", "margin_gain"}
    assert np.isfinite(bb["neg_loss"][:6]).all() and np.isnan(bb["neg_loss"][6:]).all()
    direct = final_model_scores(run.model, InputCanaries(xs, ys))
    np.testing.assert_allclose(bb["neg_loss"][:6], direct["neg_loss"])
    before = final_model_scores(initial["model"], InputCanaries(xs, ys))
    np.testing.assert_allclose(bb["loss_gain"][:6], direct["neg_loss"] - before["neg_loss"],
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(bb["margin_gain"][:6],
                               direct["logit_margin"] - before["logit_margin"], rtol=1e-6,
                               atol=1e-7)
    hidden = run.hook.hidden_state_scores()
    assert np.isnan(hidden[:6]).all() and np.isfinite(hidden[6:]).all()


def test_sums_releases_needs_a_constant_rate():
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert sums_releases(opt, [(0.1,), (0.1,)])[0]
    ok, why = sums_releases(opt, [(0.1,), (0.05,)])
    assert not ok and "learning rate changed" in why
    ok, why = sums_releases(torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=1e-4), [])
    assert not ok and "weight decay" in why


def test_a_forward_that_cannot_take_the_canaries_alone_is_named_not_raised_in_training():
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, x):
            return self.lin(x), x

    can = InputCanaries(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="not one tensor"):
        final_model_scores(Pair(), can)
    assert "not one tensor" in final_model_scores(Pair(), can, reason=True)["reason"]
