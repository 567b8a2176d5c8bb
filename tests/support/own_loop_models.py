"""Seventeen small models over Opacus' layer families, trained in an ordinary Opacus loop with
an ``AuditHook`` and judged by ``audit_report`` (the own-loop path; no tests here).

Each family is (model factory, synthetic data, make_private options). ``own_loop_audit`` trains
one with Dirac gradient canaries on its largest tensor and the training loader given to the
hook, optionally with a planted zoo bug (on the optimizer, on the Poisson sampler of the
loader, or the data-loader bug: fixed-size shuffled batches accounted as Poisson), and returns
``audit_report(hook, privacy_engine=..., dataset_size=...)``. ``BUG_CLASSES`` names one bug per
class of the zoo and the white-box statement that must refute the claim for it.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.layers import DPGRU, DPLSTM, DPRNN, DPMultiheadAttention
from opacus.utils.batch_memory_manager import BatchMemoryManager
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpaudit.bugs import BUG_ZOO, plant_bug, plant_sampler_bug
from dpaudit.capture import AuditHook, GradientCanaries
from dpaudit.experiment import audit_report

warnings.filterwarnings("ignore", module="opacus")

N = 640  # examples
BATCH = 32  # expected batch (sample rate 1/20)
STEPS = 30
CLASSES = 4
VOCAB, SEQ = 24, 6


class Pool(nn.Module):
    """Mean over a dimension (token positions, sequence steps)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return x.mean(self.dim)


class Recurrent(nn.Module):
    """Embedding -> an Opacus recurrent layer -> its last output -> Linear."""

    def __init__(self, cell) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.rnn = cell(16, 24, batch_first=True)
        self.head = nn.Linear(24, CLASSES)

    def forward(self, x):
        out, _ = self.rnn(self.emb(x))
        return self.head(out[:, -1])


class Attention(nn.Module):
    """Embedding -> DPMultiheadAttention (self-attention) -> mean -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.att = DPMultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, x):
        h = self.emb(x)
        out, _ = self.att(h, h, h)
        return self.head(out.mean(1))


class Bag(nn.Module):
    """EmbeddingBag (mean of each row's tokens) -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(VOCAB, 32, mode="mean")
        self.head = nn.Linear(32, CLASSES)

    def forward(self, x):  # Opacus' grad sampler needs the (flat input, offsets) form
        offsets = torch.arange(0, x.numel(), x.shape[1], device=x.device)
        return self.head(self.bag(x.reshape(-1), offsets))


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, CLASSES))


def _frozen_first() -> nn.Module:
    model = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 32), nn.ReLU(),
                          nn.Linear(32, CLASSES))
    for p in model[0].parameters():
        p.requires_grad_(False)
    return model


FAMILIES_MODELS = {
    "linear": _mlp,
    "conv1d": lambda: nn.Sequential(nn.Conv1d(4, 16, 3), nn.ReLU(), nn.Flatten(),
                                    nn.Linear(16 * 14, CLASSES)),
    "conv2d_groupnorm": lambda: nn.Sequential(nn.Conv2d(2, 16, 3), nn.GroupNorm(4, 16),
                                              nn.ReLU(), nn.Flatten(),
                                              nn.Linear(16 * 36, CLASSES)),
    "conv3d": lambda: nn.Sequential(nn.Conv3d(1, 8, 2), nn.ReLU(), nn.Flatten(),
                                    nn.Linear(8 * 27, CLASSES)),
    "layernorm": lambda: nn.Sequential(nn.Linear(64, 48), nn.LayerNorm(48), nn.ReLU(),
                                       nn.Linear(48, CLASSES)),
    "instancenorm": lambda: nn.Sequential(nn.Conv1d(4, 16, 3), nn.InstanceNorm1d(16, affine=True),
                                          nn.ReLU(), nn.Flatten(), nn.Linear(16 * 14, CLASSES)),
    "rmsnorm": lambda: nn.Sequential(nn.Linear(64, 48), nn.RMSNorm(48), nn.ReLU(),
                                     nn.Linear(48, CLASSES)),
    "embedding": lambda: nn.Sequential(nn.Embedding(VOCAB, 32), Pool(1),
                                       nn.Linear(32, CLASSES)),
    "embeddingbag": Bag,
    "dplstm": lambda: Recurrent(DPLSTM),
    "dpgru": lambda: Recurrent(DPGRU),
    "dprnn": lambda: Recurrent(DPRNN),
    "attention": Attention,
    "frozen_first_layer": _frozen_first,
    "functorch": _mlp,
    "ew": _mlp,
    "batch_memory_manager": _mlp,
}


