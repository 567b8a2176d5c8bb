"""Input canaries folded into the training batch (dpaudit.capture.fold) on real Opacus runs.

Folding leaves training unchanged bit for bit (final parameters and
accountant equal to a run without the hook, for mean and sum reductions, virtual steps, manual
gradient accumulation and empty Poisson batches), and the folded canary / reference gradients
equal the separate pass. Plus the fallbacks and the errors that name ``input_pass``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from capture_support import digits_flat, flat_params, logreg, private_run
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader

from dpaudit.attacks import StepScore
from dpaudit.capture import AuditHook, InputCanaries
from dpaudit.capture.fold import BatchFold
from dpaudit.gradients import per_sample_clipped_grads
from dpaudit.models import build_model

DATA, _ = digits_flat(n_train=300)
X, Y = DATA.tensors
NF = 64


class GradRecorder(StepScore):
    """Stores each step's canary and reference gradients; returns <g*, g_t>."""

    name = "grads"
    requires_reference_grads = True

    def __init__(self):
        self.grads, self.refs = [], []

    def step(self, canary_grads, released, ctx):
        self.grads.append(canary_grads.clone())
        self.refs.append(ctx.reference_grads.clone())
        return canary_grads @ released


def _same_params(a: nn.Module, b: nn.Module, atol: float) -> None:
    torch.testing.assert_close(flat_params(a), flat_params(b), atol=atol, rtol=0)


def _audited(input_pass: str, rec: GradRecorder | None = None, **run_kw):
    def hook_fn(opt, model):
        return AuditHook(
            opt,
            model,
            [InputCanaries(X[:5], Y[:5]), InputCanaries(X[5:8], Y[5:8])],
            scores=(rec or GradRecorder(),),
            reference=(X[8:12], Y[8:12]),
            input_pass=input_pass,
            keep_per_step=True,
        )

    return private_run(DATA, run_kw.pop("model_fn", logreg(NF)), hook_fn, **run_kw)


