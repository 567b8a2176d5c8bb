"""Report helpers: atomic JSON with numpy / non-finite values, aligned tables."""

import json

import numpy as np
import pytest

from dpaudit.report import format_table, write_json


def test_write_json_converts_numpy_and_nonfinite(tmp_path):
    path = write_json(
        tmp_path / "sub" / "r.json",
        {"a": np.arange(3), "b": np.float32(0.5), "c": float("nan"), "d": float("inf")},
    )
    data = json.loads(path.read_text())
    assert data == {"a": [0, 1, 2], "b": 0.5, "c": "nan", "d": "inf"}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temp file left


def test_write_json_failure_leaves_previous_file_intact(tmp_path):
    path = write_json(tmp_path / "r.json", {"ok": 1})
    with pytest.raises(TypeError):
        write_json(path, {"bad": object()})
    assert json.loads(path.read_text()) == {"ok": 1}
    assert len(list(tmp_path.iterdir())) == 1


def test_format_table_aligns_columns():
    text = format_table([{"name": "a", "x": 1.23456}, {"name": "bbb", "x": 10.0}], precision=2)
    lines = text.splitlines()
    assert lines[0].split() == ["name", "x"]
    assert lines[2].endswith(" 1.23") and lines[3].endswith("10.00")
    assert len({len(line) for line in lines}) == 1


def test_top_level_names_resolve():
    import dpaudit

    for name in dpaudit.__all__:
        assert getattr(dpaudit, name) is not None
    with pytest.raises(AttributeError, match="no attribute"):
        dpaudit.nope