@dataclass(frozen=True)
class Family:
    """How one model family is built, fed and made private."""

    model: str
    inputs: str  # "features", "conv1d", "conv2d", "conv3d", "tokens"
    grad_sample_mode: str = "hooks"
    physical_batch: int | None = None
    extra: dict = field(default_factory=dict)


INPUTS = {"linear": "features", "conv1d": "conv1d", "conv2d_groupnorm": "conv2d",
          "conv3d": "conv3d", "layernorm": "features", "instancenorm": "conv1d",
          "rmsnorm": "features", "embedding": "tokens", "embeddingbag": "tokens",
          "dplstm": "tokens", "dpgru": "tokens", "dprnn": "tokens", "attention": "tokens",
          "frozen_first_layer": "features", "functorch": "features", "ew": "features",
          "batch_memory_manager": "features"}

FAMILIES = {
    name: Family(name, INPUTS[name],
                 grad_sample_mode={"functorch": "functorch", "ew": "ew"}.get(name, "hooks"),
                 physical_batch=8 if name == "batch_memory_manager" else None)
    for name in FAMILIES_MODELS
}

# one bug per class of the zoo, and the white-box statement that must refute the claim for it
BUG_CLASSES = {
    "noise of the wrong scale": ("halved_noise", "noise_scale"),
    "noise missing on some steps": ("noise_skipped_steps", "noise_scale"),
    "noise reused or correlated across steps": ("noise_reused", "noise_freshness"),
    "noise missing on some parameter tensors": ("noise_partial_tensors", "noise_scale"),
    "noise of the wrong law": ("laplace_noise", "noise_marginal"),
    "noise shared within a step": ("broadcast_noise", "noise_alignment"),
    "clipping broken": ("unclipped_example", "clipping"),
    "wrong normalisation": ("realised_batch_size", "normalisation"),
    "sampling that is not Poisson": ("shuffled_batches", "poisson_sampling"),
    "sampling that is not Poisson (replayed passes)": ("replayed_batches",
                                                       "sampling_by_example"),
    "the accountant told less than training did": ("accountant_sigma", "bookkeeping"),
    "the model moved outside the private step": ("out_of_band_update", "model_integrity"),
    "noise that depends on the data": ("batch_seeded_noise", "noise_ignores_data"),
}


def clip_at_twice_the_norm(opt) -> None:
    """Plant a clipping bug of 2 C: the optimizer clips to 2 C while its noise stays sigma C
    (``opt.max_grad_norm`` doubled inside ``clip_and_accumulate`` only)."""
    clip = opt.clip_and_accumulate

    def doubled() -> None:
        c = opt.max_grad_norm
        opt.max_grad_norm = 2 * c
        try:
            clip()
        finally:
            opt.max_grad_norm = c

    opt.clip_and_accumulate = doubled


def double_first_layer_bound(opt) -> None:
    """Plant a per-layer clipping bug: the first tensor clipped to 2 C_1 while the noise stays
    sigma C (``DPPerLayerOptimizer.max_grad_norms[0]`` doubled after construction)."""
    opt.max_grad_norms = [2 * opt.max_grad_norms[0], *opt.max_grad_norms[1:]]


def bound_from_true_count(opt) -> None:
    """Plant an adaptive-clipping bug: the bound moves by the true count of unclipped examples
    (read before the count's noise), not the released one."""
    add_noise, update = opt.add_noise, opt.update_max_grad_norm
    seen = {}

    def noised() -> None:
        seen["count"] = opt.unclipped_num
        add_noise()

    def updated() -> None:
        noisy, opt.unclipped_num = opt.unclipped_num, seen["count"]
        update()
        opt.unclipped_num = noisy

    opt.add_noise, opt.update_max_grad_norm = noised, updated


