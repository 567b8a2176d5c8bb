"""Tests of dpaudit.capture.AuditHook on real (small, CPU) Opacus DP-SGD runs.

Exact checks (float tolerances only): the released gradient against parameter deltas (sign),
input-canary gradients against an independent autograd loop at theta_t, gradient-canary
insertion against a paired run without insertion, streamed scores against manual inner
products, the accountant, detach, hooks/functorch modes, momentum/Adam, empty batches, errors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from capture_support import digits_flat, dirac_coords, flat_params, logreg, private_run
from opacus.optimizers import DPOptimizer
from torch import nn

from dpaudit.attacks import ScalarProduct, StepContext, StepScore, score_trace
from dpaudit.capture import AuditHook, GradientCanaries, InputCanaries, Trace, load_trace
from dpaudit.models import build_model

DATA, ZERO = digits_flat(pad=8, n_train=400)  # 72 features, 400 examples
NF = 72
D = NF * 10 + 10


class Recorder(StepScore):
    """Test score: stores every step's canary gradients and context; returns a fixed stat."""

    name = "recorder"

    def __init__(self, aggregate: str = "sum", needs_ref: bool = False):
        self.aggregate = aggregate
        self.requires_reference_grads = needs_ref
        self.grads: list[torch.Tensor] = []
        self.ctx: list[StepContext] = []

    def step(self, canary_grads, released, ctx):
        self.grads.append(canary_grads.clone())
        self.ctx.append(ctx)
        return canary_grads @ released + ctx.step  # differs from ScalarProduct per step


def _inputs(k: int = 5):
    x, y = DATA.tensors
    return InputCanaries(x[:k], y[:k])


