"""Every ```python block of README.md and docs/*.md runs as written, or says why it cannot.

A block runs in a fresh namespace, in a temporary working directory (what it writes stays
there), with torch's global random stream and the registries (``dpaudit.names.REGISTRIES``)
restored afterwards. An HTML comment on the last non-blank line before a block's fence
changes that (the comment is invisible once rendered):

* ``<!-- fragment: REASON -->``: the block is a piece of something larger (it uses a hook
  or a file the reader has); not run, and REASON must say why;
* ``<!-- continues -->``: the block runs in the namespace of the block before it in the same
  file (which must run): a walk-through in several blocks is one test;
* ``<!-- slow -->``: the block (and its chain) runs in the slow tier (``pytest -m slow``);
  the fast tier keeps the cheap ones, a few seconds in all.

``continues`` and ``slow`` combine with ``;`` (``<!-- continues; slow -->``); a fragment's
reason is the rest of its comment. Any other comment before a block is no marker.
``CHECKS`` adds assertions on what a block leaves behind, found by a line of its code (so a
block may move between sections), and each must find a block that runs.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DIRECTIVES = ("fragment", "continues", "slow")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
_COMMENT = re.compile(r"^\s*<!--(.*?)-->\s*$")


@dataclass
class Block:
    """One ```python block: where it is, its code and the directives before it."""

    path: Path
    line: int  # the fence's line, 1-based
    code: str
    marks: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"


def parse_marks(comment: str | None) -> dict[str, str]:
    """The directives of a marker comment (``{"fragment": reason, ...}``); {} for a comment
    that is no marker (it does not start with a directive)."""
    if comment is None:
        return {}
    text = comment.strip()
    if re.match(r"fragment\b", text):  # its reason is the rest, whatever it holds
        return {"fragment": text[len("fragment"):].lstrip(":").strip()}
    parts = [p.strip() for p in text.split(";") if p.strip()]
    names = [re.split(r"[:\s]", p, maxsplit=1)[0] for p in parts]
    if not parts or names[0] not in DIRECTIVES:
        return {}
    marks = {}
    for part, name in zip(parts, names, strict=True):
        if name not in DIRECTIVES:
            raise ValueError(f"unknown directive {name!r} in <!--{comment}-->: "
                             f"the directives are {DIRECTIVES}")
        marks[name] = part[len(name):].lstrip(":").strip()
    return marks


def python_blocks(path: Path) -> list[Block]:
    """The ```python blocks of a Markdown file, each with the marker before its fence."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence.group(2)):
            end += 1
        if fence.group(3) == "python":
            before = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
            comment = _COMMENT.match(before)
            indent = len(fence.group(1))
            code = "\n".join(ln[indent:] for ln in lines[i + 1:end]) + "\n"
            blocks.append(Block(path, i + 1, code,
                                parse_marks(comment.group(1) if comment else None)))
        i = end + 1
    return blocks


def chains(paths: list[Path] = DOCS) -> list[list[Block]]:
    """The blocks to run, a block and the ones that continue it, in file order."""
    out: list[list[Block]] = []
    for path in paths:
        previous = None
        for block in python_blocks(path):
            if "fragment" in block.marks:
                previous = None
            elif "continues" in block.marks:
                if previous is None:
                    raise ValueError(f"{block.where}: marked continues, but no block that "
                                     "runs comes before it in the file")
                previous.append(block)
            else:
                previous = [block]
                out.append(previous)
    return out


def _param(chain: list[Block]):
    slow = any("slow" in b.marks for b in chain)
    return pytest.param(chain, id=chain[0].where, marks=[pytest.mark.slow] if slow else [])


# --- what some blocks must leave behind (their code contains the key line) -----------------

def _quickstart(ns, out, tmp):
    hook = ns["hook"]
    assert hook.steps > 0 and len(hook.canaries[0]) == 1000  # on the canary block
    assert out.startswith("Your epsilon ") and "(PRV accountant, " in out
    assert "verified at most" in out and "Canaries" not in out


