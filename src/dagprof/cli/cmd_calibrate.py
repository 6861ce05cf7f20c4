"""``dagprof calibrate``: measure all-reduce (and FSDP2's all-gather and reduce-scatter) over message sizes and save the link model.

Three sources, one output format (``whatif --link-model FILE``):
- live, spawned: ``dagprof calibrate -o link.json --world 2`` starts gloo ranks on this machine
  (``--fsdp``: also FSDP2's optimizer step and copy-out, for ``whatif --data-parallel fsdp`` of a DDP profile;
  ``--overlap``: also how much an in-flight all-reduce slows compute, for ``optimize --link-model``);
- live, inside a job: ``torchrun --nproc-per-node 4 -m dagprof.cli.main calibrate -o link.json``
  (RANK/WORLD_SIZE set: joins that group, rank 0 writes);
- tables: ``dagprof calibrate --nccl-tests DIR -o a100.json`` fits every nccl-tests table in
  DIR, one link per GPU count.
"""
from __future__ import annotations

import argparse
import os

import msgspec
import numpy as np

from ..collect.measure import calibrate as live
from ..collect.measure.overlap import OVERLAP_BYTES
from ..costmodel.alphabeta import ring_allreduce_us
from ..costmodel.calibrate_lut import fit_lut_folder
from ..costmodel.topology import allreduce_equivalent_factor, save_link_model
from ..errors import DagprofError
from ..fsutil import check_output_folder
from ..passes.compression import chained_text
from ..traces.cpu_sets import usable_cpus
from ..traces.events import CommKind
from ..units import MB
from .common import finite_positive, positive_int, shown

HELP = "measure collective times over message sizes (live gloo group, or nccl-tests tables) and save a link model"


def add_arguments(p) -> None:
    p.add_argument("-o", "--out", default="link-model.json", help="where to write the link model (JSON; default link-model.json)")
    p.add_argument("--world", type=positive_int, default=2, help="ranks to spawn on this machine (default 2; ignored inside torchrun)")
    p.add_argument("--max-mb", type=finite_positive, default=16.0, help="largest message (MiB, default 16); sizes go up by 4x from 4 KiB")
    p.add_argument("--iters", type=positive_int, default=5, help="timed repetitions per size, their median kept (default 5)")
    p.add_argument("--kinds", type=_kinds, default=live.KINDS, metavar="K[,K]",
                   help="live: collectives to sweep besides the all-reduce, each fitted on its own (FSDP's collectives are priced by "
                        "their kind's fit): all_gather, reduce_scatter (default: both); all_reduce alone: none")
    p.add_argument("--fsdp", action="store_true",
                   help="live: also measure FSDP2's costs that a DDP profile cannot show (the optimizer on DTensor shards against plain "
                        "tensors, the all-gather copy-out per byte, each unit's hooks and waits beyond its collectives) on small "
                        "fully_shard models; whatif --data-parallel fsdp uses them")
    p.add_argument("--overlap", action="store_true",
                   help="live: also measure how much an in-flight all-reduce (--overlap-mb) slows compute on the ranks (a matrix-product "
                        "loop alone and beside it) and the loop the all-reduce; optimize and sgd --link-model price overlap by it")
    p.add_argument("--overlap-mb", type=finite_positive, default=OVERLAP_BYTES / 2**20, metavar="MIB",
                   help="--overlap: the all-reduce's size (default 8): the slowdowns depend on it, so give the size of the job's "
                        "all-reduces that overlap compute (dagprof sgd: WFBP's per-layer gradients)")
    p.add_argument("--nccl-tests", metavar="PATH", help="fit nccl-tests all-reduce tables (a file or a folder) instead of measuring")


def _kinds(text: str) -> tuple[CommKind, ...]:
    known = {k.label: k for k in live.KINDS}
    labels = tuple(k.strip() for k in text.split(",") if k.strip())
    if not labels or any(k not in known for k in labels):
        raise argparse.ArgumentTypeError(f"collective kinds are {', '.join(known)}, got {text!r}")
    return tuple(known[k] for k in labels)


def _sizes(max_mb: float) -> tuple[int, ...]:
    if not max_mb > 0:
        raise DagprofError(f"--max-mb must be positive, got {max_mb}")
    top = int(max_mb * MB)
    sizes = [s for s in live.DEFAULT_SIZES if s <= top] or [4096]
    return tuple(sizes) + ((top,) if top > sizes[-1] else ())


