"""Opacus' per-layer and adaptive clipping under the default audit: correct training and bugs.

For each set-up (``dp.clipping=per_layer``: each of the L tensors clipped to C / sqrt(L);
``dp.clipping=adaptive``: Opacus' ``AdaClipDPOptimizer`` from C with the CLI's defaults) and
each path a user takes:

* ``cli``: ``run_audit(dp={"clipping": ...}, seed=S)``, the CLI's default audit
  (``dpaudit dp.clipping=... seed=S``: 1,000 Dirac gradient canaries, T = 100, sigma 6);
* ``own``: the own loop of ``tests/support/own_loop_models.py`` (the MLP family, 24 Dirac
  canaries, T = 30, sigma 2, ``audit_report(hook, ...)``).

it prints, over ``--seeds`` correct trainings: the verdicts, the certified epsilon (median
[min, max]) and how many carried each warning; and over ``--bug-seeds`` trainings per planted
bug (the zoo's ``halved_noise`` and ``accountant_sigma``; for clipping, the zoo's
``unclipped_example`` on the CLI path and a bug adapted to the set-up on the own loop: the
first tensor's bound doubled under per-layer clipping, a clip at 2 C_t under adaptive
clipping; under adaptive clipping also a bound moved by the true count), how many were a
PRIVACY BUG and by which check.

    OMP_NUM_THREADS=1 python benchmarks/clipping_modes.py --seeds 50 --bug-seeds 5 --jobs 2
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import sys
import tempfile
import time
import warnings
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

SETUPS = ("per_layer", "adaptive")
CLI_BUGS = {"noise": "halved_noise", "clipping": "unclipped_example",
            "bookkeeping": "accountant_sigma"}


def _one(job: tuple) -> dict:
    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    path, setup, cls, seed = job
    if path == "cli":
        from dpaudit.experiment import run_audit

        dp = {"clipping": setup}
        if cls != "correct":
            dp["bug"] = CLI_BUGS[cls]
        with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
            res = run_audit(output_dir=out, dp=dp, seed=seed, progress=False)
    else:
        from own_loop_models import CLIPPING_BUGS, own_loop_audit

        kw = {}
        if cls != "correct":
            bug = CLIPPING_BUGS[setup][cls][0]
            kw = {"bug": bug} if isinstance(bug, str) else {"planted": bug}
        res = own_loop_audit("linear", seed=seed, clipping=setup, quiet=True, **kw)
    v = res["verdict"]
    return {"path": path, "setup": setup, "cls": cls, "seed": seed, "status": v["status"],
            "fired": v["white_box_fired"] + v["claim_rejected_by"],
            "warned": v["white_box_warned"], "certified": v["best_lower_bound"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=50)
    p.add_argument("--bug-seeds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=1)
    args = p.parse_args()
    from own_loop_models import CLIPPING_BUGS

    jobs = []
    for path in ("cli", "own"):
        for setup in SETUPS:
            jobs += [(path, setup, "correct", s) for s in range(args.seeds)]
            classes = CLI_BUGS if path == "cli" else CLIPPING_BUGS[setup]
            jobs += [(path, setup, c, s) for c in classes for s in range(args.bug_seeds)]
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(_one, jobs))
    print("| path | set-up | correct: verdicts | certified epsilon, median [min, max] | "
          "warnings | planted bugs: PRIVACY BUG (checks) |")
    print("|---|---|---|---|---|---|")
    for path in ("cli", "own"):
        for setup in SETUPS:
            ok = [r for r in rows if (r["path"], r["setup"], r["cls"]) == (path, setup,
                                                                            "correct")]
            status = Counter(r["status"] for r in ok)
            cert = np.array([r["certified"] for r in ok])
            warned = Counter(w for r in ok for w in r["warned"])
            bugs = []
            for cls in dict.fromkeys(r["cls"] for r in rows
                                     if (r["path"], r["setup"]) == (path, setup)):
                if cls == "correct":
                    continue
                bad = [r for r in rows if (r["path"], r["setup"], r["cls"]) == (path, setup,
                                                                                 cls)]
                hit = [r for r in bad if r["status"] == "privacy_bug"]
                names = Counter(n for r in hit for n in r["fired"])
                bugs.append(f"{cls} {len(hit)}/{len(bad)} ("
                            + ", ".join(f"{n} {c}" for n, c in names.most_common(3)) + ")")
            print(f"| {path} | {setup} | "
                  + ", ".join(f"{k} {v}/{len(ok)}" for k, v in status.items())
                  + f" | {np.median(cert):.3f} [{cert.min():.3f}, {cert.max():.3f}] | "
                  + (", ".join(f"{k} {v}/{len(ok)}" for k, v in warned.items()) or "none")
                  + " | " + "; ".join(bugs) + " |", flush=True)
    print(f"\n{len(jobs)} audits in {time.perf_counter() - start:.0f} s, {args.jobs} job(s), "
          f"1 thread each, {platform.machine()}, load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
