"""Task arguments checked against the task function before any work (``tasks.arguments``)."""

import pytest
from hydra import compose, initialize_config_module
from hydra.utils import get_method
from omegaconf import OmegaConf

from dpaudit.conf import preset_names
from dpaudit.experiment.settings import AuditSettings
from dpaudit.tasks.arguments import check_task_arguments
from dpaudit.tasks.stats_demo import stats_demo

AUDIT_TASK = "dpaudit.tasks.audit.audit_task"


def _task(name: str) -> dict:
    with initialize_config_module("dpaudit.conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={name}"])
    return OmegaConf.to_container(cfg.task, resolve=True)


@pytest.mark.parametrize("name", preset_names("experiment"))
def test_every_presets_own_arguments_pass_the_check(name):
    """No false refusal: each preset's task, as shipped, passes its check."""
    task = _task(name)
    if task["_target_"] == AUDIT_TASK:  # an audit: its arguments are AuditSettings' groups
        AuditSettings.from_mappings(**{k: v for k, v in task.items() if not k.startswith("_")})
    else:
        check_task_arguments(get_method(task["_target_"]), task)


@pytest.mark.parametrize("arguments,message", [
    ({"foo": 1}, "task.foo is not an argument of stats_demo; it takes: mus, n, delta"),
    ({"mus": 0.5}, "task.mus must be a list"),
    ({"n": 2.5}, "task.n must be an integer, got 2.5"),
    ({"n": True}, "task.n must be an integer, got True"),
    ({"delta": "small"}, "task.delta must be a number"),
])
def test_unknown_keys_and_wrong_kinds_are_named(arguments, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        check_task_arguments(stats_demo, arguments, "stats_demo")


@pytest.mark.parametrize("arguments,message", [
    ({"n": -3}, "task.n must be a positive finite integer, got -3"),
    ({"mus": []}, "task.mus must be a non-empty list"),
    ({"mus": [1.0, -1.0]}, "task.mus must be a positive finite number, got -1.0"),
    ({"confidence": 1.0}, r"task.confidence must be in \(0, 1\), got 1.0"),
    ({"methods": ["gdp", "magic"]}, "task.methods must be one of"),
])
def test_stats_demo_checks_its_ranges_before_any_draw(arguments, message):
    with pytest.raises(ValueError, match=message):
        stats_demo(**arguments)


def test_a_value_of_the_right_kind_passes_and_ints_count_as_numbers():
    check_task_arguments(stats_demo, {"mus": [1, 2], "n": 10, "delta": 1e-5, "confidence": 1})
