"""The audit end to end through the Python API: tiny configs, real Opacus training."""

import json

import numpy as np
import pytest

from dpaudit.experiment import AuditSettings, audit_run, run_audit
from dpaudit.experiment import settings as settings_module
from dpaudit.experiment.plan import plan_audit, planned_threat_model, poisson_sample_rate
from dpaudit.experiment.trainings.run import RunRecord, prepare_run

TINY = {
    "data": {"name": "digits"},
    "model": {"name": "logreg"},
    "dp": {"noise_multiplier": 4.0, "steps": 40, "batch_size": 64},
    # no canaries inserted like an example: tests/experiment/test_lower_side_cli.py has them
    "canary": {"kind": "gradient", "count": 40, "lower_side": 0},
    "attack": {"scores": ["scalar", "mixture_lr"]},
    "audit": {"methods": ["gdp", "gaussian", "clopper_pearson"]},
    "progress": False,
}


def test_one_run_audit_report(tmp_path):
    res = run_audit(output_dir=tmp_path, **TINY)
    th = res["theory"]
    # Dirac canaries inserted at every step: the exact answer is mu = sqrt(T) / sigma.
    assert th["threat_model"]["sample_rate"] == 1.0
    assert th["gaussian_mu"] == pytest.approx(np.sqrt(40) / 4.0)
    assert res["steps"] == 40
    v = res["verdict"]
    # 40 Dirac canaries but only 30 dead coordinates: 10 canaries share coordinates with the
    # data, so the canaries are not independent and threshold-based numbers are estimates;
    # no method that certifies under dependence (one_run) was asked for.
    assert not res["independent_canaries"]
    assert {b["kind"] for b in res["bounds"]} == {"estimate"}
    assert v["best_lower_bound"] == 0.0 and v["best_method"] is None
    # the every-step canaries are the mechanism's stress test, reported apart from the claim
    assert not v["certified_bound_applies"]
    assert "no certified epsilon bound applies" in v["stress_test"]["message"]
    assert "no certified epsilon bound applies" not in v["message"]
    assert 0.0 < v["best_estimate"] <= th["claimed_epsilon"] and v["status"] == "consistent"
    # Bounds are simultaneously valid: each at 1 - 0.05 / (2 attacks x (3 methods + the
    # claim test) + the 2 attacks' one-run claim tests (canaries not independent)); the 7
    # white-box tests (the released noise floor, the noise's scale, marginal law, alignment
    # and freshness, Poisson sampling, the sampling by example) are a family of their own;
    # the PRIVACY BUG level 1e-6 is split over the 2 + 2 claim tests and the 7 white-box tests.
    wb = res["white_box"]
    assert wb["statistical_tests"] == 7
    assert set(wb["checks"]) == {
        "noise_floor", "noise_scale", "noise_marginal", "noise_alignment", "noise_freshness",
        "poisson_sampling", "clipping", "bookkeeping", "normalisation", "sampling_by_example",
        "sampling_duplicates", "model_integrity", "noise_ignores_data", "loader_fed_training",
    }
    assert not any(c["rejected"] for c in wb["checks"].values())
    assert all(b["confidence"] == pytest.approx(1 - 0.05 / 10) for b in res["bounds"])
    assert res["per_test_confidence"] == pytest.approx(1 - 0.05 / 10)
    assert wb["checks"]["noise_scale"]["warning_level"] == pytest.approx(0.05 / 7)
    assert res["refutation_per_statement"] == pytest.approx(1e-6 / 11)
    assert set(res["one_run_claim"]) == set(res["claim"])
    assert all(c["certified"] and not c["rejected"] for c in res["one_run_claim"].values())
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["schema_version"] == saved["provenance"]["schema_version"]
    assert saved["provenance"]["device"] == "cpu" and saved["provenance"]["versions"]["opacus"]
    assert saved["verdict"]["best_lower_bound"] == pytest.approx(v["best_lower_bound"])
    for plot in ("roc.png", "score_histograms.png"):
        assert (tmp_path / plot).stat().st_size > 1000


