"""Input canaries for any model input, with training unchanged bit for bit.

Real Opacus runs (``make_private`` with Poisson sampling and the global RNG for sampling and
noise, so that any draw the hook took would shift the whole trajectory). Checked against
instruments independent of the hook:

* every input canary's gradient at every step equals a per-example autograd loop on the
  unwrapped module at the same parameters, clipped at C with Opacus' rule (token inputs
  through Embedding + DPLSTM, a DPMultiheadAttention block with a per-canary padding mask, a
  two-input ``forward(x, side)``, a forward with a non-tensor keyword);
* the final parameters equal (``torch.equal``) those of the same run without the hook, for the
  fold and the separate pass, with dropout and under bf16 autocast;
* under autocast the clipped canary gradients are float32 with norm <= C (float32 rounding);
* what cannot be replayed is refused with an error naming the argument.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from opacus import PrivacyEngine
from opacus.layers import DPLSTM, DPMultiheadAttention
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit.attacks import StepScore
from dpaudit.capture import AuditHook, InputCanaries
from dpaudit.capture.fold import MIN_FOLD_ROWS, BatchFold, random_modules

warnings.filterwarnings("ignore", module="opacus")
C = 0.5
CE = nn.functional.cross_entropy


# ---------------------------------------------------------------------------- models
class TwoInputs(nn.Module):
    """forward(x, side): two required positional inputs."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(6, 8), nn.Linear(3, 8), nn.Linear(8, 3)

    def forward(self, x, side):
        return self.head(torch.tanh(self.a(x) + self.b(side)))


class TokenLSTM(nn.Module):
    """Embedding + DPLSTM on integer tokens, last hidden state -> classes."""

    def __init__(self, vocab=20, dim=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.lstm = DPLSTM(dim, 5, batch_first=True)
        self.head = nn.Linear(5, 3)

    def forward(self, tokens):
        out, _ = self.lstm(self.emb(tokens))
        return self.head(out[:, -1])


class BagOfTokens(nn.Module):
    """EmbeddingBag (Opacus' grad sampler needs its flat-tokens + offsets form) behind a
    batch-first forward(tokens, lengths): padded (B, L) tokens, each row's first ``lengths``
    tokens are its bag. The recipe for token models that use offsets."""

    def __init__(self, vocab=20, dim=6):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.head = nn.Linear(dim, 3)

    def forward(self, tokens, lengths):
        keep = torch.arange(tokens.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])
        return self.head(self.bag(tokens[keep], offsets))


