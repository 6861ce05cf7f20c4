"""A user's Horovod script: a convolutional autoencoder (strided Conv2d encoder, a Linear bottleneck,
ConvTranspose2d decoder) on synthetic 32x32 images, MSE loss, SGD with momentum.

Habits it exercises that the other Horovod scripts do not: ``hvd.DistributedOptimizer(...,
backward_passes_per_step=2, compression=hvd.Compression.fp16)`` with two micro-batches backpropagated per
``optimizer.step()`` (gradient accumulation: Horovod all-reduces each gradient once, at the second backward),
a learning-rate warm-up written as a per-step callback (``LambdaLR`` over the first steps, as Horovod's
Keras ``LearningRateWarmupCallback`` does), ``hvd.broadcast_parameters(model.state_dict())`` and
``broadcast_optimizer_state``, rank 0 alone printing. No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_autoencoder.py``.
"""
import argparse

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="Horovod conv autoencoder, fp16 compression, 2 backward passes per step")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--accum", type=int, default=2)
parser.add_argument("--warmup-steps", type=int, default=5)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--adasum", action="store_true", help="op=hvd.Adasum, uncompressed (Horovod built without MPI refuses it)")
args = parser.parse_args()

hvd.init()
torch.manual_seed(1234)
torch.set_num_threads(1)


class AutoEncoder(nn.Module):
    def __init__(self, latent=128):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(3, 32, 4, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 4, 2, 1), nn.ReLU(), nn.Flatten(),
                                     nn.Linear(64 * 8 * 8, latent))
        self.decoder_in = nn.Linear(latent, 64 * 8 * 8)
        self.decoder = nn.Sequential(nn.ReLU(), nn.ConvTranspose2d(64, 32, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(32, 3, 4, 2, 1))

    def forward(self, x):
        z = self.encoder(x)
        return self.decoder(self.decoder_in(z).view(-1, 64, 8, 8))


g = torch.Generator().manual_seed(100 + hvd.rank())
images = [torch.rand(args.batch_size, 3, 32, 32, generator=g) for _ in range(6)]

model = AutoEncoder()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), backward_passes_per_step=args.accum,
                                     compression=hvd.Compression.none if args.adasum else hvd.Compression.fp16,
                                     op=hvd.Adasum if args.adasum else hvd.Average)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / args.warmup_steps))

model.train()
for step in range(args.steps):
    optimizer.zero_grad()
    for micro in range(args.accum):
        x = images[(step * args.accum + micro) % len(images)]
        loss = F.mse_loss(model(x), x) / args.accum
        loss.backward()
    optimizer.step()
    warmup.step()  # the warm-up callback: once per optimizer step
    if hvd.rank() == 0 and step % 5 == 0:
        print(f"step {step} loss {loss.item() * args.accum:.4f} lr {warmup.get_last_lr()[0]:.4f}", flush=True)
