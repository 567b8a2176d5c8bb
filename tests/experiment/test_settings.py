"""AuditSettings checks that must fire before any training: non-finite or out-of-range values,
devices that are not there, audits without members or non-members, and the warning that an
audit's bounds will be 0 by design."""

import math

import numpy as np
import pytest
import torch

from dpaudit.experiment.plan import (
    Realisation,
    draw_membership,
    membership_counts,
    plan_audit,
    planned_threat_model,
    resolve_device,
)
from dpaudit.experiment.settings import AuditSettings
from dpaudit.experiment.trainings.run import (
    expected_certified_bound,
    ideal_scores,
    warn_if_bounds_vanish,
)
from dpaudit.threat_model import ThreatModel


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


@pytest.mark.parametrize(
    "dp,key",
    [
        ({"clipping": "ghost"}, "clipping"),
        ({"clipping": "adaptive", "target_unclipped_quantile": 1.0}, "target_unclipped_quantile"),
        ({"clipping": "adaptive", "clipbound_learning_rate": 0.0}, "clipbound_learning_rate"),
        ({"clipping": "adaptive", "min_clipbound": 2.0, "max_clipbound": 1.0}, "max_clipbound"),
        ({"clipping": "adaptive", "noise_multiplier": 4.0, "unclipped_num_std": 2.0},
         "unclipped_num_std"),
    ],
)
def test_clipping_settings_are_refused_by_name(dp, key):
    with pytest.raises(ValueError, match=rf"dp\.{key}"):
        AuditSettings.from_mappings(dp=dp)


def test_clipping_defaults_fill_in():
    dp = AuditSettings.from_mappings(dp={"clipping": "adaptive", "noise_multiplier": 6.0}).dp
    assert dp.clipbounds() == (0.01, 100.0)
    # the larger of B / 20 and 2 sigma: the gradient's multiplier at most 1.033 sigma
    assert dp.count_std() == 12.0
    assert AuditSettings.from_mappings(dp={"clipping": "adaptive"}).dp.count_std() == 3.2
    sigma_g = (dp.noise_multiplier**-2 - (2 * dp.count_std()) ** -2) ** -0.5
    assert sigma_g == pytest.approx(dp.noise_multiplier / np.sqrt(1 - 1 / 16))


def test_default_settings_validate():
    s = AuditSettings()
    s.check()
    assert (s.model.name, s.model.width, s.dp.steps, s.canary.count) == ("mlp", 400, 100, 1000)
    # sigma 1: the training data's epsilon is 3.35 at delta 1e-5, bracketed from both sides
    assert (s.dp.noise_multiplier, s.canary.lower_side) == (1.0, None)


def test_multi_run_needs_two_runs():
    with pytest.raises(ValueError, match=r"audit\.runs must be at least 2"):
        AuditSettings.from_mappings(audit={"mode": "multi_run", "runs": 1},
                                    canary={"count": 1})


def test_membership_counts_match_the_draw_and_refuse_one_sided_audits():
    plan = plan_audit(AuditSettings.from_mappings(canary={"count": 40}))
    n_in, n_out = membership_counts(plan)
    assert n_in == int(draw_membership(plan).sum()) and n_in + n_out == 40
    with pytest.raises(ValueError, match=r"canary\.count=20 with audit\.inclusion=0\.999"):
        membership_counts(plan_audit(AuditSettings.from_mappings(
            canary={"count": 20}, audit={"inclusion": 0.999})))
    multi = AuditSettings.from_mappings(canary={"count": 1},
                                        audit={"mode": "multi_run", "runs": 3, "inclusion": 0.99})
    with pytest.raises(ValueError, match=r"audit\.runs=3 with audit\.inclusion=0\.99"):
        membership_counts(plan_audit(multi))


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
        resolve_device("cuda")


def test_bad_device_strings():
    with pytest.raises(ValueError, match=r"device='gpu0' is not a torch device"):
        resolve_device("gpu0")
    assert resolve_device("cpu") == torch.device("cpu")
    n = torch.cuda.device_count()
    if n:
        with pytest.raises(ValueError, match="no such GPU"):
            resolve_device(f"cuda:{n}")


@pytest.mark.parametrize("q", [1.0, 0.3])
def test_ideal_scores_are_the_likelihood_ratio_of_the_claimed_mechanism(q):
    """One step, canary norm C, sigma 1 (m = 1): the most powerful attack's score s is the log
    likelihood ratio, so E_out[e^s] = 1 and E_in[e^-s] = 1 (q = 1: N(1, 1) vs N(0, 1), whose
    log ratio is x - 1/2, so the test is on s - 1/2). Tolerance: 4 standard errors."""
    threat = ThreatModel(noise_multiplier=1.0, max_grad_norm=1.0, sample_rate=q, steps=1,
                         delta=1e-5, canary_kind="gradient")
    n = 200_000
    s_in, s_out = ideal_scores(threat, n, n, seed=3)
    llr_in, llr_out = (s_in - 0.5, s_out - 0.5) if q == 1.0 else (s_in, s_out)
    for values in (np.exp(llr_out), np.exp(-llr_in)):
        assert abs(values.mean() - 1) < 4 * values.std() / np.sqrt(n)
    assert np.mean(s_in) > np.mean(s_out)


