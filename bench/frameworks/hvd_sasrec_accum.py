"""A user's Horovod script: a SASRec-style sequential recommender (Kang & McAuley 2018, small): item and position
embeddings, two causal self-attention blocks, the next item scored against the item table (its positive and 8 sampled
negatives, binary cross-entropy), on synthetic users' click sequences.

Habits it exercises that the other Horovod scripts do not: an embedding-bearing model under
``DistributedOptimizer(..., backward_passes_per_step=2, compression=hvd.Compression.fp16)`` (two micro-batches
backpropagated per step, their gradients summed before one fp16 all-reduce), gradient clipping by the documented
pattern (``optimizer.synchronize()``, ``clip_grad_norm_``, then ``optimizer.step()`` inside
``optimizer.skip_synchronize()``), ``hvd.broadcast_parameters`` of ``named_parameters()`` and
``hvd.broadcast_optimizer_state`` of an Adam that has state, scores by ``torch.einsum`` against gathered item vectors,
padding id 0 masked out of the loss, and hit-rate@10 on a held-out next item every 5 steps (no collective: each rank
prints its own). No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_sasrec_accum.py``.
"""
import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="Horovod SASRec with accumulation and fp16 compression")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=32, help="per micro-batch")
parser.add_argument("--accum", type=int, default=2)
parser.add_argument("--seq", type=int, default=50)
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

hvd.init()
torch.set_num_threads(1)
torch.manual_seed(0)
ITEMS, DIM, NEG = 3000, 64, 8


class SASRec(nn.Module):
    def __init__(self):
        super().__init__()
        self.items = nn.Embedding(ITEMS + 1, DIM, padding_idx=0)
        self.pos = nn.Embedding(args.seq, DIM)
        layer = nn.TransformerEncoderLayer(DIM, 2, 2 * DIM, dropout=0.2, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(DIM)
        self.register_buffer("causal", torch.triu(torch.ones(args.seq, args.seq, dtype=torch.bool), 1))

    def forward(self, seq):
        h = self.items(seq) * DIM ** 0.5 + self.pos.weight[None]
        return self.norm(self.blocks(h, mask=self.causal, src_key_padding_mask=seq == 0))

    def score(self, h, candidates):  # h (B, L, D), candidates (B, L, C) -> (B, L, C)
        return torch.einsum("bld,blcd->blc", h, self.items(candidates))


def sessions(g, n):
    """Users drifting through item clusters: each next item near the last one; left-padded with 0."""
    seq = torch.zeros((n, args.seq + 1), dtype=torch.long)
    for i in range(n):
        length = int(torch.randint(args.seq // 2, args.seq + 2, (1,), generator=g))
        steps = torch.randint(-20, 21, (length,), generator=g).cumsum(0)
        start = int(torch.randint(1, ITEMS, (1,), generator=g))
        seq[i, -length:] = (start + steps) % ITEMS + 1
    return seq


model = SASRec()
g = torch.Generator().manual_seed(23 + hvd.rank())
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size(), betas=(0.9, 0.98))
# one step before wrapping, so Adam has state for broadcast_optimizer_state to send (as a resumed job would)
model(sessions(g, 2)[:, :-1]).sum().mul(0).backward()
optimizer.step()
optimizer.zero_grad()
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     backward_passes_per_step=args.accum, compression=hvd.Compression.fp16)
hvd.broadcast_parameters(dict(model.named_parameters()), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

model.train()
for step in range(args.steps):
    optimizer.zero_grad()
    for _ in range(args.accum):
        seq = sessions(g, args.batch_size)
        inputs, pos = seq[:, :-1], seq[:, 1:]
        neg = torch.randint(1, ITEMS + 1, (*pos.shape, NEG), generator=g)
        logits = model.score(model(inputs), torch.cat([pos[..., None], neg], -1))
        target = torch.zeros_like(logits)
        target[..., 0] = 1.0
        mask = (pos != 0)[..., None].expand_as(logits).float()
        loss = (F.binary_cross_entropy_with_logits(logits, target, reduction="none") * mask).sum() / mask.sum()
        (loss / args.accum).backward()
    optimizer.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    with optimizer.skip_synchronize():
        optimizer.step()
    if step % 5 == 4:
        with torch.no_grad():
            model.eval()
            seq = sessions(g, 64)
            h = model(seq[:, :-1])[:, -1]
            top = (h @ model.items.weight[1:].T).topk(10, -1).indices + 1
            hr = (top == seq[:, -1:]).any(-1).float().mean()
            model.train()
        print(f"rank {hvd.rank()} step {step}: loss {loss.item():.3f} HR@10 {hr.item():.3f}", flush=True)
