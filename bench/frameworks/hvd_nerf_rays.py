"""A user's Horovod script: a tiny NeRF (Mildenhall et al. 2020, small: positional encoding of points and view
directions, a coarse and a fine MLP with a skip connection, density and colour heads, volume rendering by alpha
compositing, the fine network's points drawn by inverse-transform sampling of the coarse weights) fitted to rays of a
synthetic scene (a coloured sphere before a checkered backdrop, rendered analytically), trained on the photometric
loss of both networks with Adam and an exponential decay.

Habits it exercises that the other Horovod scripts do not: two models in one optimizer (one ``Adam`` over both
networks' parameters, ``named_parameters`` chained with prefixes for ``DistributedOptimizer``), per-ray sampling
inside the step (stratified jitter by ``torch.rand``, hierarchical samples by ``torch.searchsorted`` over the coarse
weights' CDF, detached), each rank drawing its own random rays every step from the whole image set (no sampler),
the learning rate scaled by ``hvd.size()`` and decayed per step by ``ExponentialLR``, and the PSNR averaged over the
ranks by ``hvd.allreduce_async`` in each step, its handle waited on with ``hvd.synchronize`` one step later (the
logging kept off the step's critical path). No dagprof line:
``dagprof profile -o RUN --steps 6:16 -- horovodrun -np 2 -H localhost:2 --gloo python hvd_nerf_rays.py``.
"""
import argparse
import itertools
import math

import horovod.torch as hvd
import torch
import torch.nn as nn

parser = argparse.ArgumentParser(description="Horovod tiny NeRF, synthetic sphere scene")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--rays", type=int, default=256, help="rays per rank and step")
parser.add_argument("--samples", type=int, default=16, help="coarse samples per ray (as many fine)")
parser.add_argument("--lr", type=float, default=5e-4)
args = parser.parse_args()

NEAR, FAR, VIEWS, RES = 2.0, 6.0, 8, 32


def encode(x, freqs):
    bands = 2.0 ** torch.arange(freqs, dtype=x.dtype) * math.pi
    xb = (x[..., None] * bands).flatten(-2)
    return torch.cat([x, torch.sin(xb), torch.cos(xb)], -1)


