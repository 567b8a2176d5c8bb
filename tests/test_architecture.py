"""The import direction of the design (docs/design.md section 2), read from the source.

Every ``dpaudit`` module's imports (``ast``, module level and inside functions alike, and
string constants that name a ``dpaudit`` module, as lazy-import tables do) give an edge
between two top-level packages or modules of ``dpaudit``. An edge must run downhill:
from a layer to a strictly lower one. Within a layer there are no edges, so there is no
cycle between packages either. A new package must be given a layer here.
"""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "dpaudit"

# Lowest first. Leaves import nothing from dpaudit; the source papers, the open registries and
# the per-sample gradients only the leaves' input checks (their unknown names get "did you
# mean"); stats and covariance only those; the lab, the
# attacks and the canaries use them; capture uses attacks and covariance; report writes what they
# produce; forecast says what a threat model lets an audit certify before it trains; the bug zoo
# patches Opacus' optimizer with capture's patching (its sampling bugs, Opacus' sampler, in
# sampler_bugs below it); experiment composes; tasks and the config
# schema sit on top of it; cli only parses the config and calls a task.
LAYERS = (
    ("_jsonable", "_validate", "seeds", "names"),
    ("papers", "registry", "gradients"),
    ("stats", "covariance"),
    ("accounting", "meanlab", "attacks", "canaries", "data", "models"),
    ("threat_model", "capture", "validity", "report"),
    ("sampler_bugs",),
    ("bugs", "forecast"),
    ("experiment",),
    ("conf", "tasks"),
    ("cli",),
    ("__main__",),
)
LEVEL = {name: i for i, layer in enumerate(LAYERS) for name in layer}

# Inside experiment/: the canary designs (torch-free plug-ins the settings check with), the
# settings (the audit's schema) and the plan (the settings resolved once into typed records)
# below its two wings, which never
# import each other (trainings: set up, train and record runs, one or many; judging: evidence,
# verdict and report from what the runs recorded); audit.py composes the two, collect.py
# re-judges directories of runs on top of it; the package's __init__ only re-exports.
EXPERIMENT_LAYERS = (
    ("canary_designs",), ("settings",), ("plan",), ("trainings", "judging"), ("audit",),
    ("collect",),
)
EXPERIMENT_LEVEL = {name: i for i, layer in enumerate(EXPERIMENT_LAYERS) for name in layer}

# names.REGISTRIES locates registries by module name in sys.modules (settings' checks read
# registered names without importing torch): a lookup, not an import.
READ_BY_NAME_ONLY = {"dpaudit.names"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, module: str) -> set[str]:
    """Absolute names of the dpaudit modules that ``path`` imports (``from dpaudit import x``
    gives ``dpaudit.x``; relative imports are resolved)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            out.add(stem)
            out |= {f"{stem}.{a.name}" for a in node.names}
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and module not in READ_BY_NAME_ONLY and _names_a_module(node.value)):
            out.add(node.value)  # "dpaudit.x.y" in a lazy-import table or import_module()
    return {m for m in out if m.split(".")[0] == "dpaudit"}


def _names_a_module(text: str) -> bool:
    """True when ``text`` is the dotted name of a module or package of the source tree."""
    if not text.startswith("dpaudit.") or not text.replace(".", "").replace("_", "").isalnum():
        return False
    path = SRC.parent.joinpath(*text.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _top(module: str) -> str | None:
    """The top-level package or module of ``dpaudit.x.y`` (``x``), None for the root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def package_edges() -> dict[tuple[str, str], list[str]]:
    """(importer, imported) top-level pairs -> the 'module -> module' lines that make them."""
    tops = {p.stem if p.is_file() else p.name for p in SRC.iterdir()
            if (p.suffix == ".py" or (p / "__init__.py").exists()) and p.stem != "__init__"}
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path)
        a = _top(module)
        if a is None:  # the root __init__ only re-exports, imported lazily by name
            continue
        for target in _imported(path, module):
            b = _top(target)
            if b is None or b == a or b not in tops:  # "from dpaudit import x": x counted
                continue
            edges.setdefault((a, b), []).append(f"{module} -> {target}")
    return edges


def test_every_package_has_a_layer():
    tops = {_top(_module_name(p)) for p in SRC.rglob("*.py")} - {None}
    assert sorted(tops - set(LEVEL)) == []


def test_imports_run_downhill():
    uphill = {
        f"{a} (layer {LEVEL[a]}) -> {b} (layer {LEVEL[b]})": sorted(set(lines))
        for (a, b), lines in package_edges().items()
        if LEVEL.get(b, -1) >= LEVEL.get(a, -1)
    }
    assert uphill == {}


