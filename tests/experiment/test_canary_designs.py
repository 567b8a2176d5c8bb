"""Canary designs as plug-ins: a design written outside the package (tests/support/
my_design.py, one file) runs a whole audit; the built-in designs answer what they realise."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from my_design import NAME, SparseSignDesign, register, unregister

from dpaudit.experiment import AuditSettings, run_audit
from dpaudit.experiment.canary_designs import DESIGNS, GradientDesign, InputDesign, design_of
from dpaudit.experiment.plan import independent_canaries, plan_audit, planned_threat_model

TINY = dict(canary={"kind": NAME, "count": 200, "options": {"support": 8}},
            dp={"noise_multiplier": 6.0, "steps": 20}, progress=False)


@pytest.fixture
def sparse_sign():
    register()
    yield
    unregister()


def test_a_design_from_outside_the_package_runs_an_audit(sparse_sign):
    result = run_audit(**TINY)
    tm = result["theory"]["threat_model"]
    # what the design says it realises is the claim under test: gradient canaries of norm C,
    # every step (q = 1), so the exact Gaussian mechanism with mu = sqrt(T) / sigma
    assert (tm["canary_kind"], tm["sample_rate"], tm["canary_norm"]) == ("gradient", 1.0, 1.0)
    assert result["theory"]["gaussian_mu"] == pytest.approx(np.sqrt(20) / 6.0)
    assert result["canary_info"]["support"] == 8
    # its canaries are not declared independent: the threshold methods become estimates
    assert result["independent_canaries"] is False
    cp = next(b for b in result["bounds"] if b["method"] == "clopper_pearson")
    assert cp["kind"] == "estimate"
    # the members' scalar scores are shifted by about mu: AUC = Phi(mu / sqrt 2) ~ 0.70
    assert 0.6 < result["attacks"]["scalar"]["auc"] < 0.8
    assert result["verdict"]["status"] == "consistent"


def test_its_options_and_refusals_are_checked_before_training(sparse_sign):
    with pytest.raises(ValueError, match=r"unknown canary.options key 'width'; allowed: .*support"):
        AuditSettings.from_mappings(canary={"kind": NAME, "options": {"width": 3}})
    with pytest.raises(ValueError, match="support must be a positive integer"):
        AuditSettings.from_mappings(canary={"kind": NAME, "options": {"support": 0}})
    with pytest.raises(ValueError, match=r"without 'mixture_lr' with canary\.kind=sparse_sign"):
        AuditSettings.from_mappings(canary={"kind": NAME}, attack={"scores": ["mixture_lr"]})
    with pytest.raises(TypeError, match="must be a CanaryDesign instance"):
        DESIGNS.register("not_a_design", SparseSignDesign)  # the class, not an instance


def test_the_example_design_reads_no_settings_field():
    """The plug-in example of the docs (tests/support/my_design.py) never names the settings:
    its options, the typed context and a Realisation are all it uses."""
    import ast

    import my_design

    tree = ast.parse(Path(my_design.__file__).read_text())
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "settings" not in names and "AuditSettings" not in Path(my_design.__file__).read_text()
    assert {"options", "count", "max_grad_norm"} <= names


def test_a_design_written_for_the_old_interface_still_audits_with_a_warning(sparse_sign):
    """tests/support/legacy_design.py is my_design.py as written for dpaudit 0.1 (hooks taking
    the settings, ``ctx.settings`` in ``build``): it still audits, with a DeprecationWarning,
    and its audit is the new design's number for number."""
    import legacy_design

    from dpaudit.experiment.canary_designs import legacy

    legacy_design.register()
    legacy._WARNED.discard(legacy_design.SparseSignDesign)
    try:
        with pytest.warns(DeprecationWarning, match=r"SparseSignDesign\.sample_rate, "
                          r"canary_norm, check\(settings, \.\.\.\) is the dpaudit-0\.1"):
            old = run_audit(**{**TINY, "canary": {**TINY["canary"], "kind": legacy_design.NAME}})
        with pytest.raises(ValueError, match="support must be a positive integer"):
            AuditSettings.from_mappings(canary={"kind": legacy_design.NAME,
                                                "options": {"support": 0}})
    finally:
        legacy_design.unregister()
    new = run_audit(**TINY)
    for key in ("attacks", "claim", "bounds", "theory", "canary_info", "independent_canaries",
                "verdict"):  # as JSON: a bound that does not apply is NaN on both sides
        # (the reason the report gives for no canaries inserted like an example names the kind)
        was = json.dumps(old[key], sort_keys=True).replace(legacy_design.NAME, NAME)
        assert was == json.dumps(new[key], sort_keys=True), key


