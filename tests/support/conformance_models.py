"""Model families, seeded Opacus runs and independent instruments for the conformance suite.

No tests here (imported by ``tests/capture/test_conformance.py``). Each ``Family`` is one tiny model
of a kind users train with Opacus, with synthetic data and *dead coordinates*: parameter
entries the data never touch (weights of an input channel or feature that is identically zero,
embedding rows of token ids that never occur), so their per-example gradients are exactly zero
and Dirac gradient canaries placed there meet only the noise.

``run`` trains one seeded DP-SGD run with the options under test, optionally with an
``AuditHook``, and records with instruments that do not go through the hook:

* ``applied``: a step pre-hook on the *underlying* torch optimizer (``original_optimizer``)
  copies ``p.grad`` — the gradient really applied, after Opacus' noise and scaling;
* ``thetas``: the parameters at that moment, i.e. theta_t at which the step's gradients were
  computed (for the per-example autograd reference);
* ``final``: the parameters after training; ``epsilon``: the accountant's epsilon.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
from opacus import PrivacyEngine
from opacus.layers import DPLSTM, DPMultiheadAttention
from opacus.utils.batch_memory_manager import BatchMemoryManager
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

warnings.filterwarnings("ignore", module="opacus")

N_TRAIN = 32
BATCH = 8
VOCAB = 12  # token ids 1..VOCAB-3 occur; 0 is padding; VOCAB-2, VOCAB-1 never occur
SEQ = 6
CLASSES = 3


# ----------------------------------------------------------------------------- models
class GroupNormCNN(nn.Module):
    """Conv -> GroupNorm -> ReLU -> pool -> Linear on 2-channel 6x6 images (channel 1 is zero)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.norm = nn.GroupNorm(2, 4)
        self.head = nn.Linear(4, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm(self.conv(x)))
        return self.head(h.mean(dim=(2, 3)))