@pytest.mark.parametrize(
    "group,values,needle",
    [
        ("dp", {"delta": 1.0}, "dp.delta"),
        ("dp", {"bug": "typo"}, "dp.bug"),
        ("canary", {"norm": 2.0}, "exceeds the clip norm"),
        ("canary", {"count": 100000}, "larger than the candidate pool"),
        ("canary", {"kind": "input", "count": 500, "candidates": 100}, "candidate pool"),
        (
            "canary",
            {"kind": "input", "source": "blank", "count": 12, "candidates": 1000},
            r"the blank source makes at most 10 here, whatever canary\.candidates says",
        ),
        (
            "canary",
            {"kind": "input", "selection": "stratified", "count": 12},
            r"canary\.count must be a multiple of 5 with canary\.selection=stratified",
        ),
        ("attack", {"scores": ["nope"]}, "attack.scores"),
        ("attack", {"scores": ["batch_size"]}, "without 'batch_size' in a one-run audit"),
        ("audit", {"confidence": 95}, "audit.confidence"),
        ("model", {"name": "resnet"}, "model.name"),
        ("dp", {"lr_typo": 1}, "unknown dp setting"),
    ],
)
def test_bad_settings_fail_clearly(group, values, needle):
    cfg = {**TINY, group: {**TINY.get(group, {}), **values}}
    if cfg["canary"]["kind"] == "input":  # TINY's mixture_lr is for gradient canaries only
        cfg["attack"] = {"scores": ["scalar"]}
    with pytest.raises(ValueError, match=needle):
        run_audit(**cfg)


def test_stratified_selection_draws_count_over_five_score_strata():
    """canary.selection=stratified: count / 5 canaries at random from each quintile of the
    candidates' Mahalanobis scores (seeded), count in all, each quintile represented."""
    cfg = {
        **TINY,
        "dp": {"noise_multiplier": 1.0, "steps": 2, "batch_size": 64},
        "canary": {"kind": "input", "count": 10, "selection": "stratified", "candidates": 60},
        "attack": {"scores": ["scalar"]},
    }
    settings = AuditSettings.from_mappings(**cfg)
    setup = prepare_run(plan_audit(settings), np.ones(10, dtype=bool)).setup
    chosen, scores = np.asarray(setup.chosen), np.asarray(setup.candidate_scores)
    assert len(chosen) == len(set(chosen.tolist())) == 10
    ranks = np.argsort(np.argsort(scores))  # 0 = lowest score
    strata = ranks[chosen] * 5 // len(scores)
    assert sorted(np.bincount(strata, minlength=5).tolist()) == [2] * 5
    again = prepare_run(plan_audit(settings), np.ones(10, dtype=bool)).setup
    assert np.array_equal(again.chosen, setup.chosen)


def test_scores_that_cannot_apply_are_refused_before_anything_is_loaded():
    """mixture_lr models a gradient canary's per-step inclusion; batch_size gives every canary
    of one training the same value. Both refused by the settings, naming attack.scores."""
    refused = r"attack\.scores must be without 'mixture_lr' with canary\.kind=input"
    with pytest.raises(ValueError, match=refused):
        AuditSettings.from_mappings(canary={"kind": "input", "count": 5},
                                    attack={"scores": ["scalar", "mixture_lr"]})
    with pytest.raises(ValueError, match=r"attack\.scores must be without 'batch_size' in a one"):
        AuditSettings.from_mappings(attack={"scores": ["batch_size"]})
    multi = AuditSettings.from_mappings(  # where batch_size can separate: one bit per run
        canary={"count": 1}, attack={"scores": ["batch_size"]},
        audit={"mode": "multi_run", "runs": 10},
    )
    assert multi.attack_scores() == ["batch_size"]


def test_settings_reject_unknown_group():
    with pytest.raises(ValueError, match="unknown audit setting"):
        AuditSettings.from_mappings(datta={})


