"""per_sample_clipped_grads: the Opacus-hooks backend equals the torch.func backend and an
autograd loop, and leaves the GradSampleModule's training state untouched."""

from __future__ import annotations

import warnings

import pytest
import torch
from opacus import GradSampleModule
from torch import nn

from dpaudit.gradients import per_sample_clipped_grads
from dpaudit.models import build_model

warnings.filterwarnings("ignore", module="opacus")


def _loop(model, x, y, clip):
    rows = []
    for i in range(len(x)):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        rows.append(g * min(1.0, clip / (float(g.norm()) + 1e-6)))
    return torch.stack(rows)


@pytest.mark.parametrize("name", ["logreg", "mlp", "cnn"])
def test_backends_agree_with_autograd_loop(name):
    torch.manual_seed(0)
    plain = build_model(name, (1, 8, 8), 10, width=6)
    x, y = torch.randn(9, 1, 8, 8), torch.randint(0, 10, (9,))
    want = _loop(plain, x, y, clip=0.3)
    gsm = GradSampleModule(build_model(name, (1, 8, 8), 10, width=6))
    gsm.load_state_dict(plain.state_dict(), strict=False)
    gsm._module.load_state_dict(plain.state_dict())
    for backend in ("func", "opacus", "auto"):
        got = per_sample_clipped_grads(gsm, x, y, nn.functional.cross_entropy, 0.3, backend=backend)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_opacus_backend_restores_training_state():
    torch.manual_seed(1)
    gsm = GradSampleModule(build_model("mlp", (5,), 3, width=4))
    xb, yb = torch.randn(7, 5), torch.randint(0, 3, (7,))
    nn.functional.cross_entropy(gsm(xb), yb).backward()
    before = {
        n: (p.grad, p.grad_sample, p.grad.clone(), p.grad_sample.clone())
        for n, p in gsm._module.named_parameters()
    }
    out = per_sample_clipped_grads(
        gsm,
        torch.randn(4, 5),
        torch.randint(0, 3, (4,)),
        nn.functional.cross_entropy,
        1.0,
        backend="opacus",
    )
    assert out.shape == (4, 5 * 4 + 4 + 4 * 3 + 3)
    for n, p in gsm._module.named_parameters():
        g, gs, g_val, gs_val = before[n]
        assert p.grad is g and p.grad_sample is gs
        assert torch.equal(p.grad, g_val) and torch.equal(p.grad_sample, gs_val)
    assert all(not getattr(m, "activations", []) for m in gsm.modules())


def test_empty_inputs_and_bad_backend():
    model = build_model("logreg", (4,), 3)
    out = per_sample_clipped_grads(
        model, torch.zeros(0, 4), torch.zeros(0).long(), nn.functional.cross_entropy, 1.0
    )
    assert out.shape == (0, 15)
    with pytest.raises(ValueError, match="backend"):
        per_sample_clipped_grads(
            model,
            torch.zeros(1, 4),
            torch.zeros(1).long(),
            nn.functional.cross_entropy,
            1.0,
            backend="jax",
        )
    with pytest.raises(ValueError, match="GradSampleModule"):
        per_sample_clipped_grads(
            model,
            torch.zeros(1, 4),
            torch.zeros(1).long(),
            nn.functional.cross_entropy,
            1.0,
            backend="opacus",
        )


def test_summed_loss_fast_path_equals_per_example_vmap():
    from dpaudit.gradients.persample import summed_loss

    torch.manual_seed(0)
    out, y = torch.randn(7, 4), torch.randint(0, 4, (7,))
    fast = summed_loss(torch.nn.functional.cross_entropy, out, y)

    def ce(o, t):  # not in the fast-path set: goes through vmap
        return torch.nn.functional.cross_entropy(o, t)

    slow = summed_loss(ce, out, y)
    torch.testing.assert_close(fast, slow)
    by_hand = sum(torch.nn.functional.cross_entropy(out[i : i + 1], y[i : i + 1]) for i in range(7))
    torch.testing.assert_close(fast, by_hand)


@pytest.mark.parametrize("loss", ["cross_entropy", "nll_loss", "custom"])
def test_summed_loss_output_grad_equals_autograd(loss):
    """Closed forms (cross-entropy, NLL) and the autograd fallback agree with autograd."""
    from dpaudit.gradients.persample import summed_loss, summed_loss_output_grad

    torch.manual_seed(1)
    out, y = torch.randn(9, 5, dtype=torch.float64), torch.randint(0, 5, (9,))
    fn = {
        "cross_entropy": torch.nn.functional.cross_entropy,
        "nll_loss": torch.nn.functional.nll_loss,
        "custom": lambda o, t: ((o - torch.nn.functional.one_hot(t, 5)) ** 2).sum(),
    }[loss]
    leaf = out.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(summed_loss(fn, leaf, y), leaf)
    got = summed_loss_output_grad(fn, out, y)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert not got.requires_grad


class _Gated(nn.Module):
    """forward(x, side, gate=..., scale=...): a second positional input, a per-example keyword
    tensor and a shared non-tensor keyword."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(5, 4), nn.Linear(2, 4), nn.Linear(4, 3)

    def forward(self, x, side, gate, scale=1.0):
        return self.head(torch.tanh(self.a(x) + self.b(side)) * gate * scale)


def test_per_example_args_kwargs_and_shared_kwargs_agree_with_autograd_loop():
    torch.manual_seed(2)
    plain = _Gated()
    x, side, gate = torch.randn(6, 5), torch.randn(6, 2), torch.rand(6, 1) + 0.5
    y = torch.randint(0, 3, (6,))
    rows = []
    for i in range(6):
        plain.zero_grad()
        out = plain(x[i : i + 1], side[i : i + 1], gate=gate[i : i + 1], scale=1.5)
        nn.functional.cross_entropy(out, y[i : i + 1]).backward()
        g = torch.cat([p.grad.reshape(-1) for p in plain.parameters()])
        rows.append(g * min(1.0, 0.4 / (float(g.norm()) + 1e-6)))
    want = torch.stack(rows)
    gsm = GradSampleModule(_Gated())
    gsm._module.load_state_dict(plain.state_dict())
    for backend in ("func", "opacus"):
        got = per_sample_clipped_grads(
            gsm, x, y, nn.functional.cross_entropy, 0.4, backend=backend,
            args=(side,), kwargs={"gate": gate}, shared_kwargs={"scale": 1.5},
        )
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match=r"kwargs\['gate'\] must be a tensor with the 6"):
        per_sample_clipped_grads(gsm, x, y, nn.functional.cross_entropy, 0.4,
                                 args=(side,), kwargs={"gate": gate[:2]})
