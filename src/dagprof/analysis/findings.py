"""Plain-language findings: what limits scaling in this run, ranked by time at stake."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..passes.buckets import sparse_buckets
from ..passes.link_fit import SIZES_HINT
from ..traces.events import CommKind, CommRole, Kind
from . import Analysis
from .critical_path import op_words


@dataclass
class Finding:
    title: str
    detail: str
    ms_per_iter: float  # time at stake per iteration

    def to_dict(self) -> dict:
        return {"title": self.title, "detail": self.detail, "ms_per_iter": self.ms_per_iter}


# What dagprof can do about exposed communication, per framework: only what it can search or predict there.
_REMEDY = {
    None: "try other bucket sizes or compression (dagprof optimize)",
    "horovod": "try other fusion thresholds and cycle times (dagprof whatif --fusion-mb, --cycle-ms)",
    "tensorflow": ("TensorFlow packs gradients itself: set CommunicationOptions(bytes_per_pack=...) of the strategy by hand; "
                   "dagprof whatif --bandwidth, --workers predicts other links and worker counts"),
    "jax": "XLA lays out the all-reduces itself; dagprof whatif --bandwidth, --workers predicts other links and worker counts",
    "mxnet": "try more servers or another link (dagprof whatif --scheme ps:K, --bandwidth, --workers)",
}
_OTHER = "dagprof whatif --bandwidth, --workers predicts other links and worker counts"


def remedy_for(g) -> str:
    """What dagprof can do about a run's exposed communication, by its framework (``GraphMeta.framework``; None: PyTorch
    DDP); a Horovod run whose gradients go in explicit groups cannot be re-fused (``passes.horovod.set_horovod`` refuses)."""
    par = g.meta.parallel
    if par is not None and par.in_loop_dp[0]:  # what the script can change; whatif refuses where the loop op times some
        text = par.in_loop_text(max(len(g.meta.steps), 1) * max(g.meta.world_size, 1))
        return text + ("; so no what-if predicts this run" if par.looped_dp[0] else "")
    if sizeless(g):
        return f"its collectives were timed without their sizes, so no what-if can price them ({SIZES_HINT})"
    hv = g.meta.horovod
    if hv is not None and any(t.startswith("grouped_") for t in hv.tensor_bytes):
        return "its gradients go in explicit groups (DistributedOptimizer(groups=...)); " + _OTHER
    if g.meta.framework is None and (sparse := sparse_buckets(g)):
        return f"its {len(sparse)} sparse gradients go in buckets of their own, which dagprof optimize does not lay out again; " + _OTHER
    return _REMEDY.get(g.meta.framework, _OTHER)


def sizeless(g) -> bool:
    """A PyTorch trace whose collectives carry no sizes (Kineto without record_shapes): nothing can re-price them."""
    comm = (g.kind == Kind.COMM) & (g.rank < 0)
    return g.meta.framework is None and bool(comm.any()) and not (g.nbytes[comm] > 0).any()


def comm_word(g) -> str:
    """What the job's gradient exchange is called: a parameter server pushes and pulls; ZeRO-1 all-reduces gradients and
    broadcasts the updated parameters from their owners; a sparse gradient's rows are all-gathered (TensorFlow's
    embeddings: most of a ragged recommender's exposed communication)."""
    if g.meta.ps:
        return "push/pull"
    if g.meta.zero:
        return "all-reduce and ZeRO parameter broadcast"
    sparse = (g.role == CommRole.SPARSE) & (g.comm_kind == CommKind.ALL_GATHER)
    return "all-reduce and sparse-gradient all-gather" if sparse.any() else "all-reduce"


def _own_waits(a: Analysis, it_ms: float) -> list[Finding]:
    """Waits at the job's own collectives (``breakdown.own_collectives``: a barrier, a logging or metric all-reduce) are
    no straggler's: ``habits_loop.py``'s rank 0 reached its evaluation's metric all-reduce 1.2 s after rank 1 once in
    8 steps, and analyze named rank 0 a straggler at the all-reduces, 217 ms per iteration, 144 of them there."""
    own = {b.rank: b.own_wait_us / a.steps / 1e3 for b in a.ranks}
    if len(own) < 2 or max(own.values()) <= 0.03 * it_ms:
        return []
    late, waiter = min(own, key=own.get), max(a.ranks, key=lambda b: b.own_wait_us)
    lost = own[waiter.rank]
    return [Finding(
        "ranks wait at the job's own collectives",
        f"rank {late} arrives last at collectives beside DDP's gradient buckets ({', '.join(waiter.own_names)} in "
        f"{a.steps} steps); rank {waiter.rank} waits {lost:.1f} ms per iteration there: work one rank does alone or longer "
        "before them (rank 0's checkpoint or print ahead of a barrier, an evaluation pass) holds the others, not a slow "
        "link or node", lost)]


