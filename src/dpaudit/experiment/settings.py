"""Typed settings of one audit, one dataclass per Hydra config group (data, model, dp, ...).

These dataclasses are the one source of defaults: ``AuditSettings()`` is the audit that
``dpaudit`` runs with no arguments, and the CLI registers them as Hydra's structured-config
schema (``dpaudit.conf``), so the YAML group files list only what differs. Each field carries a
one-line ``help`` (and, where the values are a closed set, ``choices``) in its metadata; the
CLI's ``--help`` (``dpaudit.conf.describe_settings``) is generated from them.

Hydra passes plain mappings; ``AuditSettings.from_mappings`` turns them into these objects and
every field is checked here, once, with an error that names the group and the field. The names
of data sets, models, input-canary sources, attack scores, bound methods, planted bugs and
covariance estimators come from the registries next to their code, read when a check needs
them so this module stays cheap to import (no torch); ``settings.DATASETS`` /
``INPUT_SOURCES`` / ``ATTACKS`` give the names as tuples.
"""

from __future__ import annotations

import sys
from dataclasses import MISSING, asdict, dataclass, field, fields
from types import SimpleNamespace
from typing import Any

from dpaudit import names
from dpaudit._validate import (
    is_finite_number,
    refuse,
    require_choice,
    require_integer,
    require_known,
    require_level,
    require_nonnegative,
    require_positive,
    require_unit,
)
from dpaudit.experiment.canary_designs import CanaryDesign, DesignContext, design_of
from dpaudit.experiment.canary_designs.gradient import (
    DIRECTIONS,
    GRADIENT_POLICIES,
    PLACEMENTS,
    VIEWS,
)
from dpaudit.experiment.canary_designs.inputs import CANARY_SELECTIONS

MODES = ("one_run", "multi_run")
THREAT_MODELS = names.THREAT_MODELS
MODEL_INITS = names.MODEL_INITS
COORDINATIONS = names.COORDINATIONS
REQUIREMENTS = names.REQUIREMENTS
OPTIMIZERS = ("sgd", "adam")
# canary.lower_side's largest value: its block (2 x this many coordinates) costs every step a
# per-example gradient of that many zeros and as many noise draws
LOWER_SIDE_MAX = 1_000_000
# the attack scores that read each Dirac canary's own coordinate only (the hook's DiracRows):
# beside them the canary block's canaries are independent experiments
LOWER_SIDE_SCORES = ("scalar", "mixture_lr")


def _registry_names(name: str) -> tuple[str, ...]:
    """The names a registry holds: the live registry once its module is imported (names
    registered at run time count), else the names ``dpaudit.names`` declares without
    importing torch (``--help``, config errors)."""
    module, attr = names.REGISTRIES[name]
    loaded = sys.modules.get(module)
    if loaded is not None and hasattr(loaded, attr):
        return tuple(getattr(loaded, attr))
    return tuple(getattr(names, name))


