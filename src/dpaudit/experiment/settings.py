"""Typed settings of one audit, one dataclass per Hydra config group (data, model, dp, ...).

Hydra passes plain mappings; ``AuditSettings.from_mappings`` turns them into these objects and
every field is checked here, once, with an error that names the group and the field. The names
of data sets, input-canary sources and attack scores come from the registries next to their
code (``dpaudit.data.DATASETS``, ``dpaudit.canaries.INPUT_SOURCES``,
``dpaudit.experiment.scores.SCORES``), read when a check needs them so this module stays cheap
to import; ``settings.DATASETS`` / ``INPUT_SOURCES`` / ``ATTACKS`` give the names as tuples.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from dpaudit.experiment.bugs import BUGS

CANARY_KINDS = ("gradient", "input")
DIRECTIONS = ("dirac", "random")
GRADIENT_POLICIES = ("every_step", "bernoulli")
VIEWS = ("full", "auto")
SELECTIONS = ("top", "easy", "medium", "hard", "stratified", "random")
MODES = ("one_run", "multi_run")
OPTIMIZERS = ("sgd", "adam")


def _registry_names(name: str) -> tuple[str, ...]:
    """The names a registry holds, imported on first use (the registries import torch)."""
    if name == "DATASETS":
        from dpaudit.data import DATASETS as registry
    elif name == "INPUT_SOURCES":
        from dpaudit.canaries.sources import INPUT_SOURCES as registry
    else:
        from dpaudit.experiment.scores import SCORES as registry
    return tuple(registry)


def __getattr__(name: str) -> tuple[str, ...]:
    """``DATASETS``, ``INPUT_SOURCES`` and ``ATTACKS``: the allowed names, from the registries."""
    if name in ("DATASETS", "INPUT_SOURCES", "ATTACKS"):
        return _registry_names(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _fail(group: str, name: str, expected: str, got: Any) -> None:
    raise ValueError(f"{group}.{name} must be {expected}, got {got!r}")


def _positive(group, name, v, integer=False):
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
    if integer:
        ok = ok and int(v) == v
    if not ok:
        _fail(group, name, "a positive " + ("integer" if integer else "number"), v)


def _choice(group, name, v, options):
    if v not in options:
        _fail(group, name, f"one of {options}", v)


def _unit(group, name, v, closed_right=False):
    num = isinstance(v, (int, float)) and not isinstance(v, bool)
    ok = num and (0 < v < 1 or (closed_right and v == 1))
    if not ok:
        _fail(group, name, "in (0, 1]" if closed_right else "in (0, 1)", v)


@dataclass
class DataSettings:
    name: str = "digits"
    n_train: int | None = None
    test_fraction: float = 0.25
    root: str = "data"
    download: bool = False
    options: dict = field(default_factory=dict)  # synthetic generator options

    def load(self, seed: int):
        """``(train, test, info)`` of this data set for ``seed`` (``dpaudit.data.load_dataset``)."""
        from dpaudit.data import load_dataset

        return load_dataset(
            self.name,
            seed=seed,
            test_fraction=self.test_fraction,
            n_train=self.n_train,
            root=self.root,
            download=self.download,
            **self.options,
        )

    def check(self) -> None:
        _choice("data", "name", self.name, _registry_names("DATASETS"))
        if self.n_train is not None:
            _positive("data", "n_train", self.n_train, integer=True)
        _unit("data", "test_fraction", self.test_fraction)


@dataclass
class ModelSettings:
    name: str = "logreg"
    width: int = 16

    def check(self) -> None:
        from dpaudit.models import MODELS

        _choice("model", "name", self.name, MODELS)
        _positive("model", "width", self.width, integer=True)


@dataclass
class DPSettings:
    noise_multiplier: float = 1.0
    max_grad_norm: float = 1.0
    batch_size: int = 64  # expected Poisson batch size: sample_rate = batch_size / n_train
    epochs: float = 1.0
    steps: int | None = None  # overrides epochs when set
    lr: float = 0.5
    optimizer: str = "sgd"
    momentum: float = 0.0
    delta: float = 1e-5
    max_physical_batch_size: int | None = None  # BatchMemoryManager when set
    bug: str = "none"
    bug_factor: float = 0.5  # bug=scaled_noise: the noise is bug_factor x sigma

    def check(self) -> None:
        _positive("dp", "noise_multiplier", self.noise_multiplier)
        _positive("dp", "max_grad_norm", self.max_grad_norm)
        _positive("dp", "batch_size", self.batch_size, integer=True)
        _positive("dp", "epochs", self.epochs)
        if self.steps is not None:
            _positive("dp", "steps", self.steps, integer=True)
        _positive("dp", "lr", self.lr)
        _choice("dp", "optimizer", self.optimizer, OPTIMIZERS)
        if not 0 <= self.momentum < 1:
            _fail("dp", "momentum", "in [0, 1)", self.momentum)
        _unit("dp", "delta", self.delta)
        if self.max_physical_batch_size is not None:
            _positive("dp", "max_physical_batch_size", self.max_physical_batch_size, integer=True)
        _choice("dp", "bug", self.bug, BUGS)
        if not (isinstance(self.bug_factor, (int, float)) and 0 < self.bug_factor <= 1):
            _fail("dp", "bug_factor", "in (0, 1]", self.bug_factor)


@dataclass
class CanarySettings:
    kind: str = "gradient"
    count: int = 500
    # gradient canaries
    direction: str = "dirac"
    norm: float | None = None  # default: the clip norm C; must be <= C
    policy: str = "every_step"
    inclusion_prob: float | None = None  # q_c for policy=bernoulli; default: the sample rate
    params: list[str] | None = None  # parameter / module names the canaries live in
    # "auto": Dirac canaries are recorded and scored in the coordinate view of their own
    # coordinates (AuditHook(coordinates=...)), O(K^2) per step instead of O(K d)
    view: str = "full"
    # input canaries (Algorithm 3)
    source: str = "mislabeled"
    selection: str = "top"
    candidates: int = 200
    n_references: int = 128
    estimator: str = "ledoit_wolf"
    # source=crafted: value of the one non-zero input feature (gradient norm grows with it)
    crafted_value: float = 100.0

    def check(self) -> None:
        _choice("canary", "kind", self.kind, CANARY_KINDS)
        _positive("canary", "count", self.count, integer=True)
        _choice("canary", "direction", self.direction, DIRECTIONS)
        if self.norm is not None:
            _positive("canary", "norm", self.norm)
        _choice("canary", "policy", self.policy, GRADIENT_POLICIES)
        _choice("canary", "view", self.view, VIEWS)
        if self.inclusion_prob is not None:
            _unit("canary", "inclusion_prob", self.inclusion_prob, closed_right=True)
        _choice("canary", "source", self.source, _registry_names("INPUT_SOURCES"))
        _choice("canary", "selection", self.selection, SELECTIONS)
        _positive("canary", "candidates", self.candidates, integer=True)
        _positive("canary", "n_references", self.n_references, integer=True)
        _positive("canary", "crafted_value", self.crafted_value)


@dataclass
class AttackSettings:
    scores: list[str] = field(default_factory=lambda: ["scalar"])
    estimator: str = "ledoit_wolf"  # covariance / glir precision estimator
    n_references: int = 128

    def check(self) -> None:
        attacks = _registry_names("ATTACKS")
        if not self.scores:
            _fail("attack", "scores", f"a non-empty list from {attacks}", self.scores)
        for s in self.scores:
            _choice("attack", "scores", s, attacks)
        _positive("attack", "n_references", self.n_references, integer=True)


@dataclass
class AuditModeSettings:
    mode: str = "one_run"
    runs: int = 1  # multi_run: number of training runs (one membership bit each)
    methods: list[str] = field(default_factory=lambda: ["gdp", "gaussian", "clopper_pearson"])
    confidence: float = 0.95
    inclusion: float = 0.5  # probability that a canary is a member

    def check(self) -> None:
        from dpaudit.stats import METHODS

        _choice("audit", "mode", self.mode, MODES)
        _positive("audit", "runs", self.runs, integer=True)
        for m in self.methods:
            _choice("audit", "methods", m, METHODS)
        _unit("audit", "confidence", self.confidence)
        _unit("audit", "inclusion", self.inclusion)


@dataclass
class AuditSettings:
    data: DataSettings = field(default_factory=DataSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    dp: DPSettings = field(default_factory=DPSettings)
    canary: CanarySettings = field(default_factory=CanarySettings)
    attack: AttackSettings = field(default_factory=AttackSettings)
    audit: AuditModeSettings = field(default_factory=AuditModeSettings)
    seed: int = 0
    device: str | None = None  # default: CUDA when available, else CPU
    progress: bool = True

    @classmethod
    def from_mappings(cls, **groups: Any) -> AuditSettings:
        """Build from plain dicts (Hydra groups); unknown keys are errors naming the group."""
        kinds = {f.name: f for f in fields(cls)}
        values = {}
        for name, value in groups.items():
            if name not in kinds:
                raise ValueError(f"unknown audit setting {name!r}; expected one of {list(kinds)}")
            factory = kinds[name].default_factory
            sub = factory() if callable(factory) else None
            if sub is not None and hasattr(sub, "check"):
                value = _build(type(sub), name, value)
            values[name] = value
        out = cls(**values)
        out.check()
        return out

    def check(self) -> None:
        for part in (self.data, self.model, self.dp, self.canary, self.attack, self.audit):
            part.check()
        if self.dp.bug == "realised_batch_size" and self.dp.max_physical_batch_size:
            _fail("dp", "max_physical_batch_size", "unset with bug=realised_batch_size", 1)
        c = self.canary
        if self.audit.mode == "multi_run" and c.count > 1:
            if c.kind != "gradient" or c.direction != "dirac":
                raise ValueError(
                    f"canary.count={c.count} with audit.mode=multi_run needs canary.kind=gradient "
                    "and canary.direction=dirac: all canaries of a run share one membership bit, "
                    "so other canaries form a group of records and the one-record claim does not "
                    "apply (Dirac canaries on dead coordinates do not see each other); use "
                    "canary.count=1"
                )

    def to_dict(self) -> dict:
        return asdict(self)


def _build(kind, group: str, value):
    if isinstance(value, kind):
        return value
    if value is None:
        return kind()
    if not isinstance(value, dict):
        raise ValueError(f"{group} must be a mapping of settings, got {type(value).__name__}")
    allowed = {f.name for f in fields(kind)}
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ValueError(f"unknown {group} setting(s) {unknown}; allowed: {sorted(allowed)}")
    return kind(**value)
