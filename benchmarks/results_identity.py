"""results.json of six audits, reduced to what must not change when the code is refactored.

Runs six configurations (the default audit, Poisson gradient canaries, input canaries, a
multi-run audit, the own loop through ``audit_report`` and a registered canary design) into
``<out>/<name>/`` and writes ``<out>/digests.json``: per configuration the sha256 of
results.json with the keys that record when and how long (``timing``, ``wall_seconds``,
``provenance``) removed, every other key and value in the file's order. Two such
directories, made before and after a change, must agree (``--compare``):

    python benchmarks/results_identity.py /tmp/before        # on the old commit
    python benchmarks/results_identity.py /tmp/after         # on the new one
    python benchmarks/results_identity.py --compare /tmp/before /tmp/after

``--only name,...`` runs some of them. Every configuration is small enough for a laptop; the
default audit is ``dpaudit``'s own default (``run_audit`` with no settings).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

VOLATILE = ("timing", "wall_seconds", "provenance")
SMALL = {"dp": {"steps": 30}}


def _configs() -> dict:
    return {
        "default": {},
        "poisson": {"canary": {"kind": "gradient", "policy": "bernoulli", "count": 200},
                    "dp": {"noise_multiplier": 1.0, "steps": 40}},
        "input": {"canary": {"kind": "input", "count": 20, "candidates": 100}, **SMALL},
        "multi_run": {"audit": {"mode": "multi_run", "runs": 6}, "canary": {"count": 1},
                      "dp": {"steps": 20}},
        "registered": {"canary": {"kind": "sparse_sign", "count": 40,
                                  "options": {"support": 3}}, **SMALL},
    }


def stripped(path: Path) -> dict:
    data = json.loads(path.read_text())
    return {k: v for k, v in data.items() if k not in VOLATILE}


def digest(out: Path) -> dict:
    res = stripped(out / "results.json")
    text = json.dumps(res).encode()  # in the file's own key order: the order must hold too
    return {"results_sha256": hashlib.sha256(text).hexdigest(),
            "status": res["verdict"]["status"],
            "best_lower_bound": res["verdict"]["best_lower_bound"],
            "claimed_epsilon": res["verdict"]["claimed_epsilon"]}


def run_one(name: str, groups: dict, out: Path) -> None:
    from dpaudit.experiment import run_audit

    run_audit(output_dir=out, progress=False, **groups)


def run_own_loop(out: Path) -> None:
    from own_loop_models import own_loop_audit

    own_loop_audit("linear", seed=0, output_dir=out, quiet=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    p.add_argument("--only", default="")
    args = p.parse_args()
    if args.compare:
        a, b = (json.loads(Path(d, "digests.json").read_text()) for d in args.compare)
        same = True
        for name in sorted(set(a) | set(b)):
            ok = a.get(name, {}).get("results_sha256") == b.get(name, {}).get("results_sha256")
            same &= ok
            print(f"{name:12s} {'identical' if ok else 'DIFFERENT'}  "
                  f"{a.get(name, {}).get('status')} / {b.get(name, {}).get('status')}")
        sys.exit(0 if same else 1)
    import my_design  # the registered design of tests/support

    warnings.simplefilter("ignore")
    my_design.register()
    out = Path(args.out)
    only = set(filter(None, args.only.split(",")))
    saved = Path(out, "digests.json")
    digests = json.loads(saved.read_text()) if only and saved.exists() else {}
    for name, groups in [*_configs().items(), ("own_loop", None)]:
        if only and name not in only:
            continue
        target = out / name
        start = time.perf_counter()
        if groups is None:
            run_own_loop(target)
        else:
            run_one(name, groups, target)
        digests[name] = {**digest(target), "seconds": round(time.perf_counter() - start, 1)}
        print(name, digests[name], flush=True)
    saved.write_text(json.dumps(digests, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
