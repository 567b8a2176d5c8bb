"""README.md's Python snippets run verbatim, so the documentation cannot rot."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(heading: str) -> list[str]:
    """The ```python blocks of the README section that starts with ``heading``."""
    section = README.read_text().split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_audit_your_own_loop_snippet_runs(capsys, tmp_path, monkeypatch):
    (block,) = python_blocks("## Audit your own training loop")
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "__snippet__"}
    exec(compile(block, str(README), "exec"), ns)
    hook = ns["hook"]
    assert hook.steps > 0 and hook.scores()["scalar"].shape == (hook.num_canaries,)
    assert "accountant epsilon" in capsys.readouterr().out
    report, inputs = ns["report"], ns["inputs"]
    assert report["theory"]["threat_model"]["sample_rate"] == 1.0  # every-step canaries
    assert report["claim"]["scalar"]["certified"] and report["verdict"]["status"] == "consistent"
    assert inputs["theory"]["threat_model"]["canary_kind"] == "input"
    assert {b["kind"] for b in inputs["bounds"] if b["method"] == "one_run"} == {"certified"}
    assert (tmp_path / "audit_out" / "gradient" / "results.json").exists()


def test_python_api_snippets_run(tmp_path, monkeypatch, capsys):
    stats_block, audit_block = python_blocks("## Python API")
    monkeypatch.chdir(tmp_path)
    exec(compile(stats_block, str(README), "exec"), {"__name__": "__snippet__"})
    ns: dict = {"__name__": "__snippet__"}
    exec(compile(audit_block, str(README), "exec"), ns)
    assert ns["result"]["verdict"]["privacy_bug"]  # the planted bug is caught
    assert (tmp_path / "audit_out" / "results.json").exists()
    lower, _, truth = capsys.readouterr().out.splitlines()[0].partition(" <= ")
    assert 0 < float(lower) <= float(truth)


def bash_blocks(heading: str) -> list[str]:
    section = README.read_text().split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]


def test_ci_runs_exactly_the_readme_test_command_first():
    main_job, tests = bash_blocks("## Two commands (fresh machine, from the repository root)")
    ci = [line for line in (README.parent / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith("#")]
    # After the shell options, the first command CI runs is the README's, verbatim.
    assert ci[:3] == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', tests]
    install = 'pip install -c requirements/dev.txt -e ".[dev,docs]"'
    assert tests.startswith("python3 -m venv .venv && . .venv/bin/activate && " + install)
    assert tests.endswith("&& ruff check . && pytest")
    # ... and then the slow tier that the README names
    assert "step slow-tests pytest -m slow -n 2" in ci
    assert "pytest -m slow -n 2" in README.read_text()
    # Both commands install from the lock; the main job is the same install without extras.
    venv = tests.split(" && pip")[0]
    assert main_job == venv + " && pip install -c requirements/dev.txt -e . && dpaudit"


def test_links_point_into_the_repository():
    """README and the package docstring name only files that exist in the repository."""
    import dpaudit

    root = README.parent
    text = README.read_text()
    targets = re.findall(r"\]\(([^)#\s]+)[^)]*\)", text)
    targets = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert targets, "README has no relative links?"
    for t in targets:
        assert (root / t).exists(), f"README links to {t}, which is not in the repository"
    for t in re.findall(r"``([\w./-]+\.(?:md|ipynb|py|txt))``", dpaudit.__doc__):
        assert (root / t).exists(), f"dpaudit's docstring names {t}, not in the repository"
    assert "DESIGN.md" not in text and "DESIGN.md" not in dpaudit.__doc__


def test_extending_snippet_runs(monkeypatch):
    from dpaudit.experiment.trainings.scores import SCORES
    from dpaudit.models import MODELS
    from dpaudit.stats.bounds import METHOD_REGISTRY

    ns = {"__name__": "__snippet__"}
    try:
        for block in python_blocks("## Extending dpaudit"):
            exec(compile(block, str(README), "exec"), ns)
    finally:  # the registries are process-wide: leave them as they were
        for registry, name in ((MODELS, "wide_logreg"), (SCORES, "cosine"),
                               (METHOD_REGISTRY, "my_cp")):
            registry.pop(name, None)
    rows = {(b["attack"], b["method"]): b for b in ns["result"]["bounds"]}
    assert rows[("cosine", "my_cp")]["kind"] == "estimate"
    assert rows[("cosine", "my_cp")]["epsilon"] == rows[("cosine", "clopper_pearson")][
        "epsilon"]
