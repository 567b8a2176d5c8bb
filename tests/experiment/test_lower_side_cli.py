"""The CLI's canaries inserted like an example (issue 66): ``canary.lower_side`` adds, beside
the audited canaries, N member and N non-member Dirac canaries on a canary block of the
audit's own, each member entering a step with probability q (the data's rate); their
mixture log-LR scores are the certified lower side of the user's epsilon."""

import json

import numpy as np
import pytest
from scipy import stats

from dpaudit.experiment import AuditSettings, run_audit
from dpaudit.experiment.audit import evaluate, lower_input
from dpaudit.experiment.plan import plan_audit
from dpaudit.experiment.trainings.data_rate import (
    DataRateRecord,
    data_rate_design,
)
from dpaudit.experiment.trainings.run import RunRecord, audit_run
from dpaudit.names import DATA_RATE_PER_SIDE
from dpaudit.stats.data_rate import mixture_score_law

# logistic regression on digits: 30 first-layer weights of always-blank pixels carry the 20
# audited every-step canaries; 300 per side inserted like an example on the block
SMALL = {"model": {"name": "logreg"}, "dp": {"noise_multiplier": 1.0, "steps": 30},
         "canary": {"count": 20, "lower_side": 300}, "audit": {"methods": ["clopper_pearson"]},
         "progress": False}


@pytest.fixture(scope="module")
def small():
    """One small audited run with canaries inserted like an example, and its plan."""
    settings = AuditSettings.from_mappings(**SMALL)
    plan = plan_audit(settings)
    return settings, plan, audit_run(plan)


def test_the_default_audit_has_them_and_settings_where_they_cannot_apply_say_why():
    plan = plan_audit(AuditSettings())
    assert (plan.canary.lower_side, plan.canary.lower_side_note) == (DATA_RATE_PER_SIDE, "")
    off = plan_audit(AuditSettings.from_mappings(canary={"lower_side": 0}))
    assert (off.canary.lower_side, off.canary.lower_side_note) == (
        0, "canary.lower_side=0 turned them off")
    for groups, why in [
        ({"audit": {"mode": "multi_run", "runs": 4}, "canary": {"count": 1}},
         "audit.mode=multi_run"),
        ({"canary": {"kind": "input"}}, "canary.kind=input"),
        ({"canary": {"view": "full"}}, "canary.view=full"),
        ({"canary": {"direction": "random"}}, "canary.direction=random"),
        ({"dp": {"clipping": "per_layer"}}, "dp.clipping=per_layer"),
        ({"attack": {"scores": ["scalar", "covariance"]}}, "attack.scores has 'covariance'"),
    ]:
        plan = plan_audit(AuditSettings.from_mappings(**groups))  # null: none, and why
        assert plan.canary.lower_side == 0 and why in plan.canary.lower_side_note, groups
        with pytest.raises(ValueError, match=rf"canary\.lower_side must be 0 or null here: "
                                             rf".*{why}"):
            canary = {**groups.get("canary", {}), "lower_side": 10}
            AuditSettings.from_mappings(**{**groups, "canary": canary})


@pytest.mark.parametrize("value", [-1, 1.5, True, "many", 1_000_001])
def test_a_bad_count_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"canary\.lower_side must be an integer in "
                                         r"\[0, 1000001\)"):
        AuditSettings.from_mappings(canary={"lower_side": value})


def test_the_design_has_exactly_n_per_side_and_depends_on_the_seed_only():
    a = data_rate_design(500, 3, 0.05, 1.0)
    assert a.size == 1000 and int(a.membership.sum()) == 500
    assert np.array_equal(a.membership, data_rate_design(500, 3, 0.05, 1.0).membership)
    assert not np.array_equal(a.membership, data_rate_design(500, 4, 0.05, 1.0).membership)
    assert data_rate_design(0, 3, 0.05, 1.0) is None


def test_a_run_keeps_them_apart_from_the_audited_canaries(small):
    run = small[2]
    rate = run.data_rate
    # the audited canaries are unchanged: 20 every-step Dirac canaries, their scores only
    assert len(run.membership) == 20 and set(run.scores) == {"scalar"}
    assert all(len(v) == 20 for v in run.scores.values())
    assert run.per_step["scalar"].shape == (20, 30)
    assert run.canary_info["lower_side"]["per_side"] == 300
    # 300 + 300 on the block, seen independent at every step, at the data's rate and norm C
    assert len(rate.scores) == 600 and sum(rate.membership) == 300
    assert rate.independent and "every one of 30 steps" in rate.independence
    t = rate.threat_model
    assert (t.sample_rate, t.training_sample_rate, t.sensitivity, t.steps) == (
        run.sample_rate, run.sample_rate, 1.0, 30)
    # the hook watched both sets: neither was reached by the data
    sets = run.white_box.independence.sets
    assert [(s["set"], s["watched"], s["live_canaries"]) for s in sets] == [
        (0, True, 0), (1, True, 0)]


def test_their_scores_follow_the_claimed_mechanism_exactly(small):
    """Known answer: inserted like an example into Opacus' real step (clipped at C, the same
    noise), a member's summed mixture log-LR has the exact law of the Poisson-subsampled
    Gaussian's privacy loss (``stats.data_rate.mixture_score_law``), a non-member's too."""
    _, _, run = small
    s_in, s_out = run.data_rate.split()
    law = mixture_score_law(30, run.sample_rate, 1.0)
    for scores, cdf in ((s_in, law.cdf_in), (s_out, law.cdf_out)):
        assert stats.kstest(scores, cdf).pvalue > 1e-3
    assert s_in.mean() > s_out.mean()