def test_poisson_canary_defaults_say_before_training_that_they_certify_nothing():
    """canary=gradient_poisson at sigma 6 (q = 0.048, 200 canaries): even the
    most powerful attack certifies 0, said with what to change; at sigma 1 and 1000 canaries
    a positive bound is expected and nothing is said."""
    def expect(noise, count):
        settings = AuditSettings.from_mappings(
            dp={"noise_multiplier": noise},
            canary={"kind": "gradient", "policy": "bernoulli", "count": count},
        )
        plan = plan_audit(settings)
        realised = Realisation(kind="gradient", norm=1.0)  # at the data's rate
        threat = planned_threat_model(plan, realised, 64 / 1347, 100)
        info = {}
        warn_if_bounds_vanish(plan, membership_counts(plan), threat, info)
        return info["expected_certified_epsilon"]

    with pytest.warns(UserWarning, match=r"expect epsilon bounds of 0: canary\.count=200 .*"
                      r"most powerful attack on Poisson gradient canaries .*lower "
                      r"dp\.noise_multiplier, raise dp\.steps or canary\.inclusion_prob"):
        weak = expect(6.0, 200)
    assert weak["epsilon"] == 0 and "advice" in weak
    strong = expect(1.0, 1000)
    assert strong["epsilon"] > 0.1 and "advice" not in strong


@pytest.mark.parametrize("cli,groups", [
    (["canary=input"], {"canary": {"kind": "input"}}),
    (["canary=input", "canary.count=7"], {"canary": {"kind": "input", "count": 7}}),
    (["canary=gradient_poisson"], {"canary": {"kind": "gradient", "policy": "bernoulli"}}),
    (["audit=multi_run", "canary.count=1"], {"audit": {"mode": "multi_run"},
                                             "canary": {"count": 1}}),
    (["model=cnn"], {"model": {"name": "cnn"}}),
])
def test_python_group_mappings_take_the_cli_options_defaults(cli, groups):
    # run_audit(canary={"kind": "input"}) is the audit `dpaudit canary=input` runs
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module(config_module="dpaudit.conf", version_base="1.3"):
        cfg = compose("config", overrides=cli)
    task = OmegaConf.to_container(cfg.task, resolve=True)
    from_cli = AuditSettings.from_mappings(
        **{k: task[k] for k in ("data", "model", "dp", "canary", "attack", "audit")}
    )
    assert AuditSettings.from_mappings(**groups) == from_cli


def test_settings_are_frozen_and_the_cli_schema_composes_on_a_mutable_twin():
    """Nothing assigns to the settings after the check: every group is a frozen dataclass (a
    change is ``dataclasses.replace``). Hydra composes onto the schema's twin, which has the
    same fields, defaults and help."""
    import dataclasses

    from dpaudit.conf import DpauditConfig
    from dpaudit.experiment.settings import GROUPS

    s = AuditSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 1
    for group in GROUPS:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(getattr(s, group), dataclasses.fields(GROUPS[group])[0].name, None)
    twin = {f.name: f for f in dataclasses.fields(DpauditConfig)}
    for f in dataclasses.fields(AuditSettings):
        assert twin[f.name].metadata == f.metadata
        if f.name in GROUPS:
            kind = twin[f.name].type
            assert [(g.name, g.default, g.metadata) for g in dataclasses.fields(kind)] == [
                (g.name, g.default, g.metadata) for g in dataclasses.fields(GROUPS[f.name])]
            assert not kind.__dataclass_params__.frozen


@pytest.mark.parametrize(("groups", "message"), [
    ({"dp": {"noise_multipler": 2}},
     "unknown dp setting 'noise_multipler' (did you mean 'noise_multiplier'?); allowed: "),
    ({"model": {"name": "mpl"}}, "model.name must be one of ('logreg', 'mlp', 'cnn'), got "
     "'mpl' (did you mean 'mlp'?)"),
    ({"canary": {"kind": "gradeint"}}, "got 'gradeint' (did you mean 'gradient'?)"),
    ({"dp": {"clipping": "per_layr"}}, "got 'per_layr' (did you mean 'per_layer'?)"),
    ({"attack": {"scores": ["scalr"]}}, "got 'scalr' (did you mean 'scalar'?)"),
    ({"data": {"name": "digit"}}, "got 'digit' (did you mean 'digits'?)"),
    ({"dp": {"bug": "halvednoise"}}, "got 'halvednoise' (did you mean 'halved_noise' or "),
    ({"canary": {"options": {"placment": "random_live"}}},
     "unknown canary.options key 'placment' (did you mean 'placement'?)"),
    ({"nosie": 3}, "unknown audit setting 'nosie'; allowed: attack, audit, canary"),
    ({"noise_multiplier": 2}, "unknown audit setting 'noise_multiplier': it is a dp setting, "
     "give it as dp={'noise_multiplier': ...}"),
])
def test_an_unknown_key_or_value_gets_did_you_mean(groups, message):
    with pytest.raises(ValueError) as err:
        AuditSettings.from_mappings(**groups)
    assert message in str(err.value)


def test_run_audit_says_did_you_mean_before_any_work():
    from dpaudit.experiment import run_audit

    with pytest.raises(ValueError, match=r"'noise_multipler' \(did you mean 'noise_multiplier'"):
        run_audit(dp={"noise_multipler": 2})
