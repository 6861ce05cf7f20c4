"""An FSDP2 job's own collectives outside FSDP's calls (``bench/review6/hsdp_moe.py``: routers passed as
``ignored_params``, their gradients averaged by the user's ``dist.all_reduce``; tests/data/review6/moe-routers):
FSDP's hooks do not see them, so the graph keeps them as host time, and a warning counts them (none did before). FSDP
recordings vendored before have no Kineto trace, where nothing shows them."""
from __future__ import annotations

from testdata import DATA

from dagprof.traces.dagprof_run import read_run

MOE = DATA / "review6" / "moe-routers"


def test_own_allreduces_are_counted():
    run = read_run(MOE)
    texts = run.meta.warning_texts()
    own = [w for w in texts if "outside FSDP's calls" in w]
    assert len(own) == 1 and own[0].startswith("6 collective(s) a rank ran")  # 3 routers x 2 steps, on every rank: one line