def test_input_canary_audit_reports_predicted_leakage(tmp_path):
    cfg = {
        **TINY,
        "dp": {"noise_multiplier": 1.0, "steps": 10, "batch_size": 64},
        "canary": {"kind": "input", "count": 10, "source": "mislabeled", "candidates": 60},
        "attack": {"scores": ["scalar", "covariance"]},
    }
    res = run_audit(output_dir=tmp_path, **cfg)
    pred = res["canary_info"]["predicted_leakage"]
    assert len(pred["mu_composed"]) == 10 and all(m > 0 for m in pred["mu_composed"])
    assert 0.5 < pred["mean_auc_summed_score"] < 1.0
    assert res["theory"]["threat_model"]["sample_rate"] == pytest.approx(res["sample_rate"])
    assert (tmp_path / "candidates_mahalanobis.png").exists()


def test_woodbury_covariance_audit_reports_its_truncation(tmp_path):
    """attack.estimator=woodbury takes the noise's ridge and attack.explained_variance; what
    it kept is in canary_info.precision (rank <= references, variance kept >= requested)."""
    cfg = {
        **TINY,
        "dp": {"noise_multiplier": 1.0, "steps": 5, "batch_size": 64},
        "canary": {"kind": "input", "count": 10, "source": "mislabeled", "candidates": 60},
        "attack": {
            "scores": ["covariance"], "estimator": "woodbury", "n_references": 32,
            "explained_variance": 0.9,
        },
    }
    res = run_audit(output_dir=tmp_path, **cfg)
    kept = res["canary_info"]["precision"]
    assert kept["n_refs"] == 32 and 1 <= kept["rank"] < 32
    assert 0.9 <= kept["explained_variance_kept"] <= 1.0
    assert 0 < kept["noise_ridge"] <= 1.0 and kept["ridge"] == 0  # sigma^2 C^2 / b, no extra
    assert kept["estimator"] == "woodbury"
    rows = [b for b in res["bounds"] if b["attack"] == "covariance"]
    assert rows and all(np.isfinite(b["epsilon"]) for b in rows if b["kind"] != "not applicable")
    with pytest.raises(ValueError, match=r"attack\.explained_variance must be null unless"):
        AuditSettings.from_mappings(attack={"explained_variance": 0.9})
    with pytest.raises(ValueError, match=r"attack\.explained_variance must be in \(0, 1\]"):
        AuditSettings.from_mappings(attack={"estimator": "woodbury", "explained_variance": 1.5})


@pytest.mark.parametrize("estimator", ["ledoit_wolf", "oas", "diagonal", "dense", "woodbury"])
def test_covariance_and_glir_score_dirac_canaries_on_dead_coordinates(tmp_path, estimator):
    """The default audit's Dirac canaries sit on dead coordinates, where every reference
    gradient is 0: the noise-aware precision is (sigma^2 C^2 / b)^-1 I there, never singular,
    so the covariance score is an increasing affine map of the scalar product (the same ranks,
    hence the same AUC and bounds) and GLiR runs too. The estimator's choice is recorded."""
    cfg = {
        **TINY,
        "dp": {"noise_multiplier": 4.0, "steps": 10, "batch_size": 64},
        "canary": {"kind": "gradient", "count": 20},
        "attack": {"scores": ["scalar", "covariance", "glir"], "estimator": estimator},
        "audit": {"methods": ["clopper_pearson", "gdp"]},
    }
    run = audit_run(plan_audit(AuditSettings.from_mappings(**cfg)), white_box=False)
    info = run.canary_info["precision"]
    sigma, b = cfg["dp"]["noise_multiplier"], info["batch_size"]
    assert info["estimator"] == estimator and info["ridge"] == 0.0 and info["dim"] == 20
    assert b == pytest.approx(64) and info["noise_ridge"] == pytest.approx(sigma**2 / b)
    scalar, cov = (np.asarray(run.scores[k]) for k in ("scalar", "covariance"))
    slope, offset = np.polyfit(scalar, cov, 1)
    np.testing.assert_allclose(cov, slope * scalar + offset, rtol=1e-6, atol=1e-6 * abs(cov).max())
    assert slope == pytest.approx(1 / info["noise_ridge"], rel=1e-6)
    assert np.isfinite(run.scores["glir"]).all() and np.ptp(run.scores["glir"]) > 0


