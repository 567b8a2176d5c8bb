"""The white-box checks in the user's own loop, model family by bug class: a table.

For each of the 17 model families of ``tests/support/own_loop_models.py`` (an ordinary Opacus
loop with an ``AuditHook``, judged by ``audit_report(hook, privacy_engine=..., dataset_size=...)``)
and each of the bug classes of ``own_loop_models.BUG_CLASSES`` (one zoo bug each), plus the
correct optimizer, prints the verdict: for the correct optimizer the number of checks that ran
and whether any refuted the claim; for a bug, whether it was a PRIVACY BUG by the check named
for its class (``ok``), by another check only (its names), or not flagged (``MISSED``).
``tests/experiment/test_own_loop.py`` asserts the same (``pytest -m slow`` for every pair).

    OMP_NUM_THREADS=1 python benchmarks/own_loop.py --seeds 1
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=1)
    args = p.parse_args()
    import torch
    from own_loop_models import BUG_CLASSES, FAMILIES, own_loop_audit

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    classes = list(BUG_CLASSES)
    short = {c: BUG_CLASSES[c][0] for c in classes}
    print("| family | correct: checks run, refuted | "
          + " | ".join(short[c] for c in classes) + " |")
    print("|---|---|" + "---|" * len(classes))
    start, flagged, planted = time.perf_counter(), 0, 0
    for family in FAMILIES:
        cells = []
        for seed in range(args.seeds):
            res = own_loop_audit(family, seed=seed)
            checks = res["white_box"]["checks"]
            refuted = [k for k, c in checks.items() if c["rejected"]]
            cells.append(f"{len(checks)}, {'none' if not refuted else ', '.join(refuted)}")
        row = [" / ".join(dict.fromkeys(cells))]
        for cls in classes:
            bug, statement = BUG_CLASSES[cls]
            outcomes = []
            for seed in range(args.seeds):
                v = own_loop_audit(family, bug, seed=seed)["verdict"]
                planted += 1
                if v["status"] == "privacy_bug":
                    flagged += 1
                if v["status"] == "privacy_bug" and statement in v["white_box_fired"]:
                    outcomes.append("ok")
                elif v["status"] == "privacy_bug":
                    outcomes.append("+".join(v["white_box_fired"] or v["claim_rejected_by"]))
                else:
                    outcomes.append("MISSED")
            row.append(" / ".join(dict.fromkeys(outcomes)))
        print(f"| {family} | " + " | ".join(row) + " |", flush=True)
    print(f"\n{flagged} of {planted} planted bugs flagged; {len(FAMILIES)} families x "
          f"{len(classes)} classes x {args.seeds} seed(s) in {time.perf_counter() - start:.0f} s, "
          f"1 thread, {platform.machine()}")


if __name__ == "__main__":
    main()
