import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/synthetic.py, tests/testdata.py


@pytest.fixture(scope="session")
def small_ddp_run(tmp_path_factory) -> str:
    """One real, profiled 2-rank gloo DDP run of the tiny demo model, shared by every test that reads one."""
    from dagprof.collect.demo_train import DemoConfig, run_demo_training

    small = DemoConfig.small()
    opts = {k: getattr(small, k) for k in ("width", "blocks", "image_size", "batch_size")}
    out = tmp_path_factory.mktemp("small-ddp-run")
    return run_demo_training(out, world_size=2, steps=8, profile_steps=(2, 6), bucket_cap_mb=0.01, **opts)
