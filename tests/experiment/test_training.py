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


@pytest.mark.parametrize("clipping", ["per_layer", "adaptive"])
def test_the_cli_trains_with_opacus_per_layer_and_adaptive_clipping(clipping, tmp_path):
    """``dp.clipping``: Opacus' optimizer of that clipping, per-layer bounds C / sqrt(L), and
    the audit's checks of the set-up (each part against its C_p; adaptive clipping's own)."""
    import contextlib
    import io

    from dpaudit.experiment import run_audit
    from dpaudit.experiment.trainings.training import clipping_options

    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    opts = clipping_options(model, DPSettings(clipping=clipping, max_grad_norm=2.0))
    if clipping == "per_layer":
        assert opts["max_grad_norm"] == pytest.approx([1.0] * 4)  # 2 / sqrt(4) each
    else:
        assert opts["clipping"] == "adaptive" and opts["max_grad_norm"] == 2.0
    with contextlib.redirect_stdout(io.StringIO()):
        res = run_audit(output_dir=tmp_path, model={"name": "logreg"},
                        dp={"clipping": clipping, "steps": 12}, canary={"count": 60},
                        progress=False)
    checks = res["white_box"]["checks"]
    assert res["verdict"]["status"] == "consistent", res["verdict"]["message"]
    # only a DPPerLayerOptimizer gets per-part ratios, only an AdaClipDPOptimizer these checks
    if clipping == "per_layer":
        assert checks["clipping"]["details"]["max_group_ratio"] <= 1 + 1e-4
        assert "count_noise" not in checks
    else:
        assert {"count_noise", "adaptive_bound", "adaptive_accounting"} <= set(checks)
        assert "max_group_ratio" not in checks["clipping"]["details"]