CLIPPING_BUGS = {  # set-up -> {bug class: (plant or zoo bug name, the check that must refute)}
    "per_layer": {"noise": ("halved_noise", "noise_scale"),
                  "clipping": (double_first_layer_bound, "clipping"),
                  "bookkeeping": ("accountant_sigma", "bookkeeping")},
    "adaptive": {"noise": ("halved_noise", "noise_scale"),
                 "clipping": (clip_at_twice_the_norm, "clipping"),
                 "bookkeeping": ("accountant_sigma", "bookkeeping"),
                 "bound update": (bound_from_true_count, "adaptive_bound")},
}


def clipping_kwargs(clipping: str, model: nn.Module, sigma: float) -> dict:
    """``make_private``'s clipping arguments: flat C = 1; per-layer 1 / sqrt(L) for each of
    the L trainable tensors; adaptive from C = 1 (the CLI's defaults: target 0.5, rate 0.2,
    bounds [0.01, 100], count noise max(B / 20, 2 sigma))."""
    if clipping == "per_layer":
        n = sum(1 for p in model.parameters() if p.requires_grad)
        return {"clipping": "per_layer", "max_grad_norm": [n**-0.5] * n}
    if clipping == "adaptive":
        return {"clipping": "adaptive", "max_grad_norm": 1.0, "target_unclipped_quantile": 0.5,
                "clipbound_learning_rate": 0.2, "min_clipbound": 0.01, "max_clipbound": 100.0,
                "unclipped_num_std": max(BATCH / 20, 2 * sigma)}
    return {"max_grad_norm": 1.0}


