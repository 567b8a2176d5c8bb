"""The `dpaudit` Hydra CLI, end to end in a subprocess, on tiny configs."""

import json
import subprocess
import sys

import pytest


def run_cli(tmp_path, *overrides):
    cmd = [sys.executable, "-m", "dpaudit.cli", f"hydra.run.dir={tmp_path}", *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_stats_demo_writes_sound_bounds(tmp_path):
    proc = run_cli(tmp_path, "experiment=stats_demo", "task.n=2000", "task.mus=[1.0,2.0]")
    assert proc.returncode == 0, proc.stderr
    assert "true_eps" in proc.stdout  # the console table
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["mu"] for r in rows] == [1.0, 2.0]
    kinds = json.loads((tmp_path / "results.json").read_text())["kinds"]
    assert kinds == {"gdp": "estimate", "clopper_pearson": "certified", "one_run": "certified",
                     "density": "certified", "density_tv": "estimate"}
    for row in rows:
        # Certified bounds: conservative enough that one seed above the truth would be a bug.
        # The gdp estimate's mu_lower has nearly exact 95% coverage (measured 4.5% of 200
        # repetitions above mu = 1 at this size), so one seed says nothing about its
        # validity: that is the validity suite's job (tests/test_validity.py).
        for method, kind in kinds.items():
            assert row[method] >= 0.0
            if kind == "certified":
                assert row[method] <= row["true_eps"], (method, row)
        assert 0.5 * row["true_eps"] <= row["gdp"] <= 1.1 * row["true_eps"]


@pytest.mark.parametrize(
    "override,needle",
    [("experiment=no_such_preset", "no_such_preset"), ("task.delta=1.5", "delta")],
)
def test_bad_config_fails_with_a_clear_message(tmp_path, override, needle):
    proc = run_cli(tmp_path, override, "task.n=200")
    assert proc.returncode != 0
    assert needle in proc.stderr


def test_default_audit_tiny_end_to_end(tmp_path):
    proc = run_cli(tmp_path, "dp.steps=10", "canary.count=20", "progress=false")
    assert proc.returncode == 0, proc.stderr
    assert "threat model: gradient canaries" in proc.stdout
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["steps"] == 10 and res["settings"]["canary"]["count"] == 20
    assert res["verdict"]["best_lower_bound"] <= res["theory"]["upper_bound"]
    assert (tmp_path / "roc.png").exists()


@pytest.mark.parametrize(
    "override,needle",
    [
        ("model=resnet", "model/resnet"),
        ("dp.delta=1.0", "dp.delta"),
        ("canary.norm=5.0", "exceeds the clip norm"),
        ("canary.count=100000", "larger than the candidate pool"),
    ],
)
def test_bad_audit_config_fails_clearly(tmp_path, override, needle):
    proc = run_cli(tmp_path, override, "dp.steps=2", "progress=false")
    assert proc.returncode != 0
    assert needle in proc.stderr


@pytest.mark.parametrize("launcher", ["slurm_gpu", "cpu_parallel"])
def test_launcher_presets_compose(launcher):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="dpaudit.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    target = cfg.hydra.launcher._target_
    assert ("Slurm" in target) if launcher == "slurm_gpu" else ("Joblib" in target)


@pytest.mark.slow
def test_privacy_bug_sets_the_exit_status(tmp_path):
    """A certified PRIVACY BUG exits with status 3 (an audit can gate CI); fail_on_bug=false
    keeps 0. Halved noise, 300 every-step Dirac canaries on dead MLP weights (mu 1 -> 2)."""
    tiny = ["experiment=bug_halved_noise", "model.width=100", "canary.count=300",
            "progress=false"]
    proc = run_cli(tmp_path / "gate", *tiny)
    assert proc.returncode == 3, proc.stderr
    assert "PRIVACY BUG at 95% confidence" in proc.stdout
    res = json.loads((tmp_path / "gate" / "results.json").read_text())
    assert res["verdict"]["status"] == "privacy_bug"
    proc = run_cli(tmp_path / "nogate", *tiny, "fail_on_bug=false")
    assert proc.returncode == 0, proc.stderr
