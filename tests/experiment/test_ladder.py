"""The threat-model ladder: the same training judged as the white-box, hidden-state and
black-box adversaries see it (``judging.ladder``), from the own loop and from the CLI."""

import json

import numpy as np
import pytest
import torch
from capture_support import digits_flat, dirac_coords, private_run
from torch import nn

from dpaudit.capture import AuditHook, GradientCanaries, InputCanaries
from dpaudit.experiment import audit_report, run_audit
from dpaudit.experiment.judging.ladder import ladder_warnings, with_ladder_warnings
from dpaudit.experiment.judging.outputs import console_table

PAD = 8
DIM = 10 * (64 + PAD) + 10


@pytest.fixture(scope="module")
def data():
    return digits_flat(pad=PAD, n_train=500)


def _run(data, optimizer="sgd", lr=0.3, epochs=2, inputs=None):
    ds, zero = data
    coords = dirac_coords(zero, 64 + PAD)[:60]
    member = np.random.default_rng(1).random(60) < 0.5
    policy = ["every_step" if m else "never" for m in member]

    def make(opt, model):
        sets = [GradientCanaries.dirac(coords, 1.0, DIM, policy=policy)]
        if inputs is not None:
            sets.insert(0, InputCanaries(*inputs))
        return AuditHook(opt, model, sets)
    return private_run(ds, lambda: nn.Linear(64 + PAD, 10), make, optimizer=optimizer, lr=lr,
                       epochs=epochs, sigma=2.0), member


def _rows(res):
    return {r["rung"]: r for r in res["threat_model_ladder"]["rungs"]}


def test_hidden_state_of_plain_sgd_equals_the_white_box_rung(data):
    """Same training, plain SGD: the final coordinates are -lr x the sums the white-box
    scalar reads, so both rungs rank alike and certify the same epsilon."""
    run, _ = _run(data)
    res = audit_report(run.hook, rung="hidden_state", quiet=True)
    rows = _rows(res)
    wb, hs = rows["white_box"], rows["hidden_state"]
    white = run.hook.scores()["scalar"]
    hidden = run.hook.hidden_state_scores()
    assert np.array_equal(np.argsort(white, kind="stable"), np.argsort(hidden, kind="stable"))
    assert hs["certified_epsilon"] == wb["certified_epsilon"] > 0
    assert hs["certified_ratio"] == 1.0 and hs["independent_canaries"]
    assert hs["summary"]["sums_releases"]
    assert not rows["black_box"]["available"] and "input" in rows["black_box"]["reason"]
    # the verdict is the hidden-state rung's, and says so
    assert res["threat_model_ladder"]["selected"] == "hidden_state"
    assert "verdict's adversary: hidden_state" in res["verdict"]["message"]
    assert res["verdict"]["best_lower_bound"] == pytest.approx(hs["certified_epsilon"], rel=0.2)


def test_canaries_the_data_reached_are_dependent_on_every_rung(data):
    """Dirac canaries on live weights, declared independent: the hook's independence record
    withdraws it for the verdict and for every rung of the ladder alike."""
    ds, _ = data
    live = [c * (64 + PAD) + j for j in range(10, 40) for c in (0,)]

    def make(opt, model):
        return AuditHook(opt, model, GradientCanaries.dirac(live, 1.0, DIM, policy=[
            "every_step", "never"] * 15))
    run = private_run(ds, lambda: nn.Linear(64 + PAD, 10), make, epochs=1)
    res = audit_report(run.hook, rung="hidden_state", independent_canaries=True, quiet=True)
    assert res["white_box"]["canary_independence"]["withdrawn"]
    rows = _rows(res)
    assert not rows["white_box"]["independent_canaries"]
    assert not rows["hidden_state"]["independent_canaries"]


def test_hidden_state_under_adam_stays_certified_and_named(data):
    run, _ = _run(data, optimizer="adam", lr=0.02)
    hs = _rows(audit_report(run.hook, rung="hidden_state", quiet=True))["hidden_state"]
    assert hs["independent_canaries"] and hs["summary"]["base_optimizer"] == "Adam"
    assert not hs["summary"]["sums_releases"]
    assert hs["status"] != "privacy_bug"


def test_black_box_rung_of_input_canaries(data):
    ds, _ = data
    x, y = ds.tensors[0][:40], (ds.tensors[1][:40] + 3) % 10
    run, _ = _run(data, inputs=(x, y))
    member = np.random.default_rng(2).random(40) < 0.5  # not in the data: a null membership
    res = audit_report(run.hook, canaries=0, membership=member, rung="black_box")
    rows = _rows(res)
    bb = rows["black_box"]
    assert bb["available"]
    assert bb["scores"] == ["logit_margin", "loss_gain", "margin_gain", "neg_loss"]
    assert not bb["independent_canaries"]  # trained together: the one-run methods certify
    assert set(bb["forecast"]["epsilon_at_per_side"]) == {"1000", "10000"}
    assert "not a bound" in bb["forecast"]["kind"]
    assert not rows["hidden_state"]["available"]
    assert res["threat_model_ladder"]["selected"] == "black_box"
    json.dumps(res["threat_model_ladder"])  # plain JSON, as results.json writes it
    assert "threat-model ladder" in console_table(res)