def findings(a: Analysis) -> list[Finding]:
    out: list[Finding] = []
    it_ms = a.predicted_us / 1e3
    steps = a.steps
    framework = a.graph.meta.framework
    ddp = framework is None and bool(a.graph.meta.buckets)  # optimize re-buckets DDP's recorded layout, nothing else
    remedy = remedy_for(a.graph) if framework or ddp or sizeless(a.graph) else _OTHER
    word = comm_word(a.graph)
    if not any(c == "communication" for c in a.path.by_category) and not any(b.comm_us for b in a.ranks):
        out.append(Finding("no gradient communication seen",
                           "this is not a DDP (data-parallel) job, or its collectives were not profiled: nothing to scale", 0.0))
        return out
    if a.graph.meta.fsdp is not None:  # optimize refuses FSDP runs: say what helps there
        word = "FSDP collective"
        remedy = ("gloo runs them synchronously on CPU, so none overlaps; a faster link or fewer, larger units helps "
                  "(dagprof whatif --bandwidth, --workers predicts them)")
    worst = max(a.ranks, key=lambda b: b.exposed_comm_us)
    exposed = worst.exposed_comm_us / steps / 1e3
    if exposed > 0.05 * it_ms:
        out.append(Finding(
            "communication is exposed",
            f"{exposed:.1f} ms of {it_ms:.1f} ms per iteration on rank {worst.rank} is {word} not hidden behind compute "
            f"({worst.overlap_us / max(worst.comm_us, 1e-9):.0%} of communication overlaps); {remedy}",
            exposed,
        ))
    waits = {b.rank: (b.wait_us - b.own_wait_us) / steps / 1e3 for b in a.ranks}
    out += _own_waits(a, it_ms)
    if len(waits) > 1:
        slow = min(waits, key=waits.get)
        lost = max(waits.values())
        if lost > 0.03 * it_ms:
            out.append(Finding(
                "ranks wait for a straggler",
                f"rank {slow} arrives last at the {word}s; other ranks wait up to {lost:.1f} ms per iteration for it",
                lost,
            ))
    overhead = a.path.by_category.get("framework overhead", 0.0) / steps / 1e3
    if overhead > 0.1 * it_ms:
        out.append(Finding(
            "framework overhead on the critical path",
            f"{overhead:.1f} ms per iteration is time between the timed ops (Python, dispatch, launch latency, or work nothing "
            "timed) on the critical path"
            + (f"; the largest parts: {', '.join(f'{k} {v / steps / 1e3:.1f} ms' for k, v in list(a.path.overhead.items())[:3])}"
               if a.path.overhead else ""),
            overhead,
        ))
    if a.path.top_ops:
        name, us = a.path.top_ops[0]
        out.append(Finding("largest op on the critical path",
                           f"{op_words(name, a.path.layer_types)}: {us / steps / 1e3:.1f} ms per iteration{_between(a, name)}", us / steps / 1e3))
    return sorted(out, key=lambda f: -f.ms_per_iter)


# what the loop's own gaps between the hooked model's calls hold (``traces.run_partition``'s phases): compute the loop runs
# outside the wrapped model lands here untimed, named nowhere else (MoCo's key encoder in ``other:loss``, 59.6 of a 165 ms
# step: bench/ddp_fresh/moco_shuffle_bn.py; a distilled spotter's features and teacher in ``other:pre-forward`` and
# ``other:post-backward``, 240 and 248 ms of an 824 ms step: bench/ddp_fresh/kws_stft_distill.py)
_LOOP_GAPS = {
    "other:pre-forward": "the step's code before the model's first forward: zero_grad, the batch's preparation (features, "
                         "augmentation)",
    "other:loss": "the code between the model's forward and its backward: the loss",
    "other:post-backward": "the code after a backward, before the optimizer or the next micro-batch's forward: clipping, the next "
                           "micro-batch's preparation",
}


def _between(a: Analysis, op: str) -> str:
    """Where an ``other:forward``/``other:backward`` gap (time between timed layers) leads the path: the modules whose
    gradients no timed layer's forward ran, whose code it holds (a profile from before ``nn.MultiheadAttention`` was
    timed as one layer names its attention here, not only "other:forward"; a GAT layer's own attention parameters beside
    its ``lin`` child, ``bench/ddp_fresh/gat_edges.py``, were told to profile again, which times nothing more); where a
    gap of the loop's own leads it
    (``_LOOP_GAPS``), what that can hold."""
    if op in _LOOP_GAPS:
        return (f" (time no hook timed: {_LOOP_GAPS[op]}, and any module run outside the wrapped model there, such as a frozen "
                "teacher or an EMA or momentum encoder; the Kineto trace dagprof profile writes beside each rank names its ops)")
    g = a.graph
    if op not in ("other:forward", "other:backward") or not g.meta.layer_grad_bytes:
        return ""
    ran = {g.layers[k] for k in np.unique(g.layer[np.isin(g.kind, [Kind.FORWARD, Kind.BACKWARD]) & (g.layer >= 0)]).tolist()}
    untimed = [m for m in g.meta.layer_grad_bytes if m not in ran]
    if not untimed:  # every parameter's layer ran: the gap is code in modules with children (a Llama block's rotary and
        # attention, a PointNet++ layer's sampling loop: bench/fsdp_fresh/llama_swiglu.py, hsdp_pointnet2.py), said nowhere
        part = "forward" if op == "other:forward" else "backward"
        return (f" (the {part} of code in modules with children outside their leaf modules, "
                "such as a block's attention arithmetic or a Python loop; code moved into a module of its own is timed as a layer)")
    # the root's own parameters (a DETR's queries, a position table) are counted under its class name, which no layer's
    # path starts with: its forward's own lines, not an untimed attention module (bench/fsdp_fresh/detr_setpred.py)
    roots = [m for m in untimed if "." not in m and not any(str(x).startswith(m + ".") for x in g.layers)]
    modules = [m for m in untimed if m not in roots]
    root = (f"the model's own code outside its layers (the root {', '.join(roots)}'s forward, with its own parameters; the loss, "
            "unless a loss module times it)") if roots else ""
    code = (f"the code of {', '.join(modules[:4])}{' ...' if len(modules) > 4 else ''}, whose parameters no timed layer ran: "
            "a module's own arithmetic on parameters of its own beside its children (a hand-written attention's scores) is no "
            "layer's; only in a profile from before dagprof timed an nn.MultiheadAttention or a weight_norm module as one "
            "layer are those here too") if modules else ""
    return f" (it holds {'; and '.join(x for x in (root, code) if x)})"
