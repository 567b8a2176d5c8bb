"""The threat-model ladder measured: the same trainings judged by each adversary's view.

Four studies, each printing a table of median [min-max] over seeds (every number from
``results.json``'s ``threat_model_ladder`` block, ``experiment.judging.ladder``):

* ``hidden``: the default audit (MLP 400 on digits, sigma 6, T = 100, 1,000 Dirac canaries)
  with ``audit.threat_model=hidden_state``, under plain SGD (lr 0.5), SGD with momentum 0.9
  and Adam (lr 0.001: Adam's step on a canary coordinate does not depend on the rate's scale,
  eps 1e-8 aside); per seed the white-box and hidden-state rungs of the SAME run: certified
  epsilon, their ratio, how many seeds certify exactly the same, the certified mu_lower ratio;
* ``black_box``: ``experiment=black_box_mnist5k`` (150 crafted canaries in one full-batch run
  on mnist5k, claim epsilon 10): every black-box score's certified epsilon / claim and / the
  white-box rung's, the best one, and the forecast for more canaries;
* ``anchor``: ``experiment=worst_case_init_mnist5k`` (Annamalai & De Cristofaro's setting,
  ``--runs`` trainings, 200 by default): the anchor's GDP figure (an estimate, uncorrected),
  dpaudit's certified Clopper-Pearson and its gdp estimate, per score and rung, the wall time;
* ``correct``: ``--audits`` correct audits per rung (hidden state: the default audit at 50
  steps; black box one run: black_box_mnist5k at 50 steps; black box many runs:
  worst_case_init_mnist5k at 20 runs of 20 steps), counting PRIVACY BUG verdicts of each rung
  and certified epsilons above the claim.

Runs (one torch thread; the machine's load is printed):

    OMP_NUM_THREADS=1 python benchmarks/threat_model_ladder.py hidden --seeds 10
    OMP_NUM_THREADS=1 python benchmarks/threat_model_ladder.py black_box --seeds 10
    OMP_NUM_THREADS=1 python benchmarks/threat_model_ladder.py anchor --seeds 1 --runs 200
    OMP_NUM_THREADS=1 python benchmarks/threat_model_ladder.py correct --audits 50

``--json FILE`` keeps every row.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verdict_power import med_range, run_preset

OPTIMIZERS = {
    "sgd": [],
    "momentum": ["dp.momentum=0.9"],
    "adam": ["dp.optimizer=adam", "dp.lr=0.001"],
}


def rungs(result: dict) -> dict:
    return {r["rung"]: r for r in result["threat_model_ladder"]["rungs"]}


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def table(header: list[str], rows: list[list]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*["-" * w for w in widths])]
    out += [fmt.format(*[str(x) for x in r]) for r in rows]
    return "\n".join(out)


def hidden(seeds: int, extra: list[str]) -> list[dict]:
    out = []
    for name, opts in OPTIMIZERS.items():
        for seed in range(seeds):
            start_load = load()
            res, _, sec = run_preset("default", [*opts, "audit.threat_model=hidden_state",
                                                 f"seed={seed}", *extra])
            r = rungs(res)
            wb, hs = r["white_box"], r["hidden_state"]
            out.append({"optimizer": name, "seed": seed, "seconds": sec, "load": start_load,
                        "claimed": res["threat_model_ladder"]["claimed_epsilon"],
                        "white_box": wb["certified_epsilon"],
                        "hidden_state": hs["certified_epsilon"],
                        "ratio": hs["certified_ratio"],
                        "mu_ratio": (hs["mu_lower"] / wb["mu_lower"] if wb["mu_lower"] else
                                     None),
                        "estimate_ratio": hs["estimate_ratio"],
                        "equal": hs["certified_epsilon"] == wb["certified_epsilon"],
                        "sums_releases": hs["summary"]["sums_releases"],
                        "status": [wb["status"], hs["status"]]})
            print(f"  {name} seed {seed}: white box {wb['certified_epsilon']:.4f}, hidden "
                  f"{hs['certified_epsilon']:.4f} ({sec:.1f} s, load {start_load})",
                  flush=True)
    rows = []
    for name in OPTIMIZERS:
        g = [x for x in out if x["optimizer"] == name]
        rows.append([name, len(g), med_range([x["claimed"] for x in g]),
                     med_range([x["white_box"] for x in g]),
                     med_range([x["hidden_state"] for x in g]),
                     med_range([x["ratio"] for x in g]), f"{sum(x['equal'] for x in g)}/{len(g)}",
                     med_range([x["mu_ratio"] for x in g]),
                     med_range([x["estimate_ratio"] for x in g]),
                     sum(s != "consistent" for x in g for s in x["status"]),
                     med_range([x["seconds"] for x in g])])
    print(table(["optimizer", "seeds", "claim eps", "white-box cert. eps",
                 "hidden-state cert. eps", "hidden / white (cert.)", "equal",
                 "mu_lower ratio", "estimate ratio", "not consistent", "s per audit"], rows))
    return out


def black_box(seeds: int, extra: list[str]) -> list[dict]:
    out = []
    for seed in range(seeds):
        start_load = load()
        res, _, sec = run_preset("black_box_mnist5k", [f"seed={seed}", *extra])
        r = rungs(res)
        wb, bb = r["white_box"], r["black_box"]
        claimed = res["threat_model_ladder"]["claimed_epsilon"]
        per_score = {}
        for b in res["bounds"]:
            if b["kind"] == "certified" and b["valid"]:
                per_score[b["attack"]] = max(per_score.get(b["attack"], 0.0), b["epsilon"])
        out.append({"seed": seed, "seconds": sec, "load": start_load, "claimed": claimed,
                    "white_box": wb["certified_epsilon"], "black_box": bb["certified_epsilon"],
                    "black_box_by": bb["certified_by"], "per_score": per_score,
                    "auc": bb["auc"], "white_auc": wb["auc"], "forecast": bb["forecast"],
                    "lower_side": res["verdict"]["training_data"]["epsilon_lower"],
                    "status": [wb["status"], bb["status"]]})
        print(f"  seed {seed}: black box {bb['certified_epsilon']:.3f} ({bb['certified_by']}), "
              f"white box {wb['certified_epsilon']:.3f} ({sec:.1f} s, load {start_load})",
              flush=True)
    scores = sorted({k for x in out for k in x["auc"]})
    rows = [["white box (scalar)", med_range([x["white_auc"]["scalar"] for x in out]),
             med_range([x["white_box"] / x["claimed"] for x in out]), "1"]]
    for s in scores:
        rows.append([f"black box {s}", med_range([x["auc"][s] for x in out]),
                     med_range([x["per_score"].get(s, 0.0) / x["claimed"] for x in out]),
                     med_range([x["per_score"].get(s, 0.0) / x["white_box"] for x in out
                                if x["white_box"] > 0])])
    rows.append(["black box, best (verdict)", "-",
                 med_range([x["black_box"] / x["claimed"] for x in out]),
                 med_range([x["black_box"] / x["white_box"] for x in out if x["white_box"]])])
    print(table(["rung / score", "AUC", "certified eps / claim", "/ white box"], rows))
    fc = [x["forecast"] for x in out]
    print("forecast (binormal at the best score's AUC, fdp_one_run_certified; not a bound): "
          + ", ".join(f"{int(n):,} per side {med_range([f['epsilon_at_per_side'][n] / x['claimed'] for f, x in zip(fc, out, strict=True)])} x claim"  # noqa: E501
                      for n in fc[0]["epsilon_at_per_side"]))
    print(f"claim epsilon {out[0]['claimed']:.4g}; lower side of the training data's epsilon "
          f"(certified): {med_range([x['lower_side'] for x in out])}; not consistent: "
          f"{sum(s != 'consistent' for x in out for s in x['status'])}; "
          f"s per audit {med_range([x['seconds'] for x in out])}")
    return out


def anchor(seeds: int, runs: int, extra: list[str]) -> list[dict]:
    out = []
    for seed in range(seeds):
        start_load = load()
        t0, c0 = time.perf_counter(), time.process_time()
        res, _, _ = run_preset("worst_case_init_mnist5k",
                                 [f"seed={seed}", f"audit.runs={runs}", *extra])
        cpu = time.process_time() - c0
        r = rungs(res)
        rows: dict = {}
        for b in res["bounds"]:
            rows.setdefault(b["attack"], {})[b["method"]] = b["epsilon"]
        ceiling = res["canary_info"]["certifiable_ceiling"]
        out.append({"seed": seed, "runs": runs, "seconds": time.perf_counter() - t0,
                    "cpu_seconds": cpu, "load": start_load,
                    "claimed": res["threat_model_ladder"]["claimed_epsilon"],
                    "black_box": rows, "white_box_rung": r["white_box"],
                    "black_box_rung": r["black_box"],
                    "pretrained": res["canary_info"].get("pretrained"),
                    "members": ceiling["n_in"], "non_members": ceiling["n_out"],
                    "timing": res.get("timing"),
                    "device": str((res.get("provenance") or {}).get("device"))})
        print(f"  seed {seed}: {runs} trainings in {out[-1]['seconds']:.0f} s wall "
              f"({cpu:.0f} s CPU, load {start_load}); anchor_gdp "
              + ", ".join(f"{a} {m.get('anchor_gdp', float('nan')):.3f}"
                          for a, m in rows.items()), flush=True)
    scores = sorted({a for x in out for a in x["black_box"]})
    tab = []
    for s in scores:
        tab.append([f"black box {s}",
                    med_range([x["black_box"][s].get("anchor_gdp") for x in out]),
                    med_range([x["black_box"][s].get("clopper_pearson") for x in out]),
                    med_range([x["black_box"][s].get("gdp") for x in out])])
    w = [x["white_box_rung"] for x in out]
    tab.append(["white box scalar (same runs)",
                med_range([(x["anchor_gdp"] or {}).get("epsilon") for x in w]),
                med_range([x["certified_epsilon"] for x in w]),
                med_range([x["estimate"] for x in w])])
    print(table(["rung / score", "anchor_gdp (estimate, uncorrected)",
                 "clopper_pearson (certified)", "gdp (estimate, corrected)"], tab))
    print(f"claim epsilon {out[0]['claimed']:.4g}; {runs} trainings per audit "
          f"({med_range([x['members'] for x in out])} with the canary); wall "
          f"{med_range([x['seconds'] for x in out])} s, CPU {med_range([x['cpu_seconds'] for x in out])} s"  # noqa: E501
          f"; device {out[0]['device']}, {torch.get_num_threads()} torch thread(s)")
    return out


CORRECT = {
    "hidden_state": ("default", ["audit.threat_model=hidden_state", "dp.steps=50"]),
    "black_box_one_run": ("black_box_mnist5k", ["dp.steps=50"]),
    "black_box_multi_run": ("worst_case_init_mnist5k", ["audit.runs=20", "dp.steps=20"]),
}


def correct(audits: int, extra: list[str], only: list[str] | None) -> list[dict]:
    out = []
    for name, (preset, opts) in CORRECT.items():
        if only and name not in only:
            continue
        for seed in range(audits):
            res, _, sec = run_preset(preset, [*opts, f"seed={1000 + seed}", *extra])
            claimed = res["threat_model_ladder"]["claimed_epsilon"]
            for r in res["threat_model_ladder"]["rungs"]:
                if not r["available"]:
                    continue
                out.append({"config": name, "seed": 1000 + seed, "rung": r["rung"],
                            "status": r["status"], "certified": r["certified_epsilon"],
                            "above_claim": r["certified_epsilon"] > claimed,
                            "seconds": sec})
            print(f"  {name} seed {1000 + seed}: "
                  + ", ".join(f"{r['rung']} {r['status']}" for r in
                              res["threat_model_ladder"]["rungs"] if r["available"]),
                  flush=True)
    rows = []
    for name in CORRECT:
        for rung in ("white_box", "hidden_state", "black_box"):
            g = [x for x in out if x["config"] == name and x["rung"] == rung]
            if g:
                rows.append([name, rung, len(g), sum(x["status"] == "privacy_bug" for x in g),
                             sum(x["status"] == "estimate_above_claim" for x in g),
                             sum(x["above_claim"] for x in g),
                             med_range([x["certified"] for x in g])])
    print(table(["config", "rung", "correct audits", "PRIVACY BUG", "estimate above claim",
                 "certified > claim", "certified eps"], rows))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("study", choices=("hidden", "black_box", "anchor", "correct"))
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--audits", type=int, default=50)
    p.add_argument("--only", default="", help="correct: configs to run (comma-separated)")
    p.add_argument("--json", default=None)
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    a = p.parse_args(argv[:cut])
    a.extra = argv[cut + 1:]  # Hydra overrides for every audit
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(f"threat-model ladder, {a.study}: load {load()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s)", flush=True)
    if a.study == "hidden":
        rows = hidden(a.seeds, a.extra)
    elif a.study == "black_box":
        rows = black_box(a.seeds, a.extra)
    elif a.study == "anchor":
        rows = anchor(a.seeds, a.runs, a.extra)
    else:
        rows = correct(a.audits, a.extra, [x for x in a.only.split(",") if x])
    print(f"done: load {load()}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