def test_attack_ridge_adds_to_the_noise_ridge_and_dense_beyond_its_size_is_named(tmp_path):
    """attack.ridge regularises beyond the noise: on dead coordinates the covariance score's
    slope against the scalar product is 1 / (sigma^2 C^2 / b + ridge). An estimator that
    cannot take the coordinates is refused before training, naming attack.estimator."""
    cfg = {
        **TINY,
        "dp": {"noise_multiplier": 4.0, "steps": 5, "batch_size": 64},
        "canary": {"kind": "gradient", "count": 10},
        "attack": {"scores": ["scalar", "covariance"], "ridge": 1.0},
    }
    run = audit_run(plan_audit(AuditSettings.from_mappings(**cfg)), white_box=False)
    info = run.canary_info["precision"]
    assert info["ridge"] == 1.0
    slope = np.polyfit(run.scores["scalar"], run.scores["covariance"], 1)[0]
    assert slope == pytest.approx(1 / (info["noise_ridge"] + 1.0), rel=1e-6)
    with pytest.raises(ValueError, match=r"^attack\.ridge must be a non-negative"):
        AuditSettings.from_mappings(attack={"ridge": -0.5})
    big = {**cfg, "model": {"name": "mlp"},
           "canary": {"kind": "input", "count": 4, "source": "mislabeled", "candidates": 20},
           "attack": {"scores": ["covariance"], "estimator": "dense"}}
    with pytest.raises(ValueError, match=r"^attack\.estimator=dense: dense estimator forms d x d"):
        audit_run(plan_audit(AuditSettings.from_mappings(**big)), white_box=False)


def test_allowed_names_come_from_the_registries():
    from dpaudit.canaries import INPUT_SOURCES
    from dpaudit.data import DATASETS
    from dpaudit.experiment.trainings.scores import SCORES

    assert settings_module.ATTACKS == tuple(SCORES)
    assert settings_module.INPUT_SOURCES == tuple(INPUT_SOURCES)
    assert settings_module.DATASETS == tuple(DATASETS)
    with pytest.raises(ValueError, match=r"canary\.source must be one of \('in_distribution'"):
        AuditSettings.from_mappings(canary={"source": "nope"})
    with pytest.raises(AttributeError):
        settings_module.NO_SUCH_REGISTRY


def test_threat_model_built_once_sets_bernoulli_canaries_inclusion():
    """Bernoulli gradient canaries (q_c defaulting to the data's q): the canaries, the
    mixture LR and the run record all use the threat model's sample rate."""
    settings = AuditSettings.from_mappings(
        **{
            **TINY,
            "dp": {"noise_multiplier": 4.0, "steps": 3, "batch_size": 64},
            "canary": {"kind": "gradient", "count": 10, "policy": "bernoulli"},
        }
    )
    plan = plan_audit(settings)
    prepared = prepare_run(plan)
    threat = prepared.threat
    q = poisson_sample_rate(64, prepared.setup.n_base)
    assert threat == planned_threat_model(plan, prepared.derived.realised, q, 3)
    assert prepared.derived.realised.member_rate == q and prepared.derived.realised.norm == 1.0
    assert threat.sample_rate == q == prepared.sample_rate < 1.0
    assert prepared.setup.canaries.inclusion_prob == threat.sample_rate
    mixture = next(s for s in prepared.scores if type(s).__name__ == "MixtureLR")
    assert mixture.inclusion_prob == threat.sample_rate
    run = audit_run(plan, prepared=prepared)
    assert isinstance(run, RunRecord) and run.threat_model == threat and run.steps == 3
    assert RunRecord.from_dict(run.to_dict()).threat_model == threat  # JSON round trip
