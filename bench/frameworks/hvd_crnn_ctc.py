"""A user's Horovod script: a CRNN text recogniser (Shi et al. 2015, small: a conv stack with BatchNorm that pools the
height away, a 2-layer bidirectional LSTM over the image's columns, a per-column Linear over 10 digits and the CTC
blank) reading synthetic strips of 3-7 digits, trained with ``nn.CTCLoss`` and Adam.

Habits it exercises that the other Horovod scripts do not: a CTC loss over label sequences of different lengths
(targets concatenated, ``input_lengths``/``target_lengths`` given), the run's settings sent from rank 0 as a dict
with ``hvd.broadcast_object`` (every rank passing a dict: Horovod names the broadcast after the object's type, and a
``None`` on the other ranks, tried first, hangs the job) and the workers' own data statistics gathered with ``hvd.allgather_object`` before
training, a greedy CTC decode every 5 steps whose per-rank character error counts meet on every rank by
``hvd.allgather_object`` (a Python object gathered: two allgathers of bytes between steps, inside the profiled window),
``torch.optim.Adam(amsgrad=True)`` with ``hvd.DistributedOptimizer(..., compression=hvd.Compression.none)``,
``torch.nn.utils.clip_grad_value_`` by the documented pattern (``optimizer.synchronize()``, clip, then
``optimizer.step()`` under ``optimizer.skip_synchronize()``), and an ``ExponentialLR`` schedule. No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_crnn_ctc.py``.
"""
import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn

parser = argparse.ArgumentParser(description="Horovod CRNN + CTC on synthetic digit strips")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=24)
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

HEIGHT, WIDTH, DIGITS, BLANK = 16, 64, 10, 10
GLYPHS = torch.Generator().manual_seed(0)
GLYPH = torch.rand(DIGITS, HEIGHT, 6, generator=GLYPHS)  # each digit a fixed 16x6 pattern


def strips(n, gen):
    """Strips of 3-7 digits drawn from their glyphs at jittered positions, with noise; targets concatenated."""
    images = 0.1 * torch.randn(n, 1, HEIGHT, WIDTH, generator=gen)
    lengths = torch.randint(3, 8, (n,), generator=gen)
    labels = []
    for k in range(n):
        digits = torch.randint(0, DIGITS, (int(lengths[k]),), generator=gen)
        x = int(torch.randint(0, 4, (1,), generator=gen))
        for d in digits.tolist():
            images[k, 0, :, x:x + 6] += GLYPH[d]
            x += 8
        labels.append(digits)
    return images, torch.cat(labels), lengths


class CRNN(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        def block(cin, cout, pool):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(pool))
        self.cnn = nn.Sequential(block(1, 32, (2, 1)), block(32, 64, (2, 2)), block(64, 96, (2, 1)), block(96, 96, (2, 1)))
        self.rnn = nn.LSTM(96, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(2 * hidden, DIGITS + 1)

    def forward(self, images):
        f = self.cnn(images).squeeze(2).transpose(1, 2)  # (batch, columns, channels)
        out, _ = self.rnn(f)
        return self.head(out).log_softmax(-1).transpose(0, 1)  # (columns, batch, classes) as CTCLoss wants


def greedy_errors(log_probs, labels, lengths):
    """Characters wrong after a greedy CTC decode (collapse repeats, drop blanks), counted per position."""
    best = log_probs.argmax(-1).t()
    wrong, start = 0, 0
    for k, n in enumerate(lengths.tolist()):
        seq = [c for i, c in enumerate(best[k].tolist()) if c != BLANK and (i == 0 or c != best[k][i - 1])]
        truth = labels[start:start + n].tolist()
        wrong += sum(a != b for a, b in zip(seq, truth)) + abs(len(seq) - n)
        start += n
    return wrong, int(lengths.sum())


if __name__ == "__main__":
    hvd.init()
    torch.set_num_threads(1)
    # every rank passes an object of the same type (broadcast_object names the collective after it: a None elsewhere hangs)
    settings = hvd.broadcast_object({"hidden": 96, "clip": 0.5, "seed": 23 + hvd.rank()}, root_rank=0, name="settings")
    torch.manual_seed(settings["seed"])
    gen = torch.Generator().manual_seed(settings["seed"] + hvd.rank())
    seen = hvd.allgather_object({"rank": hvd.rank(), "mean_len": float(strips(64, gen)[2].float().mean())})
    if hvd.rank() == 0:
        print("label lengths by rank:", seen, flush=True)
    model = CRNN(settings["hidden"])
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * hvd.size(), amsgrad=True)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=hvd.Compression.none)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    schedule = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.97)
    ctc = nn.CTCLoss(blank=BLANK, zero_infinity=True)

    model.train()
    for step in range(1, args.steps + 1):
        images, labels, lengths = strips(args.batch_size, gen)
        optimizer.zero_grad()
        log_probs = model(images)
        columns = torch.full((args.batch_size,), log_probs.shape[0], dtype=torch.long)
        loss = ctc(log_probs, labels, columns, lengths)
        loss.backward()
        optimizer.synchronize()
        torch.nn.utils.clip_grad_value_(model.parameters(), settings["clip"])
        with optimizer.skip_synchronize():
            optimizer.step()
        schedule.step()
        if step % 5 == 0:
            counts = hvd.allgather_object(greedy_errors(log_probs.detach(), labels, lengths))
            if hvd.rank() == 0:
                wrong, total = map(sum, zip(*counts))
                print(f"step {step}: loss {loss.item():.4f} CER {wrong / total:.3f}", flush=True)
