"""The white-box checks in the user's own loop: ``audit_report(hook, ...)`` runs every check the
hook's records allow, by default, on 17 models over Opacus' layer families (Linear, Conv1d /
2d / 3d, GroupNorm, LayerNorm, InstanceNorm, RMSNorm, Embedding, EmbeddingBag, DPLSTM, DPGRU,
DPRNN, DPMultiheadAttention, a frozen first layer, functorch and ew modes, BatchMemoryManager):
no check refutes a correct optimizer, and a planted zoo bug of each class is a PRIVACY BUG by
the white-box statement named for its class. The fast tier plants one class per family (in
turn) and every class on two families; ``-m slow`` plants every class on every family."""

import json

import pytest
from own_loop_models import BUG_CLASSES, FAMILIES, own_loop_audit

ALL_CHECKS = {"noise_floor", "noise_scale", "noise_marginal", "noise_alignment",
              "noise_freshness", "poisson_sampling", "clipping", "bookkeeping", "normalisation",
              "sampling_by_example", "sampling_duplicates", "model_integrity",
              "noise_ignores_data", "loader_fed_training"}
CLASSES = list(BUG_CLASSES)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_correct_optimizer_every_check_runs_and_none_refutes(family):
    res = own_loop_audit(family)
    wb = res["white_box"]
    # every check runs: under BatchMemoryManager too the batch sizes are the rows each
    # (logical) step clipped, which the hook counts over the physical batches
    assert set(wb["checks"]) == ALL_CHECKS
    assert not any(c["rejected"] for c in wb["checks"].values())
    assert res["verdict"]["status"] != "privacy_bug", res["verdict"]["message"]
    assert wb["not_checked"] == []
    where = wb["checks"]["poisson_sampling"]["checked"][0]
    assert "realised batch sizes" in where, where
    assert not wb["checks"]["loader_fed_training"]["warning"]


def _assert_flagged(family: str, cls: str) -> None:
    bug, statement = BUG_CLASSES[cls]
    v = own_loop_audit(family, bug)["verdict"]
    assert v["status"] == "privacy_bug", (family, bug, v["message"])
    assert statement in v["white_box_fired"], (family, bug, v["white_box_fired"])
    assert statement.replace("_", " ") in v["message"].lower()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_planted_bug_is_flagged_in_every_family(family):
    # one class per family, in turn, so that all ten classes are planted across the families
    cls = CLASSES[list(FAMILIES).index(family) % len(CLASSES)]
    _assert_flagged(family, cls)


@pytest.mark.parametrize("family", ["linear", "attention"])
@pytest.mark.parametrize("cls", CLASSES)
def test_every_bug_class_is_flagged(family, cls):
    _assert_flagged(family, cls)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("cls", CLASSES)
def test_every_bug_class_in_every_family(family, cls):
    _assert_flagged(family, cls)


def test_the_own_loop_report_is_the_clis(tmp_path, capsys):
    # results.json carries the same white-box block and the console the same table
    res = own_loop_audit("linear", output_dir=tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["white_box"]["checks"]) == ALL_CHECKS
    assert saved["verdict"]["refutation_level"] == 1e-6
    assert saved["white_box"] == json.loads(json.dumps(res["white_box"]))
    out = capsys.readouterr().out
    assert "white-box checks of the mechanism" in out and "noise_freshness" in out
    assert (tmp_path / "white_box.png").stat().st_size > 1000


def _patch_noise(make):
    """A planted ``add_noise``: ``make(opt, std)`` gives every parameter's noise."""
    from dpaudit.bugs import _noise_per_param
    from dpaudit.capture.patching import InstancePatch

    def plant(opt):
        def add_noise():
            _noise_per_param(opt, [], make(opt, opt.noise_multiplier * opt.max_grad_norm))

        InstancePatch(opt, "add_noise", add_noise, owner="test").apply()

    return plant


def _bounded(opt, std):
    # uniform noise of the right variance: a shift of C lands outside its support
    import math

    import torch

    return [(torch.rand(p.summed_grad.shape) * 2 - 1) * std * math.sqrt(3) for p in opt.params]


def _cancelling(opt, std):
    # the largest tensor's noise starts with minus the first tensor's, coordinate by
    # coordinate: their sum there is released without noise
    import torch

    noises = [torch.randn(p.summed_grad.shape) * std for p in opt.params]
    big = max(range(1, len(noises)), key=lambda i: noises[i].numel())
    first, flat = noises[0].reshape(-1), noises[big].reshape(-1)
    n = min(first.numel(), flat.numel())
    flat[:n] = -first[:n]
    return noises


@pytest.mark.parametrize(("make", "statement"), [(_bounded, "noise_marginal"),
                                                 (_cancelling, "noise_alignment")])
