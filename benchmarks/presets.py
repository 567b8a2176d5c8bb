"""The performance table: every preset's wall time, where it goes, and its peak memory.

Runs each preset as a user would (``python -m dpaudit experiment=NAME``, in a fresh process,
its outputs in a temporary directory) and prints one row per preset:

* wall time and peak resident memory of the process (``/usr/bin/time``);
* for audits, the split that ``results.json``'s ``timing`` block records: trainings with the
  capture hook, the rest of the run (canary set-up, scoring), evaluation (statistics and
  accounting) and the report (plots); "start-up and rest" is the wall time minus those
  (interpreter, imports, Hydra, writing); other tasks give the wall time only;
* the evaluation's share of the wall time, which should stay at most 10% or 2 s;
* with ``--ratio``, for every audit preset, the audited / plain training ratio: in one more
  fresh process, after the preset's set-up (``prepare_run``), one training with the capture
  hook (``audit_run``, as the audit trains: white-box records for one-run audits, none for the
  runs of a multi-run audit) and one plain Opacus training of the same data, model, DP settings
  and seed (``experiment.trainings.training.train_plain``), alternated twice; the ratio of the
  medians, with both medians (per training of at most 100 steps: the hook's cost is per step,
  so longer presets are timed on their first 100). Planted bugs are not planted in the plain
  training.

The threads, cores and machine load are printed beside the table. Presets whose data cannot
be loaded here (FMNIST and CIFAR-10 need their own files) are listed as skipped, with the
reason. Run:

    OMP_NUM_THREADS=1 python benchmarks/presets.py --ratio --markdown docs/performance_table.md
    python benchmarks/presets.py --presets default,bug_realised_batch_size --json perf.json

Extra Hydra overrides for every preset go after ``--``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONF = Path(__file__).resolve().parents[1] / "src" / "dpaudit" / "conf" / "experiment"
NEEDS_OWN_DATA = {"fig3_fmnist": "FMNIST files", "fig3_cifar10": "CIFAR-10 files"}
PARTS = ("training_seconds", "setup_seconds", "evaluation_seconds", "report_seconds")


def presets() -> list[str]:
    return sorted(p.stem for p in CONF.glob("*.yaml"))


def run_preset(name: str, overrides: list[str], module: str = "dpaudit") -> dict:
    """Wall time, peak memory and the results' timing block of one preset run
    (``python -m MODULE experiment=NAME``)."""
    out = Path(tempfile.mkdtemp(prefix=f"preset_{name}_"))
    cmd = [sys.executable, "-m", module, f"experiment={name}", f"hydra.run.dir={out}",
           *overrides]
    timer = shutil.which("time") or "/usr/bin/time"
    peak_mb = None
    start = time.perf_counter()
    if Path(timer).exists():
        proc = subprocess.run([timer, "-f", "PEAK_KB %M", *cmd], capture_output=True, text=True)
        for line in proc.stderr.splitlines():
            if line.startswith("PEAK_KB "):
                peak_mb = int(line.split()[1]) / 1024
    else:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    row = {"preset": name, "returncode": proc.returncode, "wall_seconds": wall,
           "peak_mb": peak_mb}
    res = out / "results.json"
    if res.exists():
        data = json.loads(res.read_text())
        timing = data.get("timing") or {}
        row.update({k: timing.get(k) for k in ("run_seconds", *PARTS)})
        row["verdict"] = (data.get("verdict") or {}).get("status")
        row["sigma_upper"] = (data.get("verdict") or {}).get("sigma_upper")
    elif proc.returncode != 0:
        lines = [x for x in proc.stderr.strip().splitlines() if not x.startswith("PEAK_KB")]
        row["error"] = lines[-1] if lines else "?"
    shutil.rmtree(out, ignore_errors=True)
    return row


# Runs in a fresh process: the audited / plain training ratio of one preset (``--ratio``).
_RATIO = r"""
import json, statistics, sys, warnings
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
warnings.simplefilter("ignore")
from dpaudit.experiment.plan import plan_audit, poisson_sample_rate, total_steps
from dpaudit.experiment.trainings.run import audit_run, prepare_run
from dpaudit.experiment.settings import AuditSettings
from dpaudit.experiment.trainings.training import train_plain
import copy
name, overrides, MAX_STEPS = sys.argv[1], json.loads(sys.argv[2]), 100
with initialize_config_module(config_module="dpaudit.conf", version_base="1.3"):
    cfg = compose("config", overrides=[f"experiment={name}", *overrides, "progress=false"])
task = OmegaConf.to_container(cfg.task, resolve=True)
groups = {k: task[k] for k in ("data", "model", "dp", "canary", "attack", "audit", "seed",
                               "device", "progress") if k in task}
