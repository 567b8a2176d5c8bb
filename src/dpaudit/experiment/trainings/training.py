"""One DP-SGD training run with Opacus and the audit hook attached (DESIGN 3, step 4).

The loop is the ordinary Opacus one — ``PrivacyEngine.make_private`` with Poisson sampling,
optionally ``BatchMemoryManager`` — with a planted bug if the settings ask for one and an
``AuditHook`` around it. Everything random in the run (initial Poisson draws, noise) comes from
the seeded torch generator inside ``fork_rng``, so a run is reproducible from its seed.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.data_loader import DPDataLoader
from opacus.utils.batch_memory_manager import BatchMemoryManager
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from dpaudit._validate import require_choice
from dpaudit.accounting import AccountantEpsilon, engine_epsilons
from dpaudit.attacks import StepScore
from dpaudit.bugs import check_bug, plant_bug, plant_sampler_bug
from dpaudit.capture import AuditHook
from dpaudit.capture.final_state import rung_scores
from dpaudit.capture.independence import seen_independent
from dpaudit.capture.records import WhiteBoxRecords
from dpaudit.experiment.settings import DPSettings
from dpaudit.experiment.trainings import data_rate as rate_block
from dpaudit.gradients import resolve_parameter_names
from dpaudit.models import LOSS

SAMPLINGS = ("poisson", "shuffle")


@dataclass
class TrainingOutcome:
    """What one audited run produced: per-canary scores and the run's DP bookkeeping."""

    scores: dict[str, np.ndarray]
    inclusions: np.ndarray
    steps: int
    sample_rate: float
    accountants: dict[str, AccountantEpsilon]
    test_accuracy: float
    seconds: float
    white_box: WhiteBoxRecords | None = None  # for ``experiment.judging.white_box``
    per_step: dict[str, np.ndarray] | None = None  # score name -> (K, T) per-step values
    rungs: dict | None = None  # the weaker rungs' scores (``capture.final_state.rung_scores``)
    # the canaries inserted like an example (``data_rate``): {"scores": (2N,) summed mixture
    # log-LR in the block's order, "independent": bool, "independence": why (not)}
    data_rate: dict | None = None


def make_optimizer(model: nn.Module, dp: DPSettings) -> torch.optim.Optimizer:
    """The base optimizer the DP optimizer wraps."""
    if dp.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=dp.lr)
    return torch.optim.SGD(model.parameters(), lr=dp.lr, momentum=dp.momentum)


def shuffle_sample_rate(n_train: int, batch_size: int) -> float:
    """The rate of shuffled batches of ``batch_size``: 1 / (batches per epoch)."""
    return 1.0 / math.ceil(n_train / batch_size)


@torch.no_grad()
def accuracy(model: nn.Module, data: Dataset, device: torch.device) -> float:
    """Top-1 accuracy of ``model`` on a (small) dataset."""
    if len(data) == 0:
        return float("nan")
    loader = DataLoader(data, batch_size=1024)
    correct = 0
    for x, y in loader:
        correct += int((model(x.to(device)).argmax(1) == y.to(device)).sum())
    return correct / len(data)


@contextlib.contextmanager
def _seeded(device: torch.device, seed: int):
    """torch's generators forked and seeded with ``seed`` (the GPU's too when ``device`` is
    CUDA): what a training draws inside never touches the caller's random streams."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


def _make_private(model, train_set, dp: DPSettings, sample_rate: float, seed: int,
                  shuffled: bool):
    """Opacus' PrivacyEngine on ``model``: (engine, model, optimizer, loader), the loader
    Poisson-sampled at ``sample_rate`` or, when ``shuffled``, shuffled batches of
    ``dp.batch_size`` (seeded). The caller has seeded torch."""
    with warnings.catch_warnings():  # "Secure RNG turned off", warned at construction
        warnings.filterwarnings("ignore", message="Secure RNG turned off")
        engine = PrivacyEngine(accountant="prv")
    if shuffled:
        shuffle_gen = torch.Generator().manual_seed(seed)
        loader = DataLoader(train_set, batch_size=dp.batch_size, shuffle=True,
                            generator=shuffle_gen)
    else:
        loader = DPDataLoader(train_set, sample_rate=sample_rate)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Secure RNG turned off")
        model, opt, loader = engine.make_private(
            module=model,
            optimizer=make_optimizer(model, dp),
            data_loader=loader,
            noise_multiplier=dp.noise_multiplier,
            poisson_sampling=False,  # the loader above already samples
            grad_sample_mode="hooks",
            **clipping_options(model, dp),
        )
    return engine, model, opt, loader


def clipping_options(model: nn.Module, dp: DPSettings) -> dict:
    """``make_private``'s clipping arguments for ``dp.clipping``: flat C; per-layer C / sqrt(L)
    for each of the L trainable tensors (their combined bound is C, the noise sigma C);
    adaptive clipping starting at C with the settings' update rule and count noise."""
    if dp.clipping == "per_layer":
        n = sum(1 for p in model.parameters() if p.requires_grad)
        return {"clipping": "per_layer", "max_grad_norm": [dp.max_grad_norm / math.sqrt(n)] * n}
    if dp.clipping == "adaptive":
        lo, hi = dp.clipbounds()
        return {"clipping": "adaptive", "max_grad_norm": dp.max_grad_norm,
                "target_unclipped_quantile": dp.target_unclipped_quantile,
                "clipbound_learning_rate": dp.clipbound_learning_rate,
                "min_clipbound": lo, "max_clipbound": hi,
                "unclipped_num_std": dp.count_std()}
    return {"max_grad_norm": dp.max_grad_norm}


