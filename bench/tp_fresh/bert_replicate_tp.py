"""A fresh DP x TP job (issue 16 review): a BERT-style masked LM, tensor parallel by DTensor, data parallel by ``replicate``.

``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))``: TP groups {0,1},{2,3}, DP groups {0,2},{1,3}.
Habits it exercises, as users write them (no other tp_fresh job has them: each uses DDP, FSDP or its own all-reduces):
- a post-norm BERT encoder (token, position and segment embeddings, ``nn.MultiheadAttention``-free attention written
  with ``F.scaled_dot_product_attention`` and a padding mask, GELU FFN), the masked-LM loss on the 15 % of positions
  masked, the decoder's weight tied to the token embedding;
- per block a plan with ``PrepareModuleInput`` (the block's input replicated over TP), q/k/v ``ColwiseParallel``,
  ``out`` ``RowwiseParallel``, FFN ``ffn_in`` colwise and ``ffn_out`` rowwise; embeddings, norms and the head replicated;
- data parallelism by the composable ``replicate(model, device_mesh=mesh["dp"])`` (DDP's reducer as a module hook, no
  wrapper class), bucket cap ``--bucket-mb`` (2);
- ``LAMB``-less BERT habit: ``AdamW`` over two parameter groups (no decay on norms and biases), linear warm-up.

    dagprof profile -o runs/bert -- torchrun --standalone --nproc-per-node 4 bench/tp_fresh/bert_replicate_tp.py
    torchrun --standalone --nproc-per-node 4 bench/tp_fresh/bert_replicate_tp.py --trace traces/bert
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from common import init, loop, parse
from torch.distributed._composable.replicate import replicate
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, parallelize_module

DIM, HEADS, VOCAB, SEQ, BATCH, MASK_ID = 128, 4, 3000, 64, 8, 1


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(DIM, DIM) for _ in range(4))
        self.ffn_in, self.ffn_out = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)
        self.n1, self.n2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        heads = lambda y: y.view(b, t, -1, DIM // HEADS).transpose(1, 2)  # noqa: E731 - local width under TP
        a = F.scaled_dot_product_attention(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), attn_mask=keep)
        x = self.n1(x + self.out(a.transpose(1, 2).reshape(b, t, -1)))
        return self.n2(x + self.ffn_out(F.gelu(self.ffn_in(x))))


class Bert(nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.tok, self.pos, self.seg = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM), nn.Embedding(2, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.layers = nn.ModuleList(Layer() for _ in range(layers))
        self.transform = nn.Sequential(nn.Linear(DIM, DIM), nn.GELU(), nn.LayerNorm(DIM))
        self.decoder = nn.Linear(DIM, VOCAB)
        self.decoder.weight = self.tok.weight

    def forward(self, ids: torch.Tensor, seg: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.tok(ids) + self.pos(torch.arange(ids.shape[1])) + self.seg(seg))
        keep = (~pad)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, keep)
        return self.decoder(self.transform(x))


def batch(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    ids = torch.randint(5, VOCAB, (BATCH, SEQ), generator=gen)
    seg = (torch.arange(SEQ) >= SEQ // 2).long().expand(BATCH, SEQ)
    lengths = torch.randint(SEQ // 2, SEQ + 1, (BATCH,), generator=gen)
    pad = torch.arange(SEQ)[None, :] >= lengths[:, None]
    masked = (torch.rand(BATCH, SEQ, generator=gen) < 0.15) & ~pad
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    return ids.masked_fill(masked, MASK_ID), seg, pad, labels


def main() -> None:
    args = parse(__doc__, layers=(int, 2), bucket_mb=(float, 2.0))
    init()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = Bert(args.layers)
    plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "out": RowwiseParallel(),
            "ffn_in": ColwiseParallel(), "ffn_out": RowwiseParallel()}
    for layer in model.layers:
        parallelize_module(layer, mesh["tp"], plan)
        parallelize_module(layer, mesh["tp"], PrepareModuleInput(input_layouts=(Replicate(), None),
                                                                 desired_input_layouts=(Replicate(), None),
                                                                 use_local_output=True))
    replicate(model, device_mesh=mesh["dp"], bucket_cap_mb=args.bucket_mb)
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-4)
    warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    gen = torch.Generator().manual_seed(10 + mesh["dp"].get_local_rank())

    def step() -> None:
        ids, seg, pad, labels = batch(gen)
        logits = model(ids, seg, pad)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)
        loss.backward()
        opt.step()
        warm.step()
        opt.zero_grad(set_to_none=True)

    loop(args, step)


if __name__ == "__main__":
    main()
