"""One two-process DDP run (gloo, CPU) for both DDP test files: each rank initialises the
process group once and records what tests/capture/test_conformance.py and
tests/capture/test_ddp.py check (their ``ddp_results``)."""

from __future__ import annotations

import warnings

import torch

WORLD = 2


def both_files_worker(rank: int, port: int, out_dir: str) -> None:
    """One rank of the shared run (module-level, so that spawn can import it)."""
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    try:
        import test_conformance
        import test_ddp

        results = {"conformance": test_conformance.ddp_results(rank),
                   "ddp": test_ddp.ddp_results(rank)}
        torch.save(results, f"{out_dir}/rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()
