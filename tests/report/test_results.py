"""Typed results: results.json is AuditResult.to_dict(); it reads back, old files too."""

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dpaudit._jsonable import to_jsonable
from dpaudit.report.provenance import SCHEMA_VERSION
from dpaudit.report.results import STATUSES, AuditResult, BoundRow, ClaimRow, Verdict

OLD = Path(__file__).resolve().parent / "data" / "results_schema2_default.json"


def _same(a, b) -> bool:
    """Equal as JSON values, NaN equal to NaN (not-applicable rows carry epsilon NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_the_old_release_file_is_read_with_its_numbers():
    raw = json.loads(OLD.read_text())
    assert raw["schema_version"] == 2
    res = AuditResult.from_dict(raw)
    v = raw["verdict"]
    assert isinstance(res.verdict, Verdict) and res.status == v["status"] == "consistent"
    assert res.verdict.claimed_epsilon == v["claimed_epsilon"] == v["upper_bound"]
    assert res.verdict.best_lower_bound == v["best_lower_bound"]
    assert "upper_bound" not in res.to_dict()["verdict"]  # the duplicate is gone
    assert "upper_bound" not in res.theory and res.theory["claimed_epsilon"] == v[
        "claimed_epsilon"]
    assert len(res.bounds) == len(raw["bounds"]) and all(
        isinstance(b, BoundRow) for b in res.bounds)
    cp = res.bound("scalar", "clopper_pearson")
    assert cp.certified and cp.epsilon == raw["bounds"][0]["epsilon"]
    assert isinstance(res.claim["scalar"], ClaimRow)
    assert res.claim["scalar"].sigma_upper == raw["claim"]["scalar"]["sigma_upper"]
    assert res.extra == {"wall_seconds": raw["wall_seconds"]}
    # the current serialisation is a fixed point
    once = res.to_dict()
    assert once["schema_version"] == SCHEMA_VERSION
    assert _same(AuditResult.from_dict(once).to_dict(), once)
    assert math.isinf(AuditResult.from_dict(once).verdict.sigma_upper) is math.isinf(
        float(raw["verdict"]["sigma_upper"]))


def test_a_schema_4_file_is_read_without_the_training_datas_block():
    raw = json.loads((OLD.parent / "results_schema4_short.json").read_text())
    assert raw["schema_version"] == 4 and "training_data" not in raw["verdict"]
    res = AuditResult.from_dict(raw)
    assert res.verdict.training_data is None
    assert res.verdict.message == raw["verdict"]["message"]
    again = res.to_dict()
    assert again["schema_version"] == SCHEMA_VERSION and again["verdict"]["training_data"] is None


def test_todays_default_audit_reads_back_from_python_and_the_file(tmp_path):
    from dpaudit.experiment import run_audit

    # the default audit, small (a few hundred canaries inserted like an example)
    result = run_audit(output_dir=tmp_path, dp={"steps": 20},
                       canary={"count": 200, "lower_side": 300}, progress=False)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["schema_version"] == SCHEMA_VERSION
    typed = AuditResult.read(tmp_path / "results.json")
    assert _same(to_jsonable(typed.to_dict()), saved)  # the file is its serialisation
    not_applicable = [b for b in typed.bounds if b.kind == "not applicable"]
    assert all(isinstance(b.epsilon, float) and math.isnan(b.epsilon) for b in not_applicable)
    assert _same(to_jsonable(result), saved)  # what Python got (NaN written as "nan")
    assert typed.status in STATUSES and typed.verdict.privacy_bug is False
    # schema 5: the training data's epsilon, stable keys, in Python and in the file alike
    td = saved["verdict"]["training_data"]
    assert {"epsilon_claimed", "epsilon_upper", "epsilon_lower", "premises",
            "sentence"} <= set(td)
    assert all({"name", "status"} <= set(p) for p in td["premises"])
    assert saved["verdict"]["message"].startswith(td["sentence"])
    assert typed.verdict.training_data["epsilon_claimed"] == td["epsilon_claimed"]
    # the lower side of the canaries inserted like an example, in the file as in Python
    assert td["lower"]["canaries"] == [300, 300] and "within_family" in td["lower"]
    assert typed.verdict.training_data["lower"]["epsilon"] == td["epsilon_lower"]


def test_bad_files_are_refused_naming_what_is_wrong():
    raw = json.loads(OLD.read_text())
    newer = {**raw, "schema_version": SCHEMA_VERSION + 1}
    with pytest.raises(ValueError, match="newer than this dpaudit reads"):
        AuditResult.from_dict(newer)
    with pytest.raises(ValueError, match="an audit result lacks verdict"):
        AuditResult.from_dict({"task": "stats_demo", "bounds": [], "claim": {}})
    bad = copy.deepcopy(raw)
    bad["verdict"]["status"] = "fine"
    with pytest.raises(ValueError, match="verdict status must be one of"):
        AuditResult.from_dict(bad)
    bad = copy.deepcopy(raw)
    bad["bounds"][0]["kind"] = "proven"
    with pytest.raises(ValueError, match="kind must be one of"):
        AuditResult.from_dict(bad)
    bad = copy.deepcopy(raw)
    del bad["verdict"]["sigma_upper"]
    with pytest.raises(ValueError, match="the verdict lacks sigma_upper"):
        AuditResult.from_dict(bad)


def test_dpaudit_aggregate_reads_an_old_and_a_new_file_in_one_sweep(tmp_path):
    for job, source in (("0", OLD), ("1", OLD)):
        d = tmp_path / job
        (d / ".hydra").mkdir(parents=True)
        (d / "results.json").write_text(source.read_text())
    new = AuditResult.from_dict(json.loads(OLD.read_text())).to_dict()
    (tmp_path / "1" / "results.json").write_text(json.dumps(new))
    proc = subprocess.run([sys.executable, "-m", "dpaudit.tasks.aggregate", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "sweep_summary.json").read_text())
    old = json.loads(OLD.read_text())["verdict"]
    assert [j["status"] for j in summary["jobs"]] == ["consistent", "consistent"]
    assert {j["eps_claimed"] for j in summary["jobs"]} == {old["claimed_epsilon"]}
    assert summary["unreadable"] == {}
