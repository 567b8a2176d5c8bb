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


# --- figures that stand alone, and a report whose files belong together --------------------


def _bug_audit(tmp_path, seed=0, n=100):
    """A PRIVACY BUG without training: scores of N(3, 1) members vs N(0, 1) non-members
    against a claim of sigma=20, T=1 (mu = 0.05), audited through ``audit_report``."""
    from dpaudit.experiment import audit_report
    from dpaudit.threat_model import ThreatModel

    rng = np.random.default_rng(seed)
    member = np.arange(2 * n) < n
    scores = np.where(member, 3.0, 0.0) + rng.standard_normal(2 * n)
    threat = ThreatModel(
        noise_multiplier=20.0,
        max_grad_norm=1.0,
        sample_rate=1.0,
        steps=1,
        delta=1e-5,
        canary_kind="gradient",
        canary_norm=1.0,
        training_sample_rate=0.01,
    )
    return audit_report(
        scores={"scalar": scores},
        membership=member,
        threat_model=threat,
        methods=["gdp", "gaussian", "clopper_pearson"],
        independent_canaries=True,
        output_dir=tmp_path,
        quiet=True,
    )


def test_score_bins_follow_the_sample_size():
    from dpaudit.report.plots import MAX_BINS, score_bins

    x = np.random.default_rng(1).standard_normal(20)
    edges = score_bins(x)
    # numpy 'auto': the finer of Sturges (log2(n) + 1 bins) and Freedman-Diaconis
    sturges = int(np.ceil(np.log2(20) + 1))
    iqr = np.subtract(*np.percentile(x, [75, 25]))
    fd = int(np.ceil(np.ptp(x) / (2 * iqr * 20 ** (-1 / 3))))
    assert len(edges) - 1 == max(sturges, fd) == 6  # not 50 bins for 20 scores
    assert edges[0] == x.min() and edges[-1] == x.max()
    big = np.random.default_rng(2).standard_normal(10**5)
    assert len(score_bins(big)) - 1 == MAX_BINS  # 'auto' would give ~190: capped
    assert len(score_bins(np.ones(5))) == 2  # one value: one bin around it
    with pytest.raises(ValueError, match="values"):
        score_bins([np.nan])


def test_figures_stand_alone(tmp_path):
    from matplotlib.colors import to_hex

    from dpaudit.report.plots import (
        VERDICT_COLOURS,
        histogram_figure,
        pyplot,
        roc_figure,
        score_bins,
    )

    plt = pyplot()
    rng = np.random.default_rng(3)
    split = {"scalar": (rng.normal(1, 1, 10), rng.normal(0, 1, 10))}
    grid = np.logspace(-5, 0, 200)
    theory = {"claimed: x": grid, "certified: mu >= 1.0": grid, "estimate: mu_hat=2": grid}
    title = "T=8, sigma=2, delta=1e-05, q=0.01; claimed epsilon 6.573"
    fig = roc_figure(
        split,
        theory,
        title,
        {"certified operating point": (0.1, 0.5)},
        note="PRIVACY BUG at 95%",
        status="privacy_bug",
    )
    for ax in fig.axes:  # every panel: a legend with every curve, labelled axes
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels[0] == "empirical: scalar (10 in, 10 out)"
        assert {"certified: mu >= 1.0", "estimate: mu_hat=2", "chance"} <= set(labels)
        assert ax.get_xlabel() == "false positive rate" and ax.get_ylabel()
    texts = {t.get_gid(): t for t in fig.texts}
    assert texts["title"].get_text() == title
    assert texts["verdict"].get_text() == "PRIVACY BUG at 95%"
    box = texts["verdict"].get_bbox_patch().get_facecolor()
    assert to_hex(box) == VERDICT_COLOURS["privacy_bug"]
    styles = {line.get_label(): line.get_linestyle() for line in fig.axes[0].get_lines()}
    assert styles["certified: mu >= 1.0"] == ":" and styles["estimate: mu_hat=2"] == "--"
    plt.close(fig)
    fig = histogram_figure(split, title, {"scalar": 0.5}, note="CONSISTENT", status="consistent")
    (ax,) = fig.axes
    assert ax.get_ylabel() == "density" and ax.get_xlabel() == "scalar score"
    bins = len(score_bins(np.concatenate(split["scalar"]))) - 1
    assert len(ax.patches) == 2 * bins and ax.get_title() == f"scalar: {bins} bins for 20 scores"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [
        "non-members (out, n=10)",
        "members (in, n=10)",
        "claim-test threshold 0.5",
    ]
    plt.close(fig)


def test_report_files_describe_themselves_and_belong_together(tmp_path):
    import copy
    import hashlib
    import os
    import stat

    from dpaudit.experiment.judging.evaluation import split_scores
    from dpaudit.experiment.judging.outputs import write_audit_report

    result = _bug_audit(tmp_path)
    assert result["verdict"]["status"] == "privacy_bug"
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["audit_mode"]["name"] == "own_loop" and "mode" not in saved
    conf = saved["confidence"]  # 1 attack x (3 methods + claim test) = 4 statements
    assert conf["statements"] == 4 and conf["per_statement"] == pytest.approx(1 - 0.05 / 4)
    assert "Bonferroni" in conf["correction"]
    assert all(b["confidence"] == conf["per_statement"] for b in saved["bounds"])
    assert saved["provenance"]["versions"]["opacus"] and saved["schema_version"] >= 2
    mask = os.umask(0o022)
    os.umask(mask)
    for name, digest in saved["plot_sha256"].items():  # these plots, this result
        assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == digest
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~mask
    assert stat.S_IMODE((tmp_path / "results.json").stat().st_mode) == 0o666 & ~mask
    # A failed results.json write leaves the previous report whole: no new plot beside it.
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    broken = copy.deepcopy(saved)
    broken["unwritable"] = object()
    rng = np.random.default_rng(9)
    split = split_scores({"scalar": rng.standard_normal(40)}, np.arange(40) < 20)
    with pytest.raises(TypeError):
        write_audit_report(broken, split, tmp_path, quiet=True)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
