"""Hydra entry point (`dpaudit`): parse the config and call the task it names.

Every experiment preset sets ``task`` to a Hydra-callable config (``_target_`` plus keyword
arguments). The CLI adds ``output_dir`` (Hydra's run directory) and calls it; the task writes
its JSON and plots there and returns its results. Nothing else happens here.
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import call
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def _hydra_main(cfg: DictConfig):
    output_dir = HydraConfig.get().runtime.output_dir
    return call(cfg.task, output_dir=output_dir)


def main() -> None:
    """Console-script entry point."""
    _hydra_main()


if __name__ == "__main__":
    main()
