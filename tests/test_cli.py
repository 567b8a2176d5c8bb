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
    for row in rows:
        for method in ("gdp", "clopper_pearson", "one_run", "density", "density_tv"):
            assert 0.0 <= row[method] <= row["true_eps"], (method, row)
        assert row["gdp"] >= 0.5 * row["true_eps"]


@pytest.mark.parametrize(
    "override,needle",
    [("experiment=no_such_preset", "no_such_preset"), ("task.delta=1.5", "delta")],
)
def test_bad_config_fails_with_a_clear_message(tmp_path, override, needle):
    proc = run_cli(tmp_path, override, "task.n=200")
    assert proc.returncode != 0
    assert needle in proc.stderr
