"""The audit's plan: the settings resolved once into frozen, typed run inputs.

``plan_audit(settings)`` is where ``AuditSettings`` (the Hydra schema) stops: it resolves the
device, the canary design with its typed options and context, the attack scores and the
judging choices into an ``AuditPlan``. Everything below the orchestration (the trainings and
judging wings, the canary designs, the scores) receives these records, never the settings.
What depends on the data and the canaries built (the data's sample rate q, the number of
steps T, Opacus' expected batch size, what the design realises, the threat model, whether the
canaries are independent experiments) is derived once per prepared run by ``derive`` into a
``RunPlan``. Each of these values has exactly one function computing it, here
(``tests/test_architecture.py`` finds the calls): ``resolve_device``, ``poisson_sample_rate``,
``total_steps``, ``expected_batch_size``, ``threat_model``, ``independent_canaries``, and
the one-run membership draw ``draw_membership`` (a multi-run audit's bits are
``seeds.run_bit``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpaudit import seeds
from dpaudit.experiment.canary_designs import CanaryDesign, DesignContext, Realisation
from dpaudit.experiment.settings import (
    AttackSettings,
    AuditSettings,
    DataSettings,
    DPSettings,
    ModelSettings,
)
from dpaudit.threat_model import ThreatModel

__all__ = [
    "AuditPlan",
    "CanaryPlan",
    "Judging",
    "RunPlan",
    "derive",
    "draw_membership",
    "expected_batch_size",
    "membership_counts",
    "plan_audit",
    "planned_threat_model",
    "poisson_sample_rate",
    "resolve_device",
    "threat_model",
    "total_steps",
]


@dataclass(frozen=True)
class CanaryPlan:
    """The canaries: the design (typed interface), its options and context, the parameters
    they live in (None: all), the number of reference examples drawn for them, and the
    canaries inserted like an example beside them (``lower_side`` per side, on a canary block
    of the audit's own; 0: none, ``lower_side_note`` says why: ``AuditSettings.
    lower_side_per_side``)."""

    kind: str
    design: CanaryDesign
    options: Any
    context: DesignContext
    params: tuple[str, ...] | None
    n_references: int
    lower_side: int = 0
    lower_side_note: str = ""

    @property
    def count(self) -> int:
        return self.context.count


@dataclass(frozen=True)
class Judging:
    """How scores become evidence: the bound methods, the confidence of all statements
    together, the PRIVACY BUG level, the membership design (each canary, or run, a member with
    probability ``inclusion``), the audit mode and, multi-run, the number of runs."""

    methods: tuple[str, ...]
    confidence: float
    refutation_level: float
    inclusion: float
    mode: str
    runs: int
    threat_model: str = "white_box"  # the verdict's rung of the threat-model ladder


@dataclass(frozen=True)
class AuditPlan:
    """Everything an audit's runs need, resolved once from its settings (module doc).

    ``data`` / ``model`` / ``dp`` / ``attack``: the frozen groups each leaf reads (the data
    loader, the architecture, DP-SGD's optimizer, the scores' estimator); ``scores``: the attack
    scores to compute (the design's default when ``attack.scores`` is null)."""

    seed: int
    device: Any  # torch.device
    progress: bool
    data: DataSettings
    model: ModelSettings
    dp: DPSettings
    canary: CanaryPlan
    attack: AttackSettings
    scores: tuple[str, ...]
    judging: Judging

    def quiet(self) -> AuditPlan:
        """The same plan without progress bars (a multi-run audit's runs: one bar, its own)."""
        return dataclasses.replace(self, progress=False)


@dataclass(frozen=True)
class RunPlan:
    """What a prepared run derives from the plan and the canaries built: the data's Poisson
    sample rate q (on the training data without canaries), the number of steps T, Opacus'
    expected batch size, what the design realises, the threat model (the claim under test)
    and whether each canary is an independent one-canary experiment."""

    sample_rate: float
    steps: int
    expected_batch_size: int
    realised: Realisation
    threat: ThreatModel
    independent: bool


def plan_audit(settings: AuditSettings) -> AuditPlan:
    """The ``AuditPlan`` of checked ``settings``: the one place the settings are read.

    A device this machine cannot use is refused here, before any data is loaded
    (``resolve_device``)."""
    c, a, design = settings.canary, settings.audit, settings.design()
    lower, lower_note = settings.lower_side_per_side()
    return AuditPlan(
        seed=settings.seed,
        device=resolve_device(settings.device),
        progress=bool(settings.progress),
        data=settings.data,
        model=settings.model,
        dp=settings.dp,
        canary=CanaryPlan(
            kind=c.kind, design=design, options=design.options(c),
            context=settings.design_context(),
            params=None if c.params is None else tuple(c.params), n_references=c.n_references,
            lower_side=lower, lower_side_note=lower_note,
        ),
        attack=settings.attack,
        scores=tuple(settings.attack_scores()),
        judging=Judging(methods=tuple(a.methods), confidence=a.confidence,
                        refutation_level=a.refutation_level, inclusion=a.inclusion,
                        mode=a.mode, runs=a.runs, threat_model=a.threat_model),
    )


def available_devices() -> list[str]:
    """The torch devices this build and machine can use (``cpu``, ``cuda:N``, ``mps``)."""
    import torch

    out = ["cpu"]
    if torch.cuda.is_available():
        out += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    return out


def resolve_device(name: str | None):
    """The torch device ``name`` names (the ``device`` setting), or CUDA when available, else
    CPU when it is None.

    A device this torch build or machine cannot use is a ValueError naming ``device`` and the
    devices that are available (before any data is loaded or model trained).
    """
    import torch

    if not name:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    have = ", ".join(available_devices())
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError) as err:
        msg = f"device={name!r} is not a torch device ({err}); available: {have}"
        raise ValueError(msg) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device={name!r}, but CUDA is not available to this torch build "
                f"(torch {torch.__version__}, torch.cuda.is_available() is False); available: "
                f"{have} (device=null picks CUDA when there is one, else CPU)"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device={name!r}: there is no such GPU; available: {have}")
    elif dev.type != "cpu" and dev.type not in {d.split(":")[0] for d in available_devices()}:
        raise ValueError(f"device={name!r} is not available here; available: {have}")
    return dev


