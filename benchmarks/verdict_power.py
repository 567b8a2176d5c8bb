"""Power of the certified verdict: how small a noise reduction does one audit flag?

For a preset (default ``power_scaled_noise``), runs the audit with ``dp.bug=scaled_noise`` at
each ``dp.bug_factor`` (the noise is factor x sigma while the accountant sees sigma) over
``--seeds`` seeds, and prints per factor: the fraction of seeds whose verdict is
``privacy_bug`` (the power; at factor 1.0 the false-alarm rate), median [min-max] over seeds
of sigma_upper / sigma and of the certified mu_lower / mu (mu = sqrt(T) r / sigma, every-step
threat models only), and the time per audit; with the model size, K, T, sigma, threads and
machine load beside. Runs:

    OMP_NUM_THREADS=1 python benchmarks/verdict_power.py --seeds 5
    OMP_NUM_THREADS=1 python benchmarks/verdict_power.py --factors 1.0,0.9 --seeds 10 \
        --json power.json

``--preset NAME`` with ``--bug BUG`` runs any preset with its own bug (or ``--bug none``) and
reports its verdicts instead (the planted-bug presets), e.g.

    python benchmarks/verdict_power.py --preset bug_halved_noise --bug halved_noise,none

Extra Hydra overrides go after ``--``: ``... -- model.width=1000 canary.count=3000``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import torch

GROUPS = ("data", "model", "dp", "canary", "attack", "audit", "seed", "device", "progress")


def compose_groups(preset: str, overrides: list[str]) -> dict:
    """The ``run_audit`` group mappings of ``dpaudit experiment=PRESET OVERRIDES...``."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module(config_module="dpaudit.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={preset}", *overrides])
    task = OmegaConf.to_container(cfg.task, resolve=True)
    return {k: task[k] for k in GROUPS if k in task}


def run_preset(preset: str, overrides: list[str]) -> tuple[dict, dict, float]:
    """(result, groups, seconds) of one audit of ``preset`` with Hydra ``overrides``."""
    from dpaudit.experiment import run_audit

    groups = compose_groups(preset, [*overrides, "progress=false"])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        multi = groups.get("audit", {}).get("mode") == "multi_run"
        result = run_audit(output_dir=tmp if multi else None, **groups)
    return result, groups, time.perf_counter() - start


def med_range(xs) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "n/a"
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}-{max(xs):.3f}]"


def summarise(result: dict, seconds: float) -> dict:
    """The numbers one audit contributes to the power table."""
    v = result["verdict"]
    theory = result["theory"]
    mu = theory.get("gaussian_mu")
    sigma = v["noise_multiplier"]
    claims = [*result["claim"].values(), *(result.get("one_run_claim") or {}).values()]
    cert_mu = [c["mu_lower"] for c in claims if c["certified"] and c.get("applicable", True)]
    mu_lower = max(cert_mu) if cert_mu else None
    return {
        "status": v["status"],
        "privacy_bug": v["privacy_bug"],
        "sigma_upper_ratio": v["sigma_upper"] / sigma if sigma else None,
        "sigma_upper_certified": v["sigma_upper_certified"],
        "mu_lower_ratio": mu_lower / mu if (mu and mu_lower is not None) else None,
        "certified_epsilon": v["best_lower_bound"],
        "best_estimate": v["best_estimate"],
        "estimate_method": v["estimate_method"],
        "claimed_epsilon": v["claimed_epsilon"],
        "claim_rejected_by": v["claim_rejected_by"],
        "seconds": seconds,
    }