def run(args) -> dict:
    if os.path.isdir(args.out):
        raise DagprofError("is a folder: give -o the link model's file name", args.out)
    check_output_folder(os.path.dirname(os.path.abspath(args.out)))  # before the sweep, not after it
    if args.nccl_tests:
        fits = fit_lut_folder(args.nccl_tests)
        largest = fits[max(fits)]
        path = save_link_model(args.out, largest.link, by_workers={n: f.link for n, f in fits.items()}, source=os.path.abspath(args.nccl_tests),
                               method="nccl-tests tables, ring alpha-beta fit per GPU count")
        rows = [{"workers": n, "alpha_us": f.link.alpha_us, "bandwidth_GBps": f.link.bandwidth_bytes_per_s / 1e9,
                 "median_error_pct": float(np.median(np.abs(ring_allreduce_us(f.nbytes, n, f.link) - f.time_us) / f.time_us) * 100)}
                for n, f in sorted(fits.items())]
        return {"out": path, "source": "nccl-tests", "fits": rows}
    if args.iters < 1:
        raise DagprofError(f"--iters must be >= 1, got {args.iters}")
    sizes = _sizes(args.max_mb)
    load = os.getloadavg()[0]
    measured = live.live_sweep(args.world, sizes, args.iters, args.kinds, args.fsdp, args.overlap, int(args.overlap_mb * 2**20))
    world, points = measured.world, measured.points
    link = live.fit(points, world)
    kinds = {s.kind.label: (live.fit(s.points, world, s.kind), {"points": s.points, "skew_us": s.skew_us, "times_us": s.times_us})
             for s in measured.sweeps[1:]}
    path = None
    if measured.rank == 0:
        fsdp, record = measured.fsdp or (None, None)
        path = save_link_model(args.out, link, kinds=kinds, fsdp=fsdp, fsdp_record=record,
                               overlap=None if measured.overlap is None else msgspec.to_builtins(measured.overlap),
                               backend="gloo", workers=world, points=points, skew_us=measured.sweeps[0].skew_us, times_us=measured.sweeps[0].times_us,
                               cpus=usable_cpus(), load=[load, os.getloadavg()[0]],
                               method="live sweep, ring alpha-beta fit (per kind: of its all-reduce-equivalent bytes)")
    rows = [{"nbytes": m, "measured_us": t, "model_us": float(ring_allreduce_us(m, world, link))} for m, t in points]
    per_kind = [{"kind": s.kind.label, "alpha_us": ab.alpha_us, "bandwidth_GBps": ab.bandwidth_bytes_per_s / 1e9,
                 "points": [{"nbytes": m, "measured_us": t, "model_us": float(ring_allreduce_us(m * allreduce_equivalent_factor(s.kind), world, ab)),
                             "skew_us": k} for (m, t), k in zip(s.points, s.skew_us)]}
                for s in measured.sweeps[1:] for ab in [kinds[s.kind.label][0]]]
    return {"out": path, "source": "live", "workers": world, "alpha_us": link.alpha_us,
            "bandwidth_GBps": link.bandwidth_bytes_per_s / 1e9, "points": rows, "kinds": per_kind,
            "fsdp": None if measured.fsdp is None else {**measured.fsdp[0].to_dict(), **measured.fsdp[1]},
            "overlap": None if measured.overlap is None else msgspec.to_builtins(measured.overlap)}


def to_text(r: dict) -> str:
    if r["source"] == "nccl-tests":
        lines = [f"{'GPUs':>5} {'alpha us':>9} {'GB/s':>8} {'median err':>11}"]
        lines += [f"{f['workers']:>5} {f['alpha_us']:>9.2f} {f['bandwidth_GBps']:>8.1f} {f['median_error_pct']:>10.1f}%" for f in r["fits"]]
    else:
        lines = [f"{r['workers']} gloo ranks: alpha {r['alpha_us']:.1f} us, bandwidth {r['bandwidth_GBps']:.3f} GB/s",
                 f"{'bytes':>10} {'measured us':>12} {'model us':>10}"]
        lines += [f"{p['nbytes']:>10} {p['measured_us']:>12.1f} {p['model_us']:>10.1f}" for p in r["points"]]
        for k in r["kinds"]:
            lines += [f"{k['kind']}: alpha {k['alpha_us']:.1f} us, bandwidth {k['bandwidth_GBps']:.3f} GB/s (as an all-reduce of its "
                      f"all-reduce-equivalent bytes)", f"{'bytes':>10} {'measured us':>12} {'model us':>10} {'rank skew us':>13}"]
            lines += [f"{p['nbytes']:>10} {p['measured_us']:>12.1f} {p['model_us']:>10.1f} {p['skew_us']:>13.1f}" for p in k["points"]]
        if r.get("fsdp"):
            f = r["fsdp"]
            lines += [f"FSDP2 ({f['optimizer']} on {f['world']} ranks): step on plain tensors {f['plain_step']['us_per_tensor']:.1f} us/tensor + "
                      f"{f['plain_step']['us_per_byte'] * 1e6:.1f} us/MB, on DTensor shards {f['dtensor_step']['us_per_tensor']:.1f} us/tensor + "
                      f"{f['dtensor_step']['us_per_byte'] * 1e6:.1f} us/MB (of the shard); copy-out {f['copy_out_us_per_byte'] * 1e6:.1f} us/MB; "
                      f"DDP's bucket passes (in, back) {f['bucket_in_us_per_byte'] * 1e6:.1f} and {f['bucket_out_us_per_byte'] * 1e6:.1f} us/MB; per unit "
                      f"beyond its collectives: forward {f['unit_forward_us']:.0f} us, backward {f['unit_backward_us']:.0f} us, and per MB of the unit "
                      f"beyond its copy-outs {f['unit_forward_us_per_byte'] * 1e6:.0f} and {f['unit_backward_us_per_byte'] * 1e6:.0f} us more"]
        if r.get("overlap"):
            o = r["overlap"]
            lines.append(f"compute beside an in-flight {o['allreduce_bytes'] / MB:.3g} MiB all-reduce ({o['allreduce_s'] * 1e3:.1f} ms): "
                         f"compute overlapping it for a fraction f of its time takes (1 + {o['slowdown']:.2f} f) as long, the all-reduce beside "
                         f"compute (1 + {o.get('comm_slowdown', 0.0):.2f} f); PowerSGD's hook's CPU between chained all-reduces "
                         f"{o.get('chained_stretch', 0.0):.2f}x its idle time; its chained all-reduces beside a busy backward "
                         + (chained_text(o["chained_busy"], 2) if o.get("chained_busy") else "not measured")
                         + " (use with: dagprof optimize RUN --link-model FILE; dagprof sgd LAYERS "
                         "--link-model FILE)")
    if r["out"]:
        lines.append(f"link model: {shown(r['out'])} (use with: dagprof whatif RUN --link-model {shown(r['out'])})")
    return "\n".join(lines)