def data(inputs: str, seed: int = 0) -> TensorDataset:
    """Synthetic examples of the family's input kind, with labels."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"features": (64,), "conv1d": (4, 16), "conv2d": (2, 8, 8), "conv3d": (1, 4, 4, 4)}
    if inputs == "tokens":
        x = torch.randint(0, VOCAB, (N, SEQ), generator=g)
    else:
        x = torch.randn((N, *shapes[inputs]), generator=g)
    y = torch.randint(0, CLASSES, (N,), generator=g)
    return TensorDataset(x, y)


OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05),
    "momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
}


def own_loop_audit(family: str, bug: str = "none", seed: int = 0, sigma: float = 2.0,
                   canaries: int = 24, planted=None, optimizer: str = "sgd",
                   schedule: bool = False, ema: bool = False, ddp: bool = False,
                   autocast: torch.dtype | None = None, grad_scaler: bool = False,
                   clipping: str = "flat", **report) -> dict:
    """Train ``family`` in an ordinary Opacus loop with an ``AuditHook`` (and ``bug``
    planted, or ``planted(optimizer)`` called to patch it) for ``STEPS`` steps and return
    ``audit_report``'s result. ``optimizer`` (``OPTIMIZERS``), ``schedule`` (a StepLR on the
    DP optimizer) and ``ema`` (an EMA copy of the weights, torch's AveragedModel, updated
    after every step) are the loop's own; ``ddp``: inside an initialised process group, the
    model wrapped in Opacus' DPDDP (its distributed Poisson loader and optimizer);
    ``autocast``: the forward and the loss under ``torch.autocast("cpu", dtype=autocast)``
    (mixed precision); ``grad_scaler``: the loss scaled by a ``torch.amp.GradScaler``;
    ``clipping``: Opacus' flat, per-layer or adaptive clipping (``clipping_kwargs``)."""
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP

    fam = FAMILIES[family]
    torch.manual_seed(seed)
    model = FAMILIES_MODELS[family]()
    if ddp:
        model = DPDDP(model)
    train = data(fam.inputs, seed)
    shuffled = bug == "shuffled_batches"
    # under DPDDP each rank's Poisson sampler draws from this generator: seeded alike on every
    # rank, the ranks would draw the same masks and sample the examples at one shard
    # position together (not Poisson sampling; the batch sizes' spread doubles)
    rank = torch.distributed.get_rank() if ddp else 0
    loader = DataLoader(train, batch_size=BATCH, shuffle=shuffled,
                        generator=torch.Generator().manual_seed(seed + 7919 * rank))
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private(
        module=model, optimizer=OPTIMIZERS[optimizer](
            [p for p in model.parameters() if p.requires_grad]),
        data_loader=loader, noise_multiplier=sigma,
        poisson_sampling=not shuffled, grad_sample_mode=fam.grad_sample_mode,
        **clipping_kwargs(clipping, model, sigma))
    if bug not in ("none", "shuffled_batches"):
        if BUG_ZOO[bug].optimizer:
            plant_bug(opt, bug)
        else:  # a sampling bug: Opacus' Poisson sampler of the loader
            plant_sampler_bug(loader, bug)
    if planted is not None:
        planted(opt)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5) if schedule else None
    averaged = torch.optim.swa_utils.AveragedModel(model) if ema else None
    dim = sum(p.numel() for p in model.parameters() if p.requires_grad)
    members = np.random.default_rng(seed).random(canaries) < 0.5
    policy = ["every_step" if m else "never" for m in members]
    coords = np.random.default_rng(seed + 1).choice(dim, canaries, replace=False)
    can = GradientCanaries.dirac(coords.tolist(), norm=1.0, dim=dim, policy=policy)
    # with shuffled batches Opacus' accountant still says q = BATCH / N: the claim is Poisson;
    # a bug that wraps the accountant's hook hides its rate: the loop states it
    rate = BATCH / N if bug.startswith("accountant") else None
    hook = AuditHook(opt, model, [can], seed=seed, sample_rate=rate, data_loader=loader)
    loss_fn = nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler("cpu") if grad_scaler else None
    with hook:
        batches = (BatchMemoryManager(data_loader=loader, max_physical_batch_size=
                                      fam.physical_batch, optimizer=opt)
                   if fam.physical_batch else contextlib.nullcontext(loader))
        with batches as it:
            while hook.steps < STEPS:
                for x, y in it:
                    opt.zero_grad()
                    with torch.autocast("cpu", dtype=autocast or torch.bfloat16,
                                        enabled=autocast is not None):
                        loss = loss_fn(model(x), y)
                    before = hook.steps
                    if scaler is None:
                        loss.backward()
                        opt.step()
                    else:
                        scaler.scale(loss).backward()
                        scaler.step(opt)
                        scaler.update()
                    if hook.steps > before:  # a real step (not one BatchMemoryManager skips)
                        if sched is not None:
                            sched.step()
                        if averaged is not None:
                            averaged.update_parameters(model)
                    if hook.steps >= STEPS:
                        break
    return audit_report(hook, privacy_engine=engine, dataset_size=N, independent_canaries=False,
                        **report)


DDP_WORLD = 2


def _ddp_worker(rank: int, port: int, seed: int, out: str, kwargs: dict) -> None:
    """One rank of ``own_loop_ddp_audit`` (module-level: the processes import it)."""
    import json

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         rank=rank, world_size=DDP_WORLD)
    try:
        res = own_loop_audit("linear", seed=seed, ddp=True, **kwargs)
        with open(f"{out}.rank{rank}.json", "w") as f:
            json.dump(res, f, default=str)
    finally:
        torch.distributed.destroy_process_group()


def own_loop_ddp_audit(seed: int = 0, **kwargs) -> dict:
    """``own_loop_audit`` of the linear family under DPDDP in two real processes (gloo on the
    CPU, forked): rank 0's ``audit_report`` result, checked equal to rank 1's verdict."""
    import json
    import socket
    import tempfile

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/result"
        torch.multiprocessing.start_processes(
            _ddp_worker, args=(port, seed, out, kwargs), nprocs=DDP_WORLD, join=True,
            start_method="fork")
        ranks = [json.load(open(f"{out}.rank{r}.json")) for r in range(DDP_WORLD)]
    if ranks[0]["verdict"]["status"] != ranks[1]["verdict"]["status"]:
        raise RuntimeError("the ranks' verdicts differ: "
                           + " | ".join(r["verdict"]["message"] for r in ranks))
    return ranks[0]
