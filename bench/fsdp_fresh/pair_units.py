"""Where a DDP -> FSDP prediction misses, unit by unit, on kept pairs of ``mixer_rounds.sh`` (``ROUND/ddp``, ``ROUND/fsdp``)
or of ``bench_lora_memory.py`` (``DIR/ddp-K``, ``DIR/fsdp-K``): the FSDP profile's replayed step beside the DDP profile's
conversion (as ``whatif --data-parallel fsdp`` builds it), per FSDP unit: its all-gathers' and reduce-scatter's start and
end, its forward and backward layers' span (first rank in, last rank out), the reduce-scatter's lag (its start less the
unit's last backward layer's end on the later rank) and the optimizer's span; ms from the step's start, medians over the
profiled steps. ``--sum`` prints one line a pair instead: the step, and the terms summed over units; ``--kinds`` each
collective kind's calls a step and, per call, its transfer, the span from the later rank's issue to the ranks' wake
(transfer and lags, not the earlier rank's wait for its peer), each rank's blocked span, the ranks' wait after the
transfer ended (mean per call) and that of each step's last call of the kind (FSDP2's last reduce-scatter: the one
its final backward callback issues for a unit whose inputs need no gradient). No timing: run it anywhere.

    PYTHONPATH=src python bench/fsdp_fresh/pair_units.py [--sum | --kinds] OUT/r1 OUT/r2 ...   (from the repository root)
"""
from __future__ import annotations

import os
import sys
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pair_categories import pairs  # noqa: E402

from dagprof.graph.build_fsdp import fsdp_collectives  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.replay import replay  # noqa: E402
from dagprof.search import scenario  # noqa: E402
from dagprof.traces.events import CommKind, Kind  # noqa: E402

COLS = ("agf0", "agf1", "fwd0", "fwd1", "agb0", "agb1", "bwd0", "bwd1", "rs0", "rs1", "rslag", "opt0", "opt1")


def units(g) -> dict[str, dict[str, dict[str, float]]]:
    """unit -> column -> median ms over steps (``COLS``; ``step`` under the unit ``"*"``)."""
    r = replay(g)
    layer_unit = {x: u.name for u in g.meta.fsdp.units for x in u.layers}
    unit_of = np.array([layer_unit.get(x, "") for x in g.layers] + [""], dtype=object)
    lay = np.where(g.layer >= 0, g.layer, len(g.layers))
    node_unit = unit_of[lay]
    colls = fsdp_collectives(g)
    rows: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for step in g.meta.steps:
        on = np.flatnonzero((g.step == step) & (g.rank >= 0))
        t0 = float(r.start[on].min())
        rows["*"]["step"].append((float(r.end[on].max()) - t0) / 1e3)
        upd = on[g.kind[on] == Kind.UPDATE]
        if len(upd):
            rows["*"]["opt0"].append((float(r.start[upd].min()) - t0) / 1e3)
            rows["*"]["opt1"].append((float(r.end[upd].max()) - t0) / 1e3)
        bwd_end = {}
        for kind, tag in ((Kind.FORWARD, "fwd"), (Kind.BACKWARD, "bwd")):
            sel = on[(g.kind[on] == kind)]
            for u in {node_unit[v] for v in sel.tolist()} - {""}:
                m = sel[node_unit[sel] == u]
                rows[u][tag + "0"].append((float(r.start[m].min()) - t0) / 1e3)
                rows[u][tag + "1"].append((float(r.end[m].max()) - t0) / 1e3)
                if tag == "bwd":
                    bwd_end[u] = float(r.end[m].max())
        seen: dict[str, int] = defaultdict(int)
        for c in sorted((c for c in colls if g.step[c.node] == step), key=lambda c: float(r.start[c.node])):
            s, e = float(r.start[c.node]), float(r.end[c.node])
            if c.kind == CommKind.ALL_GATHER:
                tag = "agf" if seen[c.unit] == 0 else "agb"
                seen[c.unit] += 1
            elif c.kind == CommKind.REDUCE_SCATTER:
                tag = "rs"
                if c.unit in bwd_end:
                    rows[c.unit]["rslag"].append((s - bwd_end[c.unit]) / 1e3)
                rows[c.unit]["rsdur"].append((e - s) / 1e3)
            else:
                continue
            if tag in ("agf", "agb"):
                rows[c.unit][tag + "dur"].append((e - s) / 1e3)
            rows[c.unit][tag + "0"].append((s - t0) / 1e3)
            rows[c.unit][tag + "1"].append((e - t0) / 1e3)
    return {u: {k: float(np.median(v)) for k, v in cols.items()} for u, cols in rows.items()}


