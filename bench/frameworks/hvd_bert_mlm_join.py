"""A user's Horovod script: a BERT-like masked language model (token, position and segment embeddings summed and
LayerNorm-ed, 2 ``nn.TransformerEncoderLayer`` with GELU, an MLM head whose decoder is tied to the token embedding) on
synthetic sentence pairs, 15 % of the tokens masked as BERT does (80 % ``[MASK]``, 10 % random, 10 % kept), AdamW
with a linear warm-up.

Habits it exercises that the other Horovod scripts do not: uneven data over the ranks, as a user's own split of a
corpus whose size does not divide (rank r gets ``--batches - r`` batches an epoch), with ``hvd.join()`` at the end of
each epoch (the rank that ran out waits there, answering the others' all-reduces with zeros) and two epochs in a row;
``hvd.DistributedOptimizer(..., compression=hvd.Compression.fp16, op=hvd.Average)``; the loss and the masked-token
accuracy averaged over the ranks every step with ``hvd.allreduce(..., op=hvd.Average)`` on a stacked tensor (one
extra small all-reduce a step); the learning rate set by hand in ``param_groups`` each step. No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_bert_mlm_join.py --batches 20``
(the default 12 batches put the first epoch's join after rank 0's step 11, inside that window: refused in one line, the
ranks' steps no longer pairing up there).
"""
import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="Horovod BERT-like masked LM, uneven shards joined")
parser.add_argument("--batches", type=int, default=12, help="rank 0's batches an epoch (rank r: this less r)")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--seq", type=int, default=64)
parser.add_argument("--lr", type=float, default=5e-4)
args = parser.parse_args()

hvd.init()
torch.set_num_threads(1)
torch.manual_seed(0)
VOCAB, DIM, PAD, CLS, SEP, MASK = 4000, 128, 0, 1, 2, 3


class MaskedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM, padding_idx=PAD)
        self.pos = nn.Embedding(args.seq, DIM)
        self.seg = nn.Embedding(2, DIM)
        self.norm = nn.LayerNorm(DIM)
        layer = nn.TransformerEncoderLayer(DIM, 4, 4 * DIM, dropout=0.1, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.transform = nn.Sequential(nn.Linear(DIM, DIM), nn.GELU(), nn.LayerNorm(DIM))
        self.out_bias = nn.Parameter(torch.zeros(VOCAB))

    def forward(self, tokens, segments):
        pos = torch.arange(tokens.shape[1])
        h = self.norm(self.tok(tokens) + self.pos(pos)[None] + self.seg(segments))
        h = self.encoder(h, src_key_padding_mask=tokens == PAD)
        return self.transform(h) @ self.tok.weight.T + self.out_bias  # decoder tied to the token table


def mask_tokens(tokens, g):
    """BERT's masking: 15 % of the non-special tokens are targets; of those 80 % [MASK], 10 % random, 10 % as they were."""
    labels = tokens.clone()
    chosen = (torch.rand(tokens.shape, generator=g) < 0.15) & (tokens > MASK)
    labels[~chosen] = -100
    roll = torch.rand(tokens.shape, generator=g)
    tokens = tokens.clone()
    tokens[chosen & (roll < 0.8)] = MASK
    rand = chosen & (roll >= 0.8) & (roll < 0.9)
    tokens[rand] = torch.randint(MASK + 1, VOCAB, (int(rand.sum()),), generator=g)
    return tokens, labels


def sentence_pairs(g, n):
    """[CLS] a [SEP] b [SEP] with a and b of random lengths, padded; segment 1 over b."""
    toks = torch.full((n, args.seq), PAD)
    segs = torch.zeros((n, args.seq), dtype=torch.long)
    for i in range(n):
        la, lb = (int(v) for v in torch.randint(8, args.seq // 2 - 2, (2,), generator=g))
        a, b = torch.randint(MASK + 1, VOCAB, (la,), generator=g), torch.randint(MASK + 1, VOCAB, (lb,), generator=g)
        row = torch.cat([torch.tensor([CLS]), a, torch.tensor([SEP]), b, torch.tensor([SEP])])
        toks[i, :len(row)] = row
        segs[i, la + 2:len(row)] = 1
    return toks, segs


model = MaskedLM()
g = torch.Generator().manual_seed(17 + hvd.rank())
shard = [sentence_pairs(g, args.batch_size) for _ in range(args.batches - hvd.rank())]  # this rank's uneven share

base_lr = args.lr * hvd.size()
optimizer = torch.optim.AdamW(model.parameters(), lr=base_lr, weight_decay=0.01)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=hvd.Compression.fp16, op=hvd.Average)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

step, warmup = 0, 6
model.train()
for epoch in range(args.epochs):
    for tokens, segments in shard:
        for group in optimizer.param_groups:
            group["lr"] = base_lr * min(1.0, (step + 1) / warmup)
        inputs, labels = mask_tokens(tokens, g)
        optimizer.zero_grad()
        logits = model(inputs, segments)
        loss = F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1), ignore_index=-100)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            hit = (logits.argmax(-1) == labels)[labels != -100].float().mean()
            loss_avg, acc_avg = hvd.allreduce(torch.stack([loss.detach(), hit]), op=hvd.Average, name="metrics")
        if hvd.rank() == 0 and step % 5 == 4:
            print(f"epoch {epoch} step {step} loss {loss_avg.item():.3f} masked acc {acc_avg.item():.3f}", flush=True)
        step += 1
    last = hvd.join()  # the rank whose shard ran out waits here for the others
    if hvd.rank() == 0:
        print(f"epoch {epoch} joined, last rank to join: {last}", flush=True)