settings = AuditSettings.from_mappings(**groups)
from dataclasses import replace
train, _, _ = settings.data.load(settings.seed)
if total_steps(settings.dp, poisson_sample_rate(settings.dp.batch_size, len(train))) > MAX_STEPS:
    # the hook's cost is per step: the ratio of the first MAX_STEPS steps is the ratio
    settings = replace(settings, dp=replace(settings.dp, steps=MAX_STEPS))
plan = plan_audit(settings)
prepared = prepare_run(plan, warn=False)
white_box = settings.audit.mode != "multi_run"
audited, plain = [], []
for _ in range(2):
    model = copy.deepcopy(prepared.model)
    plain.append(train_plain(model, prepared.setup.train_set, settings.dp, prepared.sample_rate,
                             prepared.derived.steps, seed=settings.seed)[0])
    audited.append(audit_run(plan, prepared=prepared, white_box=white_box).train_seconds)
a, b = statistics.median(audited), statistics.median(plain)
print("RATIO " + json.dumps({"audited_training_s": a, "plain_training_s": b, "ratio": a / b}))
"""


def training_ratio(name: str, overrides: list[str]) -> dict:
    """``--ratio``: audited / plain training seconds of one preset (``_RATIO``)."""
    proc = subprocess.run([sys.executable, "-c", _RATIO, name, json.dumps(overrides)],
                          capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("RATIO "):
            return json.loads(line[6:])
    lines = proc.stderr.strip().splitlines()
    return {"ratio_error": lines[-1] if lines else f"rc {proc.returncode}"}


def _s(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(rows: list[dict]) -> str:
    lines = [
        "| preset | wall s | training s | set-up s | evaluation s | report s | start-up and "
        "rest s | evaluation share | peak MB | verdict | audited / plain training |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("skipped"):
            lines.append(f"| {r['preset']} | skipped: {r['skipped']} ||||||||||")
            continue
        if r["returncode"] not in (0, 3):  # 3: the audit found a PRIVACY BUG (by design)
            lines.append(f"| {r['preset']} | failed: {r.get('error', '?')} ||||||||||")
            continue
        known = [r.get(k) for k in ("run_seconds", "evaluation_seconds", "report_seconds")]
        rest = r["wall_seconds"] - sum(known) if all(v is not None for v in known) else None
        ev = r.get("evaluation_seconds")
        share = "-" if ev is None else f"{ev / r['wall_seconds']:.0%}"
        ratio = "-"
        if r.get("ratio") is not None:
            ratio = (f"{r['ratio']:.2f} ({r['audited_training_s']:.2f} s / "
                     f"{r['plain_training_s']:.2f} s)")
        elif r.get("ratio_error"):
            ratio = f"failed: {r['ratio_error']}"
        lines.append(
            f"| {r['preset']} | {r['wall_seconds']:.1f} | {_s(r.get('training_seconds'))} "
            f"| {_s(r.get('setup_seconds'))} | {_s(ev)} | {_s(r.get('report_seconds'))} "
            f"| {_s(rest)} | {share} | {_s(r.get('peak_mb'))} | {r.get('verdict') or '-'} "
            f"| {ratio} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default=",".join(presets()))
    p.add_argument("--markdown", default=None, help="write the table (and its setting) here")
    p.add_argument("--json", default=None)
    p.add_argument("--module", default="dpaudit",
                   help="run python -m MODULE (dpaudit.cli for versions before python -m dpaudit)")
    p.add_argument("--ratio", action="store_true",
                   help="also the audited / plain training ratio of every audit preset")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    rows = []
    load = []
    for name in a.presets.split(","):
        if name in NEEDS_OWN_DATA:
            rows.append({"preset": name, "skipped": f"needs {NEEDS_OWN_DATA[name]}"})
            continue
        load.append(os.getloadavg()[0])
        row = run_preset(name, a.overrides, a.module)
        if a.ratio and row.get("training_seconds") is not None:
            row.update(training_ratio(name, a.overrides))
        rows.append(row)
        print(f"  {name}: {row['wall_seconds']:.1f} s, rc {row['returncode']}", flush=True)
    setting = (
        f"{platform.machine()}, {os.cpu_count()} cores, torch threads "
        f"{os.environ.get('OMP_NUM_THREADS', 'default')}, load avg (1 min) at each start "
        f"{min(load, default=0):.2f}-{max(load, default=0):.2f}; python {platform.python_version()}"
    )
    text = f"{setting}\n\n{table(rows)}\n"
    print("\n" + text)
    if a.markdown:
        Path(a.markdown).write_text(text)
    if a.json:
        Path(a.json).write_text(json.dumps({"setting": setting, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