def _physical_batches(loader, dp: DPSettings, opt):
    """The loader's batches, split by Opacus' BatchMemoryManager when
    ``dp.max_physical_batch_size`` is set (a context manager either way)."""
    if not dp.max_physical_batch_size:
        return contextlib.nullcontext(loader)
    return BatchMemoryManager(data_loader=loader,
                              max_physical_batch_size=dp.max_physical_batch_size, optimizer=opt)


def train_plain(model: nn.Module, train_set: Dataset, dp: DPSettings, sample_rate: float,
                steps: int, seed: int = 0) -> tuple[float, int]:
    """The same DP-SGD training as ``train_audited`` without the audit: no hook, no canary
    scores, no planted bug (Poisson sampling at ``sample_rate``, ``steps`` optimizer steps).
    Returns (seconds, optimizer steps taken): the baseline of the audited / plain training
    ratio (``benchmarks/presets.py --ratio``). ``model`` is trained in place."""
    device = next(model.parameters()).device
    start = time.perf_counter()
    with _seeded(device, seed):
        engine, model, opt, loader = _make_private(model, train_set, dp, sample_rate, seed,
                                                   False)
        bmm = _physical_batches(loader, dp, opt)
        model.train()
        done = 0
        with bmm as batches, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            while done < steps:
                for x, y in batches:
                    opt.zero_grad(set_to_none=True)
                    loss = LOSS(model(x.to(device)), y.to(device))
                    loss.backward()
                    opt.step()
                    # the accountant records every step the optimizer takes (not the skipped
                    # ones of BatchMemoryManager's accumulation)
                    done = sum(int(h[2]) for h in engine.accountant.history)
                    if done >= steps:
                        break
    model.eval()
    return time.perf_counter() - start, done


