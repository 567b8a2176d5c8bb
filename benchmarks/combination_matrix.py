"""Issue 31's combination matrix as a table: every case of tests/experiment/test_combinations.py
(each advertised axis value at least twice, each canary kind x score, every preset at two
seeds) with its outcome: ran (and what it certified or why 0), refused (the one-line reason),
or a finding (crash, refused after training or unclearly, unexplained zero).

    python benchmarks/combination_matrix.py [--presets] [--out matrix.md]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "experiment"))

from test_combinations import CASES, classify, classify_preset

from dpaudit.conf import preset_names


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", action="store_true", help="also every preset at seeds 0, 1")
    ap.add_argument("--out", type=Path, help="also write the table to this Markdown file")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    rows = []
    jobs = [(name, lambda out, g=groups: classify(g, out)) for name, groups in CASES]
    if args.presets:
        jobs += [
            (f"experiment={p} seed={s}", lambda out, p=p, s=s: classify_preset(p, s, out))
            for p in preset_names("experiment")
            for s in (0, 1)
        ]
    for name, job in jobs:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            outcome, detail = job(Path(tmp))
        rows.append((name, outcome, detail.replace("|", "/")[:160], time.perf_counter() - start))
        print(f"{outcome:18s} {rows[-1][3]:5.1f} s  {name}: {rows[-1][2]}", flush=True)
    counts = Counter(r[1] for r in rows)
    table = ["| case | outcome | detail | s |", "|---|---|---|---|"] + [
        f"| {n} | {o} | {d} | {t:.1f} |" for n, o, d, t in rows
    ]
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    print(f"\n{len(rows)} cases: {summary}")
    if args.out:
        args.out.write_text("\n".join([*table, "", f"{len(rows)} cases: {summary}", ""]))


if __name__ == "__main__":
    main()
