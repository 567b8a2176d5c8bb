"""README.md's commands are the ones CI runs and its links point into the repository (its
Python blocks run in tests/test_docs_run.py, with every block of docs/)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


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
