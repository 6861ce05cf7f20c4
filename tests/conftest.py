import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/synthetic.py, tests/testdata.py


@pytest.fixture(scope="session", autouse=True)
def _private_parse_cache(tmp_path_factory):
    """Parse caches go to a session temp folder, never the real ``~/.cache/dagprof`` (subprocesses inherit it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGPROF_CACHE_DIR", str(tmp_path_factory.mktemp("dagprof-cache")))
        yield


@pytest.fixture(scope="session", autouse=True)
def _fixed_terminal_width():
    """The CLI folds text at ``$COLUMNS`` (``cli.terminal.wrap_lines``), and tests read phrases off its lines: pin the width
    the CLI takes where output is no terminal, since an xdist worker's environment says 80 and a shell may say anything."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "100")
        yield


@pytest.fixture
def one_rank_group(tmp_path):
    """A real single-process gloo group, so DDP, FSDP's hooks and a DTensor mesh run in this process."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def small_ddp_run(tmp_path_factory) -> str:
    """One real, profiled 2-rank gloo DDP run of the tiny demo model, shared by every test that reads one."""
    from dagprof.collect.jobs.demo_train import DemoConfig, run_demo_training

    small = DemoConfig.small()
    opts = {k: getattr(small, k) for k in ("width", "blocks", "image_size", "batch_size")}
    out = tmp_path_factory.mktemp("small-ddp-run")
    return run_demo_training(out, world_size=2, steps=8, profile_steps=(2, 6), bucket_cap_mb=0.01, **opts)


@pytest.fixture(scope="session")
def prof(small_ddp_run):
    """``small_ddp_run`` opened (loaded, aligned, built, replayed) once for every test that searches or rewrites it."""
    from dagprof.pipeline import open_run

    return open_run(small_ddp_run)


@pytest.fixture(scope="session")
def order(prof):
    """The gradient order (parameters in ready order, with sizes) of ``small_ddp_run``'s last bucket layout."""
    from dagprof.passes.gradients import gradient_order

    return gradient_order(prof.graph, prof.run.ranks[0].buckets)
