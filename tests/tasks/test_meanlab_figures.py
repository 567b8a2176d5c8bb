"""Mean-lab Hydra tasks: each writes results.json and PNGs, and every preset composes."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import call, get_method

import dpaudit.conf  # noqa: F401  (registers the config schema the presets compose with)
from dpaudit.meanlab import theory as th
from dpaudit.tasks import meanlab_figures as fig

CONF = Path(fig.__file__).resolve().parents[1] / "conf"
PRESETS = sorted(p.stem for p in (CONF / "experiment").glob("meanlab_*.yaml"))
SMALL = {"n": 100, "d": 300, "rounds": 200}


def _check(out: Path, res: dict, pngs):
    data = json.loads((out / "results.json").read_text())
    assert data.keys() == res.keys()
    for name in pngs:
        assert (out / name).stat().st_size > 1000


def test_lr_histograms_task(tmp_path):
    res = fig.lr_histograms(tmp_path, seed=1, **SMALL)
    _check(tmp_path, res, ["lr_histograms.png"])
    easy = res["targets"]["easy"]
    assert easy["theory"]["mean_in"] == pytest.approx(easy["m_star"] / 2)


def test_roc_targets_task(tmp_path):
    res = fig.roc_targets(tmp_path, seed=1, **SMALL)
    _check(tmp_path, res, ["roc_targets.png"])
    m = [res["targets"][k]["m_star"] for k in ("easy", "medium", "hard")]
    assert m[0] > m[1] > m[2]
    assert res["targets"]["easy"]["gdp"]["mu"] == pytest.approx(m[0] ** 0.5)


def test_roc_noise_and_subsampling_tasks(tmp_path):
    res = fig.roc_noise(tmp_path / "noise", seed=1, gammas=(0.0, 1.0), **SMALL)
    _check(tmp_path / "noise", res, ["roc_noise.png"])
    assert res["gammas"]["1.0"]["m_tilde"] < res["gammas"]["0.0"]["m_tilde"]
    res = fig.roc_subsampling(tmp_path / "sub", seed=1, rhos=(0.5,), **SMALL)
    _check(tmp_path / "sub", res, ["roc_subsampling.png"])
    r = res["modes"]["shared"]["0.5"]
    assert r["mixture_tpr_at_fpr"]["0.05"] == pytest.approx(
        th.subsampled_power_mixture(0.05, res["m_star"], 0.5)
    )


@pytest.mark.parametrize("family", ["bernoulli", "gaussian"])
def test_reference_points_task(tmp_path, family):
    res = fig.reference_points(tmp_path, seed=1, n0s=(20, 2000), family=family, **SMALL)
    _check(tmp_path, res, ["roc_reference_points.png", "power_vs_n0.png"])
    s = res["scores"]
    assert s["oracle"]["mu_theory"] >= s["plugin_2000"]["mu_theory"]


def test_linreg_task(tmp_path):
    res = fig.linreg_sweep(
        tmp_path, seed=1, n=20, D=200, rounds=100, gammas=(2.0, 5.0), ridges=(0.0, 0.1)
    )
    _check(tmp_path, res, ["linreg_advantage.png"])
    assert "adv_theory" in res["ridge"]["0.0"][0]
    assert "adv_theory" not in res["ridge"]["0.1"][0]


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_compose_and_name_a_task(preset):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"experiment={preset}", "seed=3"])
    assert cfg.task.seed == 3
    assert callable(get_method(cfg.task._target_))


def test_preset_runs_through_hydra_call(tmp_path):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=["experiment=meanlab_hist", "task.d=200", "task.n=50", "task.rounds=100"],
        )
    res = call(cfg.task, output_dir=str(tmp_path))
    assert (tmp_path / "lr_histograms.png").exists()
    assert set(res["targets"]) == {"easy", "hard"}


def test_presets_exist():
    assert {
        "meanlab_hist",
        "meanlab_roc",
        "meanlab_noise",
        "meanlab_subsampling",
        "meanlab_refs",
        "meanlab_linreg",
    } <= set(PRESETS)