def _own_loop_readme(ns, out, tmp):
    hook = ns["hook"]
    assert hook.steps > 0 and hook.scores()["scalar"].shape == (hook.num_canaries,)
    assert "accountant epsilon" in out
    report, inputs = ns["report"], ns["inputs"]
    assert report["theory"]["threat_model"]["sample_rate"] == 1.0  # every-step canaries
    assert report["claim"]["scalar"]["certified"] and report["verdict"]["status"] == "consistent"
    assert inputs["theory"]["threat_model"]["canary_kind"] == "input"
    assert {b["kind"] for b in inputs["bounds"] if b["method"] == "one_run"} == {"certified"}
    assert (tmp / "audit_out" / "gradient" / "results.json").exists()


def _own_loop_api(ns, out, tmp):
    assert len(ns["coords"]) == 30  # 3 blank pixels x 10 classes, structurally dead
    assert ns["dim"] == 650 and ns["hook"].steps > 0
    assert ns["report"]["verdict"]["status"] == "consistent"
    assert "clipping" in ns["report"]["white_box"]["checks"]
    assert (tmp / "audit_out" / "results.json").exists()


def _halved_noise(ns, out, tmp):
    assert ns["result"]["verdict"]["privacy_bug"]  # the planted bug is caught
    assert (tmp / "audit_out" / "results.json").exists()


def _stats(ns, out, tmp):
    first = out.splitlines()[0]
    if " <= " in first:  # the README's: a certified bound below the truth
        lower, _, truth = first.partition(" <= ")
        assert 0 < float(lower) <= float(truth)
    assert ns["bound"].kind == "certified" and ns["bound"].epsilon > 0


def _extending(ns, out, tmp):
    rows = {(b["attack"], b["method"]): b for b in ns["result"]["bounds"]}
    assert rows[("cosine", "my_cp")]["kind"] == "estimate"
    assert rows[("cosine", "my_cp")]["epsilon"] == rows[("cosine", "clopper_pearson")][
        "epsilon"]


def _no_dead(ns, out, tmp):
    assert out.split()[:2] == ["0", "0"]


CHECKS = {
    "add_canary_block(model)  # dpaudit 1/3": _quickstart,
    'output_dir="audit_out/gradient")': _own_loop_readme,
    "coords = dead_coordinates(model, train)    #": _own_loop_api,
    'dp={"noise_multiplier": 10.0, "steps": 100, "bug": "halved_noise"},': _halved_noise,
    'bound = epsilon_lower_bound(scores_in, scores_out, delta=1e-5, method="clopper_pearson")':
        _stats,
    '@dpaudit.register_model("wide_logreg")': _extending,
    'model = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 3))': _no_dead,
}


@contextlib.contextmanager
def _sandbox():
    """Registries and torch's global random stream as they were, whatever a block does."""
    import torch

    from dpaudit import names

    tables = [getattr(importlib.import_module(m), a) for m, a in names.REGISTRIES.values()]
    registries = [t for t in tables if isinstance(t, dict)]  # the open ones (tuples are fixed)
    saved = [dict(r) for r in registries]
    with torch.random.fork_rng(devices=[]):  # the blocks seed torch; numpy's they never use
        try:
            yield
        finally:
            for registry, before in zip(registries, saved, strict=True):
                registry.clear()
                registry.update(before)


@pytest.mark.parametrize("chain", [_param(c) for c in chains()])
def test_docs_block_runs(chain, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "__docs__"}
    with _sandbox():
        for block in chain:
            exec(compile(block.code, block.where, "exec"), ns)
    out = capsys.readouterr().out
    for key, check in CHECKS.items():
        if any(key in b.code for b in chain):
            check(ns, out, tmp_path)