class TokenLSTM(nn.Module):
    """Embedding -> Opacus DPLSTM -> Linear on the last hidden state, integer tokens (N, SEQ)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 4)
        self.lstm = DPLSTM(4, 5, batch_first=True)
        self.head = nn.Linear(5, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out[:, -1])


class MaskedTransformer(nn.Module):
    """One post-norm transformer block (DPMultiheadAttention) on tokens with a padding mask.

    ``forward(tokens, key_padding_mask=mask)`` (True = padding): the mask is a keyword tensor
    of the forward, as in every NLP pipeline; pooling averages the non-padded positions.
    """

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.attn = DPMultiheadAttention(8, 2, batch_first=True)
        self.norm1 = nn.LayerNorm(8)
        self.ff = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        self.norm2 = nn.LayerNorm(8)
        self.head = nn.Linear(8, CLASSES)

    def forward(
        self, tokens: torch.Tensor, key_padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        h = self.embed(tokens)
        a, _ = self.attn(h, h, h, key_padding_mask=key_padding_mask, need_weights=False)
        h = self.norm1(h + a)
        h = self.norm2(h + self.ff(h))
        if key_padding_mask is None:
            return self.head(h.mean(dim=1))
        keep = (~key_padding_mask).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1.0))


class DropoutMLP(nn.Module):
    """Linear -> ReLU -> Dropout(0.3) -> Linear on 8 features (features 6, 7 are zero)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 6)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(6, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


# ----------------------------------------------------------------------------- families
def _flat_index(model: nn.Module, name: str, index: tuple) -> int:
    """Flat index of ``param[index]`` in the concatenation of all trainable parameters."""
    offset = 0
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if n == name:
            return offset + int(torch.arange(p.numel()).view(p.shape)[index])
        offset += p.numel()
    raise KeyError(name)


@dataclass
class Family:
    """One model family: factory, synthetic data, how a batch is fed, and dead coordinates.

    ``data(seed)`` returns the training tensors (inputs..., labels) with labels last;
    ``forward(model, batch)`` calls the model on a batch (tuple of those tensors without the
    label) the way users do (keyword tensors included); ``dead`` lists (parameter name, index)
    entries the data never touch.
    """

    name: str
    model: Callable[[], nn.Module]
    data: Callable[[int], tuple[torch.Tensor, ...]]
    forward: Callable[[nn.Module, tuple[torch.Tensor, ...]], torch.Tensor]
    dead: list[tuple[str, tuple]]
    token_inputs: bool = False
    keyword_forward: bool = False
    dropout: bool = False
    modes: tuple[str, ...] = ("hooks", "functorch", "ew")
    extra: dict = field(default_factory=dict)

    def dead_coords(self) -> list[int]:
        m = self.model()
        return [_flat_index(m, n, idx) for n, idx in self.dead]

    def dim(self) -> int:
        return sum(p.numel() for p in self.model().parameters() if p.requires_grad)


def _cnn_data(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N_TRAIN, 2, 6, 6, generator=g)
    x[:, 1] = 0.0  # channel 1 never carries signal: conv.weight[:, 1] is dead
    return x, torch.randint(0, CLASSES, (N_TRAIN,), generator=g)


def _tokens(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, VOCAB - 2, (N_TRAIN, SEQ), generator=g)
    lengths = torch.randint(2, SEQ + 1, (N_TRAIN,), generator=g)
    pad = torch.arange(SEQ).unsqueeze(0) >= lengths.unsqueeze(1)
    tokens = tokens.masked_fill(pad, 0)
    return tokens, pad, torch.randint(0, CLASSES, (N_TRAIN,), generator=g)


def _lstm_data(seed: int) -> tuple[torch.Tensor, ...]:
    tokens, _, y = _tokens(seed)
    return tokens, y


def _mlp_data(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N_TRAIN, 8, generator=g)
    x[:, 6:] = 0.0  # features 6, 7 never carry signal: fc1.weight[:, 6:] is dead
    return x, torch.randint(0, CLASSES, (N_TRAIN,), generator=g)


def _plain(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return model(*batch)


def _masked(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    tokens, mask = batch
    return model(tokens, key_padding_mask=mask)


FAMILIES = {
    "cnn_groupnorm": Family(
        "cnn_groupnorm",
        GroupNormCNN,
        _cnn_data,
        _plain,
        dead=[("conv.weight", (o, 1, i, j)) for o in range(4) for i in range(3) for j in range(3)],
    ),
    "lstm_tokens": Family(
        "lstm_tokens",
        TokenLSTM,
        _lstm_data,
        _plain,
        dead=[("embed.weight", (v, e)) for v in (VOCAB - 2, VOCAB - 1) for e in range(4)],
        token_inputs=True,
    ),
    "transformer_mask": Family(
        "transformer_mask",
        MaskedTransformer,
        _tokens,
        _masked,
        dead=[("embed.weight", (v, e)) for v in (VOCAB - 2, VOCAB - 1) for e in range(8)],
        token_inputs=True,
        keyword_forward=True,
    ),
    "mlp_dropout": Family(
        "mlp_dropout",
        DropoutMLP,
        _mlp_data,
        _plain,
        dead=[("fc1.weight", (o, f)) for o in range(6) for f in (6, 7)],
        dropout=True,
    ),
}


# ----------------------------------------------------------------------------- options
@dataclass(frozen=True)
class Options:
    """The Opacus set-up under test (defaults: hooks, flat clipping, Poisson, plain loop)."""

    mode: str = "hooks"
    poisson: bool = True
    bmm: int | None = None  # BatchMemoryManager max_physical_batch_size
    accumulate: int = 1  # manual accumulation: backward passes per optimizer step
    autocast: bool = False  # bf16 autocast on CPU around the forward
    clipping: str = "flat"
    ddp: bool = False  # DPDDP in an initialised process group (Opacus' distributed optimizer)

    def label(self) -> str:
        parts = [self.mode]
        if not self.poisson:
            parts.append("nopoisson")
        if self.bmm:
            parts.append(f"bmm{self.bmm}")
        if self.accumulate > 1:
            parts.append(f"accum{self.accumulate}")
        if self.autocast:
            parts.append("bf16")
        if self.clipping != "flat":
            parts.append(self.clipping)
        if self.ddp:
            parts.append("ddp")
        return "-".join(parts)


SIGMA = 0.25
CLIP = 1.0
LR = 0.5
STEPS = 4


def per_layer_bounds(model: nn.Module) -> list[float]:
    """The per-layer set-up's bounds: C / sqrt(L) for each of the L trainable tensors."""
    n = sum(1 for p in model.parameters() if p.requires_grad)
    return [CLIP / n**0.5] * n


def _clipping_kwargs(opts: Options, model: nn.Module) -> dict:
    if opts.clipping == "flat":
        return {"max_grad_norm": CLIP}
    if opts.clipping == "per_layer":
        return {"clipping": "per_layer", "max_grad_norm": per_layer_bounds(model)}
    if opts.clipping == "adaptive":
        return {
            "clipping": "adaptive",
            "max_grad_norm": CLIP,
            "target_unclipped_quantile": 0.5,
            "clipbound_learning_rate": 0.2,
            "max_clipbound": 10.0,
            "min_clipbound": 0.1,
            "unclipped_num_std": 2.0,
        }
    raise ValueError(opts.clipping)


def make_private(family: Family, opts: Options, seed: int = 0):
    """(model, optimizer, criterion, loader, engine) from Opacus' make_private, seeded."""
    torch.manual_seed(seed)
    model = family.model()
    if opts.ddp:
        from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP

        model = DPDDP(model)
    data = TensorDataset(*family.data(seed))
    loader = DataLoader(data, batch_size=BATCH, generator=torch.Generator().manual_seed(seed))
    engine = PrivacyEngine()
    out = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=LR),
        data_loader=loader,
        noise_multiplier=SIGMA,
        poisson_sampling=opts.poisson,
        grad_sample_mode=opts.mode,
        criterion=nn.CrossEntropyLoss(),
        noise_generator=torch.Generator().manual_seed(seed + 1),
        **_clipping_kwargs(opts, model),
    )
    if opts.mode == "ghost":
        model, opt, criterion, loader = out
    else:
        (model, opt, loader), criterion = out, nn.CrossEntropyLoss()
    return model, opt, criterion, loader, engine


def trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    module = getattr(model, "_module", model)
    module = getattr(module, "module", module)  # DPDDP
    return [(n, p) for n, p in module.named_parameters() if p.requires_grad]


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).clone() for t in tensors])


