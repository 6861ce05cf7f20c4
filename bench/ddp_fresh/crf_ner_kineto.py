"""The BiLSTM-CRF tagger (``crf_ner_stream.py``) traced the way its user traces it: plain ``torch.profiler``, no dagprof.

The user's own habits with the profiler (none of the other stock-trace scripts has them):
- ``schedule(skip_first=2, wait=1, warmup=1, active=3, repeat=1)``, ``record_shapes=True``, ``with_stack=True``;
- ``on_trace_ready`` a function of their own that calls ``export_chrome_trace`` into ``OUT/crf_rank{R}.pt.trace.json``;
- the loop annotated with ``record_function`` ranges the user named after the phases ("data", "forward", "backward",
  "optimizer_step", "checkpoint"), the names a reader could take for its own;
- ``dcp.save`` every ``--ckpt-every`` (3) steps, so one of the three traced steps saves a checkpoint.

    torchrun --standalone --nproc-per-node 2 bench/ddp_fresh/crf_ner_kineto.py OUT
    dagprof analyze OUT
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile, record_function, schedule
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from crf_ner_stream import BiLstmCrf, Shard, collate  # noqa: E402 - the user's model, beside this script


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--ckpt-every", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    model = DDP(BiLstmCrf(64, 96), broadcast_buffers=False, gradient_as_bucket_view=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = iter(DataLoader(Shard(rank, 24 * (args.steps + 2) + rank * 64), batch_size=24, collate_fn=collate))
    ckpt_root = os.path.join(tempfile.gettempdir(), f"crf-kineto-{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}")

    def save_trace(prof: profile) -> None:
        prof.export_chrome_trace(os.path.join(args.out, f"crf_rank{rank}.pt.trace.json"))

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True, on_trace_ready=save_trace,
                 schedule=schedule(skip_first=2, wait=1, warmup=1, active=3, repeat=1)) as prof:
        for step in range(1, args.steps + 1):
            with record_function("data"):
                words, tags, lengths = next(batches)
            with record_function("forward"):
                loss = model(words, tags, lengths)
            opt.zero_grad(set_to_none=True)
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer_step"):
                nn.utils.clip_grad_norm_(model.parameters(), 5.0)
                opt.step()
            if step % args.ckpt_every == 0:
                with record_function("checkpoint"):
                    dcp.save({"model": model.state_dict(), "optim": opt.state_dict()},
                             checkpoint_id=os.path.join(ckpt_root, f"step{step}"))
            prof.step()
    if rank == 0:
        print(f"traces in {args.out}; last loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
