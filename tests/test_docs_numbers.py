"""The documented numbers that code regenerates (benchmarks/docs_numbers.py) are current."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "docs_numbers.py"


def _module():
    spec = importlib.util.spec_from_file_location("docs_numbers", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_documented_numbers_are_what_the_code_gives_now():
    stale = _module().refresh(write=False)
    assert stale == [], f"regenerate with python benchmarks/docs_numbers.py --write: {stale}"


def test_every_block_has_a_marker_pair_in_the_docs():
    mod = _module()
    for name in mod.BLOCKS:
        assert any(mod._pattern(name).search(p.read_text()) for p in mod.DOCS), name