def poisson_sample_rate(batch_size: int, n_train: int) -> float:
    """q = 1 / round(n_train / batch_size) on ``n_train`` examples without canaries: Opacus'
    accountant reads 1 / len(loader), so q is the reciprocal of a whole number of steps per
    epoch and both sides agree exactly; the same in every run of an audit."""
    if batch_size > n_train:
        raise ValueError(
            f"dp.batch_size ({batch_size}) exceeds the training set size ({n_train})"
        )
    return 1.0 / max(1, round(n_train / batch_size))


def total_steps(dp: DPSettings, sample_rate: float) -> int:
    """Optimizer steps of a run: ``dp.steps``, or ``dp.epochs`` / q when it is null."""
    if dp.steps is not None:
        return int(dp.steps)
    return max(1, round(dp.epochs / sample_rate))


def expected_batch_size(n_train: int, sample_rate: float) -> int:
    """Opacus' expected batch size of Poisson sampling at ``sample_rate`` from ``n_train``
    examples (what its optimizer divides the noisy sum by)."""
    return max(1, int(n_train * sample_rate))


def data_context(plan: AuditPlan, n_train: int) -> DesignContext:
    """The plan's ``DesignContext`` with the data's sample rate on ``n_train`` examples."""
    rate = poisson_sample_rate(plan.dp.batch_size, n_train)
    return dataclasses.replace(plan.canary.context, data_sample_rate=rate)


def threat_model(realised: Realisation, *, noise_multiplier: float, max_grad_norm: float,
                 sample_rate: float, steps: int, delta: float) -> ThreatModel:
    """The ``ThreatModel`` of canaries that realise ``realised`` in DP-SGD with this noise
    multiplier and clip norm, on data drawn at the Poisson ``sample_rate`` for ``steps``
    steps, claimed at ``delta``: the audit's (``derive``) and the own loop's
    (``judging.loop_report``, from the hook) alike."""
    rate = sample_rate if realised.member_rate is None else realised.member_rate
    return ThreatModel(
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        sample_rate=float(rate),
        steps=int(steps),
        delta=delta,
        canary_kind=realised.kind,
        canary_norm=realised.norm,
        training_sample_rate=float(sample_rate),
    )


