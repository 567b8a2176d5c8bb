"""The README's quickstart on three kinds of model, each a plain Opacus loop with exactly the
quickstart's three added lines (``add_canary_block``, ``AuditHook(optimizer, model,
data_loader=loader)``, ``audit_report(hook, privacy_engine=engine)``): a ReLU CNN on digits, a
tanh MLP on dense random data (no coordinate dead by structure or at theta_0) and a small
transformer on tokens (DPMultiheadAttention). Each gets a verdict; its canaries stay
independent through training, as the hook checks at every step, so the claim test certifies."""

from __future__ import annotations

import warnings

import pytest
import torch
from opacus import PrivacyEngine
from opacus.layers import DPMultiheadAttention
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit import AuditHook, add_canary_block, audit_report, load_dataset

warnings.filterwarnings("ignore", module="opacus")


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 32, width: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.att = DPMultiheadAttention(width, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(),
                                 nn.Linear(2 * width, width))
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        h = self.emb(x)
        a, _ = self.att(h, h, h)
        h = h + a
        return self.head((h + self.mlp(h)).mean(1))


def _setup(kind: str):
    g = torch.Generator().manual_seed(0)
    if kind == "relu_cnn":
        data = load_dataset("digits", seed=0)[0]
        model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(8 * 16, 10))
    elif kind == "tanh_mlp":
        data = TensorDataset(torch.randn(512, 20, generator=g),
                             torch.randint(0, 3, (512,), generator=g))
        model = nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 3))
    else:
        data = TensorDataset(torch.randint(0, 32, (512, 8), generator=g),
                             torch.randint(0, 3, (512,), generator=g))
        model = TinyTransformer()
    return model, data


@pytest.mark.parametrize("kind", ["relu_cnn", "tanh_mlp", "transformer"])
def test_the_quickstart_gives_any_model_a_verdict_with_independent_canaries(kind):
    torch.manual_seed(0)
    model, data = _setup(kind)
    add_canary_block(model)  # quickstart line 1
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = PrivacyEngine()
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=DataLoader(data, batch_size=64),
        noise_multiplier=1.0, max_grad_norm=1.0)
    with AuditHook(optimizer, model, data_loader=loader) as hook:  # quickstart line 2
        for _ in range(2):
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
    report = audit_report(hook, privacy_engine=engine)  # quickstart line 3
    v = report["verdict"]
    assert v["status"] == "consistent", v["message"]
    ind = report["white_box"]["canary_independence"]
    assert ind["sets"][0]["live_canaries"] == 0 and ind["steps"] == hook.steps
    assert report["independent_canaries"] and report["claim"]["scalar"]["certified"]
    assert v["best_lower_bound"] > 0
    assert v["training_data"]["upper_status"] == "verified"
    assert not any(c["rejected"] for c in report["white_box"]["checks"].values())