def train_audited(
    model: nn.Module,
    train_set: Dataset,
    test_set: Dataset | None,
    dp: DPSettings,
    sample_rate: float,
    canaries,
    scores: list[StepScore],
    params=None,
    seed: int = 0,
    *,
    steps: int,
    reference: tuple | None = None,
    progress: bool = True,
    coordinates=None,
    sampling: str = "poisson",
    noise_probes=None,
    check_clipping: bool = True,
    white_box: bool = True,
    keep_per_step: bool | None = None,
    data_rate=None,
) -> TrainingOutcome:
    """Train ``model`` with DP-SGD on ``train_set`` for ``steps`` optimizer steps (the plan's
    T: ``experiment.plan.total_steps``), Poisson sampling at ``sample_rate``.

    ``canaries`` / ``scores`` / ``params`` / ``reference`` / ``coordinates`` (a coordinate view)
    go to ``AuditHook``, with ``noise_probes`` (coordinates no example touches) and
    ``check_clipping`` for the white-box checks (``experiment.judging.white_box``, whose records
    the outcome carries); ``white_box=False`` skips them: no probes, no clipping check, no
    per-step values; ``keep_per_step`` (default: ``white_box``) keeps the scores' per-step
    values (the per-step histogram PLD estimate; a multi-run audit's runs keep their records but
    not these). The model is trained in place on its own device. ``sampling="shuffle"`` (seed
    001's Figure 3 setting; not for audits, Opacus' accountants assume Poisson sampling) draws
    shuffled batches of ``dp.batch_size`` instead, each example once per epoch, and
    ``sample_rate`` becomes 1 / (batches per epoch) (``shuffle_sample_rate``). The planted bug
    ``dp.bug=shuffled_batches`` draws such batches too, while the audit keeps claiming Poisson
    sampling at ``sample_rate``.
    """
    device = next(model.parameters()).device
    keep_per_step = white_box if keep_per_step is None else bool(keep_per_step)
    require_choice("sampling", sampling, SAMPLINGS)
    if sampling == "shuffle":
        sample_rate = shuffle_sample_rate(len(train_set), dp.batch_size)
    shuffled = sampling == "shuffle"
    start = time.perf_counter()
    if data_rate is not None:  # the audited selection, named before the block joins the model
        params = resolve_parameter_names(model, params)
    with _seeded(device, seed):
        if data_rate is not None:
            rate_block.add_block(model, data_rate)
        engine, model, opt, loader = _make_private(model, train_set, dp, sample_rate, seed,
                                                   shuffled)
        spec = check_bug(dp.bug, dp.bug_factor)
        if spec is None:
            remove_bug = lambda: None  # noqa: E731
        elif spec.optimizer:
            remove_bug = plant_bug(opt, dp.bug, dp.bug_factor)
        else:  # a sampling bug: the loader's sampler
            remove_bug = plant_sampler_bug(loader, dp.bug, dp.bug_factor)
        hook_canaries, hook_scores = canaries, scores
        if data_rate is not None:
            params, coordinates, hook_canaries = rate_block.hook_inputs(
                model, data_rate, canaries, params, coordinates)
            hook_scores = [*scores, rate_block.mixture_score(data_rate)]
        hook = AuditHook(
            opt,
            model,
            hook_canaries,
            scores=hook_scores,
            params=params,
            reference=reference,
            coordinates=coordinates,
            sample_rate=sample_rate,  # the claimed rate, not what an accountant was told
            noise_probes=noise_probes if white_box else None,
            check_clipping=check_clipping and white_box,
            seed=seed,
            # the per-step histogram PLD estimate: of the audited canaries only
            keep_per_step=(len(canaries) if keep_per_step and data_rate is not None
                           else keep_per_step),
            data_loader=loader if white_box else None,  # which examples each step used
            check_integrity=white_box,
            check_noise_data=white_box,
        )
        bmm = _physical_batches(loader, dp, opt)
        bar = tqdm(total=steps, desc="DP-SGD (audited)", disable=not progress, leave=False)
        model.train()
        with hook, bmm as batches, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            while hook.steps < steps:
                for x, y in batches:
                    opt.zero_grad(set_to_none=True)
                    loss = LOSS(model(x.to(device)), y.to(device))
                    loss.backward()
                    before = hook.steps
                    opt.step()
                    bar.update(hook.steps - before)
                    if hook.steps >= steps:
                        break
        bar.close()
        remove_bug()
    model.eval()
    acc = accuracy(model, test_set, device) if test_set is not None else float("nan")
    audited = len(hook.canaries[0])
    rungs = (rung_scores(hook, 0, 0, audited)
             if len(hook.canaries) == 1 or data_rate is not None else None)
    scores_, inclusions = hook.scores(), hook.inclusions()
    per_step = hook.per_step() if keep_per_step else None
    rate = None
    if data_rate is not None:  # the audited canaries' values, and the data-rate set's apart
        ok, why = seen_independent(hook, 1)
        rate = {"scores": scores_.pop(rate_block.SCORE)[audited:], "independent": ok,
                "independence": why}
        scores_ = {k: v[:audited] for k, v in scores_.items()}
        inclusions = inclusions[:audited]
        if per_step is not None:  # kept for the audited canaries only
            per_step = {k: v for k, v in per_step.items() if k != rate_block.SCORE}
    return TrainingOutcome(
        scores=scores_,
        inclusions=inclusions,
        steps=hook.steps,
        sample_rate=sample_rate,
        accountants=engine_epsilons(engine, dp.delta),
        test_accuracy=acc,
        seconds=time.perf_counter() - start,
        white_box=hook.white_box_records(
            sampling={"n": len(train_set), "q": sample_rate,
                      "loader": "shuffled" if shuffled else "poisson"},
            accountant_history=engine.accountant.history,
            accountant=engine.accountant.mechanism(),
        ) if white_box else None,
        per_step=per_step,
        rungs=rungs,
        data_rate=rate,
    )
