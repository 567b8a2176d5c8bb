"""The CLI's Hydra configs against their schema (the settings dataclasses), composed in-process
with Hydra's compose API: one source of defaults, group defaults that apply, refused typos and
refused overrides of settings a preset never reads, and the generated --help."""

from dataclasses import fields

import pytest
import yaml
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from dpaudit.cli import unused_overrides
from dpaudit.conf import (
    describe_settings,
    help_text,
    option_text,
    preset_names,
    preset_task,
    task_references,
)
from dpaudit.experiment.settings import CANARY_SELECTIONS, GROUPS, AuditSettings, choices_of


@pytest.fixture(scope="module")
def hydra_conf():
    with initialize_config_module(config_module="dpaudit.conf", version_base="1.3"):
        yield


def settings_of(cfg) -> dict:
    d = OmegaConf.to_container(cfg, resolve=True)
    d.pop("task"), d.pop("fail_on_bug"), d.pop("plugins")  # the CLI's own keys
    return d


def test_default_config_is_audit_settings_defaults(hydra_conf):
    """`dpaudit` with no arguments runs AuditSettings(): the two cannot drift apart."""
    cfg = compose("config")
    assert settings_of(cfg) == AuditSettings().to_dict()
    assert cfg.task._target_ == "dpaudit.tasks.audit.audit_task"


@pytest.mark.parametrize("group", list(GROUPS))
def test_group_files_list_only_what_differs(group):
    """Each option of a settings group restates no dataclass default."""
    defaults = {f.name: (f.default_factory() if callable(f.default_factory) else f.default)
                for f in fields(GROUPS[group])}
    for name in preset_names(group):
        values = yaml.safe_load(option_text(group, name)) or {}
        same = [k for k, v in values.items() if defaults[k] == v]
        assert not same, f"{group}/{name}.yaml restates defaults {same}"


def test_chosen_canary_group_keeps_its_own_defaults(hydra_conf):
    """issue 12 Found 3: the default preset no longer forces count 1000 / view auto on
    canary=input, so the README command composes the input group's own values."""
    cfg = compose("config", overrides=["canary=input", "attack=covariance",
                                       "canary.selection=hard"])
    c = cfg.canary
    assert (c.kind, c.count, c.candidates, c.selection) == ("input", 50, 400, "hard")
    assert 3 * c.count <= c.candidates  # easy/medium/hard need 3 x count candidates
    assert list(cfg.attack.scores) == ["scalar", "covariance"]


@pytest.mark.parametrize("name", preset_names("experiment"))
def test_every_preset_composes_and_validates(hydra_conf, name):
    cfg = compose("config", overrides=[f"experiment={name}"])
    task = OmegaConf.to_container(cfg.task, resolve=True)
    groups = {k: task[k] for k in ("data", "model", "dp", "canary", "attack", "audit")
              if k in task}
    if groups:
        s = AuditSettings.from_mappings(**groups)  # every value passes the checks
        assert s.to_dict()["dp"] == settings_of(cfg)["dp"]


@pytest.mark.parametrize(
    "override,needle",
    [("canary.cout=5", "cout"), ("dp.steps=abc", "steps"), ("audit.methods=gdp", "methods")],
)
def test_schema_refuses_typos_and_wrong_types(hydra_conf, override, needle):
    with pytest.raises(ConfigCompositionException) as err:
        compose("config", overrides=[override])
    assert needle in str(err.value) + str(err.value.__cause__)