def test_run_files_keep_them_and_older_files_still_read(small):
    _, _, run = small
    d = json.loads(json.dumps(run.to_dict()))
    back = RunRecord.from_dict(d, "run_0.json")
    assert back.data_rate.scores == pytest.approx(run.data_rate.scores)
    assert back.data_rate.membership == run.data_rate.membership
    assert back.data_rate.threat_model == run.data_rate.threat_model
    assert back.data_rate.independent and back.data_rate.independence == (
        run.data_rate.independence)
    old = {k: v for k, v in d.items() if k != "data_rate"}  # a file of an earlier dpaudit
    assert RunRecord.from_dict(old).data_rate is None
    assert "data_rate" not in RunRecord.from_dict(old).to_dict()
    for bad, needle in [({**d["data_rate"], "scores": [1.0]}, "one length"),
                        ({k: v for k, v in d["data_rate"].items() if k != "membership"},
                         "lacks"),
                        ({**d["data_rate"], "threat_model": {"steps": 3}}, "threat_model")]:
        with pytest.raises(ValueError, match=rf"run_0\.json: .*{needle}"):
            RunRecord.from_dict({**d, "data_rate": bad}, "run_0.json")


def test_the_evaluation_brackets_the_users_epsilon_with_them(small):
    settings, plan, run = small
    res = evaluate(settings, run, plan=plan).to_dict()
    td = res["verdict"]["training_data"]
    lower = td["lower"]
    assert lower["canaries"] == [300, 300] and lower["kind"].startswith("certified")
    assert td["epsilon_lower"] == lower["epsilon"] <= td["epsilon_claimed"]
    fam = lower["within_family"]
    assert "conditional on the family" in fam["kind"]
    assert not lower["refuted"] and res["verdict"]["status"] != "privacy_bug"
    # the report labels the two kinds apart
    from dpaudit.experiment.judging.outputs import console_table

    text = console_table(res)
    assert "certified (valid for any mechanism, 95%): epsilon >= " in text
    assert "within the family, conditional on the mechanism being a Poisson-subsampled" in text
    assert "(conditional on the family, not a certified bound)" in text
    assert "what these canaries certify on a correct run" in text


def test_canaries_not_seen_independent_give_no_lower_side_and_say_why(small):
    settings, plan, run = small
    rate = run.data_rate
    broken = DataRateRecord(rate.scores, rate.membership, rate.threat_model, False,
                            "the data reached 3 canaries (first at step 7)")
    run2 = RunRecord(**{**run.__dict__, "data_rate": broken})
    assert lower_input(run2)[0] is None
    res = evaluate(settings, run2, plan=plan).to_dict()
    td = res["verdict"]["training_data"]
    assert td["epsilon_lower"] is None and "within_family" not in td["lower"]
    assert any("the data reached 3 canaries" in w for w in res["verdict"]["warnings"])


def test_they_refute_a_training_whose_noise_was_halved():
    """Known answer: with Opacus' noise halved (``dp.bug=halved_noise``), the canaries
    inserted like an example see the mechanism of sigma 0.5, not the claimed 1: their claim
    test refutes the user's curve at the PRIVACY BUG level (p about 4e-11 at seed 0, against
    a share of 1e-6 of about 1e-7), and their certified noise bound is below the claimed
    sigma."""
    res = run_audit(model={"name": "logreg"},
                    dp={"noise_multiplier": 1.0, "steps": 30, "bug": "halved_noise"},
                    canary={"count": 20, "lower_side": 1000},
                    audit={"methods": ["clopper_pearson"]}, progress=False)
    v = res["verdict"]
    lower = v["training_data"]["lower"]
    test = lower["claim_test"]
    assert lower["refuted"] and test["refute_p_value"] < test["refutation_level"] < 1e-6
    assert lower["within_family"]["sigma_upper"] < 1.0
    assert v["status"] == "privacy_bug"
    assert "the canaries inserted like an example refute your claimed curve" in v["message"]


def test_without_them_the_report_says_why(tmp_path):
    res = run_audit(model={"name": "logreg"}, dp={"noise_multiplier": 1.0, "steps": 5},
                    canary={"count": 20, "lower_side": 0}, audit={"methods": ["gdp"]},
                    progress=False)
    lower = res["verdict"]["training_data"]["lower"]
    assert lower["data_rate_canaries"] == "none added: canary.lower_side=0 turned them off"
    assert res["canary_info"]["lower_side"] == {
        "per_side": 0, "why": "canary.lower_side=0 turned them off"}


@pytest.mark.slow
def test_the_cli_default_audit_certifies_a_lower_side_above_zero(tmp_path):
    """The default audit (``dpaudit``, seed 0): a certified lower side above 0 from 10^4
    canaries per side, the bracket on the report's front, a consistent verdict."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "dpaudit.cli", f"hydra.run.dir={tmp_path}",
                           "progress=false"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    td = res["verdict"]["training_data"]
    assert td["lower"]["canaries"] == [DATA_RATE_PER_SIDE, DATA_RATE_PER_SIDE]
    assert 0 < td["epsilon_lower"] < td["epsilon_claimed"] <= td["epsilon_upper"]
    assert 1 <= td["epsilon_claimed"] <= 8  # an epsilon a user would publish
    assert res["verdict"]["status"] == "consistent"
    assert "certified at least" in res["verdict"]["message"]
    assert "your epsilon's lower side, from canaries inserted like an example" in proc.stdout