def setting_line(groups: dict, result: dict) -> str:
    model, dp, canary = groups["model"], groups["dp"], groups["canary"]
    theory = result["theory"]
    tm = theory["threat_model"]
    width = f" width {model['width']}" if model.get("name") == "mlp" else ""
    info = result.get("canary_info") or {}
    dead = info.get("canaries_on_zero_gradient_coordinates")
    runs = groups["audit"].get("runs", 1)
    return (
        f"model {model.get('name')}{width} ({info.get('dim', '?')} params), "
        f"K = {canary.get('count')} {canary.get('kind', '')} canaries"
        f"{f' ({dead} on dead coordinates)' if dead is not None else ''}, "
        f"mode {groups['audit'].get('mode')} (runs {runs}), T = {tm.get('steps')}, "
        f"sigma = {dp['noise_multiplier']:g}, q_canary = {tm.get('sample_rate'):g}, "
        f"mu = {theory.get('gaussian_mu') or float('nan'):.3f}, claimed eps "
        f"{theory['claimed_epsilon']:.3f} ({theory['accountant']}), methods "
        f"{groups['audit'].get('methods')}"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="power_scaled_noise")
    p.add_argument("--factors", default="1.0,0.9,0.8,0.7", help="dp.bug_factor values")
    p.add_argument(
        "--bug",
        default="scaled_noise",
        help="dp.bug values (comma list); factors apply to scaled_noise only",
    )
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write every audit's summary here")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides (after --)")
    a = p.parse_args(argv)

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cells = []
    for bug in a.bug.split(","):
        if bug == "scaled_noise":
            cells += [(bug, float(f)) for f in a.factors.split(",")]
        else:
            cells.append((bug, None))
    rows, setting = [], None
    for bug, factor in cells:
        audits = []
        for seed in range(a.first_seed, a.first_seed + a.seeds):
            ov = [f"dp.bug={bug}", f"seed={seed}", *a.overrides]
            if factor is not None:
                ov.append(f"dp.bug_factor={factor}")
            load = os.getloadavg()[0]
            result, groups, secs = run_preset(a.preset, ov)
            s = summarise(result, secs)
            s.update(seed=seed, bug=bug, factor=factor, load=load)
            setting = setting or setting_line(groups, result)
            audits.append(s)
            print(
                f"  {bug} factor={factor} seed={seed}: {s['status']} sigma_up/sigma="
                f"{s['sigma_upper_ratio']:.3f} mu_lo/mu={s['mu_lower_ratio']} cert eps "
                f"{s['certified_epsilon']:.3f} est {s['best_estimate']:.3f} "
                f"({s['estimate_method']}) claimed {s['claimed_epsilon']:.3f} "
                f"{secs:.0f} s load {load:.2f}",
                flush=True,
            )
        rows.append((bug, factor, audits))

    print(f"\npreset {a.preset} {' '.join(a.overrides)}")
    print(f"setting: {setting}")
    print(
        f"threads {torch.get_num_threads()}, {os.cpu_count()} cores, {platform.processor() or ''}"
        f"{platform.machine()}, load avg (1 min) during the runs: "
        f"{med_range([s['load'] for _, _, au in rows for s in au])}"
    )
    print(
        "\n| bug | factor | seeds | privacy_bug | other verdicts | sigma_upper / sigma "
        "| mu_lower / mu (certified) | certified eps / claimed | s per audit |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for bug, factor, audits in rows:
        n = len(audits)
        k = sum(s["privacy_bug"] for s in audits)
        others = {}
        for s in audits:
            if not s["privacy_bug"]:
                others[s["status"]] = others.get(s["status"], 0) + 1
        other = ", ".join(f"{v} {k2}" for k2, v in sorted(others.items())) or "-"
        print(
            f"| {bug} | {factor if factor is not None else '-'} | {n} | {k}/{n} = {k / n:.2f} "
            f"| {other} | {med_range([s['sigma_upper_ratio'] for s in audits])} "
            f"| {med_range([s['mu_lower_ratio'] for s in audits])} "
            f"| {med_range([s['certified_epsilon'] / s['claimed_epsilon'] for s in audits])} "
            f"| {med_range([s['seconds'] for s in audits])} |"
        )
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(
                {
                    "preset": a.preset,
                    "overrides": a.overrides,
                    "setting": setting,
                    "rows": [s for _, _, au in rows for s in au],
                },
                fh,
                indent=1,
            )


if __name__ == "__main__":
    main()
