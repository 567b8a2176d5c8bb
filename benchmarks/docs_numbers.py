"""Numbers in the documentation, regenerated from the code that produces them.

A documented number sits between two markers, ``<!-- docs-numbers:NAME -->`` and
``<!-- /docs-numbers:NAME -->`` (invisible in the rendered page; they may sit inside a table
cell). Each NAME below is a function that computes the text between them. Run:

    python benchmarks/docs_numbers.py            # check: exit 1 and list the stale blocks
    python benchmarks/docs_numbers.py --write    # rewrite every block in place

``tests/test_docs_numbers.py`` (slow tier) runs the check, so a change that moves a documented
number fails CI until the docs are regenerated. Only deterministic computations are blocks
(fixed seeds, no timing); numbers measured over seeds on a particular machine (tightness,
power, wall times) name the script and commit that produced them instead.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "experiments" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]


def stats_demo() -> str:
    """``dpaudit experiment=stats_demo``'s table (its defaults), one clause per mu."""
    from dpaudit.tasks.stats_demo import stats_demo as run

    methods = ("gdp", "clopper_pearson", "one_run", "density", "density_tv")
    rows = run(methods=methods)["rows"]
    head = "true eps / " + " / ".join(methods)
    parts = [
        f"mu = {r['mu']:g}: " + " / ".join(f"{r[k]:.3f}" for k in ("true_eps", *methods))
        for r in rows
    ]
    return f"{head} at " + "; ".join(parts)


BLOCKS: dict[str, Callable[[], str]] = {"stats_demo": stats_demo}


def _pattern(name: str) -> re.Pattern:
    key = re.escape(name)
    return re.compile(rf"(<!-- docs-numbers:{key} -->)(.*?)(<!-- /docs-numbers:{key} -->)", re.S)


def refresh(write: bool, names=None) -> list[str]:
    """Recompute every block (or ``names``); returns 'file: NAME' for each stale one, and with
    ``write`` rewrites them. A block named in no file is an error (its marker was lost)."""
    names = list(BLOCKS) if names is None else list(names)
    stale, found = [], set()
    values = {}
    for path in DOCS:
        text = path.read_text()
        new = text
        for name in names:
            pat = _pattern(name)
            if not pat.search(new):
                continue
            found.add(name)
            if name not in values:
                values[name] = BLOCKS[name]()
            value = values[name]
            for m in pat.finditer(new):
                if m.group(2) != value:
                    stale.append(f"{path.relative_to(ROOT)}: {name}")
            new = pat.sub(lambda m, v=value: m.group(1) + v + m.group(3), new)
        if write and new != text:
            path.write_text(new)
    missing = sorted(set(names) - found)
    if missing:
        raise SystemExit(f"no docs-numbers marker for {missing} in {[str(p) for p in DOCS]}")
    return stale


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the stale blocks")
    ap.add_argument("names", nargs="*", help=f"blocks to refresh (default all: {list(BLOCKS)})")
    a = ap.parse_args(argv)
    stale = refresh(a.write, a.names or None)
    if stale and not a.write:
        print("stale documented numbers (python benchmarks/docs_numbers.py --write):")
        print("\n".join(f"  {s}" for s in stale))
        sys.exit(1)
    print(("rewrote: " + ", ".join(stale)) if stale else "every documented number is current")


if __name__ == "__main__":
    main()