def test_rung_refusals(data):
    run, _ = _run(data, epochs=1)
    with pytest.raises(ValueError, match="did you mean 'hidden_state'"):
        audit_report(run.hook, rung="hidden")
    with pytest.raises(ValueError, match="black box sees the final model's outputs"):
        audit_report(run.hook, rung="black_box")
    with pytest.raises(ValueError, match="pass the AuditHook and no scores"):
        audit_report(scores=np.zeros(4), membership=[1, 0, 1, 0], rung="hidden_state")


def test_another_rung_refuting_is_a_warning_of_the_verdict():
    from dpaudit.report.results import Verdict

    block = {"selected": "hidden_state", "rungs": [
        {"rung": "white_box", "available": True, "status": "privacy_bug",
         "claim_rejected_by": ["scalar"]},
        {"rung": "hidden_state", "available": True, "status": "consistent",
         "claim_rejected_by": []},
        {"rung": "black_box", "available": False, "reason": "x"}]}
    assert len(ladder_warnings(block)) == 1
    v = Verdict(status="consistent", privacy_bug=False, message="m.", confidence=0.95,
                threat_model="t", accountant="a", claimed_epsilon=1.0, best_lower_bound=0.0,
                certified_bound_applies=True, best_attack=None, best_method=None, ratio=0.0,
                best_estimate=0.0, estimate_attack=None, estimate_method=None,
                estimate_assumption=None, estimate_ratio=0.0, claim_rejected_by=[],
                white_box_fired=[], claim_rejected_uncertified=[], sigma_upper=1.0,
                sigma_upper_attack=None, sigma_upper_certified=False, noise_multiplier=1.0)
    out = with_ladder_warnings(v, block)
    assert out.status == "consistent" and "white_box rung" in out.warnings[0]
    assert "LADDER" in out.message


def test_cli_hidden_state_audit_reports_the_ladder():
    # with canaries inserted like an example beside the audited ones (a few): the ladder's
    # rungs score the audited set alone (its 150 canaries' membership splits them)
    res = run_audit(audit={"threat_model": "hidden_state"}, dp={"steps": 20},
                    canary={"count": 150, "lower_side": 200}, model={"width": 50},
                    progress=False)
    assert res["verdict"]["training_data"]["lower"]["canaries"] == [200, 200]
    rows = _rows(res)
    assert rows["hidden_state"]["certified_epsilon"] == rows["white_box"]["certified_epsilon"]
    assert "threat-model ladder" in console_table(res)
    assert res["settings"]["audit"]["threat_model"] == "hidden_state"


def test_final_model_scores_read_the_trained_weights(data):
    """The black-box scores are the trained model's: zeroing the weights changes them."""
    ds, _ = data
    x, y = ds.tensors[0][:5], ds.tensors[1][:5]
    run, _ = _run(data, inputs=(x, y), epochs=1)
    before = run.hook.final_model_scores()["neg_loss"][:5]
    with torch.no_grad():
        run.model._module.weight.zero_()
        run.model._module.bias.zero_()
    after = run.hook.final_model_scores()["neg_loss"][:5]
    np.testing.assert_allclose(after, -np.log(10.0), rtol=1e-6)
    assert not np.allclose(before, after)


@pytest.mark.slow
@pytest.mark.parametrize("preset,overrides,rung", [
    ("worst_case_init_mnist5k", ["audit.runs=6", "dp.steps=5"], "black_box"),
    ("black_box_mnist5k", ["dp.steps=5", "canary.count=20", "canary.candidates=20"],
     "black_box"),
])
def test_the_black_box_presets_run(preset, overrides, rung, tmp_path):
    """The two mnist5k presets, shortened: the verdict is the black box's, the ladder puts
    the white box of the same training beside it, the model was pre-trained."""
    pytest.importorskip("mlxtend")
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module(config_module="dpaudit.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={preset}", *overrides,
                                           "progress=false"])
    task = OmegaConf.to_container(cfg.task, resolve=True)
    groups = {k: task[k] for k in ("data", "model", "dp", "canary", "attack", "audit", "seed",
                                   "progress") if k in task}
    res = run_audit(output_dir=tmp_path, **groups)
    rows = _rows(res)
    assert res["threat_model_ladder"]["selected"] == rung
    assert rows["white_box"]["available"] and rows["black_box"]["available"]
    assert not rows["hidden_state"]["available"]
    assert res["canary_info"]["pretrained"]["records"] == 2750
    if preset.startswith("worst"):
        assert rows["black_box"]["anchor_gdp"] is not None
        assert rows["black_box"]["independent_canaries"]  # one canary per run
