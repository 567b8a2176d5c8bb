"""AuditSettings checks that must fire before any training: non-finite or out-of-range values,
devices that are not there, audits without members or non-members, and the warning that an
audit's bounds will be 0 by design."""

import math

import numpy as np
import pytest
import torch

from dpaudit.experiment.canary_setup import draw_membership
from dpaudit.experiment.run import (
    expected_certified_bound,
    membership_counts,
    resolve_device,
)
from dpaudit.experiment.settings import AuditSettings, describe_settings


@pytest.mark.parametrize(
    "group,key,value",
    [
        ("dp", "noise_multiplier", math.inf),
        ("dp", "lr", math.inf),
        ("dp", "lr", math.nan),
        ("dp", "max_grad_norm", math.nan),
        ("dp", "epochs", math.inf),
        ("dp", "momentum", math.nan),
        ("canary", "norm", math.inf),
        ("canary", "crafted_value", math.inf),
        ("audit", "confidence", math.nan),
        ("dp", "delta", 0.0),
        ("audit", "inclusion", 1.0),
    ],
)
def test_non_finite_and_out_of_range_values_name_the_key(group, key, value):
    with pytest.raises(ValueError, match=rf"{group}\.{key} must be"):
        AuditSettings.from_mappings(**{group: {key: value}})


def test_default_settings_validate():
    s = AuditSettings()
    s.check()
    assert (s.model.name, s.model.width, s.dp.steps, s.canary.count) == ("mlp", 400, 100, 1000)


def test_multi_run_needs_two_runs():
    with pytest.raises(ValueError, match=r"audit\.runs must be at least 2"):
        AuditSettings.from_mappings(audit={"mode": "multi_run", "runs": 1},
                                    canary={"count": 1})


def test_membership_counts_match_the_draw_and_refuse_one_sided_audits():
    s = AuditSettings.from_mappings(canary={"count": 40})
    n_in, n_out = membership_counts(s)
    assert n_in == int(draw_membership(40, 0.5, 0).sum()) and n_in + n_out == 40
    with pytest.raises(ValueError, match=r"canary\.count=20 with audit\.inclusion=0\.999"):
        membership_counts(AuditSettings.from_mappings(canary={"count": 20},
                                                      audit={"inclusion": 0.999}))
    multi = AuditSettings.from_mappings(canary={"count": 1},
                                        audit={"mode": "multi_run", "runs": 3, "inclusion": 0.99})
    with pytest.raises(ValueError, match=r"audit\.runs=3 with audit\.inclusion=0\.99"):
        membership_counts(multi)


def test_expected_bound_against_the_perfect_separation_ceiling():
    """Perfectly separated scores: no Clopper-Pearson bound exceeds
    ln(TPR_lower / FPR_upper) with each rate's one-sided bound at the full alpha,
    TPR_lower = alpha^(1/n_in), FPR_upper = 1 - alpha^(1/n_out)."""
    alpha, delta = 0.05, 1e-5
    for n in (10, 50, 500):
        ceiling = math.log((alpha ** (1 / n) - delta) / (1 - alpha ** (1 / n)))
        got = expected_certified_bound(n, n, None, 1 - alpha, delta)
        assert 0 < got <= ceiling + 1e-9, (n, got, ceiling)
    # weak canaries (mu = 0.5), 10 per side: nothing to certify, hence the warning
    assert expected_certified_bound(10, 10, 0.5, 0.95, delta) == 0.0
    # strong ones (mu = 6), 500 per side: a positive bound is expected
    assert expected_certified_bound(500, 500, 6.0, 0.95, delta) > 1.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_cuda_on_a_cpu_build_names_device_and_what_is_available():
    with pytest.raises(ValueError, match=r"device='cuda'.*available: cpu"):
        resolve_device(AuditSettings(device="cuda"))


def test_bad_device_strings():
    with pytest.raises(ValueError, match=r"device='gpu0' is not a torch device"):
        resolve_device(AuditSettings(device="gpu0"))
    assert resolve_device(AuditSettings(device="cpu")) == torch.device("cpu")
    n = torch.cuda.device_count()
    if n:
        with pytest.raises(ValueError, match="no such GPU"):
            resolve_device(AuditSettings(device=f"cuda:{n}"))


def test_describe_settings_has_every_field_with_allowed_values():
    text = describe_settings()
    for group, values in AuditSettings().to_dict().items():
        keys = values if isinstance(values, dict) else {group: values}
        for key in keys:
            name = f"{group}.{key}" if isinstance(values, dict) else key
            assert f"  {name} " in text, name
    assert "allowed: gradient | input" in text
    assert np.all([line.strip() for line in text.splitlines()])
