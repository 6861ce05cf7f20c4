"""Where ``whatif --units merge:all`` misses, category by category: a per-block FSDP profile (``mae_units_rounds.sh``'s
``OUT/rK``), its merge:all, and a profile of the job run with ``fully_shard`` on the root only, each as a step's main
lanes split as ``workers_categories.row`` splits them (busy, optimizer, wake-ups, idle, each kind's transfer), the
collectives by kind and size (calls a step, bytes, transfer) and per call as ``pair_units.kinds`` reads them (blocked
span, the wait after the transfer ended), with each graph's peak memory and where it falls. No timing: run it anywhere;
compare shares, not milliseconds, where the profiles ran at different loads.

    PYTHONPATH=src python bench/fsdp_fresh/merge_split.py BLOCKS_PROFILE ROOT_ONLY_PROFILE   (from the repository root)
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pair_units import kinds  # noqa: E402
from workers_categories import row, step_ms  # noqa: E402

from dagprof.graph.build_fsdp import fsdp_collectives  # noqa: E402
from dagprof.pipeline import open_run  # noqa: E402
from dagprof.search import scenario  # noqa: E402
from dagprof.search.fsdp_memory import fsdp_peak  # noqa: E402
from dagprof.traces.events import CommKind  # noqa: E402


def graphs(blocks: str, root: str):
    c = scenario.Cluster()
    b = scenario.profiled_at(open_run(blocks).graph, c)
    yield "per-block profile", b
    yield "its merge:all", scenario.apply(b, scenario.Scenario(units="merge:all"), c, scenario.base_topology(b, c))
    yield "root-only profile", scenario.profiled_at(open_run(root).graph, c)


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.strip().splitlines()[-1].strip())
    for label, g in graphs(*sys.argv[1:]):
        r, steps = row(g), max(len(g.meta.steps), 1)
        print(f"{label}: step {step_ms(g):.1f} ms; " + ", ".join(f"{k} {v:.2f}" for k, v in r.items())
              + f" ms ({100 * (r['wake-ups'] + r['idle']) / r['busy']:.1f} % of busy waiting)")
        cs = fsdp_collectives(g)
        for k in (CommKind.ALL_GATHER, CommKind.REDUCE_SCATTER):
            mine = [c.node for c in cs if c.kind == k]
            per = kinds(g).get(k.name.lower(), {})
            print(f"  {k.label}: {len(mine) / steps:.0f} a step, {sum(int(g.nbytes[v]) for v in mine) / steps / 2**20:.2f} MiB; per call: "
                  f"transfer {per.get('transfer', 0):.2f}, blocked {per.get('blocked', 0):.2f}, wait after it {per.get('lag', 0):.2f} ms")
        m = max(fsdp_peak(g).values(), key=lambda m: m.total)
        print(f"  peak {m.total / 2**20:.2f} MiB at {m.at} (gathered {m.gathered / 2**20:.2f}, activations {m.activations / 2**20:.2f})")


if __name__ == "__main__":
    main()
