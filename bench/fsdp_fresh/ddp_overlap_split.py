"""How much of an FSDP -> DDP miss is DDP's compute slowed beside its own all-reduces, read from a pair of profiles of
one job (FSDP, then DDP): each layer's backward per step in the DDP profile over the same layer's in the FSDP profile,
against the share of it the DDP replay ran beside an in-flight all-reduce (``passes.overlap.comm_overlap``). A least-
squares line ratio = a + s x share gives s, the slowdown per unit of overlap the pair measured (the model's units), and
a, what DDP's backward took more everywhere (its autograd hooks, load); s x each layer's overlapped time is the
overlap's part of the step, beside the whole step's difference of each category.

usage: python bench/fsdp_fresh/ddp_overlap_split.py PAIR...   (PAIR: FSDP_DIR:DDP_DIR, or a folder holding fsdp/ and ddp/)
"""
from __future__ import annotations

import os
import sys

import numpy as np

from dagprof.graph.build import build_graph
from dagprof.passes.overlap import comm_overlap
from dagprof.replay import replay
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import Kind

CATEGORIES = (Kind.FORWARD, Kind.BACKWARD, Kind.UPDATE, Kind.OTHER)


def per_step(g, kinds=CATEGORIES) -> dict[str, float]:
    """ms per step of each category on the ranks' mean."""
    n = len(g.meta.steps) * max(len(np.unique(g.rank[g.rank >= 0])), 1)
    return {k.name.lower(): float(g.dur[(g.kind == k) & (g.rank >= 0) & (g.step >= 0)].sum()) / n / 1e3 for k in kinds}


def backward_by_layer(g, res=None):
    """(rank, layer) -> (mean backward us per step, mean overlapped share) over the profiled steps."""
    bw = np.flatnonzero((g.kind == Kind.BACKWARD) & (g.rank >= 0) & (g.layer >= 0) & (g.step >= 0))
    share = comm_overlap(g, res, bw) if res is not None else np.zeros(len(bw))
    out = {}
    for r in np.unique(g.rank[bw]).tolist():
        for lay in np.unique(g.layer[bw]).tolist():
            m = (g.rank[bw] == r) & (g.layer[bw] == lay)
            out[(r, g.layers[lay])] = (float(g.dur[bw][m].sum()) / len(g.meta.steps), float(np.average(share[m], weights=g.dur[bw][m])))
    return out


def split(fsdp_dir: str, ddp_dir: str) -> None:
    f, d = build_graph(read_run(fsdp_dir)), build_graph(read_run(ddp_dir))
    res = replay(d)
    fb, db = backward_by_layer(f), backward_by_layer(d, res)
    keys = [k for k in db if k in fb and fb[k][0] > 0]
    ratio = np.array([db[k][0] / fb[k][0] for k in keys])
    share = np.array([db[k][1] for k in keys])
    weight = np.array([fb[k][0] for k in keys])
    if share.max() - share.min() > 1e-3:
        a_mat = np.stack([np.ones(len(keys)), share], axis=1) * np.sqrt(weight)[:, None]
        a, s = np.linalg.lstsq(a_mat, ratio * np.sqrt(weight), rcond=None)[0]
    else:
        a, s = float(np.average(ratio, weights=weight)), float("nan")
    ranks = len({r for r, _ in keys})
    overlapped = sum(fb[k][0] * db[k][1] for k in keys) / ranks / 1e3
    fc, dc = per_step(f), per_step(d)
    before, after = (sum(x[k][0] for k in keys) / ranks / 1e3 for x in (fb, db))
    print(f"{ddp_dir}: backward per step {before:.2f} ms (FSDP) -> {after:.2f} (DDP); {overlapped:.2f} ms of it beside an all-reduce; "
          f"fit ratio = {a:.3f} + {s:.2f} x share: overlap's part {s * overlapped:+.2f} ms, the rest {(a - 1) * before:+.2f} ms")
    print("  per step (ms, ranks' mean): " + ", ".join(f"{c} {fc[c]:.2f} -> {dc[c]:.2f}" for c in fc))


def main() -> None:
    for arg in sys.argv[1:]:
        fsdp, ddp = arg.split(":", 1) if ":" in arg else (os.path.join(arg, "fsdp"), os.path.join(arg, "ddp"))
        split(fsdp, ddp)


if __name__ == "__main__":
    main()
