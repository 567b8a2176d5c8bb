"""Fixtures shared by the capture tests."""

import pytest


@pytest.fixture(scope="session")
def ddp_group(tmp_path_factory):
    """The one two-process DDP run both DDP test files read (``ddp_support``): per rank,
    ``{"conformance": ..., "ddp": ...}``."""
    from capture_support import spawn_ranks
    from ddp_support import WORLD, both_files_worker

    return spawn_ranks(both_files_worker, tmp_path_factory.mktemp("ddp"), WORLD)
