"""What the memory benches' heap reference counts beyond tensors: the autograd graph's own host memory (needs torch).

``bench/heap_peak.py`` measures a step's peak as glibc's heap, which holds besides the tensors' storages every autograd
node a forward records (the C++ node, its saved-variable records, the saved tensors' metadata). Two parts:

    python bench/autograd_host_memory.py                      # bytes per node: the SSM's forward at 3 sequence lengths
    torchrun --standalone --nproc-per-node 4 bench/autograd_host_memory.py --count bench/fsdp_fresh/ssm_reshard.py --steps 2

The first runs ``bench/fsdp_fresh/ssm_reshard.py``'s model in one process (autocast as the script does) and prints, per
node reachable from the loss: the heap's rise over the forward less the bytes of the storages saved for backward
(parameters left out), the node held before its backward ran; and what is left of the graph once backward ran while the
loss still holds it (the heap freed by dropping the loss and the model's output, less their storages), its shell. Per node as
dagprof's collector counts them (by sequence number: 806/1454/2750 at seq 12/24/48, the 30 parameters' ``AccumulateGrad``
nodes among the 836/1484/2780 reachable have none), torch 2.13 (2026-12-05, warm steps): 911/924/934 B held, 570/582/591 B
its shell.
These are ``search.memory.AUTOGRAD_NODE_BYTES``: measured here, not fitted to any job's peak.
``--count SCRIPT ARGS`` runs a training script and prints, per rank, the autograd nodes behind each ``backward()`` call.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def nodes(t: torch.Tensor) -> int:
    """The autograd nodes reachable from ``t``'s."""
    seen, stack = set(), [t.grad_fn]
    while stack:
        n = stack.pop()
        if n is not None and n not in seen:
            seen.add(n)
            stack.extend(f for f, _ in n.next_functions)
    return len(seen)


def per_node(seq: int, steps: int = 3) -> None:
    sys.path[:0] = [HERE, os.path.join(HERE, "fsdp_fresh")]
    import ssm_reshard as ssm
    from heap_peak import HeapPeak

    ssm.SEQ = seq
    torch.manual_seed(0)
    model, gen, heap = ssm.MambaLM(3), torch.Generator().manual_seed(0), HeapPeak()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    probe = torch.ones((), requires_grad=True)  # a node made now gives the sequence number the forward starts after
    for step in range(steps):
        tok = torch.randint(0, ssm.VOCAB, (ssm.BATCH, seq + 1), generator=gen)
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        first, before = probe.view(()).grad_fn._sequence_nr(), heap.in_use()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(tok[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, ssm.VOCAB), tok[:, 1:].reshape(-1))
        rise, tensors, n = heap.in_use() - before, sum(b for p, b in saved.items() if p not in params), nodes(loss)
        made = loss.grad_fn._sequence_nr() - first
        loss.backward()
        model.zero_grad(set_to_none=True)
        held, ends = heap.in_use(), logits.untyped_storage().nbytes() + loss.untyped_storage().nbytes()
        del logits, loss  # the loss keeps its graph's nodes (their saved tensors freed) alive into the next step
        shell = held - heap.in_use() - ends
        print(f"seq {seq} step {step}: heap rise {rise} B, saved storages {tensors} B, beyond them {rise - tensors} B over "
              f"{n} autograd nodes, {made} by sequence number (the collector's count): per node so counted "
              f"{(rise - tensors) / made:.0f} B held, {shell / made:.0f} B its shell after backward", flush=True)

def count(argv: list[str]) -> None:
    backward, per_step = torch.Tensor.backward, []

    def counted(self: torch.Tensor, *a, **k):
        per_step.append(nodes(self))
        return backward(self, *a, **k)

    torch.Tensor.backward = counted
    sys.argv = argv
    try:
        runpy.run_path(argv[0], run_name="__main__")
    finally:
        print(f"rank {os.environ.get('RANK', 0)}: autograd nodes behind each backward() {per_step}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", nargs=argparse.REMAINDER, metavar="SCRIPT", help="run SCRIPT ARGS, counting nodes per backward()")
    args = ap.parse_args()
    if args.count:
        count(args.count)
    else:
        for seq in (12, 24, 48):
            per_node(seq)