@pytest.mark.parametrize(
    "kw",
    [
        {"loss_reduction": "mean"},
        {"loss_reduction": "sum", "lr": 0.002},
        {"physical_batch": 16, "epochs": 2},
        {"model_fn": lambda: build_model("mlp", (NF,), 10, width=12), "optimizer": "adam"},
    ],
    ids=["mean", "sum", "virtual-steps", "mlp-adam"],
)
def test_folding_leaves_training_unchanged_and_equals_separate_pass(kw):
    """Same seed: final parameters and epsilon as without the hook; canary and reference
    gradients at every step equal the separate pass."""
    plain_kw = {k: v for k, v in kw.items()}
    model_fn = plain_kw.pop("model_fn", logreg(NF))
    plain = private_run(DATA, model_fn, None, **plain_kw)
    folded_rec, separate_rec = GradRecorder(), GradRecorder()
    folded = _audited("batch", folded_rec, **dict(kw))
    separate = _audited("separate", separate_rec, **dict(kw))
    assert folded.hook.steps == separate.hook.steps == len(folded_rec.grads) > 3
    assert folded.hook.folded_steps == folded.hook.steps and separate.hook.folded_steps == 0
    assert torch.equal(flat_params(folded.model), flat_params(plain.model))  # bit for bit
    assert folded.engine.get_epsilon(1e-5) == plain.engine.get_epsilon(1e-5)
    for a, b in zip(folded_rec.grads, separate_rec.grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    for a, b in zip(folded_rec.refs, separate_rec.refs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert folded_rec.grads[0].shape == (8, sum(p.numel() for p in model_fn().parameters()))


def test_auto_does_not_fold_a_logical_batch_batch_memory_manager_splits():
    """Under BatchMemoryManager with logical batches of several physical ones, "auto" leaves
    the physical batches as the user capped them: every step takes the separate pass, training
    is unchanged bit for bit and the canaries' gradients are the separate pass's."""
    kw = {"physical_batch": 16, "epochs": 2}
    plain = private_run(DATA, logreg(NF), None, **kw)
    auto_rec, separate_rec = GradRecorder(), GradRecorder()
    auto = _audited("auto", auto_rec, **kw)
    separate = _audited("separate", separate_rec, **kw)
    assert auto.hook.folded_steps == 0 and auto.hook.steps == separate.hook.steps > 3
    assert torch.equal(flat_params(auto.model), flat_params(plain.model))
    for a, b in zip(auto_rec.grads, separate_rec.grads, strict=True):
        assert torch.equal(a, b)
    # one physical batch per logical one (no step skipped): "auto" folds as before, from the
    # step after its probe (the first forward runs as it is, watched)
    whole = _audited("auto", GradRecorder(), physical_batch=512, epochs=1)
    assert whole.hook.folded_steps == whole.hook.steps - 1 >= 3


def test_empty_poisson_batches_are_folded():
    """Batches of zero examples still carry the canaries and train exactly as without them."""
    data, _ = digits_flat(n_train=40)
    rec = GradRecorder()

    def hook_fn(opt, model):
        return AuditHook(
            opt,
            model,
            InputCanaries(X[:3], Y[:3]),
            scores=(rec,),
            reference=(X[:2], Y[:2]),
            input_pass="batch",
        )

    folded = private_run(data, logreg(NF), hook_fn, batch_size=1, sigma=0.5)
    plain = private_run(data, logreg(NF), None, batch_size=1, sigma=0.5)
    assert folded.n_empty > 0 and folded.hook.steps == 40
    torch.testing.assert_close(
        flat_params(folded.model), flat_params(plain.model), atol=1e-6, rtol=0
    )
    assert all(torch.isfinite(g).all() for g in rec.grads)


def _accumulating_run(input_pass: str | None, microbatches: int = 2, seed: int = 0):
    """Manual gradient accumulation: ``microbatches`` forward/backward per optimizer step, so
    ``p.grad_sample`` is a list when the optimizer clips (Opacus allows this only without
    Poisson sampling)."""
    torch.manual_seed(seed)
    model = build_model("logreg", (NF,), 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(DATA, batch_size=60, generator=torch.Generator().manual_seed(seed))
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private(
        module=model,
        optimizer=opt,
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        noise_generator=torch.Generator().manual_seed(seed + 1),
        poisson_sampling=False,
    )
    rec = GradRecorder()
    hook = None
    if input_pass is not None:
        hook = AuditHook(
            opt,
            model,
            InputCanaries(X[:4], Y[:4]),
            scores=(rec,),
            reference=(X[4:6], Y[4:6]),
            input_pass=input_pass,
        ).attach()
    for xb, yb in loader:
        opt.zero_grad()
        for part_x, part_y in zip(xb.chunk(microbatches), yb.chunk(microbatches), strict=True):
            nn.functional.cross_entropy(model(part_x), part_y).backward()
        opt.step()
    if hook is not None:
        hook.detach()
    return model, rec


def test_gradient_accumulation_over_microbatches():
    plain, _ = _accumulating_run(None)
    folded, rec_f = _accumulating_run("batch")
    _, rec_s = _accumulating_run("separate")
    _same_params(folded, plain, atol=1e-5)
    assert len(rec_f.grads) == len(rec_s.grads) > 2
    for a, b in zip(rec_f.grads, rec_s.grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_per_sample_pass_during_training_is_not_folded():
    """A ``per_sample_clipped_grads`` call on the private model inside the loop (e.g. a user's
    own probe) neither gets canaries appended nor disturbs the fold."""
    probes = []

    def probe(i, xb):
        if i % 2 == 0:
            probes.append(
                per_sample_clipped_grads(
                    model_ref[0], X[:3], Y[:3], nn.functional.cross_entropy, 1.0
                )
            )
        return xb

    model_ref = []

    def hook_fn(opt, model):
        model_ref.append(model)
        return AuditHook(opt, model, InputCanaries(X[:5], Y[:5]), input_pass="batch")

    run = private_run(DATA, logreg(NF), hook_fn, on_batch=probe)
    plain = private_run(DATA, logreg(NF), None)
    assert probes and all(p.shape == (3, NF * 10 + 10) for p in probes)
    _same_params(run.model, plain.model, atol=1e-5)


class _ScaledLogreg(nn.Module):
    """A model whose forward takes a non-tensor keyword argument or returns a tuple."""

    def __init__(self, as_tuple: bool = False):
        super().__init__()
        self.fc = nn.Linear(NF, 10)
        self.as_tuple = as_tuple

    def forward(self, x, scale: float = 1.0):
        out = self.fc(x) * scale
        return (out, out.detach()) if self.as_tuple else out


def _custom_loop(as_tuple: bool, input_pass: str, call, steps: int = 3) -> GradRecorder:
    torch.manual_seed(0)
    model_module = _ScaledLogreg(as_tuple)
    opt = torch.optim.SGD(model_module.parameters(), lr=0.1)
    loader = DataLoader(DATA, batch_size=64, generator=torch.Generator().manual_seed(0))
    model, opt, loader = PrivacyEngine().make_private(
        module=model_module,
        optimizer=opt,
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    rec = GradRecorder()
    rec.hook = AuditHook(
        opt,
        model,
        InputCanaries(X[:4], Y[:4]),
        scores=(rec,),
        reference=(X[:2], Y[:2]),
        input_pass=input_pass,
    )
    with rec.hook:
        for i, (xb, yb) in enumerate(loader):
            if i == steps:
                break
            opt.zero_grad()
            nn.functional.cross_entropy(call(model, xb, opt), yb).backward()
            opt.step()
    return rec


def test_non_tensor_keywords_are_replayed_in_every_pass(monkeypatch):
    """``model(x, scale=2.0)``: the fold passes ``scale`` with the batch, the separate pass
    replays it; both give the same canary gradients, which differ from ``scale=1.0`` ones (the
    keyword reached the canaries). ``"auto"`` watches the first forward, then folds (the probe
    is told the rows are independent: whether this CPU's kernels are is not this test's
    business)."""
    monkeypatch.setattr(BatchFold, "_rows_independent", lambda self, *a: True)
    recs = {
        p: _custom_loop(False, p, lambda m, x, opt: m(x, scale=2.0))
        for p in ("auto", "separate", "batch")
    }
    unscaled = _custom_loop(False, "separate", lambda m, x, opt: m(x))
    assert [recs[p].hook.folded_steps for p in ("auto", "separate", "batch")] == [2, 0, 3]
    for a, b, c in zip(recs["batch"].grads, recs["separate"].grads, recs["auto"].grads,
                       strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(c, b, rtol=1e-4, atol=1e-6)
    assert (recs["separate"].grads[0] - unscaled.grads[0]).abs().max() > 1e-3


def test_fold_errors_name_input_pass():
    with pytest.raises(RuntimeError, match=r"one tensor with the batch.*input_pass='separate'"):
        _custom_loop(True, "batch", lambda m, x, opt: m(x)[0])
    with pytest.raises(ValueError, match=r"model returning one tensor with the 4 examples"):
        _custom_loop(True, "auto", lambda m, x, opt: m(x)[0])  # first step: separate pass

    def redo(m, x, opt):  # a first forward/backward whose per-sample gradients are discarded
        m(x).sum().backward()
        opt.zero_grad()
        return m(x)

    with pytest.raises(RuntimeError, match="several grad-enabled training forwards"):
        _custom_loop(False, "auto", redo)
    run = private_run(DATA, logreg(NF), None)
    with pytest.raises(ValueError, match="input_pass must be one of"):
        AuditHook(run.optimizer, run.model, InputCanaries(X[:2], Y[:2]), input_pass="fold")
    with pytest.raises(ValueError, match="input_pass='batch' needs the batch-first Opacus"):
        AuditHook(run.optimizer, run.model._module, InputCanaries(X[:2], Y[:2]), input_pass="batch")


def test_detach_restores_forward_hooks_and_clip():
    run = private_run(DATA, logreg(NF), None)
    opt, model = run.optimizer, run.model
    hooks_before = (dict(model._forward_pre_hooks), dict(model._forward_hooks))
    with AuditHook(opt, model, InputCanaries(X[:2], Y[:2])):
        assert "clip_and_accumulate" in opt.__dict__
        # the fold's pre-hook and the forward watcher's (forward_watch.ForwardWatcher)
        assert len(model._forward_pre_hooks) == len(hooks_before[0]) + 2
    assert "clip_and_accumulate" not in opt.__dict__
    assert (dict(model._forward_pre_hooks), dict(model._forward_hooks)) == hooks_before
    assert np.isfinite(flat_params(model).numpy()).all()


def test_redone_forward_trains_with_the_separate_pass():
    """The loop above is valid Opacus; input_pass='separate' audits it."""

    def redo(m, x, opt):
        m(x).sum().backward()
        opt.zero_grad()
        return m(x)

    assert len(_custom_loop(False, "separate", redo).grads) == 3


def test_folded_rows_in_a_coordinate_view_equal_the_gathered_full_rows():
    """With ``coordinates=`` the fold gathers and clips only the view's K x |view| entries (in
    the view's order, across parameters); they equal the full folded rows gathered there, and
    the separate pass."""
    coords = torch.randperm(NF * 10 + 10, generator=torch.Generator().manual_seed(3))[:40]
    coords = torch.cat([coords, torch.tensor([NF * 10 + 2, 5])])  # a bias entry, unsorted

    def hook_fn(rec, input_pass, view):
        return lambda opt, model: AuditHook(
            opt, model, InputCanaries(X[:5], Y[:5]), scores=(rec,), reference=(X[8:11], Y[8:11]),
            input_pass=input_pass, coordinates=coords if view else None,
        )

    recs = {key: GradRecorder() for key in ("batch-view", "separate-view", "batch-full")}
    for key, rec in recs.items():
        input_pass, view = key.split("-")
        private_run(DATA, logreg(NF), hook_fn(rec, input_pass, view == "view"))
    assert len(recs["batch-view"].grads) > 3
    for a, b, full in zip(recs["batch-view"].grads, recs["separate-view"].grads,
                          recs["batch-full"].grads, strict=True):
        assert a.shape == (5, len(coords))
        torch.testing.assert_close(a, full[:, coords], rtol=0, atol=0)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    for a, full in zip(recs["batch-view"].refs, recs["batch-full"].refs, strict=True):
        torch.testing.assert_close(a, full[:, coords], rtol=0, atol=0)


class _Keeper(StepScore):
    """Keeps the canary gradients it is handed without copying them (as a trace does)."""

    name = "keeper"

    def __init__(self):
        self.kept, self.copies = [], []

    def step(self, canary_grads, released, ctx):
        self.kept.append(canary_grads)
        self.copies.append(canary_grads.clone())
        return canary_grads @ released


def test_kept_canary_gradients_are_not_overwritten_by_later_steps():
    """The fold reuses its (K, d) clip buffer only while nothing else holds it: a score that
    keeps the tensors it was handed still reads every step's own values afterwards."""
    keeper = _Keeper()
    run = private_run(
        DATA, logreg(NF),
        lambda opt, model: AuditHook(
            opt, model, InputCanaries(X[:5], Y[:5]), scores=(keeper,), input_pass="batch"
        ),
    )
    assert run.hook.folded_steps == len(keeper.kept) > 3
    for kept, copy in zip(keeper.kept, keeper.copies, strict=True):
        assert torch.equal(kept, copy)
    assert not torch.equal(keeper.copies[0], keeper.copies[1])
