"""Set-ups the hook would record wrongly are refused with an error naming the option.

Each optimizer comes from Opacus' own ``make_private`` with the option under test (DDP from a
real one-process gloo group), so the refusal is checked on the objects users really get.
"""

from __future__ import annotations

import socket
import warnings

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit.capture import AuditHook, GradientCanaries, InputCanaries

warnings.filterwarnings("ignore", module="opacus")


def data(n=64, d=6):
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, d, generator=g), torch.randint(0, 2, (n,), generator=g))


def make(model=None, **opts):
    """(model, optimizer, loader) from Opacus' make_private with the options under test."""
    torch.manual_seed(0)
    if model is None:
        model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 2))
    return PrivacyEngine().make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data(), batch_size=16),
        noise_multiplier=1.0,
        **{"max_grad_norm": 1.0, **opts},
    )


def dirac(model):
    dim = sum(p.numel() for p in model.parameters())
    return GradientCanaries.dirac([0, 1], norm=1.0, dim=dim)


@pytest.mark.parametrize(
    "opts",
    [
        {"clipping": "adaptive", "target_unclipped_quantile": 0.5,
         "clipbound_learning_rate": 0.2, "max_clipbound": 10.0, "min_clipbound": 0.1,
         "unclipped_num_std": 2.0},
        {"clipping": "per_layer", "max_grad_norm": [0.5, 0.5, 0.5, 0.5]},
    ],
)
def test_per_layer_and_adaptive_clipping_are_accepted(opts):
    """Both set-ups are supported (exactness: tests/capture/test_conformance.py)."""
    model, opt = make(**opts)[:2]
    assert type(opt).__name__ in ("AdaClipDPOptimizer", "DPPerLayerOptimizer")
    x, y = data().tensors
    hook = AuditHook(opt, model, [dirac(model), InputCanaries(x[:2], y[:2])])
    assert hook.max_grad_norm == pytest.approx(1.0)


def test_an_unknown_clip_rule_is_refused_by_name():
    """Per-layer bounds on an optimizer that is not Opacus' per-layer one: the rule is
    unknown (the hook could not clip input canaries as the optimizer clips examples)."""
    model, opt = make()[:2]
    opt.max_grad_norms = [0.5] * 4
    with pytest.raises(ValueError, match="clips by a rule the hook does not know"):
        AuditHook(opt, model, dirac(model))


def test_one_process_dpddp_is_accepted_and_records_after_the_all_reduce():
    """A one-rank gloo group: Opacus returns DistributedDPOptimizer; the hook records in
    ``reduce_gradients`` (two-process checks: tests/capture/test_ddp.py)."""
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
    )
    try:
        torch.manual_seed(0)
        model = DPDDP(nn.Sequential(nn.Linear(6, 2)))
        model, opt, loader = make(model)
        assert type(opt).__name__ == "DistributedDPOptimizer"
        hook = AuditHook(opt, model, dirac(model))
        assert hook.distributed and hook.rank == 0 and hook.world_size == 1
        with hook:
            assert "reduce_gradients" in opt.__dict__ and "add_noise" in opt.__dict__
            xb, yb = next(iter(loader))
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        assert hook.steps == 1
        assert "reduce_gradients" not in opt.__dict__ and "add_noise" not in opt.__dict__
    finally:
        torch.distributed.destroy_process_group()


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 2)

    def forward(self, x, scale=None):
        return self.fc(x if scale is None else x * scale)


@pytest.mark.parametrize("input_pass", ["auto", "separate"])
def test_keyword_forward_with_input_canaries_is_refused_at_the_first_step(input_pass):
    torch.manual_seed(0)
    model, opt, loader = make(TwoInputs())
    x, y = data().tensors
    hook = AuditHook(opt, model, InputCanaries(x[:3], y[:3]), input_pass=input_pass)
    xb, yb = next(iter(loader))
    # a per-example keyword tensor the canaries do not carry (InputCanaries(kwargs=...))
    with hook, pytest.raises(ValueError, match="keyword tensor 'scale' with one row per batch"):
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb, scale=torch.ones(len(xb), 1)), yb).backward()
        opt.step()
    assert hook.steps == 0  # nothing was scored from the wrong gradients


def test_plain_forward_with_input_canaries_still_runs():
    model, opt = make()[:2]
    x, y = data().tensors
    hook = AuditHook(opt, model, InputCanaries(x[:3], y[:3]))
    with hook:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[:16]), y[:16]).backward()
        opt.step()
    assert hook.steps == 1 and hook.scores()["scalar"].shape == (3,)