class AttentionBlock(nn.Module):
    """Token embedding + one DPMultiheadAttention layer with a key padding mask, masked mean
    pooling -> classes. ``need_weights`` is a non-tensor keyword replayed from the call."""

    def __init__(self, vocab=20, dim=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.attn = DPMultiheadAttention(dim, 2, batch_first=True)
        self.head = nn.Linear(dim, 3)

    def forward(self, tokens, key_padding_mask, need_weights=False):
        h = self.emb(tokens)
        a, _ = self.attn(h, h, h, key_padding_mask=key_padding_mask, need_weights=need_weights)
        keep = (~key_padding_mask).unsqueeze(-1).to(a.dtype)
        return self.head((a * keep).sum(1) / keep.sum(1))


class DropoutMLP(nn.Module):
    def __init__(self, functional: bool = False):
        super().__init__()
        self.functional = functional
        self.fc1, self.fc2 = nn.Linear(6, 16), nn.Linear(16, 3)
        self.drop = nn.Identity() if functional else nn.Dropout(0.3)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = nn.functional.dropout(h, 0.3, self.training) if self.functional else self.drop(h)
        return self.fc2(h)


def mlp():
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


# ---------------------------------------------------------------------------- data
def _gen(seed):
    return torch.Generator().manual_seed(seed)


def tokens(n, seed, length=5, vocab=20):
    return torch.randint(0, vocab, (n, length), generator=_gen(seed))


def padding_mask(n, seed, length=5):
    """True = padded; every row keeps at least its first two tokens."""
    lengths = torch.randint(2, length + 1, (n,), generator=_gen(seed))
    return torch.arange(length).unsqueeze(0) >= lengths.unsqueeze(1)


def labels(n, seed):
    return torch.randint(0, 3, (n,), generator=_gen(seed))


FAMILIES = {
    # name: (model factory, per-example tensors (without labels), canaries, call)
    "two-inputs": (
        TwoInputs,
        lambda n, s: (
            torch.randn(n, 6, generator=_gen(s)),
            torch.randn(n, 3, generator=_gen(s + 7)),
        ),
        lambda: InputCanaries(
            torch.randn(4, 6, generator=_gen(90)) * 3, labels(4, 91), CE,
            args=(torch.randn(4, 3, generator=_gen(92)),),
        ),
        lambda m, x, side: m(x, side),
    ),
    "tokens-embeddingbag": (
        BagOfTokens,
        lambda n, s: (tokens(n, s), torch.randint(1, 6, (n,), generator=_gen(s + 5))),
        lambda: InputCanaries(
            tokens(4, 90), labels(4, 91), args=(torch.tensor([1, 5, 3, 2]),)
        ),
        lambda m, t, lengths: m(t, lengths),
    ),
    "tokens-lstm": (
        TokenLSTM,
        lambda n, s: (tokens(n, s),),
        lambda: InputCanaries(tokens(4, 90), labels(4, 91)),
        lambda m, t: m(t),
    ),
    "attention-mask": (
        AttentionBlock,
        lambda n, s: (tokens(n, s), padding_mask(n, s + 3)),
        lambda: InputCanaries(
            tokens(4, 90), labels(4, 91), kwargs={"key_padding_mask": padding_mask(4, 93)}
        ),
        lambda m, t, mask: m(t, key_padding_mask=mask, need_weights=False),
    ),
}


# ---------------------------------------------------------------------------- instruments
def autograd_reference(gsm, canaries: InputCanaries, clip: float, **shared) -> torch.Tensor:
    """Per-example loop on the module under Opacus' GradSampleModule (its hooks off): each
    canary's flat gradient of its own loss, clipped with Opacus' rule min(1, C / (||g|| +
    1e-6)); parameters, per-sample state and the global RNG untouched."""
    module = gsm._module
    params = [p for p in module.parameters() if p.requires_grad]
    rows = []
    gsm.disable_hooks()
    with torch.enable_grad():
        for k in range(len(canaries)):
            one = canaries.select(slice(k, k + 1))
            out = module(*one.positional, **one.kwargs, **shared)
            grads = torch.autograd.grad(one.loss_fn(out.float(), one.targets), params)
            g = torch.cat([x.reshape(-1) for x in grads]).float()
            rows.append(g * min(1.0, clip / (float(g.norm()) + 1e-6)))
    gsm.enable_hooks()
    return torch.stack(rows)


class Recorder(StepScore):
    """Keeps each step's canary gradients and the autograd reference at the same parameters."""

    name = "recorder"

    def __init__(self, module_ref, canaries, shared=None):
        self.module_ref, self.canaries, self.shared = module_ref, canaries, shared or {}
        self.got, self.want = [], []

    def step(self, canary_grads, released, ctx):
        self.got.append(canary_grads.clone())
        with torch.random.fork_rng(devices=[]):
            ref = autograd_reference(self.module_ref[0], self.canaries, C, **self.shared)
        self.want.append(ref)
        return canary_grads @ released


def run(model_fn, features, call, canaries=None, input_pass="auto", steps=3, n=48,
        autocast=False, record=None, batch=16, seed=0):
    """``steps`` DP-SGD steps; Poisson sampling and noise on the global RNG. Returns the
    trained GradSampleModule, the hook (or None) and the recorder."""
    torch.manual_seed(0)
    model = model_fn()
    data = TensorDataset(*features(n, 1), labels(n, 2))
    model, opt, loader = PrivacyEngine().make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(data, batch_size=batch),
        noise_multiplier=0.7,
        max_grad_norm=C,
    )
    rec = None
    hook = None
    if canaries is not None:
        module_ref = [model]
        rec = record(module_ref, canaries) if record else Recorder(module_ref, canaries)
        hook = AuditHook(
            opt, model, canaries, scores=(rec,), input_pass=input_pass, seed=seed
        ).attach()
    done = 0
    while done < steps:
        for *xs, y in loader:
            if done == steps:
                break
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = call(model, *xs)
            CE(out.float(), y).backward()
            opt.step()
            done += 1
    if hook is not None:
        hook.detach()
    return model, hook, rec


