"""Open registries: a data set, a model, a score and a bound method registered from outside the
package (``tests/support/my_extension.py``) run an audit, from Python and from the CLI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from my_extension import NAMES, register_all, unregister_all

import dpaudit
from dpaudit.experiment import run_audit
from dpaudit.models import MODELS, build_model
from dpaudit.registry import Registry, load_plugins
from dpaudit.stats import epsilon_lower_bound

TINY = dict(
    data={"name": NAMES["dataset"]},
    model={"name": NAMES["model"], "width": 32},
    dp={"noise_multiplier": 1.0, "steps": 30},
    canary={"count": 200},
    attack={"scores": ["scalar", NAMES["score"]]},
    audit={"methods": ["clopper_pearson", NAMES["bound"]]},
    progress=False,
)


@pytest.fixture
def extension():
    register_all()
    yield
    unregister_all()


def _rows(result):
    return {(b["attack"], b["method"]): b for b in result["bounds"]}


def test_an_audit_runs_on_a_registered_data_set_model_score_and_bound(extension):
    result = run_audit(**TINY)
    rows = _rows(result)
    assert result["settings"]["data"]["name"] == "blobs"
    # the registered score is reported under its registered name, for every method
    for method in ("clopper_pearson", "cp_estimate"):
        assert {("scalar", method), ("cosine", method)} <= set(rows)
    # the same statistic as Clopper-Pearson at the same per-test confidence: the same number,
    # but an estimate (registered without certified=True), so it cannot make a privacy bug
    for attack in ("scalar", "cosine"):
        cp, mine = rows[(attack, "clopper_pearson")], rows[(attack, "cp_estimate")]
        assert mine["epsilon"] == cp["epsilon"] and mine["confidence"] == cp["confidence"]
        assert mine["kind"] == "estimate" and "not declared certified" in mine["assumption"]
    # Dirac canaries on the registered model: the cosine score separates members at sigma = 1
    assert result["attacks"]["cosine"]["auc"] > 0.9


def test_registered_names_are_checked_like_built_in_ones(extension):
    with pytest.raises(ValueError, match=r"data\.name must be one of .*'blobs'"):
        run_audit(**{**TINY, "data": {"name": "blobz"}})
    with pytest.raises(ValueError, match="already registered; pass replace=True"):
        dpaudit.register_model(NAMES["model"], build_model)
    with pytest.raises(TypeError, match="must be a callable"):
        dpaudit.register_model("not_callable", 3)
    with pytest.raises(ValueError, match="built in and cannot be unregistered"):
        MODELS.unregister("mlp")


def test_a_registered_bound_is_an_estimate_unless_declared_certified(extension):
    rng = np.random.default_rng(0)
    s_in, s_out = rng.normal(2, 1, 500), rng.normal(0, 1, 500)
    cp = epsilon_lower_bound(s_in, s_out, delta=1e-5, method="clopper_pearson")
    mine = epsilon_lower_bound(s_in, s_out, delta=1e-5, method="cp_estimate")
    assert mine.epsilon == cp.epsilon > 0 and not mine.certified and cp.certified
    with pytest.raises(ValueError, match="dependent_ok is a property of certified methods"):
        dpaudit.register_bound("x", lambda *a, **k: cp, dependent_ok=True)


def test_a_builder_of_the_wrong_type_is_named():
    reg = Registry("gadget")
    reg.register("a", 1)
    assert reg.register("b")(len) is len and tuple(reg) == ("a", "b")
    dpaudit.register_model("returns_a_string", lambda shape, k, w: "model")
    try:
        with pytest.raises(TypeError, match=r"model 'returns_a_string' must return an nn\.Module"):
            build_model("returns_a_string", (4,), 2)
    finally:
        MODELS.unregister("returns_a_string")


def test_hydra_target_plugins_register_and_bad_ones_are_named():
    plugin = {"_target_": "dpaudit.register_model", "name": "from_hydra",
              "builder": {"_target_": "my_extension.two_layer", "_partial_": True}}
    try:
        load_plugins([plugin])
        assert build_model("from_hydra", (12,), 2, 4)[0].out_features == 4
    finally:
        MODELS.unregister("from_hydra")
    with pytest.raises(ValueError, match=r"plugins\[0\] \('no_such_module'\) failed"):
        load_plugins(["no_such_module"])


@pytest.mark.slow
def test_the_cli_loads_plugins_before_checking_the_settings(tmp_path):
    support = Path(__file__).resolve().parent / "support"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(support), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "dpaudit.cli", f"hydra.run.dir={tmp_path}",
           "plugins=[my_extension_plugin]", "data.name=blobs", "model.name=two_layer",
           "model.width=32", "dp.noise_multiplier=1.0", "dp.steps=30", "canary.count=200",
           "attack.scores=[scalar,cosine]", "audit.methods=[clopper_pearson,cp_estimate]",
           "progress=false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "results.json").read_text())
    assert {("cosine", "cp_estimate"), ("scalar", "clopper_pearson")} <= set(_rows(result))
    # without the plugin the same names are refused before training, naming the setting
    bad = subprocess.run(cmd[:4] + cmd[5:], capture_output=True, text=True, timeout=300,
                         env=env)
    assert bad.returncode != 0 and "data.name must be one of" in bad.stderr


def test_a_score_builder_reading_the_old_settings_still_works_with_a_warning():
    """dpaudit 0.1 gave score builders ``ctx.settings``; for one release it is a read-only view
    of what a score reads (the attack group, and dp's noise, clip norm and delta, which are the
    threat model's), with a DeprecationWarning; other fields fail loudly."""
    from dpaudit.attacks import ScalarProduct
    from dpaudit.experiment.trainings.scores import SCORES, register_score

    seen = {}

    def old_builder(ctx):
        seen["refs"] = ctx.settings.attack.n_references
        seen["C"], seen["sigma"] = ctx.settings.dp.max_grad_norm, ctx.settings.dp.noise_multiplier
        with pytest.raises(AttributeError):
            ctx.settings.dp.batch_size  # not part of the view
        score = ScalarProduct()
        score.name = "old_style"
        return score

    register_score("old_style", old_builder)
    try:
        with pytest.warns(DeprecationWarning, match=r"ScoreContext\.settings .* ctx\.attack"):
            res = run_audit(dp={"noise_multiplier": 3.0, "steps": 5, "max_grad_norm": 0.5},
                            canary={"count": 20}, attack={"scores": ["old_style"]},
                            audit={"methods": ["gdp"]}, progress=False)
    finally:
        SCORES.unregister("old_style")
    assert seen == {"refs": 128, "C": 0.5, "sigma": 3.0}
    assert "old_style" in res["attacks"]


def test_an_unknown_registry_name_gets_did_you_mean():
    from dpaudit.models import MODELS

    with pytest.raises(ValueError, match=r"got 'mpl' \(did you mean 'mlp'\?\)"):
        MODELS.get_or_fail("mpl", "model.name")
    with pytest.raises(ValueError, match=r"no model 'wide_logreg' is registered \(did you "
                       r"mean 'logreg'\?\)$"):
        MODELS.unregister("wide_logreg")
