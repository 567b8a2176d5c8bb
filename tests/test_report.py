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


def test_json_files_follow_the_umask_not_mkstemp(tmp_path):
    import os
    import stat

    from dpaudit.report import write_json

    old = os.umask(0o022)
    try:
        path = write_json(tmp_path / "r.json", {"a": 1})
        assert stat.S_IMODE(path.stat().st_mode) == 0o644  # group and others can read
        os.umask(0o077)
        private = write_json(tmp_path / "p.json", {"a": 1})
        assert stat.S_IMODE(private.stat().st_mode) == 0o600  # a strict umask is respected
    finally:
        os.umask(old)


def test_provenance_describes_the_run():
    from dpaudit.report.provenance import SCHEMA_VERSION, provenance

    p = provenance("cpu")
    assert p["schema_version"] == SCHEMA_VERSION and p["device"] == "cpu"
    assert p["versions"]["torch"] and p["versions"]["opacus"] and p["versions"]["dpaudit"]
    assert p["timestamp_utc"].endswith("+00:00")
    rev = p["git_revision"]  # the tests run from a git checkout (CI: a fresh clone)
    assert rev is not None and len(rev.removesuffix("-dirty")) == 40