def test_without_registration_the_kind_is_refused_naming_the_designs():
    with pytest.raises(ValueError, match=r"canary.kind must be one of \('gradient', 'input'"):
        AuditSettings.from_mappings(canary={"kind": NAME})


@pytest.mark.parametrize(("canary", "mode", "rate", "kind", "independent", "scores"), [
    ({}, "one_run", 1.0, "gradient", True, ["scalar"]),
    ({"policy": "bernoulli"}, "one_run", 0.05, "gradient", True, ["mixture_lr"]),
    ({"policy": "bernoulli", "inclusion_prob": 0.3}, "one_run", 0.3, "gradient", True,
     ["mixture_lr"]),
    ({"direction": "random"}, "one_run", 1.0, "gradient", False, ["scalar"]),
    ({"kind": "input", "count": 50}, "one_run", 0.05, "input", False, ["scalar"]),
    ({"kind": "input", "count": 1}, "multi_run", 0.05, "input", True, ["scalar"]),
])
def test_built_in_designs_say_what_they_realise(canary, mode, rate, kind, independent, scores):
    s = AuditSettings.from_mappings(canary=canary, audit={"mode": mode})
    plan = plan_audit(s)
    c = plan.canary
    ctx = dataclasses.replace(c.context, data_sample_rate=0.05)
    # a Dirac design is on dead coordinates when the build found every canary on one
    built = SimpleNamespace(info={"canaries_on_zero_gradient_coordinates": s.canary.count})
    realised = c.design.realises(c.options, ctx, built)
    threat = planned_threat_model(plan, realised, 0.05, 100)
    assert (threat.sample_rate, threat.canary_kind) == (rate, kind)
    assert independent_canaries(plan.judging, c.count, realised) is independent
    assert s.attack_scores() == list(plan.scores) == scores
    assert isinstance(design_of(s.canary), GradientDesign if kind == "gradient" else InputDesign)


@pytest.mark.slow
def test_the_cli_audits_a_design_from_a_plugin(tmp_path):
    support = Path(__file__).resolve().parents[1] / "support"
    env = {**os.environ, "MY_DESIGN_REGISTER_ON_IMPORT": "1",
           "PYTHONPATH": os.pathsep.join([str(support), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "dpaudit.cli", f"hydra.run.dir={tmp_path}", "plugins=[my_design]",
           f"canary.kind={NAME}", "canary.count=100", "+canary.options.support=8",
           "dp.steps=10", "progress=false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["settings"]["canary"]["options"] == {"support": 8}
    assert result["canary_info"]["support"] == 8


def test_tensors_gathers_a_tensor_dataset_as_it_reads_any_dataset():
    """``tensors``' one-gather path for a ``TensorDataset`` returns what reading the examples
    one by one returns (the generic path, taken for any other dataset: here a ``Subset``)."""
    import torch
    from torch.utils.data import Subset, TensorDataset

    from dpaudit.experiment.canary_designs.base import tensors

    gen = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(20, 3, 4, generator=gen), torch.randint(0, 5, (20,)))
    idx = np.array([7, 0, 19, 7, 3])
    fast = tensors(ds, idx)
    slow = tensors(Subset(ds, range(20)), idx)
    assert len(fast) == 2
    for a, b in zip(fast, slow, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