def test_every_block_runs_or_says_why_not_and_every_check_finds_its_block():
    blocks = [b for p in DOCS for b in python_blocks(p)]
    assert len(blocks) >= 10, "the docs have fewer python blocks than expected: parser?"
    for b in blocks:
        if "fragment" in b.marks:
            assert len(b.marks["fragment"].split()) >= 3, (
                f"{b.where}: a fragment must say why it cannot run (<!-- fragment: REASON -->)")
            assert set(b.marks) == {"fragment"}, f"{b.where}: a fragment has no other mark"
    chained = [b for c in chains() for b in c]
    assert len(chained) + sum("fragment" in b.marks for b in blocks) == len(blocks)
    for key in CHECKS:
        assert any(key in b.code for b in chained), f"CHECKS key {key!r} finds no block that runs"


def dpaudit_commands(path: Path) -> list[list[str]]:
    """The ``dpaudit`` commands of a file's bash blocks as argument lists, one value per sweep
    setting (``-m a=1,2`` -> ``a=1``). Hydra's own options (``hydra/...``, ``hydra.*``) are
    left out; a command that elides arguments (``...``), calls a sweep function
    (``range(2)``) or loads the reader's plug-in module is not checked."""
    import shlex

    out = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split(" #", 1)[0].strip().split("&& ")[-1]
            if not re.match(r"dpaudit(\s|$)", command):
                continue
            if "..." in command or "(" in command or "plugins=" in command:
                continue
            args = shlex.split(command)[1:]
            args = [a if "[" in a else a.split(",")[0] for a in args if a not in ("-m",)]
            out.append([a for a in args if not a.startswith(("hydra/", "hydra."))])
    return out


def test_the_dpaudit_commands_of_the_docs_parse():
    """Every ``dpaudit ...`` command shown is accepted by the CLI's checks, without training
    (``cli.check_command``): no misspelt key, unread override or bad value."""
    from dpaudit.cli import check_command

    commands = [(p, c) for p in DOCS for c in dpaudit_commands(p)]
    assert len(commands) >= 10, commands
    for path, args in commands:
        try:
            check_command(args)
        except Exception as err:
            raise AssertionError(f"{path.name}: dpaudit {' '.join(args)}: {err}") from err
    with pytest.raises(Exception, match="noise_multipler"):  # the check can fail
        check_command(["dp.noise_multipler=2"])
    with pytest.raises(ValueError, match="experiment=stats_demo does not use"):
        check_command(["experiment=stats_demo", "dp.noise_multiplier=2"])


def test_markers_are_read_as_written():
    assert parse_marks(" fragment: uses the hook of your loop ") == {
        "fragment": "uses the hook of your loop"}
    assert parse_marks(" continues; slow ") == {"continues": "", "slow": ""}
    assert parse_marks(" fragment: a file of yours; the path is an example ") == {
        "fragment": "a file of yours; the path is an example"}
    assert parse_marks(" docs-numbers:own_loop ") == {}  # another comment: no marker
    assert parse_marks(None) == {}
    with pytest.raises(ValueError, match="unknown directive 'slowly'"):
        parse_marks(" continues; slowly ")


def test_continued_blocks_share_a_namespace_and_fragments_break_the_chain(tmp_path):
    doc = tmp_path / "walk.md"
    doc.write_text("Intro.\n\n```python\na = 2\n```\n\nThen\n<!-- continues; slow -->\n"
                   "```python\nb = a * 3\n```\n\n<!-- fragment: uses your own model here -->\n"
                   "```python\nmodel.fit()\n```\n\n```bash\ndpaudit\n```\n")
    (chain,) = chains([doc])
    assert [b.line for b in chain] == [3, 9] and chain[1].marks == {"continues": "", "slow": ""}
    ns: dict = {}
    for block in chain:
        exec(compile(block.code, block.where, "exec"), ns)
    assert ns["b"] == 6
    doc.write_text("<!-- fragment: yours -->\n```python\nx\n```\n<!-- continues -->\n"
                   "```python\ny = x\n```\n")
    with pytest.raises(ValueError, match="marked continues, but no block that runs"):
        chains([doc])