def test_unused_overrides_are_found():
    stats = yaml.safe_load(option_text("experiment", "stats_demo"))["task"]
    assert task_references(stats) == {"dp.delta", "audit.confidence", "seed"}
    given = ["dp.noise_multiplier=2", "dp.delta=1e-3", "audit.confidence=0.5", "task.n=3",
             "seed=1", "experiment=stats_demo", "hydra.run.dir=x", "fail_on_bug=false",
             "audit=multi_run"]
    # audit=multi_run replaces the audit group, which stats_demo reads only confidence of
    assert unused_overrides(stats, given) == ["dp.noise_multiplier=2"]
    roc = yaml.safe_load(option_text("experiment", "meanlab_roc"))["task"]
    assert unused_overrides(roc, ["device=cpu", "canary=input", "seed=3"]) == [
        "device=cpu", "canary=input"]
    audit = preset_task("default")  # the shared audit task (conf/task/audit.yaml)
    assert audit["_target_"] == "dpaudit.tasks.audit.audit_task"
    assert unused_overrides(audit, ["device=cpu", "canary=input", "dp.lr=0.1"]) == []


def test_every_audit_preset_runs_the_one_audit_task_definition(hydra_conf):
    """The audit task is defined once (conf/task/audit.yaml); each audit preset names it."""
    shared = yaml.safe_load(option_text("task", "audit"))
    audits = [n for n in preset_names("experiment")
              if preset_task(n).get("_target_") == shared["_target_"]]
    assert len(audits) >= 9
    for name in audits:
        assert "\ntask:" not in option_text("experiment", name), name  # no copy of the block
        cfg = compose("config", overrides=[f"experiment={name}"])
        assert OmegaConf.to_container(cfg.task) == shared, name


def test_help_lists_presets_groups_and_allowed_values():
    text = help_text().replace("$$", "$")
    for name in preset_names("experiment"):
        assert f"  {name}" in text
    for group in GROUPS:
        for option in preset_names(group):
            assert f"  {option}" in text
    assert "allowed: " + " | ".join(CANARY_SELECTIONS) in text
    data_name = next(f for f in fields(GROUPS["data"]) if f.name == "name")
    assert "allowed: " + " | ".join(choices_of(data_name)) in text  # from the registry
    assert "_target_" not in text and "task:" not in text


def test_describe_settings_has_every_field_with_allowed_values():
    text = describe_settings()
    for group, values in AuditSettings().to_dict().items():
        keys = values if isinstance(values, dict) else {group: values}
        for key in keys:
            name = f"{group}.{key}" if isinstance(values, dict) else key
            assert f"  {name} " in text, name
    assert "allowed: gradient | input" in text
    assert all(line.strip() for line in text.splitlines())


def test_conf_comments_cite_papers_by_authors_not_design_note_numbers():
    """What a user reads when choosing an option names the papers as the docs do (authors
    and title), never the design notes' file numbers ("seed 001")."""
    import re
    from importlib import resources

    conf = resources.files("dpaudit.conf")
    cited = []
    for group in conf.iterdir():
        if not group.is_dir():
            continue
        for f in group.iterdir():
            if f.name.endswith(".yaml"):
                for i, line in enumerate(f.read_text().splitlines(), 1):
                    comment = line[line.find("#"):] if "#" in line else ""
                    if re.search(r"\b[Ss]eed \d{3}\b", comment):
                        cited.append(f"{group.name}/{f.name}:{i}")
    assert cited == []


def test_help_names_the_python_api_and_the_quickstart_near_the_top():
    """A user with their own Opacus loop learns from the first lines of ``dpaudit --help``
    that it is audited from Python, with which two calls, and where the quickstart is."""
    from pathlib import Path

    from dpaudit.conf import help_text

    top = "\n".join(help_text().splitlines()[:12])
    for name in ("dpaudit.capture.AuditHook", "dpaudit.audit_report", "README.md",
                 "docs/python_api.md", "Audit your own training loop"):
        assert name in top, name
    import dpaudit
    from dpaudit.capture import AuditHook  # the names it gives are the package's

    assert callable(dpaudit.audit_report) and AuditHook is dpaudit.AuditHook
    root = Path(__file__).resolve().parents[2]
    assert (root / "docs" / "python_api.md").is_file()
    assert "\n## Audit your own training loop\n" in (root / "README.md").read_text()
