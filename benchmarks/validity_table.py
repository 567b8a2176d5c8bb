"""The validity table: every epsilon method on every mechanism with known truth.

For each (method, scenario) of ``dpaudit.stats.METHODS`` x ``dpaudit.validity.SCENARIOS``,
draws ``--reps`` independent samples of ``--n`` member and ``--n`` non-member scores, computes
the method's epsilon at ``--delta`` and ``--confidence``, and prints: kind (certified /
estimate), truth, median epsilon, median epsilon / truth, and the fraction of repetitions
above the truth with its standard error. A certified method must stay at or below
1 - confidence (up to noise) on every row; estimates show how far off their model they go.

Defaults are the issue's design: delta 1e-5, 95%, 300 repetitions of 2000 per side (about
6 minutes on one core, most of it one_run). ``--designs`` adds the unequal and small designs
of ``dpaudit.validity.DESIGNS`` (200 / 5000 Bernoulli both ways, 200 / 5000 fixed, one member
against 300, ten per side; ``all`` = every one of them besides the equal sides); the one-run
methods are told each design's inclusion probability. Run:

    python benchmarks/validity_table.py --markdown validity.md --json validity.json
    python benchmarks/validity_table.py --reps 50 --n 500 --methods clopper_pearson,gdp
    python benchmarks/validity_table.py --designs all --jobs 2 --claims --json v.json

``--jobs`` runs (method, scenario) cells in parallel processes; the numbers do not depend on
it (every draw is seeded by (seed, scenario, repetition)). ``--claims`` adds the claim test's
false-rejection rate on each scenario's exact curve (needs ``dpaudit.stats.claim``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from dpaudit._jsonable import to_jsonable
from dpaudit.stats import METHODS
from dpaudit.validity import DESIGNS, SCENARIOS, claim_study, validity_study


def _cell(args: tuple) -> list[dict]:
    method, scenario, kw = args
    return validity_study([method], [scenario], **kw)


def _flag(r: dict) -> str:
    """"!" on a certified row above 1 - confidence by more than 3 standard errors."""
    certified = r["kind"] in ("certified", "not applicable", "mixed")
    return "!" if certified and r["frac_above"] > r["nominal"] + 3 * r["nominal_se"] else ""


def _fmt(x: float, width: int = 7) -> str:
    return f"{x:{width}.3f}" if x == x and abs(x) != float("inf") else f"{x!s:>{width}}"


COLUMNS = (
    "method",
    "kind",
    "scenario",
    "design",
    "truth",
    "median eps",
    "median ratio",
    "above truth",
    "valid",
    "valid & above",
    "refused",
    "reps",
)


def table_lines(rows: list[dict]) -> list[str]:
    """Plain-text table (one line per row, header first)."""
    head = (
        f"{'method':>16} {'kind':>14} {'scenario':>26} {'design':>17} {'truth':>7} "
        f"{'med eps':>7} {'ratio':>6} {'above truth':>13} {'valid':>5} {'v&above':>7} "
        f"{'refused':>7} {'reps':>4}"
    )
    out = [head, "-" * len(head)]
    for r in rows:
        out.append(
            f"{r['method']:>16} {r['kind']:>14} {r['scenario']:>26} {r['design']:>17} "
            f"{_fmt(r['truth'])} {_fmt(r['median_epsilon'])} {_fmt(r['median_ratio'], 6)} "
            f"{r['frac_above']:6.3f}±{r['frac_above_se']:.3f} {r['frac_valid']:5.2f} "
            f"{r['frac_valid_above']:7.3f} {r['frac_refused']:7.2f} {r['reps']:>4} {_flag(r)}"
        )
    return out


def markdown(rows: list[dict], header: str) -> str:
    """Markdown table of the rows, after a one-paragraph ``header``."""
    lines = [header, "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = (
            r["method"],
            r["kind"],
            r["scenario"],
            r["design"],
            _fmt(r["truth"]).strip(),
            _fmt(r["median_epsilon"]).strip(),
            _fmt(r["median_ratio"]).strip(),
            f"{r['frac_above']:.3f} ± {r['frac_above_se']:.3f}{_flag(r)}",
            f"{r['frac_valid']:.2f}",
            f"{r['frac_valid_above']:.3f}",
            f"{r['frac_refused']:.2f}",
            str(r["reps"]),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, run the study, print the table and write the requested files."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--reps", type=int, default=300, help="repetitions per cell (default 300)")
    p.add_argument("--n", type=int, default=2000, help="scores per side (default 2000)")
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated methods")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated names")
    p.add_argument(
        "--designs",
        default="equal",
        help="comma-separated: equal (--n per side), names of dpaudit.validity.DESIGNS, or all",
    )
    p.add_argument(
        "--method-reps",
        default="",
        help="per-method repetitions, e.g. one_run=100 (default: --reps for all)",
    )
    p.add_argument("--jobs", type=int, default=1, help="parallel processes (default 1)")
    p.add_argument("--json", type=Path, help="write rows and settings as JSON here")
    p.add_argument("--markdown", type=Path, help="write the table as Markdown here")
    p.add_argument("--claims", action="store_true", help="also run the claim-test study")
    args = p.parse_args(argv)

    methods = [m for m in args.methods.split(",") if m]
    scenarios = [s for s in args.scenarios.split(",") if s]
    designs = [d for d in args.designs.split(",") if d]
    if "all" in designs:
        designs = ["equal", *DESIGNS]
    per_method = dict(kv.split("=") for kv in args.method_reps.split(",") if kv)
    threads = os.cpu_count()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = threads
    machine = f"{platform.machine()} {platform.processor() or ''}".strip()
    print(f"machine: {machine}, {threads} hardware threads ({usable} usable), jobs {args.jobs}")

    tasks = []
    for m in methods:
        for d in designs:
            kw = {
                "reps": int(per_method.get(m, args.reps)),
                "delta": args.delta,
                "confidence": args.confidence,
                "seed": args.seed,
            }
            kw.update({"n_in": args.n, "n_out": args.n} if d == "equal" else {"designs": [d]})
            tasks += [(m, s, kw) for s in scenarios]
    t0 = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            results = list(pool.map(_cell, tasks))
    else:
        results = [_cell(t) for t in tasks]
    rows = [r for res in results for r in res]
    wall = time.perf_counter() - t0
    settings = (
        f"delta {args.delta:g}, confidence {args.confidence:g}, designs {','.join(designs)} "
        f"(equal: {args.n} scores per side), reps {args.reps}"
        + (f" ({args.method_reps})" if per_method else "")
        + f", seed {args.seed}; {threads} hardware threads ({usable} usable), "
        f"{args.jobs} job(s), wall {wall:.1f} s"
    )
    print("\n".join(table_lines(rows)))
    print(f"\n{settings}")
    seconds = {}
    for r in rows:
        seconds[r["method"]] = seconds.get(r["method"], 0.0) + r["seconds"]
    print("time in each method: " + ", ".join(f"{m} {t:.1f} s" for m, t in seconds.items()))

    claim_rows = []
    if args.claims:
        t1 = time.perf_counter()
        for d in designs:
            kw = {"n_in": args.n, "n_out": args.n} if d == "equal" else {"designs": [d]}
            claim_rows += claim_study(
                scenarios, reps=args.reps, confidence=args.confidence, seed=args.seed, **kw
            )
        print(f"\nclaim test on each scenario's exact curve ({time.perf_counter() - t1:.1f} s):")
        for r in claim_rows:
            bad = r["frac_rejected"] > r["nominal"] + 3 * r["nominal_se"]
            print(
                f"{r['scenario']:>26} {r['design']:>17}: rejected {r['frac_rejected']:.3f}±"
                f"{r['frac_rejected_se']:.3f} (nominal {r['nominal']:.2f}){' !' if bad else ''}"
            )

    if args.json:
        payload = {
            "settings": vars(args),
            "threads": threads,
            "usable_threads": usable,
            "wall_seconds": wall,
            "rows": rows,
            "claim_rows": claim_rows,
        }
        args.json.write_text(json.dumps(to_jsonable(payload), indent=1))
    if args.markdown:
        text = markdown(rows, f"Validity table: {settings}.")
        if claim_rows:
            text += "\n| scenario | design | claim rejected |\n|---|---|---|\n" + "".join(
                f"| {r['scenario']} | {r['design']} | {r['frac_rejected']:.3f} ± "
                f"{r['frac_rejected_se']:.3f} |\n"
                for r in claim_rows
            )
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