def __getattr__(name: str) -> tuple[str, ...]:
    """``DATASETS``, ``INPUT_SOURCES`` and ``ATTACKS``: the allowed names, from the registries."""
    if name in ("DATASETS", "INPUT_SOURCES", "ATTACKS"):
        return _registry_names(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _opt(default: Any = MISSING, help: str = "", choices: Any = None, factory: Any = None):
    """A dataclass field with its one-line ``help`` and allowed values (``choices``: a tuple, or
    the name of a registry in ``dpaudit.names``) in the metadata the CLI's help is built from."""
    meta = {"help": help, "choices": choices}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def choices_of(f) -> tuple[str, ...] | None:
    """The allowed values of a settings field (``dataclasses.Field``), or None if open."""
    ch = f.metadata.get("choices")
    if isinstance(ch, str):
        return _registry_names(ch)
    return None if ch is None else tuple(ch)


@dataclass(frozen=True)
class DataSettings:
    """The training data (``data`` group): a registered data set and its split."""

    name: str = _opt("digits", "data set (digits ships with the package)", "DATASETS")
    n_train: int | None = _opt(None, "use only this many training examples (null: all)")
    test_fraction: float = _opt(0.25, "fraction held out for test accuracy, in (0, 1)")
    root: str = _opt("data", "directory of downloaded data sets")
    download: bool = _opt(False, "download the data set into root if missing")
    options: dict = _opt(  # noqa: RUF009 (_opt returns a dataclasses.field)
        help="generator options of data=synthetic (n, dim, num_classes)", factory=dict
    )

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
        require_choice("data.name", self.name, _registry_names("DATASETS"))
        if self.n_train is not None:
            require_positive("data.n_train", self.n_train, integer=True)
        require_unit("data.test_fraction", self.test_fraction)


@dataclass(frozen=True)
class ModelSettings:
    """The model trained with DP-SGD (``model`` group)."""

    name: str = _opt("mlp", "architecture", "MODELS")
    width: int = _opt(400, "hidden width (mlp) / channels per conv layer (cnn); unused by logreg")
    init: str = _opt("random", "the initial model: random, or pretrained (plain SGD, not "
                     "private, on the training split's records outside data.n_train: "
                     "Annamalai & De Cristofaro's worst-case initial model)", MODEL_INITS)
    pretrain_epochs: int = _opt(5, "init=pretrained: epochs of pre-training")
    pretrain_lr: float = _opt(0.01, "init=pretrained: pre-training learning rate, > 0")
    pretrain_batch_size: int = _opt(32, "init=pretrained: pre-training batch size")

    def check(self) -> None:
        require_choice("model.name", self.name, _registry_names("MODELS"))
        require_positive("model.width", self.width, integer=True)
        require_choice("model.init", self.init, MODEL_INITS)
        require_positive("model.pretrain_epochs", self.pretrain_epochs, integer=True)
        require_positive("model.pretrain_lr", self.pretrain_lr)
        require_positive("model.pretrain_batch_size", self.pretrain_batch_size, integer=True)


CLIPPINGS = ("flat", "per_layer", "adaptive")


@dataclass(frozen=True)
class DPSettings:
    """DP-SGD with Poisson sampling (``dp`` group): sample rate = batch_size / n_train."""

    noise_multiplier: float = _opt(1.0, "sigma: noise std / clip norm, > 0")
    max_grad_norm: float = _opt(1.0, "clip norm C, > 0")
    batch_size: int = _opt(64, "expected Poisson batch size (sample rate = batch_size / n_train)")
    epochs: float = _opt(1.0, "training length in epochs (ignored when steps is set)")
    steps: int | None = _opt(100, "number of steps T; overrides epochs (null: use epochs)")
    lr: float = _opt(0.5, "learning rate, > 0")
    optimizer: str = _opt("sgd", "optimizer wrapped by Opacus", OPTIMIZERS)
    momentum: float = _opt(0.0, "SGD momentum, in [0, 1)")
    delta: float = _opt(1e-5, "delta of the (epsilon, delta) claim, in (0, 1)")
    max_physical_batch_size: int | None = _opt(
        None, "split logical batches for memory (Opacus BatchMemoryManager); null: off"
    )
    clipping: str = _opt(
        "flat", "Opacus' clipping: flat (one bound C), per_layer (each of the L parameter "
        "tensors clipped to C / sqrt(L); noise sigma C) or adaptive (AdaClipDPOptimizer, the "
        "bound starting at C)", CLIPPINGS)
    target_unclipped_quantile: float = _opt(
        0.5, "clipping=adaptive: the share of examples the bound aims to leave unclipped, "
        "in (0, 1)")
    clipbound_learning_rate: float = _opt(0.2, "clipping=adaptive: the bound's learning "
                                          "rate, > 0")
    min_clipbound: float | None = _opt(None, "clipping=adaptive: the smallest bound "
                                       "(null: C / 100)")
    max_clipbound: float | None = _opt(None, "clipping=adaptive: the largest bound "
                                       "(null: 100 C)")
    unclipped_num_std: float | None = _opt(
        None, "clipping=adaptive: the std of the count's noise, > noise_multiplier / 2 "
        "(null: the larger of batch_size / 20, Andrew et al.'s choice, and 2 sigma)")
    bug: str = _opt("none", "plant a known privacy bug in the optimizer (none: correct DP-SGD)",
                    "BUGS")
    bug_factor: float | None = _opt(
        None, "the bug's severity (null: its catastrophic one); what it means per bug: "
        "dpaudit.experiment.BUG_ZOO (scaled_noise: the noise is bug_factor x sigma)"
    )

    def check(self) -> None:
        require_positive("dp.noise_multiplier", self.noise_multiplier)
        require_positive("dp.max_grad_norm", self.max_grad_norm)
        require_positive("dp.batch_size", self.batch_size, integer=True)
        require_positive("dp.epochs", self.epochs)
        if self.steps is not None:
            require_positive("dp.steps", self.steps, integer=True)
        require_positive("dp.lr", self.lr)
        require_choice("dp.optimizer", self.optimizer, OPTIMIZERS)
        if not (is_finite_number(self.momentum) and 0 <= self.momentum < 1):
            refuse("dp.momentum", "in [0, 1)", self.momentum)
        require_unit("dp.delta", self.delta)
        if self.max_physical_batch_size is not None:
            require_positive("dp.max_physical_batch_size", self.max_physical_batch_size,
                             integer=True)
        require_choice("dp.clipping", self.clipping, CLIPPINGS)
        if self.clipping == "adaptive":
            if not (is_finite_number(self.target_unclipped_quantile)
                    and 0 < self.target_unclipped_quantile < 1):
                refuse("dp.target_unclipped_quantile", "in (0, 1)",
                       self.target_unclipped_quantile)
            require_positive("dp.clipbound_learning_rate", self.clipbound_learning_rate)
            lo, hi = self.clipbounds()
            require_positive("dp.min_clipbound", lo)
            if not hi > lo:
                refuse("dp.max_clipbound", f"above dp.min_clipbound = {lo}", hi)
            if self.unclipped_num_std is not None and not (
                    is_finite_number(self.unclipped_num_std)
                    and self.unclipped_num_std > self.noise_multiplier / 2):
                refuse("dp.unclipped_num_std",
                       f"a number above dp.noise_multiplier / 2 = {self.noise_multiplier / 2:g} "
                       "(Opacus' adaptive clipping needs sigma < 2 sigma_u)",
                       self.unclipped_num_std)
        require_choice("dp.bug", self.bug, _registry_names("BUGS"))
        if self.bug_factor is not None and not is_finite_number(self.bug_factor):
            refuse("dp.bug_factor", "null or a finite number", self.bug_factor)
        from dpaudit.bugs import check_bug

        check_bug(self.bug, self.bug_factor)

    def clipbounds(self) -> tuple[float, float]:
        """clipping=adaptive: (smallest, largest) bound, the defaults filled in."""
        lo = self.max_grad_norm / 100 if self.min_clipbound is None else self.min_clipbound
        hi = self.max_grad_norm * 100 if self.max_clipbound is None else self.max_clipbound
        return lo, hi

    def count_std(self) -> float:
        """clipping=adaptive: the count's noise std (the default filled in: the larger of
        batch_size / 20 and 2 sigma, so that the gradient's noise multiplier,
        (sigma^-2 - (2 sigma_u)^-2)^(-1/2), is at most 1.033 sigma)."""
        if self.unclipped_num_std is not None:
            return float(self.unclipped_num_std)
        return max(self.batch_size / 20, 2 * self.noise_multiplier)


@dataclass(frozen=True)
class CanarySettings:
    """The canaries (``canary`` group): gradient canaries inserted by the audit hook, or input
    canaries (seed 001 Algorithm 3) added to the training data."""

    kind: str = _opt("gradient", "the canary design: gradient canaries (hook), input canaries "
                     "(data), or one registered with register_canary_design", "CANARY_DESIGNS")
    count: int = _opt(1000, "number of canaries K; each a member with prob. audit.inclusion")
    direction: str = _opt("dirac", "gradient: Dirac on the least-used coordinates, or random",
                          DIRECTIONS)
    placement: str = _opt("least_active", "gradient Dirac: the least data-used coordinates, or "
                          "random coordinates the data use", PLACEMENTS)
    norm: float | None = _opt(None, "gradient: canary norm, <= dp.max_grad_norm (null: C)")
    policy: str = _opt("every_step", "gradient: members inserted every step, or w.p. q_c per "
                       "step", GRADIENT_POLICIES)
    inclusion_prob: float | None = _opt(None, "gradient, policy=bernoulli: q_c (null: the "
                                        "data's sample rate)")
    params: list[str] | None = _opt(  # noqa: RUF009
        None, "parameter / module names the canaries live in (null: all)"
    )
    view: str = _opt("auto", "gradient Dirac: auto records and scores only their own "
                     "coordinates (O(K) per step), full the whole gradient", VIEWS)
    lower_side: int | None = _opt(
        None, "canaries inserted like an example, per side, on a canary block of the audit's "
        "own beside the audited ones (each member enters a step with probability q, the "
        "data's rate: the certified lower side of your epsilon); null: "
        f"{names.DATA_RATE_PER_SIDE:,} where they apply (one-run audits of Dirac gradient "
        "canaries with view auto and flat clipping), else none, and the report says why; "
        "0: none; N: N members and N non-members (refused where they do not apply)")
    source: str = _opt("mislabeled", "input: candidate pool", "INPUT_SOURCES")
    selection: str = _opt("top", "input: which ranked candidates (easy/medium/hard need 3 x "
                          "count candidates; stratified: count / 5 from each score quintile)",
                          CANARY_SELECTIONS)
    candidates: int = _opt(200, "input: size of the candidate pool, >= count")
    n_references: int = _opt(128, "reference points for Algorithm 3's covariance")
    estimator: str = _opt("ledoit_wolf", "input: Algorithm 3's covariance estimator",
                          "ESTIMATORS")
    crafted_value: float = _opt(100.0, "input, source=crafted / crafted_distinct: value of "
                                "the one non-zero feature")
    options: dict[str, Any] = _opt(  # noqa: RUF009
        help="options of a registered canary design (its Options record's fields)",
        factory=dict,
    )

    def check(self) -> None:
        require_choice("canary.kind", self.kind, _registry_names("CANARY_DESIGNS"))
        require_positive("canary.count", self.count, integer=True)
        require_choice("canary.direction", self.direction, DIRECTIONS)
        require_choice("canary.placement", self.placement, PLACEMENTS)
        if self.norm is not None:
            require_positive("canary.norm", self.norm)
        require_choice("canary.policy", self.policy, GRADIENT_POLICIES)
        require_choice("canary.view", self.view, VIEWS)
        if self.lower_side is not None:
            require_integer("canary.lower_side", self.lower_side, 0, LOWER_SIDE_MAX + 1)
        if self.inclusion_prob is not None:
            require_unit("canary.inclusion_prob", self.inclusion_prob, closed_right=True)
        require_choice("canary.source", self.source, _registry_names("INPUT_SOURCES"))
        require_choice("canary.selection", self.selection, CANARY_SELECTIONS)
        require_positive("canary.candidates", self.candidates, integer=True)
        require_positive("canary.n_references", self.n_references, integer=True)
        require_choice("canary.estimator", self.estimator, _registry_names("ESTIMATORS"))
        require_positive("canary.crafted_value", self.crafted_value)
        if not isinstance(self.options, dict):
            refuse("canary.options", "a mapping of a registered design's options",
                  self.options)


@dataclass(frozen=True)
class AttackSettings:
    """The membership scores computed from the released gradients (``attack`` group)."""

    scores: list[str] | None = _opt(  # noqa: RUF009
        None,
        "scores to compute, each a separate attack (null: the canary design's default, "
        "mixture_lr for gradient canaries with canary.policy=bernoulli, scalar otherwise)",
        choices="ATTACKS",
    )
    estimator: str = _opt("ledoit_wolf", "covariance / glir precision estimator", "ESTIMATORS")
    n_references: int = _opt(128, "reference points for the covariance / glir precision")
    ridge: float = _opt(
        0.0, "covariance / glir: ridge added to the DP noise's (sigma^2 C^2 / b) I in the "
        "precision; needed only at dp.noise_multiplier=0 when the references are all equal"
    )
    explained_variance: float | None = _opt(
        None, "woodbury only: keep the fewest reference components reaching this share of the "
        "variance (null: all; the kept rank is reported in canary_info.precision)"
    )

    def check(self) -> None:
        attacks = _registry_names("ATTACKS")
        if self.scores is not None:
            if isinstance(self.scores, str) or not self.scores:
                refuse("attack.scores", f"null or a non-empty list from {attacks}", self.scores)
            for s in self.scores:
                require_choice("attack.scores", s, attacks)
        require_choice("attack.estimator", self.estimator, _registry_names("ESTIMATORS"))
        require_positive("attack.n_references", self.n_references, integer=True)
        require_nonnegative("attack.ridge", self.ridge)
        if self.explained_variance is not None:
            if self.estimator != "woodbury":
                refuse("attack.explained_variance", "null unless attack.estimator=woodbury "
                      "(it truncates woodbury's reference span)", self.explained_variance)
            require_unit("attack.explained_variance", self.explained_variance, closed_right=True)


@dataclass(frozen=True)
class AuditGroupSettings:
    """How membership is drawn and how the scores are turned into bounds (``audit`` group)."""

    mode: str = _opt("one_run", "one_run: K canaries in one training; multi_run: `runs` "
                     "trainings, one membership bit each", MODES)
    runs: int = _opt(1, "multi_run: number of trainings (>= 2)")
    methods: list[str] = _opt(  # noqa: RUF009
        help="epsilon lower-bound methods (certified and estimates)",
        choices="METHODS",
        factory=lambda: [
            "clopper_pearson", "one_run", "fdp_one_run_certified", "gdp", "gaussian",
            "fdp_one_run",
        ],
    )
    confidence: float = _opt(0.95, "confidence of all statements together, in (0, 1)")
    refutation_level: float = _opt(1e-6, "failure probability of a PRIVACY BUG verdict (the "
                                   "refuting statements' own, far below 1 - confidence), in "
                                   "(0, 1 - confidence]")
    inclusion: float = _opt(0.5, "probability that a canary (multi_run: a run) is a member")
    threat_model: str = _opt(
        "white_box", "what the verdict's adversary sees: white_box (every released gradient), "
        "hidden_state (the final parameters only; sparse gradient canaries) or black_box (the "
        "final model's outputs on input canaries); below white_box the report adds the "
        "ladder, every rung's evidence side by side (docs/threat_models.md)", THREAT_MODELS)
    require: str = _opt(
        "none", "the CLI's gate on the verdict: none (exit status 3 on a PRIVACY BUG only) or "
        "verified (also exit status 4 when your epsilon's upper side is not verified: a "
        "premise could not be seen)", REQUIREMENTS)
    worker: int = _opt(0, "multi_run: this worker's index among `workers` sharing the "
                       "directory (where it starts claiming runs; no effect on results)")
    workers: int = _opt(1, "multi_run: how many workers share the directory (with `worker`: "
                        "a sweep over worker=0,...,n-1 spreads the runs)")
    coordination: str = _opt("locks", "multi_run: how workers sharing the directory split the "
                             "runs: locks (per-run claims; a killed worker's runs are redone "
                             "by the others) or static (worker k of n trains runs r with r mod "
                             "n == k, no locks: for file systems without working locks)",
                             COORDINATIONS)

    def check(self) -> None:
        require_choice("audit.mode", self.mode, MODES)
        require_choice("audit.threat_model", self.threat_model, THREAT_MODELS)
        require_choice("audit.coordination", self.coordination, COORDINATIONS)
        require_choice("audit.require", self.require, REQUIREMENTS)
        require_positive("audit.workers", self.workers, integer=True)
        require_integer("audit.worker", self.worker, 0, self.workers)
        require_positive("audit.runs", self.runs, integer=True)
        if self.mode == "multi_run" and self.runs < 2:
            refuse("audit.runs", "at least 2 with audit.mode=multi_run (one membership bit "
                  "per run: a bound needs runs with and runs without the canary)", self.runs)
        methods = _registry_names("METHODS")
        if not self.methods:
            refuse("audit.methods", f"a non-empty list from {methods}", self.methods)
        for m in self.methods:
            require_choice("audit.methods", m, methods)
        require_unit("audit.confidence", self.confidence)
        require_unit("audit.inclusion", self.inclusion)
        require_level("audit.refutation_level", self.refutation_level, self.confidence)


@dataclass(frozen=True)
class AuditSettings:
    """Everything that defines one audit; ``AuditSettings()`` is the default audit.

    The default (what ``dpaudit`` runs): DP-SGD with Opacus on digits, an MLP of width 400,
    sigma = 1, T = 100 steps, q = 1/21 (the training data's epsilon 3.35 at delta 1e-5, PRV:
    one a user would publish); 1000 Dirac gradient canaries on first-layer weights no data
    gradient touches, each a member with probability 1/2 and inserted at every step (threat
    model q = 1: the mechanism's stress test), the scalar-product attack, every certified
    method and the estimates; beside them 10,000 member and 10,000 non-member Dirac canaries
    on a canary block, each member inserted with probability q per step like an example
    (``canary.lower_side``: the certified lower side of the training data's epsilon).

    Attributes:
        data, model, dp, canary, attack, audit: the groups (``DataSettings``,
            ``ModelSettings``, ``DPSettings``, ``CanarySettings``, ``AttackSettings``,
            ``AuditGroupSettings``); ``dpaudit.conf.describe_settings()`` lists every field with its
            one-line help and allowed values.
        seed: seed of the data split, the initial model, the canaries and the training.
        device: torch device ("cpu", "cuda", "cuda:1", ...); None: CUDA when available.
        progress: show progress bars.
    """

    data: DataSettings = field(default_factory=DataSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    dp: DPSettings = field(default_factory=DPSettings)
    canary: CanarySettings = field(default_factory=CanarySettings)
    attack: AttackSettings = field(default_factory=AttackSettings)
    audit: AuditGroupSettings = field(default_factory=AuditGroupSettings)
    seed: int = _opt(0, "seed of the data split, model, canaries and training noise")
    device: str | None = _opt(None, "torch device: cpu, cuda, cuda:N (null: CUDA when "
                              "available, else CPU)")
    progress: bool = _opt(True, "show progress bars")

    @classmethod
    def from_mappings(cls, **groups: Any) -> AuditSettings:
        """Build from plain dicts (Hydra groups); unknown keys are errors naming the group.

        A group mapping that selects one of the CLI's group options starts from that option's
        file, as the CLI does: ``canary={"kind": "input"}`` means ``canary=input`` (its count
        and candidate pool), ``audit={"mode": "multi_run"}`` means ``audit=multi_run``,
        ``model={"name": "cnn"}`` means ``model=cnn`` (``group_option_defaults``); the keys
        given override the file's."""
        kinds = {f.name: f for f in fields(cls)}
        values = {}
        for name, value in groups.items():
            owner = [g for g, kind in GROUPS.items()
                     if name not in kinds and name in {f.name for f in fields(kind)}]
            if owner:  # a group's key given at the top: run_audit(noise_multiplier=2)
                raise ValueError(f"unknown audit setting {name!r}: it is a {owner[0]} setting, "
                                 f"give it as {owner[0]}={{{name!r}: ...}}")
            require_known("audit setting", [name], kinds)
            factory = kinds[name].default_factory
            sub = factory() if callable(factory) else None
            if sub is not None and hasattr(sub, "check"):
                if isinstance(value, dict):
                    value = {**group_option_defaults(name, value), **value}
                value = _build(type(sub), name, value)
            values[name] = value
        out = cls(**values)
        out.check()
        return out

    def check(self) -> None:
        """Check every field; a ValueError names the first bad one and what was expected."""
        for part in (self.data, self.model, self.dp, self.canary, self.attack, self.audit):
            part.check()
        if not (isinstance(self.seed, int) and not isinstance(self.seed, bool)):
            refuse("seed", "an integer", self.seed)
        if self.device is not None and not (isinstance(self.device, str) and self.device):
            refuse("device", "null or a torch device string (cpu, cuda, cuda:N)", self.device)
        if self.dp.bug == "realised_batch_size" and self.dp.max_physical_batch_size:
            refuse("dp.max_physical_batch_size", "unset with bug=realised_batch_size", 1)
        design, ctx = self.design(), self.design_context()
        options = design.options(self.canary)
        design.check(options, ctx)
        scores = self.attack_scores()
        refused = [a for a in scores if a in design.refused_scores]
        if refused:
            refuse("attack.scores", f"without {refused[0]!r} with canary.kind="
                   f"{self.canary.kind} ({design.refused_scores[refused[0]]})", scores)
        if self.audit.mode == "one_run" and "batch_size" in scores:
            refuse("attack.scores", "without 'batch_size' in a one-run audit: that score reads "
                   "only the released gradient's norm, the same for every canary of one "
                   "training, so it cannot tell members apart (use it with audit=multi_run)",
                   scores)
        self._check_threat_model(design)
        c, why = self.canary, self.lower_side_absent()
        if c.lower_side and why:
            refuse("canary.lower_side", f"0 or null here: {why}", c.lower_side)
        if self.model.init == "pretrained" and self.data.n_train is None:
            refuse("data.n_train", "a number of training records with model.init=pretrained "
                   "(the model is pre-trained on the training split's other records, disjoint "
                   "from the audited ones)", None)
        if (self.audit.mode == "multi_run" and c.count > 1
                and not design.realises(options, ctx).shares_a_run):
            raise ValueError(
                f"canary.count={c.count} with audit.mode=multi_run needs canaries that do not "
                "see each other (canary.kind=gradient with canary.direction=dirac): all "
                "canaries of a run share one membership bit, so other canaries form a group of "
                "records and the one-record claim does not apply; use canary.count=1"
            )

    def lower_side_absent(self) -> str:
        """Why these settings can have no canaries inserted like an example beside the audited
        ones (``canary.lower_side``), or "" when they can: they sit on a canary block that
        joins the hook's coordinate view, so the audited canaries must be Dirac gradient
        canaries in their own view, scored by scores that read each canary's own coordinate
        only (input canaries' and dense canaries' scores read the whole selection, covariance
        and GLiR the whole view), in one training (a multi-run audit's runs would each need
        their own), under flat clipping (the block would change per-layer clipping's bounds,
        and adaptive clipping's gradient noise is not the claimed sigma's)."""
        c, a = self.canary, self.audit
        if a.mode != "one_run":
            return ("a multi-run audit (audit.mode=multi_run) pools one membership bit per "
                    "training; canaries inserted like an example are a one-run design")
        if c.kind != "gradient":
            return (f"canary.kind={c.kind}: its canaries' scores read the whole parameter "
                    "selection, which the canary block would join")
        if c.direction != "dirac" or c.view != "auto":
            return ("the audited gradient canaries are not Dirac canaries in their own view "
                    f"(canary.direction={c.direction}, canary.view={c.view}): the canary "
                    "block's coordinates join that view")
        wide = [s for s in self.attack_scores() if s not in LOWER_SIDE_SCORES]
        if wide:
            return (f"attack.scores has {wide[0]!r}, which reads more than each canary's own "
                    "coordinate (the canary block's coordinates would join what it reads, and "
                    "the canaries would not be independent experiments)")
        if self.dp.clipping != "flat":
            return (f"dp.clipping={self.dp.clipping}: the block would be one more clipped "
                    "tensor (per_layer: every tensor's bound C / sqrt(L) would change), and "
                    "the lower side's claim is the flat-clipped Gaussian at dp.noise_multiplier")
        if a.threat_model == "black_box":
            return "audit.threat_model=black_box audits input canaries"
        return ""

    def lower_side_per_side(self) -> tuple[int, str]:
        """(canaries inserted like an example per side, why none): ``canary.lower_side``, by
        default ``names.DATA_RATE_PER_SIDE`` where they apply (``lower_side_absent``)."""
        why = self.lower_side_absent()
        n = self.canary.lower_side
        if why:
            return 0, why
        if n == 0:
            return 0, "canary.lower_side=0 turned them off"
        return (names.DATA_RATE_PER_SIDE if n is None else int(n)), ""

    def _check_threat_model(self, design: CanaryDesign) -> None:
        """The rung ``audit.threat_model`` names must exist for these canaries: the hidden
        state reads sparse gradient canaries' final coordinates, the black box queries input
        canaries."""
        rung, c = self.audit.threat_model, self.canary
        sparse = c.kind != "gradient" or (c.direction == "dirac" and c.view == "auto")
        if rung == "hidden_state" and not (design.threat_kind == "gradient" and sparse):
            refuse("audit.threat_model", "white_box or black_box with these canaries: "
                   "hidden_state scores sparse gradient canaries from the final parameters "
                   "(canary.kind=gradient canary.direction=dirac canary.view=auto)", rung)
        if rung == "black_box" and design.threat_kind != "input":
            refuse("audit.threat_model", "white_box or hidden_state with gradient canaries: "
                   "black_box queries the final model on input canaries (canary=input)", rung)

    def design(self) -> CanaryDesign:
        """The canary design ``canary.kind`` names, through the typed interface (a release-0.5
        design gets a read-only view of these settings: ``canary_designs.legacy``)."""
        view = SimpleNamespace(**{f.name: getattr(self, f.name) for f in fields(self)})
        return design_of(self.canary, view)

    def design_context(self, data_sample_rate: float | None = None) -> DesignContext:
        """The ``DesignContext`` a design reads (``data_sample_rate``: the data's q, once the
        data are loaded)."""
        return DesignContext(count=self.canary.count, max_grad_norm=self.dp.max_grad_norm,
                             seed=self.seed, mode=self.audit.mode,
                             data_sample_rate=data_sample_rate)

    def attack_scores(self) -> list[str]:
        """The attacks this audit computes: ``attack.scores``, or when it is null the canary
        design's default (``CanaryDesign.default_scores``)."""
        if self.attack.scores is not None:
            return list(self.attack.scores)
        design = self.design()
        return design.default_scores(design.options(self.canary))

    def to_dict(self) -> dict:
        """The settings as plain JSON-ready dicts (what ``from_mappings`` reads back)."""
        return asdict(self)


GROUPS = {
    "data": DataSettings,
    "model": ModelSettings,
    "dp": DPSettings,
    "canary": CanarySettings,
    "attack": AttackSettings,
    "audit": AuditGroupSettings,
}


# The key that names a group option, per group (the files in dpaudit/conf/<group>/ set it).
_OPTION_KEYS = {"canary": ("kind", "policy"), "audit": ("mode",), "model": ("name",),
                "data": ("name",)}


def group_option_defaults(group: str, mapping: dict) -> dict:
    """The values of the CLI's option file of ``group`` that ``mapping`` selects (by its
    option key: ``_OPTION_KEYS``), or {} when it selects none. With several matches (canary
    kind gradient) the file whose keys all agree with ``mapping`` and that says the most wins.
    """
    keys = _OPTION_KEYS.get(group, ())
    if not any(k in mapping for k in keys):
        return {}
    from importlib import resources

    import yaml  # PyYAML, Hydra's dependency; only read when a group mapping is given

    best: dict = {}
    folder = resources.files("dpaudit").joinpath("conf", group)
    for path in sorted(folder.iterdir(), key=lambda p: p.name):
        if not path.name.endswith(".yaml"):
            continue
        values = yaml.safe_load(path.read_text()) or {}
        selected = [k for k in keys if k in values and k in mapping]
        if not selected or any(values[k] != mapping[k] for k in selected):
            continue
        if len(values) > len(best):
            best = values
    return dict(best)


def _build(kind, group: str, value):
    if isinstance(value, kind):
        return value
    if value is None:
        return kind()
    if not isinstance(value, dict):
        raise ValueError(f"{group} must be a mapping of settings, got {type(value).__name__}")
    require_known(f"{group} setting", sorted(value), [f.name for f in fields(kind)])
    return kind(**value)
