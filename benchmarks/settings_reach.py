"""How far the audit's settings travel, read from the source (issue: "resolve the settings once").

For a source tree (default: this checkout's ``src/dpaudit``) prints, from the modules' syntax
trees alone:

* every function (and dataclass) under ``experiment/`` that takes the whole ``AuditSettings``:
  a parameter named ``settings`` or annotated ``AuditSettings``, or a dataclass field of that
  type;
* where each derived value is computed: the calls, in the whole package, of the functions that
  compute the data's sample rate q, the number of steps T, Opacus' expected batch size and the
  device, and the places that write the expected batch size inline (``len(...) * sample_rate``);
* the longest chain of calls that hands the whole settings on (``f(settings, ...)`` inside a
  function that took them).

    python benchmarks/settings_reach.py                      # this checkout
    python benchmarks/settings_reach.py /path/to/old/src/dpaudit
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

DERIVED = {
    "q": ("poisson_sample_rate",),
    "T": ("total_steps",),
    "expected batch size": ("expected_batch_size",),
    "device": ("resolve_device",),
}


def _takes_settings(fn: ast.FunctionDef) -> bool:
    args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    return any(a.arg == "settings" or (a.annotation is not None
                                       and "AuditSettings" in ast.unparse(a.annotation))
               for a in args)


def _passes_settings(call: ast.Call) -> bool:
    values = list(call.args) + [k.value for k in call.keywords]
    for v in values:
        if isinstance(v, ast.Name) and v.id == "settings":
            return True
        if (isinstance(v, ast.Call) and ast.unparse(v.func).endswith("replace") and v.args
                and isinstance(v.args[0], ast.Name) and v.args[0].id == "settings"):
            return True  # dataclasses.replace(settings, ...)
    return False


def _name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)


def analyse(root: Path) -> dict:
    modules = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        modules[".".join(rel.parts)] = ast.parse(path.read_text(), str(path))
    takers, graph, derived, inline = [], {}, {k: [] for k in DERIVED}, []
    for module, tree in modules.items():
        in_experiment = ".experiment." in module + "."
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and in_experiment:
                for stmt in node.body:
                    if (isinstance(stmt, ast.AnnAssign) and "AuditSettings" in ast.unparse(
                            stmt.annotation) and node.name != "AuditSettings"):
                        takers.append(f"{module}.{node.name} (field {ast.unparse(stmt.target)})")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if in_experiment and _takes_settings(node):
                    takers.append(f"{module}.{node.name}")
                    key = f"{module}.{node.name}"
                    graph[key] = sorted({_name(c) for c in ast.walk(node)
                                         if isinstance(c, ast.Call) and _passes_settings(c)}
                                        - {None})
            if isinstance(node, ast.Call):
                for value, names in DERIVED.items():
                    if _name(node) in names or (ast.unparse(node.func).endswith(
                            "poisson_sample_rate") and value == "q"):
                        derived[value].append(f"{module}:{node.lineno}")
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
                text = ast.unparse(node)
                if "len(" in text and "sample_rate" in text:
                    inline.append(f"{module}:{node.lineno} {text}")
    by_name: dict[str, list[str]] = {}
    for key in graph:
        by_name.setdefault(key.rsplit(".", 1)[1], []).append(key)

    def longest(key: str, seen: tuple) -> list[str]:
        best = [key]
        for callee in graph.get(key, []):
            for target in by_name.get(callee, []):
                if target not in seen:
                    chain = [key, *longest(target, (*seen, target))]
                    if len(chain) > len(best):
                        best = chain
        return best

    chains = [longest(k, (k,)) for k in graph]
    return {"takers": takers, "derived": derived, "inline_batch": inline,
            "longest_chain": max(chains, key=len, default=[])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", nargs="?", default=str(Path(__file__).resolve().parents[1]
                                                 / "src" / "dpaudit"))
    root = Path(p.parse_args().src)
    out = analyse(root)
    print(f"{root}\n\nfunctions / records under experiment/ taking AuditSettings: "
          f"{len(out['takers'])}")
    for t in out["takers"]:
        print(f"  {t}")
    print("\nwhere each derived value is computed (calls of its function):")
    for value, places in out["derived"].items():
        print(f"  {value}: {len(places)} call(s): {', '.join(places) or '-'}")
    print(f"  expected batch size written inline: {len(out['inline_batch'])}: "
          + ("; ".join(out["inline_batch"]) or "-"))
    chain = out["longest_chain"]
    print(f"\nlongest chain of calls handing the whole settings on ({len(chain)} functions):")
    print("  " + " -> ".join(c.replace("dpaudit.experiment.", "") for c in chain))


if __name__ == "__main__":
    main()
