"""experiment/trainings/training.py: the plain (un-audited) DP-SGD training that the performance
table's audited / plain ratio uses as its baseline."""

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from dpaudit.experiment.plan import poisson_sample_rate, total_steps
from dpaudit.experiment.settings import DPSettings
from dpaudit.experiment.trainings.training import train_plain


@pytest.mark.parametrize("physical", [None, 4])
def test_plain_training_takes_the_configured_steps(physical):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 5), torch.randint(0, 3, (64,)))
    dp = DPSettings(noise_multiplier=1.0, batch_size=16, steps=7, max_physical_batch_size=physical)
    model = nn.Sequential(nn.Linear(5, 3))
    before = [p.detach().clone() for p in model.parameters()]
    rate = poisson_sample_rate(dp.batch_size, len(data))
    state = torch.random.get_rng_state()
    seconds, steps = train_plain(model, data, dp, rate, total_steps(dp, rate), seed=3)
    assert steps == total_steps(dp, rate) == 7
    assert seconds > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert torch.equal(state, torch.random.get_rng_state())  # the user's stream is untouched
