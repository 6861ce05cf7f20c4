"""The global critical path: the chain of ops (on any rank) that set the makespan.

The replayer records for every node the ``gate``: the predecessor or device release that let it
start, and ``start = end[gate] + gap``. Following gates back from the last node to finish gives a
path whose durations plus gaps add up to the makespan exactly, crossing ranks where a collective
waited for a slower one.

Per iteration, the path is taken over the window, its first step mark to its last, as the iteration is: a GPU trace's
device runs behind its host, so the kernels a window launches end after its last step mark (a 1-rank V100 trace's path
of one step was 184.9 ms for a 95.7 ms step); there its last span's worth is kept, and what is left out (the device on
work launched before the window) is said in one line. Ranks that began the window apart stay on it, labelled so
(``analysis.overhead``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..graph.dag import Graph
from ..replay import ReplayResult
from ..traces.events import CommRole, Kind
from ..traces.run_schema import FSDP_ROOT
from .overhead import START_SKEW, overhead_breakdown

CATEGORY = {
    Kind.FORWARD: "forward",
    Kind.BACKWARD: "backward",
    Kind.UPDATE: "update",
    Kind.COMM: "communication",
    Kind.DATA: "data loading",
    Kind.KERNEL: "other compute",
    Kind.MEMCPY: "memcpy",
}


_CATEGORY_OF = {int(k): v for k, v in CATEGORY.items()}


def category(kind: int) -> str:
    return _CATEGORY_OF.get(int(kind), "other")


# the host time a dagprof run's hooks left between its spans (``traces.run_partition``'s ``other:<phase>`` nodes), by phase
_GAP_WORDS = {"pre-forward": "host work before forward (untimed)", "forward": "forward between timed layers",
              "loss": "loss (between forward and backward)", "backward": "backward between timed layers",
              "post-backward": "host work after backward (untimed)", "post-update": "host work after the update (untimed)"}
_ROOT = re.compile(rf"(by )?{re.escape(FSDP_ROOT)}")
# a DDP bucket's host call (``traces.run_comm.bucket_name``: the COMM_ENQUEUE node), beside its collective "all-reduce bucket N"
_BUCKET_CALL = re.compile(r"(allreduce|allgather sparse) bucket (\d+)")


def op_words(label: str, layer_types: dict[str, str] | None = None) -> str:
    """An op's label on the path as a person reads it: ``other:forward`` is "forward between timed layers", FSDP's root unit
    ``all_gather <root>`` "all_gather (root module)", a layer a container numbers with its class (``layer_types``: an
    ``nn.Sequential`` root's ``forward 6`` is "forward 6 ReLU"). ``CriticalPath.top_ops`` and ``--json``'s ``top_ops_ms``
    keep the label (what the graph's nodes are named, which other commands match on); the text, the report and the
    findings say this. A DDP bucket's host call (``allreduce bucket 0``) is "issuing all-reduce bucket 0 (host call)":
    printed beside its collective ("all-reduce bucket 0") it read as the same op listed twice."""
    if m := _BUCKET_CALL.fullmatch(label):
        return f"issuing {'all-reduce' if m.group(1) == 'allreduce' else 'all-gather sparse'} bucket {m.group(2)} (host call)"
    if label.startswith("other:"):
        phase = label[len("other:"):]
        return _GAP_WORDS.get(phase, f"{phase} (untimed)")
    phase, _, layer = label.partition(" ")
    if phase in ("forward", "backward") and layer in (layer_types or {}):
        return f"{label} {layer_types[layer]}"
    return _ROOT.sub(lambda m: "by the root module" if m.group(1) else "(root module)", label)


@dataclass
class CriticalPath:
    nodes: np.ndarray  # node ids, first to last
    total_us: float
    by_category: dict[str, float]  # us on the path per category, "framework overhead" = gaps
    top_ops: list[tuple[str, float]]  # (op or layer name, us on the path), largest first
    ranks_crossed: list[int]  # ranks the path visits, in order of first visit
    overhead: dict[str, float] = field(default_factory=dict)  # "framework overhead" broken down (``analysis.overhead``), us
    note: str | None = None  # why the path was cut to the iteration's span (``critical_path``), None where it was not
    counted: tuple[np.ndarray, np.ndarray] | None = None  # (duration, gap) us of each node counted on the path; None: whole
    layer_types: dict[str, str] = field(default_factory=dict)  # the graph's numbered layers' classes (``op_words``)

    def to_dict(self, per: float = 1.0) -> dict:
        return {
            "total_ms": self.total_us / per / 1e3,
            "by_category_ms": {k: v / per / 1e3 for k, v in self.by_category.items()},
            "top_ops_ms": [[name, us / per / 1e3] for name, us in self.top_ops],
            "top_ops_words": [op_words(name, self.layer_types) for name, _ in self.top_ops],  # each as a person reads it (``op_words``)
            "ranks_crossed": self.ranks_crossed,
            "length": int(len(self.nodes)),
            "overhead_ms": {k: v / per / 1e3 for k, v in self.overhead.items()},
            "note": self.note,
        }


def critical_path(g: Graph, res: ReplayResult, top: int = 10, span_us: float | None = None) -> CriticalPath:
    """The path that set the makespan; with ``span_us`` (the window's last step mark), only its last ``span_us`` where it
    ends later, each node's duration and gap counted from there on."""
    if not len(g):
        return CriticalPath(np.empty(0, np.int64), 0.0, {}, [], [])
    nodes = _gated_back(res, int(np.argmax(res.end)))
    total = float(res.end[nodes[-1]])
    dur, gap, note = g.dur[nodes].astype(np.float64), g.gap[nodes].astype(np.float64), None
    if span_us and total > span_us:
        nodes, dur, gap, note = _over_span(g, res, nodes, total - span_us)
        total = span_us
    # per category and per label, summed in path order (np.bincount adds in input order, as a loop would)
    cat_names = [category(k) for k in range(int(g.kind[nodes].max()) + 1)]
    cat_ids: dict[str, int] = {cat_names[int(g.kind[nodes[0]])]: 0, "framework overhead": 1}
    for k in g.kind[nodes][np.sort(np.unique(g.kind[nodes], return_index=True)[1])].tolist():
        cat_ids.setdefault(cat_names[k], len(cat_ids))
    code = np.array([cat_ids.get(c, -1) for c in cat_names], dtype=np.int64)[g.kind[nodes]]
    sums = np.bincount(code, weights=dur, minlength=len(cat_ids))
    sums[1] = np.bincount(np.zeros(len(nodes), np.int64), weights=gap)[0]
    by_cat = {c: float(sums[i]) for c, i in cat_ids.items()}
    layer, bucket = g.layer[nodes].astype(np.int64) + 1, g.bucket[nodes].astype(np.int64) + 1
    where = np.unique(layer * (int(bucket.max()) + 1) + bucket, return_inverse=True)[1].reshape(-1)  # (layer, bucket) -> one id
    key = (where * 256 + g.kind[nodes].astype(np.int64)) * (len(g.names) + 1) + g.name[nodes]  # < 2**63 for any real graph
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    label_ids: dict[str, int] = {}
    key_label = np.empty(len(first), dtype=np.int64)
    for k in np.argsort(first, kind="stable").tolist():
        key_label[k] = label_ids.setdefault(_label(g, int(nodes[first[k]])), len(label_ids))
    op_sums = np.bincount(key_label[inv.reshape(-1)], weights=dur, minlength=len(label_ids))
    del layer, bucket, where, key, first, inv, code  # a node's worth each: gone before the overhead's walk
    per_op = {label: float(op_sums[i]) for label, i in label_ids.items()}
    by_cat = {k: v for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1]) if v > 0}
    ops = sorted(((k, v) for k, v in per_op.items() if v > 0), key=lambda kv: -kv[1])[:top]
    ranks = g.rank[nodes][g.rank[nodes] >= 0]
    crossed, at = np.unique(ranks, return_index=True)
    return CriticalPath(nodes, total, by_cat, ops, crossed[np.argsort(at)].tolist(),
                        overhead_breakdown(g, nodes, category, None if note is None else gap), note,
                        None if note is None else (dur, gap), dict(g.meta.layer_types))


def _over_span(g: Graph, res: ReplayResult, nodes: np.ndarray, cut_us: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """The path's nodes from ``cut_us`` on, each one's duration and gap counted after it, and the line that says why."""
    start, end = res.start[nodes].astype(np.float64), res.end[nodes].astype(np.float64)
    waits = float(g.gap[nodes].astype(np.float64).sum())
    keep = end > cut_us
    nodes, start, end = nodes[keep], start[keep], end[keep]
    dur = np.minimum(end - np.maximum(start, cut_us), g.dur[nodes].astype(np.float64))
    gap = np.clip(start - cut_us, 0.0, g.gap[nodes].astype(np.float64))
    note = (f"the critical path ends {cut_us / 1e3:.2f} ms after the window's last step mark (the device runs behind its host): "
            f"counted over the window, as the iteration is; the {cut_us / 1e3:.2f} ms before left out, "
            f"{(waits - float(gap.sum())) / 1e3:.2f} ms of them framework overhead (work from before the window)")
    return nodes, dur, gap, note


def ps_key(g: Graph, key: int) -> str:
    """A parameter server's key with the parameter it carries, which the user knows it by (a number alone did not say
    that key 7 was a DeepFM's 1.3 MB embedding table)."""
    name = next((k.name for k in g.meta.ps.keys if k.key == key), "")
    return f"push/pull key {key}" + (f" ({name})" if name else "")


def _gated_back(res: ReplayResult, v: int) -> np.ndarray:
    """The chain of gates that ends at ``v``, first to last: filled from the back into one array (a list of a million
    Python ints held 36 MB through the rest of the analysis)."""
    out = np.empty(len(res.gate), dtype=np.int64)
    i = len(out)
    while v >= 0:
        i -= 1
        out[i] = v
        v = int(res.gate[v])
    return out[i:].copy()


def _label(g: Graph, v: int) -> str:
    """Group a node with its peers on other ranks and steps: by layer, bucket or op name."""
    kind = category(g.kind[v])
    if g.layer[v] >= 0:
        return f"{kind} {g.layers[g.layer[v]]}"
    if g.kind[v] == Kind.COMM and g.bucket[v] >= 0:  # a parameter server's key, Horovod's fused response, DDP's bucket
        sparse = g.role[v] == CommRole.SPARSE  # a sparse gradient's, gathered
        return (ps_key(g, int(g.bucket[v])) if g.meta.ps else f"fused all-reduce {g.bucket[v]}" if g.meta.horovod
                else f"{'all-gather sparse' if sparse else 'all-reduce'} bucket {g.bucket[v]}")
    name = g.node_name(v)
    return name.split(".", 1)[1] if name.startswith("rank") and "." in name else name.rsplit(".", 1)[0]


def skew_note(g: Graph, res: ReplayResult, path: CriticalPath, iteration_us: float) -> str | None:
    """The line that says why the path per iteration is longer than the (slowest rank's) iteration where it is: it starts
    at the first rank's first step mark, and ranks that began the window later add their start to it, labelled
    ``START_SKEW``; None where it is not longer."""
    steps = max(len(g.meta.steps), 1)
    excess = path.total_us / steps - iteration_us
    if not excess > 1e-9 * max(iteration_us, 1.0):
        return None
    marks = g.kind == Kind.STEP
    firsts = [float(res.start[marks & (g.rank == r)].min()) for r in g.ranks() if np.any(marks & (g.rank == r))]
    return (f"the critical path is {excess / 1e3:.2f} ms per iteration longer than the iteration: it starts at the first "
            f"rank's first step mark, and the ranks began the window up to {(max(firsts) - min(firsts)) / 1e3:.2f} ms apart "
            f"(on the path as framework overhead, '{START_SKEW}': {path.overhead.get(START_SKEW, 0.0) / steps / 1e3:.2f} ms)")
