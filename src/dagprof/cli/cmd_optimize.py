from __future__ import annotations

from ..pipeline import open_run
from ..search import search_bucket_sizes
from ..search.buckets import DEFAULT_CAPS_MB
from .common import add_run_arguments, comma_list, positive_number

HELP = "search DDP bucket sizes (tensor fusion) by replay and recommend the fastest"


def add_arguments(p) -> None:
    add_run_arguments(p)
    p.add_argument("--bucket-mb", type=comma_list(positive_number), default=list(DEFAULT_CAPS_MB), help="candidate bucket sizes in MB, comma separated")


def run(args) -> dict:
    caps = tuple(args.bucket_mb)
    prof = open_run(args.run, steps=args.steps, step_marker=args.step_marker)
    search = search_bucket_sizes(prof.graph, caps)
    best = search.best.cap_mb
    advice = ("keep the current buckets: no candidate is predicted faster" if best is None or search.predicted_gain_pct < 0.5
              else f"DistributedDataParallel(model, bucket_cap_mb={best:g}), then profile again to verify")
    return search.to_dict() | {"recommendation": advice}


def to_text(r: dict) -> str:
    lines = [f"{'bucket size':>12} {'buckets/step':>13} {'predicted ms':>13}",
             f"{'profiled':>12} {r['current']['buckets_per_step']:>13} {r['current']['predicted_iter_ms']:>13.2f}"]
    for c in r["candidates"]:
        lines.append(f"{c['bucket_cap_mb']:>9g} MB {c['buckets_per_step']:>13} {c['predicted_iter_ms']:>13.2f}")
    lines.append(f"replay of the profiled layout with its measured transfer times: {r['measured_layout_replay_ms']:.2f} ms")
    lines.append(f"best: {r['best']['bucket_cap_mb'] or 'the profiled layout'} (predicted {r['predicted_gain_pct']:.1f} % faster)")
    lines.append(f"recommendation: {r['recommendation']}")
    return "\n".join(lines)
