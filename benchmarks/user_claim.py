"""One verdict, about the user's claim (issue 64): the own loops of the issue over seeds, each
judged by ``audit_report`` the way a user calls it, and what the verdict says.

Loops: ``tests/support/claim_loops.py`` (the README's recipe on digits, a linear model with the
audit's canary block, ``make_private_with_epsilon(2, target_delta)``, the user's accountant) and
``tests/support/premise_loops.py``'s CNN (AdamW, StepLR, BatchMemoryManager, 88 steps). Cases:

* ``correct_cnn`` / ``correct_rdp``: correct loops, the user's delta given: consistent, verified;
* ``no_engine``: ``audit_report(hook, delta=...)`` without the engine: not verified;
* ``delta_default``: no delta given: the first sentence says the delta is dpaudit's;
* ``delta_large``: delta = 1e-3 >= 1/n: named, with n;
* ``plain_no_loader``: a plain shuffled loader under BatchMemoryManager, no loader given to the
  hook (n inferred from the optimizer): a PRIVACY BUG;
* ``newcomer``: the same with the DP loader given to the hook: a PRIVACY BUG, the loader first;
* ``head``: a head trained by a second optimizer, canaries over the whole model: the head's
  dropped and named, a PRIVACY BUG (model integrity), not a refusal;
* ``engine_<acc>_<on|off>``: RDP / PRV / GDP engines, white-box records on or off: the user's
  own accountant and epsilon every time.

Run (the tables of issue 64's closing note):

    OMP_NUM_THREADS=1 python benchmarks/user_claim.py --seeds 5 --jobs 2
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
import warnings
from pathlib import Path

from task_pool import run_tasks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

ENGINES = [f"engine_{a}_{w}" for a in ("rdp", "prv", "gdp") for w in ("on", "off")]
CASES = ("correct_cnn", "correct_rdp", "no_engine", "delta_default", "delta_large",
         "plain_no_loader", "newcomer", "head", *ENGINES)


def _audit(case: str, seed: int) -> tuple[dict, dict]:
    """Train and audit ``case`` at ``seed``: (the result, what the case expects)."""
    from claim_loops import train
    from premise_loops import premise_loop

    from dpaudit import audit_report

    if case == "correct_cnn":
        return premise_loop("correct", seed, delta=1e-5), {"status": "consistent"}
    if case.startswith("engine_"):
        _, acc, wb = case.split("_")
        t = train(accountant=acc, seed=seed, target_delta=1e-5, epochs=2)
        return (audit_report(t.hook, privacy_engine=t.engine, delta=1e-5,
                             white_box=wb == "on"),
                {"accountant": acc, "history": t.engine.accountant.history})
    kw = {"plain_no_loader": {"plain_loader": True, "give_loader": False, "epochs": 3},
          "newcomer": {"plain_loader": True, "epochs": 3},
          "head": {"head": True, "epochs": 2}}.get(case, {"accountant": "rdp",
                                                           "target_delta": 1e-6})
    t = train(seed=seed, **kw)
    report = {"privacy_engine": t.engine, "delta": 1e-6 if "accountant" in kw else 1e-5}
    if case == "no_engine":
        report.pop("privacy_engine")
    if case == "delta_default":
        report.pop("delta")
    if case == "delta_large":
        report["delta"] = 1e-3
    expect = {"correct_rdp": {"status": "consistent"}, "no_engine": {"status": "not_verified"},
              "plain_no_loader": {"status": "privacy_bug"},
              "newcomer": {"status": "privacy_bug", "first": "loader: "},
              "head": {"status": "privacy_bug", "fired": "model_integrity"},
              "delta_default": {"says": "at dpaudit's default delta 1e-05, not yours"},
              "delta_large": {"says": f"at least 1/n = 1/{t.n:,}"}}[case]
    return audit_report(t.hook, **report), expect


def one(args: tuple) -> dict:
    """One audit: what the verdict says, and whether it is what the case expects."""
    case, seed = args
    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from dpaudit.accounting import history_epsilon
    from dpaudit.experiment.judging.outputs import verdict_title

    start = time.process_time()
    res, expect = _audit(case, seed)
    v = res["verdict"]
    td = v.get("training_data") or {}
    ok = True
    if "status" in expect:
        ok &= v["status"] == expect["status"]
    if "says" in expect:
        ok &= expect["says"] in v["message"]
    if "first" in expect:
        ok &= v["message"].split(" is refuted: ", 1)[-1].startswith(expect["first"])
    if "fired" in expect:
        ok &= expect["fired"] in v["white_box_fired"]
    if "accountant" in expect:
        truth = history_epsilon(expect["history"], td["delta"], expect["accountant"]).epsilon
        ok &= td["accountant"] == expect["accountant"] and abs(
            td["epsilon_claimed"] - truth) <= 1e-9 * max(1.0, truth)
    return {"case": case, "seed": seed, "status": v["status"], "ok": bool(ok),
            "title": verdict_title(v), "chars": len(v["message"]),
            "first": v["message"][:150], "cpu": time.process_time() - start}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--show", action="store_true", help="print each verdict's first words")
    args = p.parse_args()
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"--cases: unknown {unknown}; expected names from {list(CASES)}")
    tasks = [(c, s) for c in cases for s in range(args.seeds)]
    rows, wall, load = run_tasks(one, tasks, args.jobs)
    print(f"issue 64's own loops, seeds 0-{args.seeds - 1}: {len(rows)} audits in "
          f"{wall:.0f} s wall, {args.jobs} job(s), 1 thread each, "
          f"{platform.machine()}, load {load}")
    print("| case | audits | as expected | statuses | title | message chars (max) |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        rs = [r for r in rows if r["case"] == case]
        statuses = {s: sum(r["status"] == s for r in rs) for s in dict.fromkeys(
            r["status"] for r in rs)}
        titles = sorted({r["title"] for r in rs})
        print(f"| {case} | {len(rs)} | {sum(r['ok'] for r in rs)} | "
              f"{', '.join(f'{k} {n}' for k, n in statuses.items())} | {'; '.join(titles)} | "
              f"{max(r['chars'] for r in rs)} |")
    if args.show:
        for r in rows:
            print(f"{r['case']} seed {r['seed']}: {r['first']}")


if __name__ == "__main__":
    main()
