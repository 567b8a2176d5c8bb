"""The `dpaudit` Hydra CLI, end to end in a subprocess, on tiny configs."""

import json
import subprocess
import sys

import pytest


def run_cli(tmp_path, *overrides):
    cmd = [sys.executable, "-m", "dpaudit.cli", f"hydra.run.dir={tmp_path}", *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_stats_demo_writes_sound_bounds(tmp_path):
    proc = run_cli(tmp_path, "experiment=stats_demo", "task.n=2000", "task.mus=[1.0,2.0]")
    assert proc.returncode == 0, proc.stderr
    assert "true_eps" in proc.stdout  # the console table
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["mu"] for r in rows] == [1.0, 2.0]
    kinds = json.loads((tmp_path / "results.json").read_text())["kinds"]
    assert kinds == {"gdp": "estimate", "clopper_pearson": "certified", "one_run": "certified",
                     "density": "certified", "density_tv": "estimate"}
    for row in rows:
        # Certified bounds: conservative enough that one seed above the truth would be a bug.
        # The gdp estimate's mu_lower has nearly exact 95% coverage (measured 4.5% of 200
        # repetitions above mu = 1 at this size), so one seed says nothing about its
        # validity: that is the validity suite's job (tests/validity/test_validity.py).
        for method, kind in kinds.items():
            assert row[method] >= 0.0
            if kind == "certified":
                assert row[method] <= row["true_eps"], (method, row)
        assert 0.5 * row["true_eps"] <= row["gdp"] <= 1.1 * row["true_eps"]


@pytest.mark.parametrize(
    "override,needle",
    [("experiment=no_such_preset", "no_such_preset"), ("task.delta=1.5", "delta")],
)
def test_bad_config_fails_with_a_clear_message(tmp_path, override, needle):
    proc = run_cli(tmp_path, override, "task.n=200")
    assert proc.returncode != 0
    assert needle in proc.stderr


def test_default_audit_tiny_end_to_end(tmp_path):
    # sigma 6 (the default is 1), without canaries inserted like an example
    proc = run_cli(tmp_path, "dp.steps=10", "dp.noise_multiplier=6", "canary.count=20",
                   "canary.lower_side=0", "progress=false")
    assert proc.returncode == 0, proc.stderr
    assert "threat model: gradient canaries" in proc.stdout
    assert "confidence 95%" in proc.stdout  # the table states its confidence level
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["steps"] == 10 and res["settings"]["canary"]["count"] == 20
    assert "canaries inserted like an example: none added: canary.lower_side=0" in proc.stdout
    assert res["settings"]["model"] == {"name": "mlp", "width": 400, "init": "random",
                                        "pretrain_epochs": 5, "pretrain_lr": 0.01,
                                        "pretrain_batch_size": 32}  # AuditSettings()
    assert res["verdict"]["best_lower_bound"] <= res["theory"]["claimed_epsilon"]
    assert (tmp_path / "roc.png").exists()
    # 10 + 10 canaries at mu = sqrt(10) / 6: nothing certifiable, and the CLI says so
    assert "expect epsilon bounds of 0: canary.count=20" in proc.stderr
    # Opacus' per-run warnings once on the console; every warning and the run in the log
    assert proc.stderr.count("UserWarning: Secure RNG turned off") <= 1
    assert "outputs" in proc.stdout and "results.json" in proc.stdout.split("outputs")[-1]
    log = (tmp_path / "cli.log").read_text()
    for needle in ("output directory", "settings:", "finished in", "verdict: consistent",
                   "outputs in", "expect epsilon bounds of 0"):
        assert needle in log, needle


def test_preset_refuses_overrides_it_does_not_read(tmp_path):
    """issue 12 Found 4: a preset's task that never reads dp.noise_multiplier refuses it
    (before any work) instead of running without it."""
    proc = run_cli(tmp_path, "experiment=stats_demo", "dp.noise_multiplier=2")
    assert proc.returncode == 2
    assert "does not use dp.noise_multiplier=2" in proc.stderr
    assert "task.KEY=VALUE" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "results.json").exists()
    proc = run_cli(tmp_path, "experiment=meanlab_roc", "audit.confidence=0.5")
    assert proc.returncode == 2 and "does not use audit.confidence=0.5" in proc.stderr


