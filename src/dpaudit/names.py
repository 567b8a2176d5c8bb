"""The names each registry holds, declared without importing torch.

Settings validation, config errors and ``dpaudit --help`` check names against these tuples.
The registries themselves (``dpaudit.data.DATASETS``, ``dpaudit.models.MODELS``, ...) import
torch, Opacus or scipy. ``tests/test_architecture.py`` keeps each tuple equal to its registry,
so adding a dataset, a model, an attack, a method, a bug or an estimator means one more
name here.
"""

DATASETS = ("digits", "mnist5k", "synthetic", "fmnist", "cifar10")
MODELS = ("logreg", "mlp", "cnn")
INPUT_SOURCES = ("in_distribution", "mislabeled", "blank", "crafted", "crafted_distinct")
ATTACKS = ("scalar", "covariance", "mixture_lr", "glir", "batch_size")
METHODS = (
    "clopper_pearson", "gdp", "one_run", "density", "density_tv", "gaussian", "fdp_one_run",
    "fdp_one_run_certified", "anchor_gdp",
)
BUGS = (
    "none", "halved_noise", "scaled_noise", "noise_skipped_steps", "noise_reused",
    "antithetic_noise", "laplace_noise", "rounded_noise", "broadcast_noise",
    "noise_shared_tensors", "noise_partial_tensors", "unclipped_example", "layer_clip_ignored",
    "microbatch_clipping", "realised_batch_size", "shuffled_batches",
    "shuffled_binomial_batches", "replayed_batches", "duplicated_examples",
    "out_of_band_update", "batch_seeded_noise", "accountant_sigma", "accountant_sample_rate",
    "accountant_steps",
)
CANARY_DESIGNS = ("gradient", "input")
# a gradient canary's insertion policy ("never": an out-canary, only scored); declared here so
# that the capture hook and the torch-free settings share one tuple
CANARY_POLICIES = ("every_step", "bernoulli", "never")
CANARY_KINDS = ("gradient", "input")  # the canaries a ThreatModel knows (threat_model.py)
# canaries inserted like an example (the lower side of the user's epsilon), per side, by
# default: the own loop's second set (capture.canary_choice) and the CLI's canary.lower_side;
# the lower side's power grows with their number (DESIGN 4.5)
DATA_RATE_PER_SIDE = 10_000
ESTIMATORS = ("dense", "diagonal", "ledoit_wolf", "oas", "woodbury")
# the threat-model ladder's rungs, strongest adversary first: every released gradient, the
# final parameters only, the final model's outputs only (experiment.judging.ladder)
THREAT_MODELS = ("white_box", "hidden_state", "black_box")
# how the initial model is made: drawn at random, or pre-trained (non-privately) on training
# records outside the audited subset (experiment.trainings.pretrain)
MODEL_INITS = ("random", "pretrained")
# how workers sharing a many-trainings directory split the runs (experiment.trainings.engine)
COORDINATIONS = ("locks", "static")
# the CLI's gate on the verdict (audit.require): a PRIVACY BUG only, or a verified claim too
REQUIREMENTS = ("none", "verified")

# registry name -> (module, attribute) of the registry the tuple above mirrors
REGISTRIES = {
    "DATASETS": ("dpaudit.data", "DATASETS"),
    "MODELS": ("dpaudit.models", "MODELS"),
    "INPUT_SOURCES": ("dpaudit.canaries.sources", "INPUT_SOURCES"),
    "ATTACKS": ("dpaudit.experiment.trainings.scores", "SCORES"),
    "METHODS": ("dpaudit.stats.bounds", "METHOD_REGISTRY"),
    "BUGS": ("dpaudit.bugs", "BUGS"),
    "ESTIMATORS": ("dpaudit.covariance.estimators", "ESTIMATORS"),
    "CANARY_DESIGNS": ("dpaudit.experiment.canary_designs", "DESIGNS"),
}