def kinds(g) -> dict[str, dict[str, float]]:
    """kind -> calls a step, medians per call (ms) of its transfer (the shared node), of the later issue to the ranks' wake
    and of the ranks' blocked span (each rank's issue's start to its wait's end, as replayed, averaged over the ranks),
    and means of the ranks' wait after the transfer ended: per call, and of each step's last call."""
    r = replay(g)
    enq_at: dict[tuple[int, str], list[float]] = defaultdict(list)  # (step, the name) -> its starts
    for e in np.flatnonzero(g.kind == Kind.COMM_ENQUEUE).tolist():
        enq_at[(int(g.step[e]), g.node_name(e))].append(float(r.start[e]))
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    last: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)  # kind -> step -> (order, lag) of its latest call
    for c in sorted(fsdp_collectives(g), key=lambda c: float(g.order[c.node])):
        if c.kind not in (CommKind.ALL_GATHER, CommKind.REDUCE_SCATTER):
            continue
        v = c.node
        label = g.node_name(v).rpartition(".")[0]  # "<kind> <unit>[ (prefetched by <unit>)]"
        issued, ends, gaps = [], [], []
        for w in g.succ[g.indptr[v]:g.indptr[v + 1]].tolist():
            starts = [t for t in enq_at.get((int(g.step[v]), f"rank{g.rank[w]}.fsdp {label}"), []) if t <= r.end[w]]
            if g.kind[w] == Kind.COMM_WAIT:
                gaps.append(float(g.gap[w]))
            if g.kind[w] == Kind.COMM_WAIT and starts:
                issued.append(max(starts))
                ends.append(float(r.end[w]))
        spans = [e - s for s, e in zip(issued, ends)]
        if gaps:  # the ranks' wait after the transfer ended (mean), by the call's place in its step's issue order
            last[c.kind.name.lower()][int(g.step[v])] = (float(g.order[v]), float(np.mean(gaps)) / 1e3)
            out[c.kind.name.lower()]["lag"].append(float(np.mean(gaps)) / 1e3)
        if issued:
            out[c.kind.name.lower()]["last_in"].append((float(np.mean(ends)) - max(issued)) / 1e3)
        k = c.kind.name.lower()
        out[k]["transfer"].append(float(r.end[v] - r.start[v]) / 1e3)
        if spans:
            out[k]["blocked"].append(float(np.mean(spans)) / 1e3)
    steps = max(len(g.meta.steps), 1)
    return {k: {"calls": len(x["transfer"]) / steps, "transfer": float(np.median(x["transfer"])),
                "blocked": float(np.median(x["blocked"])) if x["blocked"] else float("nan"),
                "blocked_sum": float(np.sum(x["blocked"])) / steps,
                "last_in": float(np.median(x["last_in"])) if x["last_in"] else float("nan"),
                "lag": float(np.mean(x["lag"])) if x["lag"] else float("nan"),
                "last_lag": float(np.mean([lag for _, lag in last[k].values()])) if last[k] else float("nan")} for k, x in out.items()}


def converted(ddp):
    c = scenario.Cluster()
    return scenario.apply(ddp, scenario.Scenario(data_parallel="fsdp"), c, scenario.base_topology(ddp, c))


