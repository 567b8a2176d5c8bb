"""The audit catches each planted bug and passes the correct optimizer (issue 6, section 4).

Each test runs the same small audit twice, with the bug and with ``dp.bug="none"``, and needs
the buggy optimizer's best 95% lower bound above the accountant and the correct one's below.
Miniatures of the ``bug_*`` presets (same mechanisms, fewer runs / smaller data).
"""

import pytest
import torch

from dpaudit.experiment import run_audit


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a loaded 2-core machine OpenMP
    makes them ~7x slower; results do not depend on the thread count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def evaluate_at(result: dict, out, level: float = 1e-6) -> dict:
    """The verdict of a multi-run audit's runs on disk judged again at ``level``: the same
    audit rerun into its directory (the PRIVACY BUG level is no part of the runs'
    fingerprint, so every run is read back, none trained)."""
    settings = {k: v for k, v in result["settings"].items() if k != "plugins"}
    settings["audit"] = {**settings["audit"], "refutation_level": level}
    return run_audit(output_dir=out, **settings)["verdict"]


def audit_both(cfg: dict, tmp_path=None) -> tuple[dict, dict]:
    """(buggy, correct) results of the audit ``cfg``."""
    out = {}
    for bug in (cfg["dp"]["bug"], "none"):
        kw = {"output_dir": tmp_path / bug} if tmp_path is not None else {}
        out[bug] = run_audit(**{**cfg, "dp": {**cfg["dp"], "bug": bug}}, **kw)
    return out[cfg["dp"]["bug"]], out["none"]


def test_halved_noise_is_flagged_by_dirac_canaries_on_dead_weights():
    # One run, 300 Dirac canaries on first-layer MLP weights of blank pixels, q = 1:
    # exact epsilon 4.38 (mu = 1). Observed: bug 6.16, correct 2.24 (mixture_lr, gaussian fit).
    cfg = {
        "model": {"name": "mlp", "width": 100},
        "dp": {"noise_multiplier": 10.0, "steps": 100, "bug": "halved_noise"},
        "canary": {"kind": "gradient", "count": 300, "view": "auto", "lower_side": 0},
        "attack": {"scores": ["scalar", "mixture_lr"]},
        "audit": {"methods": ["gdp", "gaussian", "clopper_pearson"]},
        "progress": False,
    }
    bad, ok = audit_both(cfg)
    assert bad["theory"]["gaussian_epsilon"] == pytest.approx(4.377, abs=0.01)
    assert bad["verdict"]["privacy_bug"], bad["verdict"]
    assert not ok["verdict"]["privacy_bug"], ok["verdict"]


@pytest.mark.slow
def test_unclipped_example_is_flagged_by_a_crafted_canary(tmp_path):
    # Multi-run, one crafted canary (blank pixel set to 100, gradient norm ~137 C), 40 runs.
    # Accountant (PRV, q = 1/8, T = 24, sigma = 4): 0.61. Observed: bug 3.70 (gdp), correct 0.
    cfg = {
        "data": {"name": "digits", "n_train": 256},
        "dp": {"noise_multiplier": 4.0, "batch_size": 32, "epochs": 3.0},
        "canary": {"kind": "input", "count": 1, "source": "crafted", "candidates": 30},
        "attack": {"scores": ["scalar"]},
        "audit": {"mode": "multi_run", "runs": 40, "methods": ["gdp", "clopper_pearson"]},
        "progress": False,
    }
    # The canary's scores refute the claim at the bounds' own 5% (40 runs cannot reach the
    # PRIVACY BUG level 1e-6 by scores alone: the claim test is a warning there). Every run
    # also keeps its white-box records, and run 0's clipping probes see the unclipped example
    # (deterministic): a PRIVACY BUG at the default level too; the correct runs pass both.
    cfg["dp"]["bug"] = "unclipped_example"
    cfg["audit"]["refutation_level"] = 0.05
    bad, ok = audit_both(cfg, tmp_path)
    assert bad["canary_info"]["source"] == "crafted"
    assert bad["verdict"]["privacy_bug"], bad["verdict"]
    assert bad["verdict"]["best_attack"] == "scalar"
    assert bad["claim"]["scalar"]["rejected"]
    assert "clipping" in bad["verdict"]["white_box_fired"]
    assert bad["verdict"]["training_data"]["upper_status"] == "refuted"
    assert not ok["verdict"]["privacy_bug"], ok["verdict"]
    assert ok["verdict"]["training_data"]["upper_status"] == "verified"
    default = evaluate_at(bad, tmp_path / "unclipped_example")
    assert default["privacy_bug"] and default["white_box_fired"] == ["clipping"], default