def planned_threat_model(plan: AuditPlan, realised: Realisation, sample_rate: float,
                         steps: int) -> ThreatModel:
    """``threat_model`` with the plan's noise multiplier, clip norm and delta."""
    dp = plan.dp
    return threat_model(realised, noise_multiplier=dp.noise_multiplier,
                        max_grad_norm=dp.max_grad_norm, sample_rate=sample_rate, steps=steps,
                        delta=dp.delta)


def recorded_threat_model(plan: AuditPlan, sample_rate: float, steps: int,
                          canary_norm: float | None) -> ThreatModel:
    """The threat model of a run file that did not store one (an older dpaudit's): the
    design's realisation at the file's sample rate, steps and canary norm."""
    c = plan.canary
    ctx = dataclasses.replace(c.context, data_sample_rate=sample_rate)
    realised = c.design.realises(c.options, ctx)
    if canary_norm is not None:
        realised = dataclasses.replace(realised, norm=canary_norm)
    return planned_threat_model(plan, realised, sample_rate, steps)


def recorded_independence(plan: AuditPlan, canary_info: dict) -> bool:
    """``independent_canaries`` of a run file that did not store it (dpaudit 0.1's): the
    design's realisation read from the file's canary info."""
    c = plan.canary
    realised = c.design.realises(c.options, c.context, _InfoOnly(canary_info or {}))
    return independent_canaries(plan.judging, c.count, realised)


@dataclass(frozen=True)
class _InfoOnly:
    info: dict


def independent_canaries(judging: Judging, count: int, realised: Realisation | None) -> bool:
    """True when every canary's (score, membership) is an independent one-canary experiment:
    multi-run audits with one canary per run, and canaries that do not see each other because
    each sits on coordinates no data gradient touches (``Realisation.on_dead_coordinates``),
    in any mode."""
    if judging.mode == "multi_run" and count == 1:
        return True
    return bool(realised is not None and realised.on_dead_coordinates)


def derive(plan: AuditPlan, setup) -> RunPlan:
    """The ``RunPlan`` of a run whose canaries were built (``setup``: a ``CanarySetup``): q on
    the training data without the canaries (input canaries drawn from the data are held out
    first), so the same in every run of an audit."""
    ctx = data_context(plan, setup.n_base)
    q = ctx.data_sample_rate
    steps = total_steps(plan.dp, q)
    c = plan.canary
    realised = c.design.realises(c.options, ctx, setup)
    if not isinstance(realised, Realisation):
        raise TypeError(f"canary design {c.kind!r}: realises() must return a Realisation, got "
                        f"{type(realised).__name__}")
    return RunPlan(
        sample_rate=q,
        steps=steps,
        expected_batch_size=expected_batch_size(len(setup.train_set), q),
        realised=realised,
        threat=planned_threat_model(plan, realised, q, steps),
        independent=independent_canaries(plan.judging, c.count, realised),
    )


def draw_membership(plan: AuditPlan) -> np.ndarray:
    """Independent Bernoulli(inclusion) membership bits, one per canary (one-run audits)."""
    rng = seeds.stream(plan.seed, seeds.MEMBERSHIP)
    return rng.random(plan.canary.count) < plan.judging.inclusion


def membership_counts(plan: AuditPlan) -> tuple[int, int]:
    """(members, non-members) among the scores the audit will pool, from the seeded draws
    alone (no training). An audit without both is refused: a ValueError says why."""
    j, count, seed = plan.judging, plan.canary.count, plan.seed
    if j.mode == "multi_run":
        with_canary = sum(seeds.run_bit(seed, r, j.inclusion) for r in range(j.runs))
        if with_canary in (0, j.runs):
            raise ValueError(
                f"audit.runs={j.runs} with audit.inclusion={j.inclusion} (seed {seed}) "
                f"draws {with_canary} runs with the canary and {j.runs - with_canary} without: "
                "a bound compares both; raise audit.runs or bring audit.inclusion toward 0.5"
            )
        return with_canary * count, (j.runs - with_canary) * count
    members = int(draw_membership(plan).sum())
    if members in (0, count):
        raise ValueError(
            f"canary.count={count} with audit.inclusion={j.inclusion} (seed {seed}) "
            f"draws {members} members and {count - members} non-members: a bound compares "
            "both; raise canary.count or bring audit.inclusion toward 0.5"
        )
    return members, count - members
