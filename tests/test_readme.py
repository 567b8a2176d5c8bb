"""README.md's Python snippets run verbatim, so the documentation cannot rot."""

import re
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("command", ["main job", "tests"])
def test_two_commands_are_documented(command):
    text = README.read_text()
    if command == "tests":
        ci = (README.parent / ".ci" / "run").read_text().strip().splitlines()[-1]
        assert ci in text  # CI runs exactly the README's test command
    else:
        assert "pip install torch==2.13.0 && pip install -e . && dpaudit" in text