def test_the_classes_kept_aside_are_refuted(make, statement):
    # two bug classes that keep each tensor's noise norm right, planted in the own loop
    v = own_loop_audit("conv2d_groupnorm", planted=_patch_noise(make))["verdict"]
    assert v["status"] == "privacy_bug" and statement in v["white_box_fired"], v["message"]


# mixed precision: the forward and the loss under bfloat16 autocast (Opacus' ExpandedWeights,
# the ew family, fails under autocast without the hook)
MIXED = [f for f in FAMILIES if f != "ew"]


def _bf16(family: str, seed: int = 0, **kw) -> dict:
    import torch

    return own_loop_audit(family, seed=seed, autocast=torch.bfloat16, **kw)


@pytest.mark.parametrize("family", ["linear", "conv2d_groupnorm", "dplstm"])
def test_bfloat16_correct_training_is_consistent_and_its_excess_reported(family):
    res = _bf16(family)
    v, clip = res["verdict"], res["white_box"]["checks"]["clipping"]
    assert v["status"] == "consistent", v["message"]
    # bfloat16 per-sample gradients: Opacus' clipped contribution exceeds C by a fraction of
    # a percent, reported with the epsilon it implies (a warning), never a PRIVACY BUG
    assert clip["warning"] and not clip["rejected"]
    assert 1 + 1e-4 < clip["witness"]["ratio"] < 1.02
    assert 0 < clip["witness"]["epsilon_excess"] < 0.05
    assert any("clipping: example" in w and "implies epsilon" in w for w in v["warnings"])
    assert "Warning" in v["message"] and "the clipping reached" in v["message"]


@pytest.mark.parametrize("bug,statement", [("halved_noise", "noise_scale"),
                                           ("clip_2C", "clipping")])
def test_bfloat16_bugs_are_still_privacy_bugs(bug, statement):
    from own_loop_models import clip_at_twice_the_norm

    res = (_bf16("linear", planted=clip_at_twice_the_norm) if bug == "clip_2C"
           else _bf16("linear", bug=bug))
    v = res["verdict"]
    assert v["status"] == "privacy_bug" and statement in v["white_box_fired"], v["message"]


def test_float16_with_a_grad_scaler_is_named_when_it_overflows():
    import torch

    with pytest.raises(ValueError, match="GradScaler"):
        own_loop_audit("linear", autocast=torch.float16, grad_scaler=True)


@pytest.mark.slow
@pytest.mark.parametrize("family", MIXED)
def test_bfloat16_every_family_consistent(family):
    for seed in range(3):
        v = _bf16(family, seed)["verdict"]
        assert v["status"] == "consistent", (family, seed, v["message"])


# Opacus' per-layer and adaptive clipping in the own loop: correct training consistent (the
# adaptive accounting's warning aside), a bug of each class adapted to the set-up refuted by
# its own statement
def _clipping_cases():
    from own_loop_models import CLIPPING_BUGS

    return [(setup, cls) for setup, bugs in CLIPPING_BUGS.items() for cls in bugs]


@pytest.mark.parametrize("setup", ["per_layer", "adaptive"])
@pytest.mark.parametrize("family", ["linear", "conv2d_groupnorm", "batch_memory_manager"])
def test_per_layer_and_adaptive_clipping_correct_training_is_consistent(setup, family):
    res = own_loop_audit(family, clipping=setup)
    v, checks = res["verdict"], res["white_box"]["checks"]
    assert v["status"] == "consistent", v["message"]
    assert res["white_box"]["not_checked"] == []
    expected = ALL_CHECKS | ({"count_noise", "adaptive_bound", "adaptive_accounting"}
                             if setup == "adaptive" else set())
    assert set(checks) == expected
    assert not any(c["rejected"] for c in checks.values())
    if setup == "adaptive":  # the count's sensitivity: reported with its epsilon, a warning
        assert v["white_box_warned"] == ["adaptive_accounting"], v["white_box_warned"]
        assert checks["adaptive_accounting"]["witness"]["epsilon_excess"] > 0
    else:
        assert checks["clipping"]["details"]["max_group_ratio"] <= 1 + 1e-4


@pytest.mark.parametrize("setup,cls", _clipping_cases())
def test_per_layer_and_adaptive_clipping_bugs_are_flagged(setup, cls):
    from own_loop_models import CLIPPING_BUGS

    bug, statement = CLIPPING_BUGS[setup][cls]
    kw = {"bug": bug} if isinstance(bug, str) else {"planted": bug}
    v = own_loop_audit("linear", clipping=setup, **kw)["verdict"]
    assert v["status"] == "privacy_bug" and statement in v["white_box_fired"], v["message"]


@pytest.mark.slow
@pytest.mark.parametrize("setup", ["per_layer", "adaptive"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_per_layer_and_adaptive_clipping_every_family(setup, family):
    v = own_loop_audit(family, clipping=setup)["verdict"]
    assert v["status"] == "consistent", (family, setup, v["message"])
