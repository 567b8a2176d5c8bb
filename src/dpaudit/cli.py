"""Hydra entry point (`dpaudit`): parse the config and call the task it names.

Every experiment preset sets ``task`` to a Hydra-callable config (``_target_`` plus keyword
arguments). The CLI adds ``output_dir`` (Hydra's run directory) and calls it; the task writes
its JSON and plots there and returns its results. Nothing else happens here, except the exit
status: an audit whose verdict is a PRIVACY BUG (certified evidence against the claim) exits
with status 3, so an audit can gate CI; ``fail_on_bug=false`` turns that off. In a sweep
(``-m``) every job runs and the status stays 0; read the jobs' verdicts with
``dpaudit-aggregate``.
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import call
from omegaconf import DictConfig

EXIT_PRIVACY_BUG = 3


def privacy_bug(result) -> bool:
    """Whether a task's result carries a PRIVACY BUG verdict."""
    return isinstance(result, dict) and bool(result.get("verdict", {}).get("privacy_bug"))


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def _hydra_main(cfg: DictConfig):
    hc = HydraConfig.get()
    result = call(cfg.task, output_dir=hc.runtime.output_dir)
    if privacy_bug(result) and cfg.get("fail_on_bug", True) and hc.mode == RunMode.RUN:
        raise SystemExit(EXIT_PRIVACY_BUG)
    return result


def main() -> None:
    """Console-script entry point."""
    _hydra_main()


if __name__ == "__main__":
    main()
