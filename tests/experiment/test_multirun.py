"""Multi-run audits: resumable, aggregated without loss or double counting; CLI launchers."""

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dpaudit.experiment import AuditSettings, aggregate, run_audit
from dpaudit.experiment.collect import collect_sweep
from dpaudit.experiment.plan import plan_audit, recorded_threat_model
from dpaudit.experiment.trainings.engine import claim_of
from dpaudit.experiment.trainings.multirun import (
    DirectoryBusyError,
    DirectoryLock,
    checksum,
    read_run,
    run_bit,
    run_one,
    run_path,
    save_settings,
)
from dpaudit.experiment.trainings.run import RunRecord
from dpaudit.tasks.aggregate import main as aggregate_main

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


def cli_results(out, *args) -> dict:
    """The CLI run to completion into ``out`` (exit 0 asserted): its results.json."""
    p = cli(f"hydra.run.dir={out}", *args)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    return json.loads((Path(out) / "results.json").read_text())


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


def test_run_files_round_trip_and_describe_themselves(tmp_path):
    settings = AuditSettings.from_mappings(**MULTI)
    path = run_one(settings, tmp_path, 0)
    saved = json.loads(path.read_text())
    record_keys = {"scores", "membership", "steps", "sample_rate", "engine_accountants"}
    record_keys |= {"test_accuracy", "train_seconds", "canary_info", "chosen", "canary_norm"}
    record_keys |= {"run", "bit", "fingerprint", "threat_model", "independent"}
    record_keys |= {"rungs"}  # the weaker rungs' scores of the threat-model ladder
    record_keys |= {"white_box"}  # the run's white-box records, compacted
    self_description = {"schema_version", "settings", "provenance", "checksum", "worker"}
    assert set(saved) == record_keys | self_description  # candidate_scores left out
    assert saved["worker"]["index"] == 0 and saved["worker"]["pid"] == os.getpid()
    assert saved["settings"] == settings.to_dict()  # the full resolved settings
    assert saved["provenance"]["versions"]["opacus"] and saved["provenance"]["device"] == "cpu"
    body = {k: v for k, v in saved.items() if k != "checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert saved["checksum"] == "sha256:" + hashlib.sha256(canonical).hexdigest()
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_umask()  # not mkstemp's 0600
    record = read_run(path, settings)
    assert RunRecord.from_dict(record.to_dict()) == record
    # The threat model and the canaries' independence are derived once, when the run is
    # prepared, from the plan; a file without them is read as an older dpaudit's
    assert saved["independent"] is True  # one canary per run
    old = RunRecord.from_dict({k: v for k, v in saved.items() if k != "independent"})
    assert old.independent is None
    assert record.threat_model == recorded_threat_model(
        plan_audit(settings), record.sample_rate, record.steps, record.canary_norm
    )
    assert saved["threat_model"]["sample_rate"] == 1.0  # every-step gradient canaries


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 6-run audit directory (copied by the tests that damage it)."""
    out = tmp_path_factory.mktemp("finished")
    result = run_audit(output_dir=out, **MULTI)
    return out, result


def _damage(runs):
    """The five kinds of damage of issue 12: truncated, not UTF-8, {}, bit flipped, scores
    x100. Returns the reason each file must be refused with."""
    p = [runs / f"run_{r:05d}.json" for r in range(5)]
    p[0].write_bytes(p[0].read_bytes()[:200])
    p[1].write_bytes(b"\xff\xfe\x00garbage")
    p[2].write_text("{}")
    d = json.loads(p[3].read_text())
    d["bit"] = 1 - d["bit"]
    d["membership"] = [d["bit"]] * len(d["membership"])
    p[3].write_text(json.dumps(d))
    d = json.loads(p[4].read_text())
    d["scores"] = {k: [100 * x for x in v] for k, v in d["scores"].items()}
    p[4].write_text(json.dumps(d))
    return {
        "run_00000.json": "is not valid JSON",
        "run_00001.json": "is not UTF-8 text (byte 0xff at offset 0)",
        "run_00002.json": "holds an empty JSON object",
        "run_00003.json": "checksum mismatch",
        "run_00004.json": "checksum mismatch",
    }


def test_damaged_run_files_are_named_set_aside_and_redone(finished, tmp_path, caplog):
    src, first = finished
    out = tmp_path / "audit"
    shutil.copytree(src, out)
    originals = {p.name: p.read_bytes() for p in (out / "runs").glob("run_*.json")}
    reasons = _damage(out / "runs")
    settings = AuditSettings.from_mappings(**MULTI)
    for name, reason in reasons.items():  # each read names the file and what is wrong
        with pytest.raises(ValueError, match=re.escape(f"{name}: {reason}")):
            read_run(out / "runs" / name, settings)
    with pytest.raises(ValueError, match=r"5 run file\(s\) .* not usable: run_00000\.json"):
        aggregate(out, settings)
    damaged = {n: (out / "runs" / n).read_bytes() for n in reasons}
    partial = out / "runs" / ".run_00005.json.x1y2.tmp"  # a writer killed mid-write
    partial.write_text('{"scores": ')
    with caplog.at_level(logging.WARNING, logger="dpaudit"):
        again = run_audit(output_dir=out, **MULTI)
    lines = [r.getMessage() for r in caplog.records if "moved to" in r.getMessage()]
    assert len(lines) == 5 and all("\n" not in line for line in lines)
    for name, reason in reasons.items():
        assert any(name in line and reason in line for line in lines)
    assert not partial.exists()  # an unfinished temp file is no run file: removed
    kept = sorted((out / "runs" / "quarantine").iterdir())  # set aside, never deleted
    assert [k.name.split(".json.")[0] + ".json" for k in kept] == sorted(reasons)
    assert {k.name.split(".json.")[0] + ".json": k.read_bytes() for k in kept} == damaged
    # Redone runs are the runs that were lost: same scores, same bits, same bounds.
    redone = {p.name: json.loads(p.read_bytes()) for p in (out / "runs").glob("run_*.json")}
    for name, raw in originals.items():
        old = json.loads(raw)
        assert redone[name]["scores"] == old["scores"] and redone[name]["bit"] == old["bit"]
    assert again["bounds"] == first["bounds"] and again["claim"] == first["claim"]


def test_each_run_keeps_its_records_and_the_first_runs_premises_are_judged(finished):
    from dpaudit.capture.records import WhiteBoxRecords
    from dpaudit.experiment.judging.white_box import white_box_evidence

    out, result = finished
    td = result["verdict"]["training_data"]
    # a correct multi-run audit measures and verifies the training data's upper side
    assert td["upper_status"] == "verified" and td["upper_reasons"] == []
    assert td["epsilon_claimed"] < td["epsilon_upper"] < 2 * td["epsilon_claimed"]
    source = result["white_box_records"]
    assert (source["run"], source["runs_with_records"], source["runs"]) == (0, 6, 6)
    assert "lowest-numbered" in source["note"]
    settings = AuditSettings.from_mappings(**MULTI)
    for r in range(6):  # every run file keeps its own records, read back typed
        rec = read_run(run_path(out, r), settings).white_box
        assert isinstance(rec, WhiteBoxRecords) and rec.num_steps == 8
    # the report's checks are run 0's, judged again from its file
    rec = read_run(run_path(out, 0), settings).white_box
    again = white_box_evidence(rec, result["refutation_per_statement"])
    assert set(again) == set(result["white_box"]["checks"])
    assert not any(c.rejected for c in again.values())


def _strip_records(path: Path) -> None:
    """A run file as dpaudit wrote it before runs kept their records (checksum consistent)."""
    d = json.loads(path.read_text())
    d.pop("white_box")
    d["checksum"] = checksum(d)
    path.write_text(json.dumps(d))


def test_run_files_without_records_are_read_as_before(finished, tmp_path):
    from dpaudit.experiment.audit import MULTI_RUN_NO_RECORDS
    from dpaudit.experiment.collect import reaggregate

    src, first = finished
    out = tmp_path / "audit"
    shutil.copytree(src, out)
    for r in (0, 1):  # older files first: the lowest-numbered run with records is judged
        _strip_records(run_path(out, r))
    mixed = reaggregate(out)
    assert mixed["white_box_records"]["run"] == 2
    assert mixed["white_box_records"]["runs_with_records"] == 4
    assert mixed["verdict"]["training_data"]["upper_status"] == "verified"
    assert mixed["bounds"] == first["bounds"]  # the scores are pooled as before
    for r in range(2, 6):
        _strip_records(run_path(out, r))
    old = reaggregate(out)
    assert "white_box_records" not in old
    td = old["verdict"]["training_data"]
    assert td["upper_status"] == "not measured" and td["upper_reasons"] == [
        MULTI_RUN_NO_RECORDS]
    assert old["white_box"]["not_checked"] == [MULTI_RUN_NO_RECORDS]


def test_malformed_records_in_a_run_file_are_named(finished, tmp_path):
    src, _ = finished
    out = tmp_path / "audit"
    shutil.copytree(src, out)
    path = run_path(out, 3)
    d = json.loads(path.read_text())
    d["white_box"]["format"] = 99  # a later dpaudit's layout, checksum consistent
    d["checksum"] = checksum(d)
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"run_00003\.json: run record's white-box records: "
                       "format 99"):
        read_run(path, AuditSettings.from_mappings(**MULTI))


def test_a_planted_bug_is_refuted_by_the_first_runs_records(tmp_path):
    # the realised batch size as divisor, in every run: run 0's records refute it
    # (normalisation, deterministic), whatever the canaries' scores say
    bugged = {**MULTI, "dp": {**MULTI["dp"], "bug": "realised_batch_size"}}
    res = run_audit(output_dir=tmp_path, **bugged)
    norm = res["white_box"]["checks"]["normalisation"]
    assert norm["rejected"] and norm["p_value"] == 0.0
    assert res["verdict"]["privacy_bug"]
    td = res["verdict"]["training_data"]
    assert td["upper_status"] == "refuted"
    assert "release_is_the_noised_sum" in td["upper_reasons"][0]


def test_bit_is_checked_against_the_seed_even_with_a_valid_checksum(finished, tmp_path):
    src, _ = finished
    out = tmp_path / "audit"
    shutil.copytree(src, out)
    settings = AuditSettings.from_mappings(**MULTI)
    path = run_path(out, 2)
    d = json.loads(path.read_text())
    d["bit"] = 1 - d["bit"]
    d["membership"] = [d["bit"]] * len(d["membership"])
    d["checksum"] = checksum(d)  # a consistent forgery: only the seed can tell
    path.write_text(json.dumps(d))
    want = int(run_bit(settings, 2))
    with pytest.raises(ValueError, match=f"membership bit {1 - want} is not the bit seed 0 gives"):
        read_run(path, settings)
    with pytest.raises(ValueError, match=r"run_00002\.json membership bit"):
        aggregate(out, settings)


def test_aggregate_command_one_line_errors(finished, tmp_path, capsys):
    src, _ = finished

    def error_of(directory) -> str:
        with pytest.raises(SystemExit) as exit_info:
            aggregate_main([str(directory)])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        return err

    assert "does not exist" in error_of(tmp_path / "nowhere")
    one_run = tmp_path / "one_run"
    one_run.mkdir()
    (one_run / "results.json").write_text("{}")
    assert "is a one-run audit" in error_of(one_run)
    empty = tmp_path / "empty"
    shutil.copytree(src, empty)
    for p in (empty / "runs").glob("run_*.json"):
        p.unlink()
    assert "no run records under" in error_of(empty)
    broken = tmp_path / "broken"
    shutil.copytree(src, broken)
    reasons = _damage(broken / "runs")
    err = error_of(broken)
    assert "5 run file(s)" in err and reasons["run_00001.json"] in err
    assert "Rerun the audit" in err
    other = tmp_path / "other"
    shutil.copytree(src, other)
    settings = AuditSettings.from_mappings(**{**MULTI, "dp": {**MULTI["dp"], "steps": 9}})
    save_settings(other, settings)  # settings.json of another audit beside these runs
    assert "come from different settings" in error_of(other)
    (other / "settings.json").write_bytes(b"\x00\x01")
    assert "settings.json: not readable audit settings" in error_of(other)
    sweep = tmp_path / "sweep"
    (sweep / "0" / ".hydra").mkdir(parents=True)
    (sweep / "0" / "results.json").write_text("{not json")
    assert "1 job(s) left out" in error_of(sweep)
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert summary["provenance"]["versions"]["dpaudit"] and summary["schema_version"] >= 2
    assert stat.S_IMODE((sweep / "sweep_summary.json").stat().st_mode) == 0o666 & ~_umask()


_HOLD_LOCK = """
import sys, time
from dpaudit.report.lock import DirectoryLock
with DirectoryLock(sys.argv[1], "audit"):
    print("locked", flush=True)
    time.sleep(120)
"""


def test_lock_keeps_a_second_process_out_and_a_dead_holder_is_taken_over(
    finished, tmp_path, caplog, capsys
):
    src, _ = finished
    out = tmp_path / "audit"
    shutil.copytree(src, out)
    holder = subprocess.Popen(  # another process (no torch import: quick)
        [sys.executable, "-c", _HOLD_LOCK, str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(DirectoryBusyError, match=f"in use by audit pid {holder.pid} on "):
            DirectoryLock(out, "test").__enter__()
        with pytest.raises(SystemExit):
            aggregate_main([str(out)])
        err = capsys.readouterr().err
        assert f"in use by audit pid {holder.pid}" in err and err.count("\n") == 1
    finally:
        holder.send_signal(signal.SIGKILL)  # dies holding it: the lock file still names it
        holder.wait()
    assert f'"pid": {holder.pid}' in (out / ".dpaudit.lock").read_text()
    with caplog.at_level(logging.WARNING, logger="dpaudit"):
        aggregate_main([str(out)])  # free again: the dead holder's lock is taken over
    assert any(
        f"lock left by audit pid {holder.pid}" in r.getMessage() and "taken over" in r.getMessage()
        for r in caplog.records
    )
    assert (out / ".dpaudit.lock").read_text() == ""  # released cleanly


@pytest.mark.slow
def test_two_cli_processes_share_one_directory(tmp_path):
    """The same command started twice on one directory: the two processes split the runs
    (each claimed by one of them), both exit 0, results.json is written once, by the last, and
    equals a sequential audit's."""
    shared, alone = tmp_path / "shared", tmp_path / "alone"
    args = [*(a if a != "audit.runs=6" else "audit.runs=12" for a in CLI_MULTI)]
    first = cli(f"hydra.run.dir={shared}", *args)
    second = cli(f"hydra.run.dir={shared}", *args)
    outs = [p.communicate(timeout=600) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    workers = [o for o, _ in outs if "another worker writes" in o]
    reports = [o for o, _ in outs if "results:" in o]
    assert len(reports) == 1 and len(workers) == 1  # one evaluated, the other left it
    trained_elsewhere = int(workers[0].split("trained ")[1].split(" of")[0])
    marker = json.loads((shared / "runs" / ".evaluated").read_text())
    assert marker["trained_here"] + trained_elsewhere == 12  # no run trained twice
    files = sorted((shared / "runs").glob("run_*.json"))
    assert [f.name for f in files] == [f"run_{r:05d}.json" for r in range(12)]
    pids = {json.loads(f.read_text())["worker"]["pid"] for f in files}
    assert pids <= {first.pid, second.pid}
    a = json.loads((shared / "results.json").read_text())
    b = cli_results(alone, *args)
    assert a["bounds"] == b["bounds"] and a["verdict"]["status"] == b["verdict"]["status"]


# A worker that dies holding a claim: its run_one claims run r, says so in a marker file, waits
# for the other worker's first run file (an event) and SIGKILLs itself without training r.
DIES_HOLDING_A_CLAIM = """
import os, signal, sys, time
from pathlib import Path
import dpaudit.experiment.trainings.multirun as multirun
from dpaudit.cli import main
def run_one(settings, out, r, prepared=None, plan=None):
    Path(out, "claimed_by_the_doomed").write_text(str(r))
    while not list(Path(out, "runs").glob("run_*.json")):
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
multirun.run_one = run_one
sys.argv[0] = "dpaudit"
main()
"""


@pytest.mark.slow
def test_a_killed_workers_run_is_redone_by_another(tmp_path):
    out, fresh = tmp_path / "audit", tmp_path / "fresh"
    doomed = subprocess.Popen(
        [sys.executable, "-c", DIES_HOLDING_A_CLAIM, f"hydra.run.dir={out}", *CLI_MULTI],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marker = out / "claimed_by_the_doomed"
    while not marker.exists():  # the doomed worker holds its claim now
        assert doomed.poll() is None, doomed.communicate()
        time.sleep(0.05)
    survivor = cli(f"hydra.run.dir={out}", *CLI_MULTI)
    _, err = survivor.communicate(timeout=600)
    doomed.communicate(timeout=600)
    assert doomed.returncode == -signal.SIGKILL
    assert survivor.returncode == 0, err
    r = int(marker.read_text())
    assert json.loads(run_path(out, r).read_text())["worker"]["pid"] == survivor.pid  # redone
    assert sorted(p.name for p in (out / "runs").glob("run_*.json")) == [
        f"run_{k:05d}.json" for k in range(6)]
    a = json.loads((out / "results.json").read_text())
    assert a["bounds"] == cli_results(fresh, *CLI_MULTI)["bounds"]


BROKEN_LOCKS = str(Path(__file__).parents[1] / "support" / "broken_locks")


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["enolck", "always"])
def test_a_shared_directory_without_working_locks(tmp_path, failure):
    """A file system whose flock fails (ENOLCK: NFS without a lock manager) or grants every
    lock (a nolock mount): two workers with the default coordination both stop before any
    training, one line naming audit.coordination=static; with it, they split the runs by
    share, each run is written once by its share's worker, one of them evaluates, and the
    audit equals a single process's on a normal directory, file for file."""
    env = {**os.environ, "DPAUDIT_TEST_FLOCK": failure,
           "PYTHONPATH": os.pathsep.join([BROKEN_LOCKS, os.environ.get("PYTHONPATH", "")])}
    args = [a if a != "audit.runs=6" else "audit.runs=10" for a in CLI_MULTI]
    refused, shared, alone = tmp_path / "refused", tmp_path / "shared", tmp_path / "alone"
    procs = [cli(f"hydra.run.dir={refused}", "audit.workers=2", f"audit.worker={w}", *args,
                 env=env) for w in (0, 1)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [2, 2], outs
    for _, err in outs:
        first = err.strip().splitlines()[0]
        assert first.startswith("dpaudit: error: ") and "audit.coordination=static" in first
    assert not list(refused.glob("runs/run_*.json"))  # nothing trained
    procs = [cli(f"hydra.run.dir={shared}", "audit.workers=2", f"audit.worker={w}",
                 "audit.coordination=static", *args, env=env) for w in (0, 1)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sum("results:" in o for o, _ in outs) == 1  # one evaluated
    files = sorted(shared.glob("runs/run_*.json"))
    assert [f.name for f in files] == [f"run_{r:05d}.json" for r in range(10)]
    reference = cli_results(alone, *args)
    for r, f in enumerate(files):
        mine, theirs = json.loads(f.read_text()), json.loads((alone / "runs" / f.name).read_text())
        assert mine["worker"]["index"] == r % 2  # its share's worker wrote it
        assert (mine["scores"], mine["membership"]) == (theirs["scores"], theirs["membership"])
    assert not (shared / "runs" / "quarantine").exists()
    assert json.loads((shared / "results.json").read_text())["bounds"] == reference["bounds"]
    status = subprocess.run([sys.executable, "-m", "dpaudit.tasks.aggregate", "--status",
                             str(shared)], capture_output=True, text=True, env=env, check=True)
    assert status.stdout.startswith(f"{shared}: 10 of 10 runs done; 0 in training or waiting "
                                    "(static coordination")


def test_status_reports_progress_without_evaluating(tmp_path, capsys):
    settings = AuditSettings.from_mappings(**MULTI)
    save_settings(tmp_path, settings)
    for r in (0, 1, 2):
        run_one(settings, tmp_path, r)
    with claim_of(tmp_path, 4):  # a worker trains run 4 now
        aggregate_main(["--status", str(tmp_path)])
        line = capsys.readouterr().out.strip()
    assert line.startswith(f"{tmp_path}: 3 of 6 runs done; 1 in training: run 4 (pid {os.getpid()}")
    assert "; 2 waiting" in line and "runs/min" in line and "s left" in line
    assert not (tmp_path / "results.json").exists()


# The CLI with a kill that cannot miss: the process SIGKILLs itself as soon as its second run
# file is on disk (an event, not a race against the clock on a loaded machine).
KILLED_AFTER_TWO_RUNS = """
import os, signal, sys
import dpaudit.experiment.trainings.multirun as multirun
from dpaudit.cli import main
real_run_one = multirun.run_one
def run_one(*args, **kwargs):
    path = real_run_one(*args, **kwargs)
    if len(list(path.parent.glob("run_*.json"))) >= 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return path
multirun.run_one = run_one
sys.argv[0] = "dpaudit"
main()
"""


@pytest.mark.slow
def test_killed_cli_audit_resumes_to_the_same_result(tmp_path):
    killed, fresh = tmp_path / "killed", tmp_path / "fresh"
    cmd = [sys.executable, "-c", KILLED_AFTER_TWO_RUNS, f"hydra.run.dir={killed}", *CLI_MULTI]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert len(list((killed / "runs").glob("run_*.json"))) == 2
    assert not (killed / "results.json").exists()
    a, b = (cli_results(out, *CLI_MULTI) for out in (killed, fresh))
    assert a["bounds"] == b["bounds"]
    listed = sorted(n for n in os.listdir(killed / "runs") if not n.startswith("."))
    assert listed == [f"run_{r:05d}.json" for r in range(6)]  # besides claims and the marker


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["cpu_parallel", "submitit_local"])
def test_one_audit_sharded_over_a_launchers_workers(tmp_path, launcher):
    """The README's sharded command on joblib's and submitit's local launchers: two workers
    share one directory and the audit equals a single process's."""
    shared, alone = tmp_path / "sweep", tmp_path / "alone"
    args = [a if a != "audit.runs=6" else "audit.runs=10" for a in CLI_MULTI]
    extra = ["hydra.launcher.timeout_min=10"] if launcher == "submitit_local" else []
    p = cli("-m", f"hydra/launcher={launcher}", f"hydra.sweep.dir={shared}",
            "hydra.sweep.subdir=shared", "audit.workers=2", "audit.worker=0,1", *extra, *args)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    out = shared / "shared"
    files = sorted(out.glob("runs/run_*.json"))
    assert [f.name for f in files] == [f"run_{r:05d}.json" for r in range(10)]
    a = json.loads((out / "results.json").read_text())
    assert a["bounds"] == cli_results(alone, *args)["bounds"]
    for f in files:  # the same run files as the single process's, whoever trained them
        mine, theirs = json.loads(f.read_text()), json.loads((alone / "runs" / f.name).read_text())
        assert (mine["scores"], mine["membership"]) == (theirs["scores"], theirs["membership"])


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


def test_vanishing_bounds_warning_is_given_once_per_audit(tmp_path):
    """Both membership bits are prepared, but the 'expect epsilon bounds of 0' warning about
    too few runs is one statement about the audit: given once."""
    cfg = {
        **MULTI, "canary": {"kind": "gradient", "count": 1}, "audit": {**MULTI["audit"], "runs": 4}
    }
    with pytest.warns(UserWarning) as caught:
        run_audit(output_dir=tmp_path, **cfg)
    vanish = [w for w in caught if "expect epsilon bounds of 0" in str(w.message)]
    assert len(vanish) == 1 and "raise audit.runs" in str(vanish[0].message)


def test_sweep_summary_lists_other_tasks_and_keeps_booleans(tmp_path):
    # a sweep holding an audit, a stats_demo and a mean-lab job: the audit is summarised
    # (privacy_bug a boolean, the configured sigma beside sigma_upper), the other tasks listed
    from dpaudit.experiment import run_audit
    from dpaudit.tasks.meanlab_figures import lr_histograms
    from dpaudit.tasks.stats_demo import stats_demo

    for job in ("0", "1", "2"):
        (tmp_path / job / ".hydra").mkdir(parents=True)
    run_audit(output_dir=tmp_path / "0", model={"name": "logreg"}, progress=False,
              dp={"noise_multiplier": 3.0, "steps": 6}, canary={"count": 20, "lower_side": 0})
    stats_demo(mus=(1.0,), n=200, output_dir=str(tmp_path / "1"))
    lr_histograms(tmp_path / "2", n=50, d=100, rounds=50, targets=("easy",))
    demo = json.loads((tmp_path / "1" / "results.json").read_text())
    assert demo["schema_version"] >= 2 and demo["provenance"]["versions"]["dpaudit"]
    aggregate_main([str(tmp_path)])  # exits 0: no SystemExit
    summary = json.loads((tmp_path / "sweep_summary.json").read_text())
    (row,) = summary["jobs"]
    assert row["job"] == "0" and row["sigma_configured"] == 3.0
    assert row["privacy_bug"] is False
    assert summary["other_tasks"] == {"1": "stats_demo", "2": "meanlab.lr_histograms"}
    assert summary["unreadable"] == {}