def run(
    family: Family,
    opts: Options,
    hook_fn: Callable | None = None,
    seed: int = 0,
    steps: int = STEPS,
) -> SimpleNamespace:
    """One seeded run of ``steps`` real optimizer steps; instruments in the module doc."""
    model, opt, criterion, loader, engine = make_private(family, opts, seed)
    params = [p for _, p in trainable(model)]
    applied, thetas, bounds = [], [], []

    def record(optimizer, args, kwargs):  # the gradient the base optimizer really applies
        applied.append(flat(p.grad for p in params))
        thetas.append(flat(params))
        bounds.append(float(opt.max_grad_norm))  # adaptive clipping: C_{t+1}, updated

    handle = opt.original_optimizer.register_step_pre_hook(record)
    hook = hook_fn(opt, model) if hook_fn is not None else None
    model.train()
    try:
        with hook if hook is not None else contextlib.nullcontext():
            ctx = (
                BatchMemoryManager(
                    data_loader=loader, max_physical_batch_size=opts.bmm, optimizer=opt
                )
                if opts.bmm
                else contextlib.nullcontext(loader)
            )
            with ctx as dl:
                it = iter(dl)
                while len(applied) < steps:
                    for _ in range(opts.accumulate):
                        try:
                            *xs, y = next(it)
                        except StopIteration:
                            it = iter(dl)
                            *xs, y = next(it)
                        amp = (
                            torch.autocast("cpu", dtype=torch.bfloat16)
                            if opts.autocast
                            else contextlib.nullcontext()
                        )
                        with amp:
                            out = family.forward(model, tuple(xs))
                        loss = criterion(out.float(), y)
                        loss.backward()
                    opt.step()
                    opt.zero_grad()
    finally:
        handle.remove()
    return SimpleNamespace(
        model=model,
        optimizer=opt,
        engine=engine,
        hook=hook,
        applied=torch.stack(applied),
        thetas=torch.stack(thetas),
        bounds=bounds,
        final=flat(params),
        epsilon=engine.accountant.get_epsilon(delta=1e-5),
        expected_batch_size=opt.expected_batch_size,
        history=list(engine.accountant.history),
    )


# ----------------------------------------------------------------------------- reference
def reference_clipped_grads(
    family: Family,
    theta: torch.Tensor,
    inputs: tuple[torch.Tensor, ...],
    targets: torch.Tensor,
    clip,
    train: bool = True,
    autocast: bool = False,
) -> torch.Tensor:
    """(K, d) per-example gradients at ``theta`` by K single-example backward passes on a fresh
    copy of the plain model (forward under bf16 autocast when ``autocast``, as in training),
    clipped in float32 with Opacus' rule: flat min(1, C / (||g|| + 1e-6)) for a float ``clip``,
    per-layer (each parameter's part by its own C_p) for a list aligned with the parameters."""
    model = family.model()
    params = [p for p in model.parameters() if p.requires_grad]
    torch.nn.utils.vector_to_parameters(theta.clone(), params)
    model.train(train)
    rows = []
    for k in range(len(targets)):
        model.zero_grad()
        xs = tuple(x[k : k + 1] for x in inputs)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = family.forward(model, xs)
        loss = nn.functional.cross_entropy(out.float(), targets[k : k + 1])
        g = torch.autograd.grad(loss, params, allow_unused=True)
        parts = [(gi if gi is not None else torch.zeros_like(p)).reshape(-1).float()
                 for gi, p in zip(g, params, strict=True)]
        if isinstance(clip, list):
            rows.append(torch.cat([x * (c / (x.norm() + 1e-6)).clamp(max=1.0)
                                   for x, c in zip(parts, clip, strict=True)]))
        else:
            g = torch.cat(parts)
            rows.append(g * (clip / (g.norm() + 1e-6)).clamp(max=1.0))
    return torch.stack(rows)