# Multi-run on 4 examples (q = 1/2), one mislabeled canary, 40 runs; the scale of the released
# gradient reveals the realised batch size. Accountant (PRV, sigma = 50, T = 48): 0.24.
# Observed: bug 3.10 (batch_size/gdp, AUC 1.0), correct 0 (AUC 0.48). Two tests (~15 s each).
# The scalar product is blind to this bug and is scored alongside.
REALISED = {
    "data": {"name": "digits", "n_train": 4},
    "dp": {"noise_multiplier": 50.0, "batch_size": 2, "steps": 48},
    "canary": {"kind": "input", "count": 1, "candidates": 2, "n_references": 4},
    "attack": {"scores": ["batch_size", "scalar"]},
    "audit": {"mode": "multi_run", "runs": 40, "methods": ["gdp", "clopper_pearson"]},
    "progress": False,
}


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["realised_batch_size", "none"])
def test_realised_batch_size_is_flagged_by_the_batch_size_score(tmp_path, bug):
    # judged at the bounds' own 5% (40 runs cannot reach 1e-6; at the default level the bug
    # is a warning, the correct optimizer neither)
    audit = {**REALISED["audit"], "refutation_level": 0.05}
    res = run_audit(output_dir=tmp_path,
                    **{**REALISED, "dp": {**REALISED["dp"], "bug": bug}, "audit": audit})
    assert res["theory"]["claimed_epsilon"] == pytest.approx(0.239, abs=0.01)
    assert res["verdict"]["privacy_bug"] == (bug != "none"), res["verdict"]
    default = evaluate_at(res, tmp_path)
    # run 0's white-box records see the divisor change with the batch (normalisation,
    # deterministic): a PRIVACY BUG at the default level, where the scores only warn
    assert default["privacy_bug"] == (bug != "none"), default
    assert default["training_data"]["upper_status"] == (
        "refuted" if bug != "none" else "verified")
    if bug != "none":
        assert res["verdict"]["best_attack"] == "batch_size"
        assert res["claim"]["batch_size"]["rejected"]
        assert "normalisation" in default["white_box_fired"], default


def test_crafted_inputs_use_blank_features_and_leave_data_weights_untouched():
    from dpaudit.canaries import crafted_inputs
    from dpaudit.data import load_dataset
    from dpaudit.gradients import per_sample_clipped_grads

    train, _, info = load_dataset("digits", seed=0)
    x = train.tensors[0]
    cand = crafted_inputs(x, 10, num=30, value=100.0)
    dead = info.extra["zero_features"]  # [0, 32, 39]: blank in every training image
    assert sorted(set(cand.source.tolist())) == dead
    flat = cand.inputs.reshape(30, -1)
    assert torch.equal((flat != 0).sum(1), torch.ones(30, dtype=torch.long))
    assert torch.equal(flat.sum(1), torch.full((30,), 100.0))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    torch.nn.init.zeros_(model[1].weight)  # uniform softmax: ||p - e_y|| = sqrt(0.9) exactly
    torch.nn.init.zeros_(model[1].bias)
    loss = torch.nn.functional.cross_entropy
    g = per_sample_clipped_grads(model, cand.inputs[:1], cand.targets[:1], loss, None)
    w = g[0, :640].reshape(10, 64)  # weight gradient x_j (p - e_y): only column j is non-zero
    j = int(cand.source[0])
    assert float(w[:, j].norm()) == pytest.approx(100.0 * 0.9**0.5, rel=1e-5)
    assert w[:, [k for k in range(64) if k != j]].abs().max() == 0
    with pytest.raises(ValueError, match="num"):
        crafted_inputs(x, 10, num=641)
