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


def test_an_fsdp_call_takes_its_transfer_on_its_groups_own_lanes():
    """A TP all-reduce issued asynchronously before an FSDP call may start on the TP group's gloo thread within the call,
    before FSDP's own transfer (bench/tp_fresh/llama_fsdp_tp.py: on 2 of its 4 ranks); the call took it, and the TP lane
    was labelled data parallel. Each call keeps to the lanes where its group's calls found their transfers; a rare call
    whose lane few calls found keeps the one it found."""
    from types import SimpleNamespace

    from dagprof.traces.fsdp_run import _call_transfers

    info = SimpleNamespace(collectives=[SimpleNamespace(group="0,2")] * 12 + [SimpleNamespace(group="0,1,2,3")])
    calls = [(k, 100 * k, 100 * k + 50) for k in range(13)]
    gloo = [("dp a" if k % 2 else "dp b", 100 * k + 10, 0, 100 * k + 40, None) for k in range(13) if k not in (3, 12)]
    gloo += [("tp", 305, 0, 320, None), ("dp a", 310, 0, 340, None), ("world", 1205, 0, 1240, None)]
    gloo.sort(key=lambda x: x[1])
    lanes = [gloo[j][0] if j is not None else None for j in _call_transfers(info, calls, gloo)]
    assert lanes == ["dp b", "dp a"] * 6 + ["world"]


def test_a_collective_between_two_passes_of_a_step_is_the_loops():
    """SAM (``bench/fsdp_fresh/sam_convnext.py``) runs forward and backward twice a step and all-reduces the gradient norm
    between them: once told as the model's own (a tensor-parallel all-reduce, SyncBatchNorm). A collective between a
    backward's end and a checkpointed block's recompute (its forward, not the step's first layer's) stays the model's."""
    import numpy as np

    from dagprof.traces.fsdp_run import _outside_text
    from dagprof.traces.run_schema import Rec

    f, b = Rec.FWD_BEGIN, Rec.BWD_END
    # layer 0 forward, layer 1 forward, backward of 1 (recomputing layer 1 first: forward of 1), backward of 0; then again
    rows = [(f, 0, 100), (f, 1, 110), (f, 1, 150), (b, 1, 160), (b, 0, 200), (f, 0, 300), (f, 1, 310), (b, 1, 360), (b, 0, 400)]
    records = np.array([[c, a, 0, t, 0] for c, a, t in rows], dtype=np.int64)
    text = _outside_text([250, 140, 155, 500], records, [(5, 0, 1000)])
    assert text.startswith("4 collective(s) a rank ran")
    assert "2 within the forward and backward passes (the model's own" in text  # 140 (before a recompute), 155 (in it)
    assert "; 1 between a backward and the next forward of one step (the loop's own, as a model run twice a step does: SAM's" in text
    assert "; 1 before or after them (the job's own" in text