def totals(t: dict[str, dict[str, float]]) -> dict[str, float]:
    us = [u for u in t if u != "*"]
    return {"step": t["*"]["step"], "ag": sum(t[u].get("agfdur", 0) + t[u].get("agbdur", 0) for u in us),
            "rs": sum(t[u].get("rsdur", 0) for u in us), "rslag": sum(t[u].get("rslag", 0) for u in us),
            "bwdspan": max((t[u].get("bwd1", 0) for u in us), default=0) - min((t[u].get("bwd0", 1e9) for u in us), default=0),
            "fwdend": max((t[u].get("fwd1", 0) for u in us), default=0),
            "opt": t["*"].get("opt1", 0) - t["*"].get("opt0", 0), "opt0": t["*"].get("opt0", 0)}


def main() -> None:
    summed, by_kind = "--sum" in sys.argv, "--kinds" in sys.argv
    roots = [a for a in sys.argv[1:] if a not in ("--sum", "--kinds")]
    if by_kind:
        head = f"{'xfer':>5s} {'last':>5s} {'blockd':>6s} {'sum':>6s} {'lag':>5s} {'lastc':>5s}"
        print(f"{'pair':34s} {'':5s} {'AG/step':>7s} {head}   {'RS/step':>7s} {head}")
        for root in roots:
            for label, ddp_dir, fsdp_dir in pairs(root):
                for name, g in (("fsdp", open_run(fsdp_dir).graph), ("conv", converted(open_run(ddp_dir).graph))):
                    k = kinds(g)
                    cells = [f"{k[x]['calls']:7.1f} {k[x]['transfer']:5.2f} {k[x]['last_in']:5.2f} {k[x]['blocked']:6.2f} "
                             f"{k[x]['blocked_sum']:6.1f} {k[x]['lag']:5.2f} {k[x]['last_lag']:5.2f}" if x in k else " " * 45
                             for x in ("all_gather", "reduce_scatter")]
                    print(f"{label[-34:]:34s} {name:5s} " + "   ".join(cells), flush=True)
        return
    if summed:
        print(f"{'pair':34s} {'':5s} {'step':>6s} {'fwdend':>6s} {'bwdspan':>7s} {'opt0':>6s} {'opt':>5s} {'ag':>6s} {'rs':>6s} {'rslag':>6s}")
    for root in roots:
        for label, ddp_dir, fsdp_dir in pairs(root):
            meas, conv = units(open_run(fsdp_dir).graph), units(converted(open_run(ddp_dir).graph))
            if summed:
                for name, t in (("fsdp", meas), ("conv", conv)):
                    x = totals(t)
                    print(f"{label[-34:]:34s} {name:5s} {x['step']:6.1f} {x['fwdend']:6.1f} {x['bwdspan']:7.1f} {x['opt0']:6.1f} "
                          f"{x['opt']:5.1f} {x['ag']:6.1f} {x['rs']:6.1f} {x['rslag']:6.1f}", flush=True)
                continue
            print(f"== {label}: step fsdp {meas['*']['step']:.1f} ms, converted {conv['*']['step']:.1f}; optimizer "
                  f"{meas['*'].get('opt0', 0):.1f}-{meas['*'].get('opt1', 0):.1f} / {conv['*'].get('opt0', 0):.1f}-{conv['*'].get('opt1', 0):.1f}")
            print(f"  {'unit':18s} " + " ".join(f"{c:>11s}" for c in COLS))
            for u in sorted(set(meas) | set(conv), key=lambda u: meas.get(u, conv.get(u, {})).get("fwd0", 1e9)):
                if u == "*":
                    continue
                cells = [f"{meas.get(u, {}).get(c, float('nan')):5.1f}/{conv.get(u, {}).get(c, float('nan')):<5.1f}" for c in COLS]
                print(f"  {u[:18]:18s} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