class NeRF(nn.Module):
    def __init__(self, width=64, pos_freqs=6, dir_freqs=2):
        super().__init__()
        self.pos_freqs, self.dir_freqs = pos_freqs, dir_freqs
        pin, din = 3 + 6 * pos_freqs, 3 + 6 * dir_freqs
        self.trunk1 = nn.Sequential(nn.Linear(pin, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
        self.trunk2 = nn.Sequential(nn.Linear(width + pin, width), nn.ReLU(), nn.Linear(width, width))
        self.sigma = nn.Linear(width, 1)
        self.rgb = nn.Sequential(nn.Linear(width + din, width // 2), nn.ReLU(), nn.Linear(width // 2, 3), nn.Sigmoid())

    def forward(self, pts, dirs):
        p = encode(pts, self.pos_freqs)
        h = self.trunk2(torch.cat([self.trunk1(p), p], -1))
        d = encode(dirs, self.dir_freqs).expand(*pts.shape[:-1], -1)
        return torch.relu(self.sigma(h))[..., 0], self.rgb(torch.cat([torch.relu(h), d], -1))


def render(model, origins, dirs, t):
    pts = origins[:, None] + dirs[:, None] * t[..., None]
    sigma, rgb = model(pts, dirs[:, None])
    delta = torch.cat([t[:, 1:] - t[:, :-1], torch.full_like(t[:, :1], 1e10)], -1)
    alpha = 1 - torch.exp(-sigma * delta)
    trans = torch.cumprod(torch.cat([torch.ones_like(alpha[:, :1]), 1 - alpha + 1e-10], -1), -1)[:, :-1]
    weights = alpha * trans
    return (weights[..., None] * rgb).sum(1), weights


def sample_pdf(t, weights, n):
    """Inverse-transform samples of the coarse weights' piecewise-constant distribution (detached)."""
    mids = 0.5 * (t[:, 1:] + t[:, :-1])
    pdf = (weights[:, 1:-1] + 1e-5) / (weights[:, 1:-1] + 1e-5).sum(-1, keepdim=True)
    cdf = torch.cat([torch.zeros_like(pdf[:, :1]), torch.cumsum(pdf, -1)], -1)
    u = torch.rand(t.shape[0], n)
    idx = torch.searchsorted(cdf, u, right=True).clamp(1, cdf.shape[1] - 1)
    lo, hi = torch.gather(cdf, 1, idx - 1), torch.gather(cdf, 1, idx)
    blo, bhi = torch.gather(mids, 1, idx - 1), torch.gather(mids, 1, idx)
    return (blo + (u - lo) / (hi - lo).clamp_min(1e-5) * (bhi - blo)).detach()


def scene(views, res):
    """Rays of ``views`` cameras on a circle looking at the origin, and each ray's colour: a sphere of radius 1 coloured
    by its normal, else a checkered backdrop."""
    origins, dirs, colours = [], [], []
    for k in range(views):
        a = 2 * math.pi * k / views
        eye = torch.tensor([4 * math.cos(a), 4 * math.sin(a), 1.0])
        fwd = -eye / eye.norm()
        right = torch.linalg.cross(fwd, torch.tensor([0.0, 0.0, 1.0]))
        right = right / right.norm()
        up = torch.linalg.cross(right, fwd)
        v, u = torch.meshgrid(torch.linspace(-0.5, 0.5, res), torch.linspace(-0.5, 0.5, res), indexing="ij")
        d = fwd + u[..., None] * right + v[..., None] * up
        d = (d / d.norm(dim=-1, keepdim=True)).reshape(-1, 3)
        b = (eye * d).sum(-1)
        disc = b ** 2 - (eye.dot(eye) - 1)
        hit = disc > 0
        n = eye + d * (-b - disc.clamp_min(0).sqrt())[:, None]
        far = eye + d * 5
        checker = ((far[:, 0].floor() + far[:, 1].floor()) % 2)[:, None].expand(-1, 3) * 0.6 + 0.2
        colours.append(torch.where(hit[:, None], 0.5 + 0.5 * n, checker))
        origins.append(eye.expand(res * res, 3))
        dirs.append(d)
    return torch.cat(origins), torch.cat(dirs), torch.cat(colours)


hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)
coarse, fine = NeRF(), NeRF()
params = list(coarse.parameters()) + list(fine.parameters())
opt = torch.optim.Adam(params, lr=args.lr * hvd.size())
hvd.broadcast_parameters(coarse.state_dict(), root_rank=0)
hvd.broadcast_parameters(fine.state_dict(), root_rank=0)
named = itertools.chain((("coarse." + k, v) for k, v in coarse.named_parameters()), (("fine." + k, v) for k, v in fine.named_parameters()))
opt = hvd.DistributedOptimizer(opt, named_parameters=named)
sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.1 ** (1 / 500))
origins, dirs, colours = scene(VIEWS, RES)
gen = torch.Generator().manual_seed(100 + hvd.rank())
pending = None
for step in range(args.steps):
    pick = torch.randint(0, origins.shape[0], (args.rays,), generator=gen)
    o, d, target = origins[pick], dirs[pick], colours[pick]
    edges = torch.linspace(NEAR, FAR, args.samples + 1)
    t = edges[:-1] + (edges[1:] - edges[:-1]) * torch.rand(args.rays, args.samples)
    opt.zero_grad()
    rgb_c, weights = render(coarse, o, d, t)
    t_fine = torch.sort(torch.cat([t, sample_pdf(t, weights.detach(), args.samples)], -1), -1).values
    rgb_f, _ = render(fine, o, d, t_fine)
    loss = ((rgb_c - target) ** 2).mean() + ((rgb_f - target) ** 2).mean()
    loss.backward()
    opt.step()
    sched.step()
    if pending is not None:
        psnr = hvd.synchronize(pending)
        if hvd.rank() == 0 and step % 5 == 0:
            print(f"step {step - 1}: psnr {psnr.item():.2f} lr {sched.get_last_lr()[0]:.2e}", flush=True)
    mse = ((rgb_f.detach() - target) ** 2).mean()
    pending = hvd.allreduce_async(-10 * torch.log10(mse), name="psnr", op=hvd.Average)
hvd.synchronize(pending)
