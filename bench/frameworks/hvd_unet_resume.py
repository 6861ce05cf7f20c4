"""A user's Horovod script: a small U-Net (two down and two up levels, ``GroupNorm`` + SiLU conv blocks, skip
connections concatenated, a 1x1 head) segmenting synthetic 32x32 images of random discs and squares into background,
disc and square, trained on cross entropy plus a soft Dice loss with SGD, Nesterov momentum and a cosine schedule.

Habits it exercises that the other Horovod scripts do not: a job resumed from a checkpoint (a first invocation writes
one, as an interrupted job would have; the script then reloads it on rank 0 only with ``torch.load`` and
``load_state_dict`` for the model, the optimizer and the scheduler, and makes every rank agree by
``hvd.broadcast_parameters`` and ``hvd.broadcast_optimizer_state`` from rank 0 and the step it stopped at by
``hvd.broadcast_object``); the images in ``torch.channels_last`` memory format (the model's weights left contiguous:
Horovod's broadcast refuses channels_last ones); a quick validation every 5 steps on a
different number of images per rank, whose per-image IoUs are gathered as variable-length tensors with ``hvd.allgather``
(inside the profiled window). No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_unet_resume.py``.
"""
import argparse
import math
import os
import tempfile

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser(description="Horovod U-Net resumed from a checkpoint, synthetic shapes")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--lr", type=float, default=0.02)
parser.add_argument("--checkpoint", default=os.path.join(tempfile.gettempdir(), f"unet-resume-{os.getppid()}.pt"))
args = parser.parse_args()

CLASSES, SIZE = 3, 32


def shapes(n, gen):
    """Images holding one disc and one square at random places and sizes, with noise; per-pixel labels."""
    yy, xx = torch.meshgrid(torch.arange(SIZE), torch.arange(SIZE), indexing="ij")
    images, masks = torch.zeros(n, 3, SIZE, SIZE), torch.zeros(n, SIZE, SIZE, dtype=torch.long)
    for k in range(n):
        cy, cx, r = (int(v) for v in torch.randint(6, 26, (3,), generator=gen))
        disc = (yy - cy) ** 2 + (xx - cx) ** 2 <= (r % 6 + 3) ** 2
        sy, sx, s = (int(v) for v in torch.randint(2, 24, (3,), generator=gen))
        square = (yy >= sy) & (yy < sy + s % 8 + 4) & (xx >= sx) & (xx < sx + s % 8 + 4)
        masks[k][disc], masks[k][square] = 1, 2
        images[k] = torch.stack([disc.float(), square.float(), (disc | square).float()]) * torch.rand(3, 1, 1, generator=gen)
    return images + 0.2 * torch.randn(images.shape, generator=gen), masks


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.GroupNorm(8, cout), nn.SiLU(),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.GroupNorm(8, cout), nn.SiLU())


class UNet(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.down1, self.down2 = block(3, width), block(width, 2 * width)
        self.bottom = block(2 * width, 4 * width)
        self.up2, self.dec2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2), block(4 * width, 2 * width)
        self.up1, self.dec1 = nn.ConvTranspose2d(2 * width, width, 2, stride=2), block(2 * width, width)
        self.head = nn.Conv2d(width, CLASSES, 1)

    def forward(self, x):
        d1 = self.down1(x)
        d2 = self.down2(F.max_pool2d(d1, 2))
        b = self.bottom(F.max_pool2d(d2, 2))
        u2 = self.dec2(torch.cat([self.up2(b), d2], 1))
        u1 = self.dec1(torch.cat([self.up1(u2), d1], 1))
        return self.head(u1)


def dice_loss(logits, masks):
    probs = logits.softmax(1)
    onehot = F.one_hot(masks, CLASSES).permute(0, 3, 1, 2).float()
    inter = (probs * onehot).sum((0, 2, 3))
    return 1 - ((2 * inter + 1) / (probs.sum((0, 2, 3)) + onehot.sum((0, 2, 3)) + 1)).mean()


def make(lr):
    model = UNet()  # its weights kept contiguous: Horovod refuses channels_last ones ("Tensor is required to be contiguous")
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, 100) / 100)))
    return model, opt, sched


hvd.init()
torch.manual_seed(1234)
torch.set_num_threads(1)
if hvd.rank() == 0 and not os.path.exists(args.checkpoint):  # the interrupted job's checkpoint (written once)
    model, opt, sched = make(args.lr * hvd.size())
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "step": 3}, args.checkpoint)
hvd.barrier()

model, opt, sched = make(args.lr * hvd.size())
start = 0
if hvd.rank() == 0:  # only rank 0 reads the checkpoint, the others get it by broadcast
    state = torch.load(args.checkpoint)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    start = state["step"]
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
start = hvd.broadcast_object(start, root_rank=0, name="resume_step")
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

gen = torch.Generator().manual_seed(100 + hvd.rank())
val_images, val_masks = shapes(6 + 3 * hvd.rank(), gen)  # each rank's own validation shard, of its own size
val_images = val_images.contiguous(memory_format=torch.channels_last)
for step in range(start, start + args.steps):
    model.train()
    images, masks = shapes(args.batch_size, gen)
    images = images.contiguous(memory_format=torch.channels_last)
    opt.zero_grad()
    logits = model(images)
    loss = F.cross_entropy(logits, masks) + dice_loss(logits, masks)
    loss.backward()
    opt.step()
    sched.step()
    if step % 5 == 4:
        model.eval()
        with torch.no_grad():
            pred = model(val_images).argmax(1)
        inter = ((pred > 0) & (val_masks > 0)).sum((1, 2)).float()
        union = ((pred > 0) | (val_masks > 0)).sum((1, 2)).float().clamp(min=1)
        ious = hvd.allgather(inter / union, name="val_iou")  # 6 on rank 0, 9 on rank 1
        if hvd.rank() == 0:
            print(f"step {step}: loss {loss.item():.3f} mean IoU {ious.mean().item():.3f} over {ious.numel()} images", flush=True)
if hvd.rank() == 0 and os.path.exists(args.checkpoint):
    os.remove(args.checkpoint)
