"""An FSDP2 (``fully_shard``) training script as a user writes one: gloo, CPU, started by torchrun.

Three models: ``mlp`` (an embedding, then a stack of MLP blocks), ``transformer`` (a stack of
pre-norm self-attention + MLP blocks) and ``tiedlm`` (a GPT-style LM of ``nn.TransformerEncoderLayer`` blocks, its head
tied to the embedding: held out from the benches' tuning). Each block and the root are ``fully_shard``-ed (one FSDP unit
each). ``--hsdp R`` shards over WORLD/R ranks and replicates over R (a 2-D mesh). ``--ddp`` wraps the same
model in ``DistributedDataParallel`` instead (``--bucket-mb``: its ``bucket_cap_mb``), for the DDP <-> FSDP what-ifs.
``--reshard`` is what every ``fully_shard`` call gets as ``reshard_after_forward``: ``all`` (True, the root too: torch 2.13
reshards a root given True; what the benchmarks and recordings here ran), ``none`` (False: every unit keeps its gathered
parameters after forward) or ``default`` (None, as a user who leaves it out: lazy init keeps the root gathered, the
other units reshard; what ``dagprof whatif --data-parallel fsdp`` predicts from a DDP profile); ``--group K`` makes every K adjacent blocks one unit
(``fully_shard([blocks.0, blocks.1], ...)``: what ``dagprof whatif --units merge:K`` predicts; ``--group 0``: the root is the
only unit, ``merge:all``); ``--prefetch K`` sets explicit forward
and backward prefetch of the next K units; ``--strategy FILE`` applies a ``dagprof optimize`` strategy.
``--dagprof DIR`` profiles with the API; without it the script runs untouched (``dagprof profile -o DIR -- torchrun ... bench/fsdp_train.py``).

    torchrun --standalone --nproc-per-node 2 bench/fsdp_train.py --model mlp --steps 12
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


class MLPBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.relu(self.up(x)))


class AttnBlock(nn.Module):
    def __init__(self, width: int, heads: int = 4) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Net(nn.Module):
    def __init__(self, model: str, blocks: int, width: int, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        block = MLPBlock if model == "mlp" else AttnBlock
        self.blocks = nn.ModuleList(block(width) for _ in range(blocks))
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


class TiedLM(nn.Module):
    """``--model tiedlm``: a small GPT-style LM written as a user would, for holding the what-ifs out (the benches were
    tuned on ``mlp`` and ``transformer``): token and learned position embeddings, ``nn.TransformerEncoderLayer`` blocks
    (pre-norm, GELU, causal), a final LayerNorm, and the output head tied to the token embedding (one parameter, in the
    root unit, used at both ends of the step)."""

    def __init__(self, blocks: int, width: int, vocab: int, seq: int, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(seq, width))
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                                               batch_first=True, norm_first=True) for _ in range(blocks))
        self.norm = nn.LayerNorm(width)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.embed(tokens) + self.pos[:t]
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        for b in self.blocks:
            x = b(x, src_mask=mask, is_causal=True)
        return F.linear(self.norm(x), self.embed.weight)


def make_model(args: argparse.Namespace) -> nn.Module:
    if args.model == "tiedlm":
        return TiedLM(args.blocks, args.width, args.vocab, args.seq)
    return Net(args.model, args.blocks, args.width, args.vocab)


RESHARD = {"all": True, "none": False, "default": None}  # --reshard: fully_shard's reshard_after_forward


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("mlp", "transformer", "tiedlm"), default="mlp")
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--reshard", choices=tuple(RESHARD), default="all", help="reshard_after_forward of every fully_shard call: all (True, "
                   "the root too), none (False) or default (None: fully_shard's default, the root kept gathered after forward)")
    p.add_argument("--group", type=int, default=1, help="fully_shard every K adjacent blocks as one unit (1: each block its own; "
                   "0: none, the root is the only unit)")
    p.add_argument("--prefetch", type=int, default=0, help="explicit forward/backward prefetch of the next K units (0: FSDP's default)")
    p.add_argument("--hsdp", type=int, default=1, help="replicate degree R of a (R, WORLD/R) mesh (1: plain FSDP)")
    p.add_argument("--bf16", action="store_true", help="MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)")
    p.add_argument("--reduce-dtype", choices=("float32", "bfloat16", "float16"), help="MixedPrecisionPolicy(reduce_dtype=...); "
                   "with --bf16 instead of its fp32")
    p.add_argument("--ddp", action="store_true", help="DistributedDataParallel instead of fully_shard (same model and optimizer)")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="with --ddp: bucket_cap_mb")
    p.add_argument("--dagprof", metavar="DIR", help="profile with dagprof.profile into DIR")
    p.add_argument("--strategy", metavar="FILE", help="dagprof.apply(model, FILE) after wrapping (a dagprof optimize strategy)")
    p.add_argument("--profile-steps", default="4:8")
    p.add_argument("--kineto", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--times", metavar="FILE", help="write rank 0's step times (s) as JSON")
    p.add_argument("--memory", metavar="FILE", help="measure each step's peak of allocated bytes per rank (torch.profiler's memory "
                   "events, profiling from before the model is built) and write them as JSON to FILE.<rank>")
    return p.parse_args(argv)


def build(args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer]:
    world = dist.get_world_size()
    if args.ddp:
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(make_model(args), bucket_cap_mb=args.bucket_mb)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)
    mesh = (init_device_mesh("cpu", (args.hsdp, world // args.hsdp), mesh_dim_names=("replicate", "shard")) if args.hsdp > 1
            else init_device_mesh("cpu", (world,)))
    torch.manual_seed(0)
    model = make_model(args)
    kw = dict(mesh=mesh, reshard_after_forward=RESHARD[args.reshard])
    if args.bf16 or args.reduce_dtype:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if args.bf16 else None, reduce_dtype=getattr(torch, args.reduce_dtype or "float32"))
    blocks = list(model.blocks)
    for i in range(0, len(blocks) if args.group else 0, max(args.group, 1)):
        fully_shard(blocks[i] if args.group == 1 else blocks[i:i + args.group], **kw)
    fully_shard(model, **kw)
    if args.strategy:
        import dagprof

        dagprof.apply(model, args.strategy)
    if args.prefetch > 0:
        units = list(model.blocks)
        for i, b in enumerate(units):
            b.set_modules_to_forward_prefetch(units[i + 1: i + 1 + args.prefetch])
            b.set_modules_to_backward_prefetch(units[max(0, i - args.prefetch): i][::-1])
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train(args: argparse.Namespace, model: nn.Module, opt: torch.optim.Optimizer, prof=None, span=None) -> list[float]:
    """``span(i)``: a context manager around step ``i`` (``measure_memory``'s step marks)."""
    g = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        with span(i) if span else contextlib.nullcontext():
            one_step(args, model, opt, g)
        times.append(time.perf_counter() - t0)
        if prof is not None:
            prof.step()
    return times


def one_step(args: argparse.Namespace, model: nn.Module, opt: torch.optim.Optimizer, g: torch.Generator) -> None:
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    logits = model(tokens)
    loss = F.cross_entropy(logits.flatten(0, 1), tokens.roll(-1, 1).flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()


def measure_memory(args: argparse.Namespace) -> list[float]:
    """Every step's peak of tensor memory (``heap_peak.HeapPeak``), and where each step peaked (``step_peak_at``: the
    aten op after which the heap was fullest, in backward the autograd function running it, and the part of the step
    then running: a unit's forward from its pre-hook, its backward from when the gradient of its output arrived (a
    tensor hook, which holds nothing), the root's layers before the inner units as ``backward of <root>``, the optimizer
    step), to check where the memory model puts the peak."""
    from heap_peak import HeapPeak, tensor_bytes

    where = ["", ""]  # the part of the step running now, and where the step's peak so far fell

    def on_peak(func) -> None:
        node = torch._C._current_autograd_node()  # in backward, the autograd function running
        where[1] = f"{where[0]} ({func}{f' in {node.name()}' if node is not None else ''})"

    probe = HeapPeak(on_peak)
    model, opt = build(args)
    at = []

    def mark(label: str):
        def set_label(*_):
            where[0] = label
        return set_label

    def on_output(label: str):
        def hook(module, inputs, output):
            where[0] = f"forward after {label}"
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(mark(label))
        return hook

    units = {("<root>" if not name else name): m for name, m in model.named_modules() if hasattr(m, "reshard")}
    for name, m in units.items():
        m.register_forward_pre_hook(mark(f"forward of {name}"))
        m.register_forward_hook(on_output(f"backward of {name}" if name != "<root>" else "backward of the root's last layers"))
    if not args.ddp:
        model.embed.register_forward_hook(on_output("backward of <root>"))
    opt.register_step_pre_hook(mark("optimizer step"))

    @contextlib.contextmanager
    def span(i: int):
        where[:] = ["step start", "step start"]
        with probe.step(tensor_bytes(model, opt, args.ddp)):
            yield
        at.append(where[1])

    times = train(args, model, opt, span=span)
    with open(f"{args.memory}.{dist.get_rank()}", "w") as f:
        json.dump({"step_peak_bytes": probe.peaks, "step_peak_at": at}, f)
    return times


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    if args.memory:
        times = measure_memory(args)
    elif args.dagprof:
        import dagprof

        model, opt = build(args)
        with dagprof.profile(args.dagprof, steps=args.profile_steps, model=model, kineto=args.kineto) as prof:
            times = train(args, model, opt, prof)
    else:
        times = train(args, *build(args))
    if args.times and dist.get_rank() == 0:
        with open(args.times, "w") as f:
            json.dump(times, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