@pytest.mark.parametrize("leaf", LAYERS[0])
def test_leaves_import_nothing_from_the_package(leaf):
    assert [b for (a, b) in package_edges() if a == leaf] == []


def test_the_graph_is_read_correctly():
    """The reader sees known edges of each import form (guards against a vacuous pass)."""
    edges = package_edges()
    assert ("attacks", "covariance") in edges  # from dpaudit.covariance import ...
    assert ("experiment", "seeds") in edges  # from dpaudit import seeds
    assert ("experiment", "canaries") in edges  # an import inside a function
    assert ("cli", "experiment") in edges
    assert ("experiment", "bugs") in edges  # a string in experiment/__init__'s lazy table


def _experiment_part(module: str) -> str | None:
    """The part of experiment/ that ``dpaudit.experiment.<part>...`` belongs to."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "experiment" else None


def test_every_part_of_experiment_has_a_layer():
    parts = {_experiment_part(_module_name(p)) for p in (SRC / "experiment").rglob("*.py")}
    assert sorted(parts - set(EXPERIMENT_LEVEL) - {None}) == []


def test_the_two_wings_of_experiment_never_import_each_other():
    """Inside experiment/, imports run downhill too (EXPERIMENT_LAYERS): the trainings wing
    and the judging wing are each readable on its own; audit.py joins them."""
    uphill = []
    for path in sorted((SRC / "experiment").rglob("*.py")):
        module = _module_name(path)
        a = _experiment_part(module)
        if a is None:  # experiment/__init__: re-exports only
            continue
        for target in _imported(path, module):
            b = _experiment_part(target)
            if b is not None and b != a and EXPERIMENT_LEVEL[b] >= EXPERIMENT_LEVEL[a]:
                uphill.append(f"{module} -> {target}")
    assert sorted(uphill) == []
    graph = _module_graph()
    assert "dpaudit.experiment.trainings.run" in graph["dpaudit.experiment.audit"]
    assert "dpaudit.experiment.judging.evaluation" in graph["dpaudit.experiment.audit"]


def test_dir_of_the_package_lists_every_public_package():
    import dpaudit

    public = {t for t in LEVEL if not t.startswith("_")}
    assert public <= set(dir(dpaudit))


def test_tests_mirror_the_package():
    """tests/ has one folder per subpackage of src/dpaudit/ (plus support/ for shared helper
    modules and examples/ for experiments/), and helper modules hold no tests."""
    tests = Path(__file__).resolve().parent
    folders = {d.name for d in tests.iterdir() if d.is_dir() and not d.name.startswith((".", "_"))}
    packages = {d.name for d in SRC.iterdir() if (d / "__init__.py").is_file()}
    assert folders - {"support", "examples"} == packages
    assert not list((tests / "support").glob("test_*.py"))
    for folder in folders - {"support"}:
        assert list((tests / folder).glob("test_*.py")), folder


def test_declared_names_are_the_registries():
    # dpaudit.names lets --help and config validation run without torch; each tuple must be
    # its registry's keys, in order
    import importlib

    from dpaudit import names

    for name, (module, attr) in names.REGISTRIES.items():
        registry = getattr(importlib.import_module(module), attr)
        assert getattr(names, name) == tuple(getattr(registry, "builtin", registry)), name


def _module_graph() -> dict[str, set[str]]:
    """Module -> the dpaudit modules it imports (``from pkg import sub`` names the submodule
    when ``sub`` is one, the package otherwise)."""
    modules = {_module_name(p) for p in SRC.rglob("*.py")}
    graph = {}
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path)
        targets = {name for name in _imported(path, module) if name in modules}
        # a "from pkg import sub" adds pkg too: drop it when sub is a module of pkg
        graph[module] = {t for t in targets if t != module and not any(
            o.startswith(t + ".") for o in targets)}
    return graph


def test_no_module_imports_itself_through_a_circle():
    """No import cycle between modules, inside a package either (experiment's run.py and
    multirun.py, now in experiment/trainings/, imported each other for a run's membership
    bit)."""
    graph = _module_graph()
    state: dict[str, int] = {}
    circles = []

    def visit(module, path):
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                circles.append(" -> ".join([*path[path.index(target):], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_no_private_name_is_imported_from_another_package():
    """A ``_name`` is private to its top-level package (``_validate`` / ``_jsonable`` are
    leaf modules shared by all): importing one from another package is a hidden dependency
    (validity/ read accounting's ``_discrete_prv``; it is public now)."""
    crossing = []
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.module and not node.level
                    and node.module.startswith("dpaudit.")):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and _top(node.module) != _top(module):
                    crossing.append(f"{module} -> {node.module}.{alias.name}")
    assert crossing == []


