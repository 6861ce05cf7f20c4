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



def test_tensor_parallel_collectives_are_told_from_the_jobs_own():
    """A DP x TP job (FSDP2 over ``dp``, attention and FFN split over ``tp``: ``bench/tp_fresh/t5_dp_tp.py --layers 1``,
    tests/data/tp-fresh/t5-dp-tp-dagprof) runs its TP all-reduces inside the forward and backward passes, outside FSDP's
    calls: 16 a step per rank (forward: enc o and w_out, dec attn o, cross o and w_out; the rest backward), and 3 of
    clipping after them. The warning once called all 19 the job's own (clipping, saves)."""
    texts = read_run(DATA / "tp-fresh" / "t5-dp-tp-dagprof").meta.warning_texts()
    own = [w for w in texts if "outside FSDP's calls" in w]
    assert len(own) == 1 and own[0].startswith("19 collective(s) a rank ran")
    assert "16 within the forward and backward passes (the model's own: a tensor-parallel" in own[0]
    assert "; 3 before or after them (the job's own: clip_grad_norm_'s" in own[0]