def test_stats_demo_honours_delta_and_confidence(tmp_path):
    """issue 12 Found 4, the command as written: stats_demo reads dp.delta and
    audit.confidence; true_eps is the closed form gdp_epsilon(mu, delta) at the given delta."""
    from dpaudit.stats import gdp_epsilon

    proc = run_cli(tmp_path, "experiment=stats_demo", "audit.confidence=0.5", "dp.delta=1e-3",
                   "task.n=500", "task.mus=[1.0]")
    assert proc.returncode == 0, proc.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    assert (res["delta"], res["confidence"]) == (1e-3, 0.5)
    assert res["rows"][0]["true_eps"] == pytest.approx(gdp_epsilon(1.0, 1e-3), rel=1e-9)
    assert "50% confidence" in proc.stdout
    assert "outputs (" in proc.stdout and str(tmp_path) in proc.stdout  # where it went
    assert "dp:\n" in (tmp_path / "cli.log").read_text()  # the settings are logged


def test_missing_launcher_plugin_names_the_extra(tmp_path):
    """hydra/launcher=joblib without hydra-joblib-launcher: a hint, not Hydra's bare error.
    The plugin is made unimportable in the child process (as if not installed)."""
    code = (
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.startswith('hydra_plugins.hydra_joblib_launcher'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "sys.argv = ['dpaudit', 'hydra/launcher=joblib', '-m', 'experiment=stats_demo']\n"
        "from dpaudit.cli import main\n"
        "main()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert "pip install -c requirements/dev.txt -e '.[launchers]'" in proc.stderr
    assert "hydra-joblib-launcher" in proc.stderr


def test_help_lists_groups_options_and_presets(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dpaudit.cli", "--help"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "== Presets (experiment=NAME) ==" in out and "stats_demo" in out
    assert "canary.selection" in out
    assert "allowed: top | easy | medium | hard | stratified | random" in out
    assert "_target_" not in out and "powered by Hydra" not in out


_HEAVY = ("torch", "opacus", "matplotlib")
_LOADED = (
    "import sys\nfrom dpaudit.cli import main\nsys.argv = ['dpaudit', *sys.argv[1:]]\n"
    "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
    f"print('LOADED', code, sorted(m for m in {_HEAVY!r} if m in sys.modules))\n"
)


@pytest.mark.parametrize(
    ("args", "code"),
    [(["--help"], 0), (["-h"], 0), (["dp.noise_multiplier=-1"], 2), (["model.name=vgg"], 2)],
)
def test_help_and_config_errors_import_neither_torch_nor_opacus(tmp_path, args, code):
    # start-up: the help text and config errors come from the light settings module
    run_dir = [] if args[0].startswith("-") else [f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run([sys.executable, "-c", _LOADED, *run_dir, *args],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    line = [x for x in proc.stdout.splitlines() if x.startswith("LOADED")][-1]
    assert line == f"LOADED {code} []", (line, proc.stderr[-2000:])


def test_a_misspelt_key_on_the_command_line_gets_did_you_mean(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dpaudit", f"hydra.run.dir={tmp_path}",
                           "dp.noise_multipler=2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == (
        "dpaudit: error: Could not override 'dp.noise_multipler': Key 'noise_multipler' not in "
        "'DPSettings' (did you mean 'noise_multiplier'?)")


def test_python_m_dpaudit_is_the_cli(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dpaudit", "--help"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "== Presets (experiment=NAME) ==" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["device=cuda"], "device='cuda', but CUDA is not available"),
        (["dp.noise_multiplier=inf"], "dp.noise_multiplier must be a positive finite number"),
        (["dp.lr=inf"], "dp.lr must be a positive finite number"),
        (["dp.lr=nan"], "dp.lr must be a positive finite number"),
        (["audit.inclusion=0.999", "canary.count=20"], "draws 20 members and 0 non-members"),
        (["audit=multi_run", "audit.runs=1", "canary.count=1"], "audit.runs must be at least 2"),
        (["audit=multi_run", "audit.runs=3", "audit.inclusion=0.99", "canary.count=1"],
         "draws 3 runs with the canary and 0 without"),
    ],
)
def test_errors_before_training(tmp_path, overrides, needle):
    """issue 12 Found 8: each refused with the key's name before any training starts (no
    Opacus warning, no run file)."""
    import torch

    if overrides == ["device=cuda"] and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    proc = run_cli(tmp_path, *overrides, "progress=false")
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert "Secure RNG" not in proc.stderr and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_readme_input_canary_command(tmp_path):
    """issue 12 Found 3: `dpaudit canary=input attack=covariance canary.selection=hard` runs
    as written with the input group's defaults (50 canaries), certifies 0 and says why (the
    canaries share one model: only the one-run methods certify); at sigma 6 it says so before
    training too."""
    proc = run_cli(tmp_path, "canary=input", "attack=covariance", "canary.selection=hard",
                   "progress=false")
    assert proc.returncode == 0, proc.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    c = res["settings"]["canary"]
    assert (c["kind"], c["count"], c["selection"]) == ("input", 50, "hard")
    assert res["verdict"]["best_lower_bound"] == 0.0
    assert "certified 0: these canaries are not independent experiments" in proc.stdout
    assert "canaries inserted like an example: none added: canary.kind=input" in proc.stdout
    proc = run_cli(tmp_path / "sigma6", "canary=input", "attack=covariance",
                   "canary.selection=hard", "dp.noise_multiplier=6", "progress=false")
    assert proc.returncode == 0, proc.stderr
    assert "expect epsilon bounds of 0: canary.count=50" in proc.stderr


@pytest.mark.parametrize(
    "override,needle",
    [
        ("model=resnet", "model/resnet"),
        ("dp.delta=1.0", "dp.delta"),
        ("canary.norm=5.0", "exceeds the clip norm"),
        ("canary.count=100000", "larger than the candidate pool"),
    ],
)
def test_bad_audit_config_fails_clearly(tmp_path, override, needle):
    proc = run_cli(tmp_path, override, "dp.steps=2", "progress=false")
    assert proc.returncode != 0
    assert needle in proc.stderr


def test_a_data_set_that_cannot_be_loaded_is_refused_in_one_line(tmp_path):
    """data=cifar10 here: torchvision missing (or, where it is installed, no copy under
    data.root): exit 2 and one line naming data.name, no traceback."""
    proc = run_cli(tmp_path, "data=cifar10", "dp.steps=2", "progress=false")
    assert proc.returncode == 2, proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("dpaudit: error:")]
    assert len(error) == 1 and "data.name=cifar10" in error[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("launcher", ["slurm_gpu", "cpu_parallel"])
def test_launcher_presets_compose(launcher):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="dpaudit.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    target = cfg.hydra.launcher._target_
    assert ("Slurm" in target) if launcher == "slurm_gpu" else ("Joblib" in target)


@pytest.mark.slow
def test_privacy_bug_sets_the_exit_status(tmp_path):
    """A certified PRIVACY BUG exits with status 3 (an audit can gate CI); fail_on_bug=false
    keeps 0. Halved noise, 300 every-step Dirac canaries on dead MLP weights (mu 1 -> 2)."""
    tiny = ["experiment=bug_halved_noise", "model.width=100", "canary.count=300",
            "progress=false"]
    proc = run_cli(tmp_path / "gate", *tiny)
    assert proc.returncode == 3, proc.stderr
    assert "PRIVACY BUG (failure probability 1e-06)" in proc.stdout
    res = json.loads((tmp_path / "gate" / "results.json").read_text())
    assert res["verdict"]["status"] == "privacy_bug"
    proc = run_cli(tmp_path / "nogate", *tiny, "fail_on_bug=false")
    assert proc.returncode == 0, proc.stderr


# (overrides, what the one line must name): mistakes a user makes, found by dpaudit's checks,
# by Hydra's parser, by a missing package or by the file system. Every one: exit status 2,
# one "dpaudit: error:" line (and at most one hint line), no traceback.
MISTAKES = [
    (["dp.noise_multipler=2"], "(did you mean 'noise_multiplier'?)"),  # misspelt key
    (["noise_multiplier=2"], "(did you mean 'dp.noise_multiplier'?)"),  # outside its group
    (["+dp.noise_multipler=2"], "(did you mean 'noise_multiplier'?)"),  # added with +
    (["model=mpl"], "(did you mean 'mlp'?)"),                  # misspelt group option
    (["dp.clipping=per_layr"], "(did you mean 'per_layer'?)"),  # misspelt value
    (["dp.noise_multiplier=abc"], "noise_multiplier"),         # wrong type
    (["dp.noise_multiplier=-1"], "noise_multiplier"),          # out of range
    (["attack.scores=covariance"], "attack.scores=[covariance]"),  # a list without brackets
    (["--frobnicate"], "--frobnicate"),                        # unknown option
    (["data=nonexistent"], "nonexistent"),                     # unknown group option
    (["experiment=nonexistent"], "nonexistent"),               # unknown preset
    (["canary.kind=banana"], "canary.kind"),
    (["canary.kind=gradeint"], "(did you mean 'gradient'?)"),
    (["dp.batch_size=0"], "batch_size"),
    (["audit.confidence=1.5"], "confidence"),
    (["dp.delta=2"], "dp.delta"),
    (["canary.count=-5"], "count"),
    (["model.name=transformer9"], "model.name"),
    (["audit.mode=three_run"], "audit.mode"),
    (["seed=abc"], "seed"),
    (["dp.steps=0"], "steps"),
    (["attack.scores=[nonexistent]"], "scores"),
    (["audit.methods=[nonexistent]"], "methods"),
    (["dp.optimizer=adamw"], "optimizer"),
    (["canary.norm=5.0"], "clip norm"),
    (["experiment=stats_demo", "dp.noise_multiplier=2"], "dp.noise_multiplier"),  # unread
    (["data=cifar10"], "cifar10"),                             # torchvision / its files
    (["hydra.run.dir=/proc/dpaudit_cannot_write_here"], "hydra.run.dir"),  # unwritable
    (["+foo=1"], "'foo' (+foo=1)"),                           # an unknown key added with +
    (["experiment=stats_demo", "task.mus=0.5"], "task.mus"),   # a list without brackets
    (["experiment=stats_demo", "task.n=-3"], "task.n"),        # out of range, in a task
    (["experiment=stats_demo", "+task.foo=1"], "task.foo"),    # not the task's argument
    (["experiment=meanlab_roc", "task.rounds=0"], "task.rounds"),
    (["experiment=meanlab_linreg", "task.gammas=[0.5,-1]"], "task.gammas"),
    (["experiment=fig3_digits", "task.coordination=nfs"], "task.coordination"),
    (["audit.coordination=nfs"], "audit.coordination"),
]


@pytest.mark.slow
def test_every_mistake_is_one_line_and_exit_status_2(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    def attempt(i_case):
        i, (overrides, _) = i_case
        run_dir = [] if any(o.startswith("hydra.run.dir=") for o in overrides) else [
            f"hydra.run.dir={tmp_path / str(i)}"]
        tiny = [] if overrides[0].startswith("experiment=") else [
            o for o in ("dp.steps=2", "progress=false")
            if not any(x.startswith(o.split("=")[0] + "=") for x in overrides)]
        cmd = [sys.executable, "-m", "dpaudit", *run_dir, *tiny, *overrides]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = list(pool.map(attempt, enumerate(MISTAKES)))
    assert len(MISTAKES) >= 20
    for (overrides, needle), proc in zip(MISTAKES, procs, strict=True):
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("dpaudit: error:")]
        what = f"{overrides}: rc {proc.returncode}, stderr:\n{proc.stderr}"
        assert proc.returncode == 2, what
        assert len(errors) == 1 and needle in errors[0], what
        assert "Traceback" not in proc.stderr, what
        assert len([ln for ln in lines if not ln.startswith(("dpaudit: error:", "("))]) == 0, what


@pytest.mark.parametrize("text,line", [
    ("Could not override 'dp.x'.\nTo append to your config use +dp.x=2\nKey 'x' not in "
     "'DPSettings'\n    full_key: dp.x\n    object_type=DPSettings\n\nSet the environment "
     "variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n",
     "Could not override 'dp.x': Key 'x' not in 'DPSettings'"),
    ("Error merging override attack.scores=covariance\nInvalid value assigned: str is not a "
     "ListConfig, list or tuple.\n    full_key: attack.scores\n",
     "Error merging override attack.scores=covariance: Invalid value assigned: str is not a "
     "ListConfig, list or tuple. (attack.scores takes a list: attack.scores=[covariance])"),
    ("usage: __main__.py [--help]\n  more usage\n__main__.py: error: unrecognized arguments: "
     "--x\n", "unrecognized arguments: --x"),
    ("In 'config': Could not find 'data/x'\n\nAvailable options in 'data':\n\tdigits\n\tsynthetic"
     "\nConfig search path:\n\tprovider=hydra, path=pkg://hydra.conf\n",
     "In 'config': Could not find 'data/x' (options: digits, synthetic)"),
    ("Could not override 'dp.noise_multipler'.\nTo append to your config use +dp.noise_multipler"
     "=2\nKey 'noise_multipler' not in 'DPSettings'\n    full_key: dp.noise_multipler\n",
     "Could not override 'dp.noise_multipler': Key 'noise_multipler' not in 'DPSettings' (did "
     "you mean 'noise_multiplier'?)"),
    ("Could not override 'width'.\nKey 'width' not in 'DpauditConfig'\n    full_key: width\n",
     "Could not override 'width': Key 'width' not in 'DpauditConfig' (did you mean "
     "'model.width'?)"),
    ("Could not override 'hydra.run.dri'.\nKey 'dri' not in 'RunDir'\n    full_key: "
     "hydra.run.dri\n", "Could not override 'hydra.run.dri': Key 'dri' not in 'RunDir' (did you "
     "mean 'dir'?)"),
    ("Could not override 'data.options.x'.\nKey 'x' is not in struct\n    full_key: "
     "data.options.x\n", "Could not override 'data.options.x': Key 'x' is not in struct"),
    ("In 'config': Could not find 'model/mpl'\n\nAvailable options in 'model':\n\tcnn\n\tlogreg"
     "\n\tmlp\nConfig search path:\n", "In 'config': Could not find 'model/mpl' (did you mean "
     "'mlp'?) (options: cnn, logreg, mlp)"),
    ("Traceback (most recent call last):\n  File \"x.py\", line 1\nPermissionError: [Errno 13] "
     "Permission denied: '/x'\n", "PermissionError: [Errno 13] Permission denied: '/x': choose a "
     "writable output directory with hydra.run.dir=DIR"),
])
def test_hydra_messages_condense_to_one_line(text, line):
    from dpaudit.cli import hydra_error_line

    assert hydra_error_line(text) == line


def test_multi_run_shows_one_bar_and_summarises_its_run_files(tmp_path):
    proc = run_cli(tmp_path, "audit=multi_run", "audit.runs=7", "canary=input",
                   "canary.count=1", "dp.steps=3")
    assert proc.returncode == 0, proc.stderr
    assert "audit runs" in proc.stderr  # the audit's bar over its runs...
    assert "DP-SGD (audited)" not in proc.stderr  # ...and no bar per run nested in it
    listed = proc.stdout.split("outputs (")[-1]
    assert "runs/ (7 files: run_00000.json ... run_00006.json)" in listed
    assert "run_00003.json" not in listed and "results.json" in listed


def test_output_list_keeps_short_folders_and_the_top_level():
    from dpaudit.cli import _listed

    files = ["a.png", "results.json", "plots/x.png", "plots/y.png",
             *(f"runs/run_{r:05d}.json" for r in range(6))]
    assert _listed(files) == ["a.png", "results.json", "plots/x.png", "plots/y.png",
                              "runs/ (6 files: run_00000.json ... run_00005.json)"]
    assert _listed(files, most=6) == files


# one option of every config group (the rest at their defaults), tiny: the settings the CLI
# writes into results.json must be the API's for the same choices, key for key
GROUP_OPTIONS = [
    ("data=synthetic", {"data": {"name": "synthetic"}}),
    ("model=logreg", {"model": {"name": "logreg"}}),
    ("model=cnn", {"model": {"name": "cnn"}}),
    ("canary=gradient_poisson", "canary/gradient_poisson"),
    ("canary=input", "canary/input"),
    ("attack=covariance", "attack/covariance"),
    ("audit=multi_run", "audit/multi_run"),
]


@pytest.mark.slow
@pytest.mark.parametrize("override,api", GROUP_OPTIONS, ids=[o for o, _ in GROUP_OPTIONS])
def test_the_api_and_the_cli_write_the_same_settings(tmp_path, override, api):
    from importlib import resources

    import yaml

    from dpaudit.experiment import run_audit

    if isinstance(api, str):  # the group file's own mapping, as an API user would pass it
        group, name = api.split("/")
        text = (resources.files("dpaudit.conf") / group / f"{name}.yaml").read_text()
        api = {group: {k: v for k, v in yaml.safe_load(text).items() if k != "defaults"}}
    tiny = {"dp": {"steps": 2}, "canary": {"count": 8}, "audit": {}}
    extra = ["audit.runs=4"] if "multi_run" in override else []
    if extra:
        tiny["audit"]["runs"] = 4
    proc = run_cli(tmp_path / "cli", override, "dp.steps=2", "canary.count=8", "progress=false",
                   *extra)
    assert proc.returncode in (0, 3), proc.stderr[-2000:]
    groups = {g: {**api.get(g, {}), **tiny.get(g, {})} for g in {*tiny, *api}}  # as the CLI
    run_audit(output_dir=tmp_path / "api", progress=False, **groups)
    cli = json.loads((tmp_path / "cli" / "results.json").read_text())["settings"]
    ours = json.loads((tmp_path / "api" / "results.json").read_text())["settings"]
    assert cli == ours
