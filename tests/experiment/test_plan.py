"""The plan: the settings resolved once into frozen records, and what each prepared run
derives from it (q, T, the expected batch size, the threat model), against closed forms."""

import dataclasses

import numpy as np
import pytest

from dpaudit.experiment.plan import (
    Realisation,
    derive,
    expected_batch_size,
    plan_audit,
    planned_threat_model,
    poisson_sample_rate,
    total_steps,
)
from dpaudit.experiment.settings import AuditSettings, DPSettings
from dpaudit.experiment.trainings.run import prepare_run


def test_the_plan_is_frozen_and_holds_what_the_settings_resolve_to():
    s = AuditSettings.from_mappings(canary={"kind": "gradient", "policy": "bernoulli",
                                            "count": 30}, device="cpu")
    plan = plan_audit(s)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.seed = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.canary.context.count = 3  # type: ignore[misc]
    assert str(plan.device) == "cpu" and plan.scores == ("mixture_lr",)
    assert plan.canary.options.policy == "bernoulli" and plan.canary.count == 30
    assert plan.judging.methods == tuple(s.audit.methods)
    assert plan.canary.context.data_sample_rate is None  # no data loaded yet


def test_the_derived_values_are_their_closed_forms():
    dp = DPSettings(batch_size=64, steps=None, epochs=2.0)
    q = poisson_sample_rate(64, 1347)
    assert q == 1 / 21  # 1347 / 64 = 21.05 steps per epoch
    assert total_steps(dp, q) == 42 and total_steps(dataclasses.replace(dp, steps=7), q) == 7
    assert expected_batch_size(1347, q) == 64 and expected_batch_size(10, 0.01) == 1
    with pytest.raises(ValueError, match=r"dp\.batch_size \(64\) exceeds the training set"):
        poisson_sample_rate(64, 50)


def test_a_run_derives_q_on_the_data_without_its_canaries():
    """Input canaries drawn from the training data are held out of it: q is computed on what
    is left (the same in every run), the expected batch on the set the model trains on (with
    the member canaries), T from dp.epochs at that q, the threat model at the data's rate."""
    s = AuditSettings.from_mappings(
        dp={"steps": None, "epochs": 0.1, "batch_size": 64}, device="cpu", progress=False,
        canary={"kind": "input", "count": 10, "source": "in_distribution", "candidates": 200},
        attack={"scores": ["scalar"]})
    plan = plan_audit(s)
    prepared = prepare_run(plan, warn=False)
    setup, derived = prepared.setup, prepared.derived
    assert setup.n_base < 1347  # the candidates were held out
    q = 1 / round(setup.n_base / 64)
    assert derived.sample_rate == q
    assert derived.steps == max(1, round(0.1 / q))
    assert derived.expected_batch_size == int(len(setup.train_set) * q)
    assert derived.realised == Realisation(kind="input", on_dead_coordinates=False)
    assert derived.threat == planned_threat_model(plan, derived.realised, q, derived.steps)
    assert derived.threat.sample_rate == q and not derived.independent
    assert derive(plan, setup) == derived  # a function of the plan and the canaries built


def test_dirac_canaries_on_dead_coordinates_are_independent_experiments():
    s = AuditSettings.from_mappings(canary={"count": 20}, dp={"steps": 3}, device="cpu",
                                    progress=False)
    prepared = prepare_run(plan_audit(s), warn=False)
    r = prepared.derived.realised
    assert (r.kind, r.member_rate, r.norm, r.shares_a_run) == ("gradient", 1.0, 1.0, True)
    assert r.on_dead_coordinates and prepared.derived.independent
    probes = prepared.setup.noise_probes
    assert probes is not None and len(probes) == 20  # every canary on a dead coordinate
    assert np.array_equal(probes, sorted(prepared.setup.info["coordinates"]))


@pytest.mark.parametrize(("kw", "needle"), [
    ({"kind": "weights"}, "Realisation.kind must be one of"),
    ({"kind": "gradient", "member_rate": 0.0}, r"Realisation.member_rate must be None or in"),
    ({"kind": "gradient", "norm": -1.0}, "Realisation.norm must be None or a positive"),
    ({"kind": "input", "shares_a_run": "yes"}, "Realisation.shares_a_run must be a bool"),
])
def test_a_design_declaring_an_impossible_realisation_is_named(kw, needle):
    with pytest.raises(ValueError, match=needle):
        Realisation(**kw)


def test_a_design_whose_realises_returns_no_realisation_is_refused():
    from types import SimpleNamespace

    from dpaudit.experiment.canary_designs import GradientDesign

    class Untyped(GradientDesign):
        def realises(self, options, ctx, setup=None):
            return {"kind": "gradient"}

    plan = plan_audit(AuditSettings.from_mappings(device="cpu"))
    plan = dataclasses.replace(plan, canary=dataclasses.replace(plan.canary, design=Untyped()))
    built = SimpleNamespace(n_base=1000, train_set=range(1000), info={})
    with pytest.raises(TypeError, match=r"'gradient': realises\(\) must return a Realisation"):
        derive(plan, built)
