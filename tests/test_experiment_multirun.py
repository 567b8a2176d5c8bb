"""Multi-run audits: resumable, aggregated without loss or double counting; CLI launchers."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from dpaudit.experiment import AuditSettings, aggregate, run_audit
from dpaudit.experiment.collect import collect_sweep
from dpaudit.experiment.collect import main as aggregate_main
from dpaudit.experiment.multirun import read_run, run_bit, run_one, run_path
from dpaudit.experiment.run import RunRecord
from dpaudit.experiment.threat import threat_model_for

MULTI = {
    "model": {"name": "logreg"},
    "dp": {"noise_multiplier": 2.0, "steps": 8, "batch_size": 64},
    "canary": {"kind": "gradient", "count": 2},
    "attack": {"scores": ["scalar"]},
    "audit": {"mode": "multi_run", "runs": 6, "methods": ["gaussian", "clopper_pearson"]},
    "progress": False,
}
CLI_MULTI = [
    "model=logreg",
    "dp.noise_multiplier=2.0",
    "dp.steps=8",
    "canary.count=2",
    "attack=scalar",
    "audit=multi_run",
    "audit.runs=6",
    "audit.methods=[gaussian,clopper_pearson]",
    "progress=false",
]


def cli(*args, **kw):
    cmd = [sys.executable, "-m", "dpaudit.cli", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_resume_skips_finished_runs_and_matches_a_fresh_audit(tmp_path):
    settings = AuditSettings.from_mappings(**MULTI)
    part = tmp_path / "part"
    for r in (0, 3):  # an interrupted audit left two finished runs on disk
        run_one(settings, part, r)
    stamps = {r: run_path(part, r).stat().st_mtime_ns for r in (0, 3)}
    resumed = run_audit(output_dir=part, **MULTI)
    assert {r: run_path(part, r).stat().st_mtime_ns for r in (0, 3)} == stamps  # not redone
    fresh = run_audit(output_dir=tmp_path / "fresh", **MULTI)
    pooled = aggregate(part, settings)
    assert pooled.runs == list(range(6))
    assert len(pooled.membership) == 6 * 2  # 6 runs x 2 canaries, nothing double counted
    bits = [run_bit(settings, r) for r in range(6)]
    assert pooled.membership == [int(b) for b in bits for _ in range(2)]
    for a, b in zip(resumed["bounds"], fresh["bounds"], strict=True):
        assert a["epsilon"] == pytest.approx(b["epsilon"], rel=1e-9, abs=1e-12)


def test_aggregate_command_reevaluates_and_reports_missing_runs(tmp_path, capsys):
    first = run_audit(output_dir=tmp_path, **MULTI)
    (tmp_path / "results.json").unlink()
    aggregate_main([str(tmp_path)])
    again = json.loads((tmp_path / "results.json").read_text())
    assert [b["epsilon"] for b in again["bounds"]] == pytest.approx(
        [b["epsilon"] for b in first["bounds"]]
    )
    assert again["runs_missing"] == []
    run_path(tmp_path, 4).unlink()  # a lost run is reported as missing, never invented
    aggregate_main([str(tmp_path)])
    again = json.loads((tmp_path / "results.json").read_text())
    assert again["runs_missing"] == [4] and again["runs_done"] == 5
    assert "1 of 6 runs missing" in capsys.readouterr().out
    with pytest.raises(ValueError, match="other settings"):
        run_audit(output_dir=tmp_path, **{**MULTI, "dp": {**MULTI["dp"], "steps": 9}})


def test_aggregate_refuses_runs_from_other_settings(tmp_path):
    settings = AuditSettings.from_mappings(**MULTI)
    run_one(settings, tmp_path, 0)
    other = AuditSettings.from_mappings(**{**MULTI, "dp": {**MULTI["dp"], "steps": 9}})
    run_one(other, tmp_path, 1)
    with pytest.raises(ValueError, match="different settings"):
        aggregate(tmp_path, settings)


def test_run_files_round_trip_and_older_files_still_load(tmp_path):
    settings = AuditSettings.from_mappings(**MULTI)
    path = run_one(settings, tmp_path, 0)
    saved = json.loads(path.read_text())
    old_keys = {"scores", "membership", "steps", "sample_rate", "engine_accountants"}
    old_keys |= {"test_accuracy", "train_seconds", "canary_info", "chosen", "canary_norm"}
    old_keys |= {"run", "bit", "fingerprint"}
    assert set(saved) == old_keys | {"threat_model"}  # candidate_scores left out, as before
    record = read_run(path)
    assert RunRecord.from_dict(record.to_dict()) == record
    # The threat model is built once, when the run is prepared, from the settings.
    assert record.threat_model == threat_model_for(
        settings, record.sample_rate, record.steps, record.canary_norm
    )
    assert saved["threat_model"]["sample_rate"] == 1.0  # every-step gradient canaries
    # A run file written before records carried the threat model: pooled with the settings'.
    legacy = {k: v for k, v in saved.items() if k != "threat_model"}
    path.write_text(json.dumps(legacy))
    assert read_run(path).threat_model is None
    assert aggregate(tmp_path, settings).threat_model == record.threat_model
    assert aggregate(tmp_path).threat_model is None
    path.write_text(json.dumps({k: v for k, v in legacy.items() if k != "scores"}))
    with pytest.raises(ValueError, match=r"run_00000\.json: run record lacks \['scores'\]"):
        aggregate(tmp_path, settings)
    path.write_text(json.dumps({k: v for k, v in legacy.items() if k != "fingerprint"}))
    with pytest.raises(ValueError, match=r"run_00000\.json: .*settings fingerprint"):
        aggregate(tmp_path, settings)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"run_00000\.json: not a JSON run record"):
        aggregate(tmp_path, settings)


@pytest.mark.slow
def test_killed_cli_audit_resumes_to_the_same_result(tmp_path):
    killed, fresh = tmp_path / "killed", tmp_path / "fresh"
    proc = cli(f"hydra.run.dir={killed}", *CLI_MULTI)
    deadline = time.time() + 240
    while len(list((killed / "runs").glob("run_*.json"))) < 2:
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(list((killed / "runs").glob("run_*.json")))
    assert 2 <= done < 6 and not (killed / "results.json").exists()
    for out in (killed, fresh):
        p = cli(f"hydra.run.dir={out}", *CLI_MULTI)
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    a = json.loads((killed / "results.json").read_text())
    b = json.loads((fresh / "results.json").read_text())
    assert a["bounds"] == b["bounds"]
    assert sorted(os.listdir(killed / "runs")) == [f"run_{r:05d}.json" for r in range(6)]


@pytest.mark.slow
def test_submitit_local_launcher_runs_a_sweep(tmp_path):
    p = cli(
        "-m",
        "hydra/launcher=submitit_local",
        f"hydra.sweep.dir={tmp_path}",
        "hydra.launcher.timeout_min=10",
        "dp.steps=10",
        "canary.count=20",
        "progress=false",
        "dp.noise_multiplier=2.0,8.0",
    )
    _, err = p.communicate(timeout=420)
    assert p.returncode == 0, err
    res = [json.loads((tmp_path / str(i) / "results.json").read_text()) for i in (0, 1)]
    mus = sorted(r["theory"]["gaussian_mu"] for r in res)
    np.testing.assert_allclose(mus, [np.sqrt(10) / 8.0, np.sqrt(10) / 2.0])
    (tmp_path / "2" / ".hydra").mkdir(parents=True)  # a job that has not finished
    summary = collect_sweep(tmp_path)
    assert [r["job"] for r in summary["jobs"]] == ["0", "1"] and summary["pending"] == ["2"]
    common = "dp.steps=10 canary.count=20 progress=False"
    assert {r["overrides"] for r in summary["jobs"]} == {
        f"{common} dp.noise_multiplier=2.0",
        f"{common} dp.noise_multiplier=8.0",
    }


@pytest.mark.slow
def test_joblib_launcher_runs_jobs_in_parallel_processes(tmp_path):
    p = cli(
        "-m",
        "hydra/launcher=cpu_parallel",
        f"hydra.sweep.dir={tmp_path}",
        "dp.steps=5",
        "canary.count=20",
        "progress=false",
        "dp.noise_multiplier=2.0,8.0",
    )
    _, err = p.communicate(timeout=420)
    assert p.returncode == 0, err
    summary = collect_sweep(tmp_path)
    assert len(summary["jobs"]) == 2 and summary["pending"] == []
    assert all(r["eps_certified"] <= r["eps_claimed"] for r in summary["jobs"])
    assert {r["status"] for r in summary["jobs"]} <= {"consistent", "estimate_above_claim"}