def params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model._module.parameters()])


# ---------------------------------------------------------------------------- tests
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("input_pass", ["batch", "separate"])
def test_canary_gradients_equal_autograd_reference_and_training_is_unchanged(family, input_pass):
    model_fn, features, canaries_fn, call = FAMILIES[family]
    plain, _, _ = run(model_fn, features, call)
    model, hook, rec = run(model_fn, features, call, canaries_fn(), input_pass=input_pass)
    assert hook.steps == 3 and len(rec.got) == 3
    assert hook.folded_steps == (3 if input_pass == "batch" else 0)
    assert torch.equal(params(model), params(plain))
    for got, want in zip(rec.got, rec.want, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
        assert float(want.norm(dim=1).max()) > 0.3 * C  # the comparison is not vacuous


def test_auto_probes_then_folds(monkeypatch):
    """``input_pass="auto"``: the first training forward is watched (no fold), later ones are
    folded. The probe is told the rows are independent (whether this CPU's kernels are is not
    asserted here)."""
    monkeypatch.setattr(BatchFold, "_rows_independent", lambda self, *a: True)
    model_fn, features, canaries_fn, call = FAMILIES["two-inputs"]
    _, hook, rec = run(model_fn, features, call, canaries_fn(), input_pass="auto", steps=4)
    assert hook.steps == 4 and hook.folded_steps == 3
    for got, want in zip(rec.got, rec.want, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("family", ["attention-mask", "tokens-lstm"])
def test_auto_never_folds_opacus_recurrent_or_attention_layers(family, monkeypatch):
    """Their per-sample gradients drift in the last bits when rows are appended, which the
    probe (outputs only) cannot see: "auto" takes the separate pass, even when the probe would
    say yes, and training is unchanged bit for bit."""
    monkeypatch.setattr(BatchFold, "_rows_independent", lambda self, *a: True)
    model_fn, features, canaries_fn, call = FAMILIES[family]
    plain, _, _ = run(model_fn, features, call, steps=4)
    model, hook, rec = run(model_fn, features, call, canaries_fn(), input_pass="auto", steps=4)
    assert hook.steps == 4 and hook.folded_steps == 0
    assert torch.equal(params(model), params(plain))
    for got, want in zip(rec.got, rec.want, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_forced_fold_replays_non_tensor_keywords():
    """``input_pass="batch"`` folds the attention block too (exact up to rounding), and
    ``need_weights=False`` reaches the canaries' forward."""
    model_fn, features, canaries_fn, call = FAMILIES["attention-mask"]
    _, hook, rec = run(model_fn, features, call, canaries_fn(), input_pass="batch", steps=4)
    assert hook.steps == 4 and hook.folded_steps == 4
    for got, want in zip(rec.got, rec.want, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("functional", [False, True], ids=["nn.Dropout", "F.dropout"])
@pytest.mark.parametrize("input_pass", ["auto", "separate"])
def test_dropout_training_is_unchanged_bit_for_bit(functional, input_pass):
    """Dropout draws from the global RNG, as do Poisson sampling and Opacus' noise here: the
    canaries' extra rows or pass must not shift any of them."""
    feats = FAMILIES["two-inputs"][1]

    def features(n, s):
        return feats(n, s)[:1]

    canaries = InputCanaries(torch.randn(4, 6, generator=_gen(5)), labels(4, 6))
    plain, _, _ = run(lambda: DropoutMLP(functional), features, lambda m, x: m(x), steps=4)
    model, hook, rec = run(
        lambda: DropoutMLP(functional), features, lambda m, x: m(x), canaries,
        input_pass=input_pass, steps=4,
    )
    assert torch.equal(params(model), params(plain))
    assert hook.steps == 4 and hook.folded_steps == 0  # random forwards are never folded
    for got in rec.got:
        assert torch.isfinite(got).all() and float(got.norm(dim=1).max()) <= C * (1 + 1e-6)


def test_hook_seed_draws_the_canaries_dropout_and_never_the_training():
    """``AuditHook(seed=)`` seeds the separate pass's private stream: the same seed gives the
    same canary gradients under dropout, another seed other masks; training is the same."""
    feats = FAMILIES["two-inputs"][1]

    def features(n, s):
        return feats(n, s)[:1]

    canaries = InputCanaries(torch.randn(4, 6, generator=_gen(5)), labels(4, 6))
    runs = [
        run(lambda: DropoutMLP(), features, lambda m, x: m(x), canaries, steps=2, seed=seed)
        for seed in (3, 3, 4)
    ]
    (m0, _, r0), (m1, _, r1), (m2, _, r2) = runs
    assert torch.equal(params(m0), params(m1)) and torch.equal(params(m0), params(m2))
    assert all(torch.equal(a, b) for a, b in zip(r0.got, r1.got, strict=True))
    assert not any(torch.equal(a, b) for a, b in zip(r0.got, r2.got, strict=True))
    model, opt = private_dropout_mlp()
    with pytest.raises(ValueError, match="seed must be an integer"):
        AuditHook(opt, model, canaries, seed=1.5)


def private_dropout_mlp():
    """A DropoutMLP made private (no training): (GradSampleModule, DPOptimizer)."""
    module = DropoutMLP()
    model, opt, _ = PrivacyEngine().make_private(
        module=module,
        optimizer=torch.optim.SGD(module.parameters(), lr=0.1),
        data_loader=DataLoader(TensorDataset(torch.randn(8, 6), labels(8, 0)), batch_size=4),
        noise_multiplier=1.0,
        max_grad_norm=C,
    )
    return model, opt


def test_dropout_refuses_forced_fold():
    model, opt = private_dropout_mlp()
    assert random_modules(model) == ["_module.drop"]
    with pytest.raises(ValueError, match="input_pass='batch': the model draws random numbers"):
        AuditHook(opt, model, InputCanaries(torch.randn(2, 6), labels(2, 0)), input_pass="batch")
    # a functional dropout is not visible statically; a forced fold is stopped at once
    with pytest.raises(RuntimeError, match="draws random numbers"):
        run(lambda: DropoutMLP(True), lambda n, s: FAMILIES["two-inputs"][1](n, s)[:1],
            lambda m, x: m(x), InputCanaries(torch.randn(2, 6), labels(2, 0)),
            input_pass="batch", steps=1)


@pytest.mark.parametrize("input_pass", ["batch", "separate"])
def test_bf16_autocast_trains_unchanged_and_clips_in_float32(input_pass):
    def features(n, s):
        return (torch.randn(n, 6, generator=_gen(s)),)

    canaries = InputCanaries(torch.randn(6, 6, generator=_gen(9)) * 5, labels(6, 8))

    class Autocast(Recorder):
        def step(self, canary_grads, released, ctx):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return super().step(canary_grads, released, ctx)

    plain, _, _ = run(mlp, features, lambda m, x: m(x), autocast=True)
    model, hook, rec = run(
        mlp, features, lambda m, x: m(x), canaries, input_pass=input_pass, autocast=True,
        record=lambda ref, c: Autocast(ref, c),
    )
    assert torch.equal(params(model), params(plain))
    assert hook.folded_steps == (3 if input_pass == "batch" else 0)
    for got, want in zip(rec.got, rec.want, strict=True):
        assert got.dtype == torch.float32
        norms = got.double().norm(dim=1)
        assert float(norms.max()) <= C * (1 + 1e-6) and float(norms.min()) > 0.99 * C
        # the reference replays the bf16 forward; the two differ by bf16 rounding only
        torch.testing.assert_close(got, want, rtol=0.05, atol=0.02 * C)


def test_unreplayable_forwards_are_refused_by_name():
    model_fn, features, _, call = FAMILIES["attention-mask"]
    bare = InputCanaries(tokens(4, 90), labels(4, 91))  # no padding mask
    with pytest.raises(ValueError, match=r"key_padding_mask.*InputCanaries\(kwargs="):
        run(model_fn, features, call, bare, input_pass="separate", steps=1)
    float_mask = InputCanaries(
        tokens(4, 90), labels(4, 91), kwargs={"key_padding_mask": torch.zeros(4, 5)}
    )
    with pytest.raises(ValueError, match=r"'key_padding_mask' is torch\.bool.*kind float"):
        run(model_fn, features, call, float_mask, steps=1)
    two_fn, two_features, _, two_call = FAMILIES["two-inputs"]
    one_input = InputCanaries(torch.randn(3, 6), labels(3, 0))
    with pytest.raises(ValueError, match=r"canaries carry 1 positional.*args="):
        run(two_fn, two_features, two_call, one_input, steps=1)


def test_keyword_varying_within_a_step_is_refused():
    """Two forwards of one step with different ``need_weights`` cannot both be replayed."""
    model_fn, features, canaries_fn, _ = FAMILIES["attention-mask"]
    flip = iter([True, False] * 10)

    def call(m, t, mask):  # two forwards in one step (one backward), another keyword each
        first = m(t, key_padding_mask=mask, need_weights=next(flip))
        return (first + m(t, key_padding_mask=mask, need_weights=next(flip))) / 2

    with pytest.raises(ValueError, match=r"\['need_weights'\] differ between the training"):
        run(model_fn, features, call, canaries_fn(), input_pass="separate", steps=1)


def test_input_canaries_validation_names_the_argument():
    x, y = torch.randn(3, 4), labels(3, 0)
    with pytest.raises(ValueError, match=r"args\[1\] must have shape \(K, \.\.\.\) with K = 3"):
        InputCanaries(x, y, args=(torch.randn(3, 2), torch.randn(2, 2)))
    with pytest.raises(ValueError, match="args must be a tuple"):
        InputCanaries(x, y, args=torch.randn(3, 2))
    with pytest.raises(ValueError, match=r"kwargs\['mask'\] must be a \(K, \.\.\.\) tensor"):
        InputCanaries(x, y, kwargs={"mask": True})
    with pytest.raises(ValueError, match="targets must have shape"):
        InputCanaries(x, labels(2, 0))
    tok = InputCanaries(tokens(3, 0), y, kwargs={"attention_mask": torch.ones(3, 5)})
    assert len(tok) == 3 and tok.signature == (1, ("attention_mask",))
    assert tok.select(slice(1, 2)).kwargs["attention_mask"].shape == (1, 5)


@pytest.mark.parametrize(
    "probe_says", [None, True, False], ids=["this-cpu", "rows-independent", "rows-dependent"]
)
def test_auto_folds_only_batches_of_enough_rows_after_a_probe(probe_says, monkeypatch):
    """``input_pass="auto"`` with tiny Poisson batches: batches of 1-3 rows (small-matrix
    kernels) are never folded; the first batch of ``MIN_FOLD_ROWS`` or more rows is the probe,
    and later such batches are folded only if the probe found the batch's outputs unchanged
    with the canary rows appended. Whether this CPU's kernels pass the probe is the CPU's
    business and is not asserted: training stays bit for bit unchanged on it either way. The
    probe's answer is also forced both ways, so both paths run on every machine."""
    model_fn, features, canaries_fn, call = FAMILIES["two-inputs"]
    rows = []

    def counted(m, x, side):
        rows.append(len(x))
        return call(m, x, side)

    plain, _, _ = run(model_fn, features, call, steps=12, batch=3)
    if probe_says is not None:
        monkeypatch.setattr(BatchFold, "_rows_independent", lambda self, *a: probe_says)
    model, hook, rec = run(model_fn, features, counted, canaries_fn(), steps=12, batch=3)
    enough = [r >= MIN_FOLD_ROWS for r in rows]
    assert hook.steps == 12 and 2 <= sum(enough) < 11  # both kinds of batch occur
    foldable = sum(enough) - 1  # every batch of enough rows after the probe
    assert hook.folded_steps in ((0, foldable) if probe_says is None else (foldable * probe_says,))
    if probe_says is not True:  # the real probe (or none folding): exact on any CPU
        assert torch.equal(params(model), params(plain))
    for got, want in zip(rec.got, rec.want, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