def test_released_gradient_equals_parameter_delta(tmp_path):
    """Plain SGD: hook's released gradient == (theta_t - theta_{t+1}) / eta (sign included)."""
    lr = 0.5
    thetas = []
    trace = Trace(tmp_path / "tr", chunk_steps=3)

    def hook_fn(opt, model):
        thetas.append(flat_params(model))
        return AuditHook(opt, model, _inputs(), trace=trace)

    run = private_run(
        DATA, logreg(NF), hook_fn, lr=lr, after_step=lambda m, o: thetas.append(flat_params(m))
    )
    tr = load_trace(tmp_path / "tr")
    theta = torch.stack(thetas).numpy()
    delta = (theta[:-1] - theta[1:]) / lr
    assert run.hook.steps == run.n_batches == tr["meta"]["steps"] == len(tr["released"])
    assert tr["meta"]["chunks"] == -(-run.hook.steps // 3)  # ceil(T / chunk_steps)
    np.testing.assert_allclose(tr["released"], delta, rtol=0, atol=2e-5)
    assert tr["meta"]["divisor"] == run.optimizer.expected_batch_size


def test_input_canary_grads_are_clipped_grads_at_current_theta():
    """Canary gradients == per-example autograd at theta_t (before the update), flat-clipped
    over all parameters, restricted to the selected module."""
    nf = 64
    data, _ = digits_flat(n_train=300)
    thetas = []
    rec = Recorder()
    x, y = data.tensors
    canaries = InputCanaries(x[10:14], y[10:14])

    def hook_fn(opt, model):
        thetas.append(flat_params(model))
        return AuditHook(opt, model, canaries, scores=(rec,), params=["3"])

    def mlp():
        return build_model("mlp", (nf,), 10, width=12)

    clip = 0.05  # small enough that every canary gradient is clipped
    run = private_run(
        data, mlp, hook_fn, clip=clip, after_step=lambda m, o: thetas.append(flat_params(m))
    )
    assert run.hook.steps == len(rec.grads) > 3
    ref = mlp()
    names = [n for n, _ in ref.named_parameters()]
    for t in (0, run.hook.steps // 2, run.hook.steps - 1):
        torch.nn.utils.vector_to_parameters(thetas[t], ref.parameters())
        expected = []
        for i in range(4):
            ref.zero_grad()
            nn.functional.cross_entropy(ref(x[10 + i : 11 + i]), y[10 + i : 11 + i]).backward()
            g = {n: p.grad.reshape(-1).clone() for n, p in ref.named_parameters()}
            norm = torch.cat(list(g.values())).norm()
            factor = min(1.0, clip / (float(norm) + 1e-6))
            expected.append(torch.cat([g[n] for n in names if n.startswith("3.")]) * factor)
        torch.testing.assert_close(rec.grads[t], torch.stack(expected), rtol=1e-4, atol=1e-6)
    assert rec.grads[0].shape == (4, 12 * 10 + 10)
    assert abs(float(rec.grads[0].norm(dim=1).max()) - clip) < clip  # sanity: some mass


def test_gradient_canaries_inserted_before_noise_with_recorded_draws(tmp_path):
    """Paired runs (same seed): with vs without insertion, released gradients differ by exactly
    sum_k b_kt g*_k / B_exp at every step, where b_kt are the recorded Bernoulli draws (the
    canaries sit on zero-gradient coordinates, so the data part is unchanged)."""
    coords = dirac_coords(ZERO, NF)[:40]
    clip = 1.5
    q = 0.3

    def run_with(policy, sub):
        can = GradientCanaries.dirac(coords, clip, D, policy=policy, inclusion_prob=q, seed=7)
        return private_run(
            DATA,
            logreg(NF),
            lambda o, m: AuditHook(o, m, can, trace=Trace(tmp_path / sub)),
            clip=clip,
        )

    a = run_with("bernoulli", "in")
    b = run_with("never", "out")
    inc = a.hook.inclusions()
    assert inc.shape == (40, a.hook.steps) and not b.hook.inclusions().any()
    diff = load_trace(tmp_path / "in")["released"] - load_trace(tmp_path / "out")["released"]
    bexp = a.optimizer.expected_batch_size
    expected = np.zeros_like(diff)
    expected[:, coords] = inc.T * clip / bexp
    np.testing.assert_allclose(diff, expected, atol=1e-5)
    # Bernoulli frequency: K*T draws, tolerance 4 binomial standard errors.
    n = inc.size
    assert abs(inc.mean() - q) < 4 * np.sqrt(q * (1 - q) / n)


def test_streamed_scores_match_manual_and_offline_replay(tmp_path):
    """Scores == sums / maxima of <g*_t, g_t> from the full trace; a projection trace onto the
    canary vectors equals the per-step scalar scores; attacks.score_trace replays the same."""
    x, y = DATA.tensors
    grad_can = GradientCanaries.random_directions(
        3, D, 0.8, seed=3, policy=["every_step", "never", "bernoulli"], inclusion_prob=0.5
    )
    mixed = [InputCanaries(x[:4], y[:4]), grad_can]
    rec = Recorder(aggregate="max")
    full = Trace(tmp_path / "full", include_canaries=True, chunk_steps=4)
    run = private_run(
        DATA,
        logreg(NF),
        lambda o, m: AuditHook(
            o, m, mixed, scores=(ScalarProduct(), rec), keep_per_step=True, trace=full
        ),
    )
    hook = run.hook
    tr = load_trace(tmp_path / "full")
    manual = np.einsum("tkd,td->kt", tr["canaries"], tr["released"])
    per = hook.per_step()
    assert per["scalar"].shape == (7, hook.steps)
    np.testing.assert_allclose(per["scalar"], manual, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(hook.scores()["scalar"], manual.sum(1), rtol=1e-4, atol=1e-6)
    steps = np.arange(hook.steps)
    np.testing.assert_allclose(hook.scores()["recorder"], (manual + steps).max(1), rtol=1e-4)
    # gradient canaries are the fixed vectors at every step
    np.testing.assert_allclose(
        tr["canaries"][:, 4:], np.broadcast_to(grad_can.vectors.numpy(), (hook.steps, 3, D)), atol=0
    )
    # offline replay through the attacks module's score_trace gives the live numbers
    ctx = StepContext(0, 1.0, 1.0, float(run.optimizer.expected_batch_size), hook.sample_rate)
    offline = score_trace(
        ScalarProduct(), torch.from_numpy(tr["canaries"]), torch.from_numpy(tr["released"]), ctx
    )
    np.testing.assert_allclose(offline.numpy(), hook.scores()["scalar"], rtol=1e-4, atol=1e-6)


def test_projection_trace_equals_scalar_scores(tmp_path):
    coords = dirac_coords(ZERO, NF)[:6]
    can = GradientCanaries.dirac(coords, 1.0, D)
    run = private_run(
        DATA,
        logreg(NF),
        lambda o, m: AuditHook(
            o,
            m,
            can,
            keep_per_step=True,
            trace=Trace(tmp_path / "p", basis=can.vectors, chunk_steps=5),
        ),
    )
    tr = load_trace(tmp_path / "p")
    assert tr["released"].shape == (run.hook.steps, 6) and tr["meta"]["projected"]
    np.testing.assert_allclose(tr["released"].T, run.hook.per_step()["scalar"], rtol=1e-5)


def test_accountant_chained_not_replaced():
    """get_epsilon after an audited run == the same run without the hook; history length T."""
    can = GradientCanaries.dirac(
        dirac_coords(ZERO, NF)[:5], 1.0, D, policy="bernoulli", inclusion_prob=0.5, seed=1
    )
    audited = private_run(
        DATA, logreg(NF), lambda o, m: AuditHook(o, m, [_inputs(), can]), epochs=2
    )
    plain = private_run(DATA, logreg(NF), None, epochs=2)
    assert audited.hook.steps == plain.n_batches
    assert len(audited.engine.accountant.history) == len(plain.engine.accountant.history) > 0
    assert audited.engine.get_epsilon(1e-5) == plain.engine.get_epsilon(1e-5)


def test_detach_restores_optimizer_exactly():
    run = private_run(DATA, logreg(NF), None)
    opt = run.optimizer
    before = opt.step_hook
    can = GradientCanaries.dirac([0], 1.0, D)
    hook = AuditHook(opt, run.model, can)
    with hook:
        assert opt.step_hook is not before and "add_noise" in opt.__dict__
    assert opt.step_hook is before and "add_noise" not in opt.__dict__
    assert not hasattr(opt, "_dpaudit_hook")
    assert hook.sample_rate == pytest.approx(1 / len(run.loader))


def test_expected_batch_size_in_context_mean_and_sum():
    for reduction, expected in (("mean", None), ("sum", 1.0)):
        rec = Recorder()
        run = private_run(
            DATA,
            logreg(NF),
            lambda o, m, r=rec: AuditHook(o, m, _inputs(2), scores=(r,)),
            loss_reduction=reduction,
            lr=0.002,
        )
        want = run.optimizer.expected_batch_size if expected is None else expected
        assert {c.divisor for c in rec.ctx} == {float(want)}
        assert {c.expected_batch_size for c in rec.ctx} == {float(want)}  # the former name
        assert [c.step for c in rec.ctx] == list(range(run.hook.steps))
        assert rec.ctx[0].noise_multiplier == 1.0 and rec.ctx[0].max_grad_norm == 1.0


def test_reference_grads_passed_to_scores():
    x, y = DATA.tensors
    rec = Recorder(needs_ref=True)
    run = private_run(
        DATA,
        logreg(NF),
        lambda o, m: AuditHook(
            o, m, InputCanaries(x[:3], y[:3]), scores=(rec,), reference=(x[:3], y[:3])
        ),
    )
    assert run.hook.steps > 0
    for c, g in zip(rec.ctx, rec.grads, strict=True):
        torch.testing.assert_close(c.reference_grads, g)


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
def test_released_gradient_is_what_the_base_optimizer_consumes(optimizer, tmp_path):
    """Momentum / Adam: the recorded g_t is p.grad as the base optimizer's step sees it."""
    seen = []

    def hook_fn(opt, model):
        base_step = opt.original_optimizer.step

        def spy(*a, **k):
            seen.append(torch.cat([p.grad.reshape(-1).clone() for p in opt.params]))
            return base_step(*a, **k)

        opt.original_optimizer.step = spy
        return AuditHook(opt, model, _inputs(2), trace=Trace(tmp_path / optimizer))

    run = private_run(DATA, logreg(NF), hook_fn, optimizer=optimizer, lr=0.01)
    tr = load_trace(tmp_path / optimizer)
    assert len(seen) == run.hook.steps
    np.testing.assert_allclose(tr["released"], torch.stack(seen).numpy(), atol=0)


def test_hooks_and_functorch_modes_give_the_same_records():
    can = [_inputs(3), GradientCanaries.dirac(dirac_coords(ZERO, NF)[:3], 1.0, D)]
    runs = [
        private_run(
            DATA,
            logreg(NF),
            lambda o, m: AuditHook(o, m, can, keep_per_step=True),
            grad_sample_mode=mode,
        )
        for mode in ("hooks", "functorch")
    ]
    a, b = (r.hook.per_step()["scalar"] for r in runs)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_poisson_empty_batches():
    """Tiny sample rate: empty logical batches are real steps (pure noise) and are recorded."""
    data, _ = digits_flat(n_train=40)
    coords = [c * 64 for c in range(10)]  # weight[c, 0]: pixel 0 is blank in digits
    can = GradientCanaries.dirac(coords, 1.0, 650)
    run = private_run(
        data,
        logreg(64),
        lambda o, m: AuditHook(o, m, [InputCanaries(*data.tensors), can]),
        batch_size=1,
        sigma=0.5,
    )
    assert run.n_empty > 0
    assert run.hook.steps == run.n_batches == 40
    assert np.isfinite(run.hook.scores()["scalar"]).all()


def test_attach_twice_and_results_before_steps():
    run = private_run(DATA, logreg(NF), None)
    hook = AuditHook(run.optimizer, run.model, _inputs(2))
    with pytest.raises(RuntimeError, match="no optimizer step"):
        hook.scores()
    with hook:
        with pytest.raises(RuntimeError, match="already attached"):
            hook.attach()
        with pytest.raises(RuntimeError, match="another AuditHook"):
            AuditHook(run.optimizer, run.model, _inputs(2)).attach()
    with pytest.raises(RuntimeError, match="keep_per_step"):
        hook.per_step()


def test_bad_inputs():
    run = private_run(DATA, logreg(NF), None)
    opt, model = run.optimizer, run.model
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = DATA.tensors
    with pytest.raises(ValueError, match="DPOptimizer"):
        AuditHook(plain, model, _inputs())
    assert not isinstance(plain, DPOptimizer)
    with pytest.raises(ValueError, match="params"):
        AuditHook(opt, model, _inputs(), params=["no_such_layer"])
    with pytest.raises(ValueError, match="d = 730"):
        AuditHook(opt, model, GradientCanaries(torch.zeros(2, 5)))
    with pytest.raises(ValueError, match="norm <= C"):
        AuditHook(opt, model, GradientCanaries.dirac([0, 1], 1.01, D))
    with pytest.raises(ValueError, match="floating point"):
        GradientCanaries(torch.zeros(2, D, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"\(K, d\)"):
        GradientCanaries(torch.zeros(D))
    with pytest.raises(ValueError, match="policy"):
        GradientCanaries(torch.zeros(1, D), policy="sometimes")
    with pytest.raises(ValueError, match="seed"):
        GradientCanaries(torch.zeros(1, D), policy="bernoulli", inclusion_prob=0.1)
    with pytest.raises(ValueError, match="inclusion_prob"):
        GradientCanaries(torch.zeros(1, D), policy="bernoulli", inclusion_prob=0.0, seed=1)
    with pytest.raises(ValueError, match="targets"):
        InputCanaries(x[:3], y[:2])
    with pytest.raises(ValueError, match="reference"):
        AuditHook(opt, model, _inputs(), scores=(Recorder(needs_ref=True),))
    with pytest.raises(ValueError, match="distinct names"):
        AuditHook(opt, model, _inputs(), scores=(ScalarProduct(), ScalarProduct()))
    with pytest.raises(ValueError, match="d = 730"):
        AuditHook(opt, model, _inputs(), trace=Trace("unused", basis=torch.zeros(3, 5)))
    with pytest.raises(ValueError, match="basis"):
        AuditHook(opt, model, _inputs(), trace=Trace("unused", basis=torch.zeros(3))).attach()


def test_non_finite_gradient_names_the_step():
    def poison(i, xb):
        if i == 2:
            xb = xb.clone()
            xb[:, 0] = float("nan")
        return xb

    with pytest.raises(ValueError, match="optimizer step 2"):
        private_run(DATA, logreg(NF), lambda o, m: AuditHook(o, m, _inputs(2)), on_batch=poison)


def test_parameter_selection_by_param_and_module_names():
    run = private_run(digits_flat()[0], lambda: build_model("mlp", (64,), 10, width=8), None)
    for sel, names in (
        (None, ["1.weight", "1.bias", "3.weight", "3.bias"]),
        (["3"], ["3.weight", "3.bias"]),
        (["3.bias", "_module.1.weight"], ["1.weight", "3.bias"]),
    ):
        hook = AuditHook(
            run.optimizer,
            run.model,
            InputCanaries(torch.zeros(1, 64), torch.zeros(1).long()),
            params=sel,
        )
        assert hook.param_names == names
        assert hook.dim == sum(dict(run.model._module.named_parameters())[n].numel() for n in names)


def test_backward_hook_warning_is_silenced_only_while_attached():
    # torch's "Full backward hook is firing ..." (Opacus' hooks on a first layer) repeated in
    # every user's loop: silenced while an AuditHook is attached, shown again after
    import warnings

    coords = dirac_coords(ZERO, NF)[:4]
    can = GradientCanaries.dirac(coords, 1.0, D, policy="every_step", seed=1)
    msg = "Full backward hook is firing when gradients are computed with respect to x"
    run = private_run(DATA, logreg(NF), lambda o, m: AuditHook(o, m, can), epochs=1)
    hook = AuditHook(run.optimizer, run.model, can)
    n_filters = len(warnings.filters)
    with hook, warnings.catch_warnings(record=True) as inside:
        warnings.warn(msg, UserWarning, stacklevel=1)
    assert not [w for w in inside if "Full backward hook" in str(w.message)]
    assert len(warnings.filters) == n_filters
    with warnings.catch_warnings(record=True) as after:
        warnings.simplefilter("always")
        warnings.warn(msg, UserWarning, stacklevel=1)
    assert [w for w in after if "Full backward hook" in str(w.message)]


def test_the_rate_is_read_from_the_dp_loader_when_a_wrapped_step_hook_hides_it():
    """A step hook wrapped by the user's code (here the zoo's accountant_steps bug) hides the
    closure Opacus' hook keeps q in: the hook then reads the DP loader's own sample_rate, and
    without a loader refuses with an error naming ``sample_rate``."""
    from opacus import PrivacyEngine

    from dpaudit.bugs import plant_bug

    data, _ = digits_flat()
    torch.manual_seed(0)
    model = nn.Linear(64, 10)
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=torch.utils.data.DataLoader(data, batch_size=64), noise_multiplier=1.0,
        max_grad_norm=1.0)
    plant_bug(opt, "accountant_steps", 0.5)
    canaries = GradientCanaries(torch.eye(650)[:4])
    hook = AuditHook(opt, model, canaries=canaries, data_loader=loader)
    assert hook.sample_rate == pytest.approx(loader.sample_rate) == pytest.approx(1 / len(loader))
    hook.detach()
    with pytest.raises(ValueError, match="sample_rate must be in"):
        AuditHook(opt, model, canaries=canaries)