# The orchestration floor (experiment/plan.py): the settings are read there, once, and turned
# into typed records; audit.py, the multi-run entry and collect.py (above audit) hand the
# settings to it and write them into files. Everything else under experiment/ receives records.
ORCHESTRATION = {
    "dpaudit.experiment", "dpaudit.experiment.settings", "dpaudit.experiment.plan",
    "dpaudit.experiment.audit", "dpaudit.experiment.trainings.multirun",
    "dpaudit.experiment.collect",
}


def _below_orchestration():
    for path in sorted((SRC / "experiment").rglob("*.py")):
        module = _module_name(path)
        if module not in ORCHESTRATION:
            yield module, ast.parse(path.read_text(), str(path))


def _settings_uses(tree) -> list[str]:
    """Where a module imports ``AuditSettings`` (or the settings module whole), names it, or
    has a parameter called ``settings``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "dpaudit.experiment.settings":
            out += [f"imports {a.name}" for a in node.names if a.name == "AuditSettings"]
        elif isinstance(node, ast.ImportFrom) and node.module == "dpaudit.experiment":
            out += [f"imports {a.name}" for a in node.names if a.name in ("settings",
                                                                           "AuditSettings")]
        elif isinstance(node, ast.Name) and node.id == "AuditSettings":
            out.append(f"names AuditSettings (line {node.lineno})")
        elif isinstance(node, ast.Constant) and node.value == "AuditSettings":
            out.append(f"annotates AuditSettings (line {node.lineno})")
        elif isinstance(node, ast.arg) and node.arg == "settings":
            out.append(f"has a parameter 'settings' (line {node.lineno})")
    return out


def test_no_module_below_the_orchestration_imports_or_receives_the_settings():
    """Trainings, judging, canary designs and scores take the plan's typed records
    (``experiment.plan``), never ``AuditSettings``: a settings field renamed breaks no leaf and
    no plug-in."""
    found = {m: uses for m, tree in _below_orchestration() if (uses := _settings_uses(tree))}
    assert found == {}
    # the reader is not vacuous: the orchestration's own modules are flagged
    plan = ast.parse((SRC / "experiment" / "plan.py").read_text())
    assert "imports AuditSettings" in _settings_uses(plan)


DERIVED = {  # value -> the one function computing it, in experiment/plan.py
    "the data's sample rate q": "poisson_sample_rate",
    "the number of steps T": "total_steps",
    "Opacus' expected batch size": "expected_batch_size",
    "the device": "resolve_device",
}


def _calls_and_definitions():
    calls, defs = {}, {}
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef) and not any(
                    ast.unparse(d) == "property" for d in node.decorator_list):
                defs.setdefault(node.name, []).append(module)  # a property reads, not derives
            elif isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                calls.setdefault(name, []).append(module)
    return calls, defs


@pytest.mark.parametrize("value", list(DERIVED))
def test_each_derived_value_is_computed_by_one_function(value):
    """q, T, the expected batch size and the device: one function each, in the plan, and
    nothing under experiment/ calls it but the plan (the tasks' own orchestration, Figure 3,
    may call the same function for its own runs)."""
    name = DERIVED[value]
    calls, defs = _calls_and_definitions()
    assert defs.get(name) == ["dpaudit.experiment.plan"]
    callers = {m for m in calls.get(name, []) if m.startswith("dpaudit.experiment")}
    assert callers == {"dpaudit.experiment.plan"}


def test_the_threat_model_is_assembled_in_one_function():
    """An audit's claim under test comes from one place, ``plan.threat_model`` (from what the
    canary design realises, or, in the own loop, what the hook's canaries realise): nothing
    else in the package calls ``ThreatModel(...)`` (``from_dict`` reads a stored one back)."""
    calls = []
    for path in sorted(SRC.rglob("*.py")):
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "ThreatModel":
                calls.append(module)
    assert calls == ["dpaudit.experiment.plan"]


def test_no_module_but_the_plan_derives_a_batch_size_or_asks_for_cuda():
    """The recomputations the plan replaced: ``len(data) * sample_rate`` (Opacus' expected
    batch) and ``torch.cuda.is_available()`` (the device) appear nowhere else in experiment/."""
    found = []
    for module, tree in _below_orchestration():
        for node in ast.walk(tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
                sides = [ast.unparse(node.left), ast.unparse(node.right)]
                if any("len(" in s for s in sides) and any("sample_rate" in s for s in sides):
                    found.append(f"{module}: {ast.unparse(node)}")
            if isinstance(node, ast.Attribute) and node.attr == "is_available" and \
                    ast.unparse(node.value).endswith("cuda"):
                found.append(f"{module}: {ast.unparse(node)}")
    assert found == []
