"""The embedded training workloads: models and synthetic batches for the demo, the testbed and benchmarks.

- ``cnn``: the demo's ResNet-like CNN (2.8 M parameters, 10.7 MB of fp32 gradients, 60 leaf modules);
- ``mlp``: Linear+ReLU layers of unequal widths (so buckets differ in size), about 9 MB of gradients;
- ``transformer``: a small encoder language model (token embedding, attention blocks, a
  vocabulary head), about 8 MB of gradients, big embedding and head matrices at both ends.

All run on one CPU thread in tens to hundreds of ms per step; torch is imported lazily.
"""
from __future__ import annotations

from typing import Any

WORKLOADS = ("cnn", "mlp", "transformer")
MLP_WIDTHS = (512, 1024, 768, 1280, 640, 1024, 896, 512, 768)


def build(cfg: Any):
    """The model of ``cfg.model`` (a ``DemoConfig``)."""
    if cfg.model == "cnn":
        return cnn(cfg.width, cfg.blocks)
    if cfg.model == "mlp":
        return mlp(cfg.width, sum(cfg.blocks) or 1)
    if cfg.model == "transformer":
        return transformer(cfg.width, len(cfg.blocks) or 1)
    raise ValueError(f"unknown workload {cfg.model!r}; choose one of {', '.join(WORKLOADS)}")


def batches(cfg: Any, rank: int, count: int = 4) -> list[tuple[Any, Any, Any]]:
    """``count`` synthetic (input, target, loss function) triples for this rank."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(cfg.seed + 1 + rank)
    out = []
    for _ in range(count):
        if cfg.model == "cnn":
            x = torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size, generator=gen)
            out.append((x, torch.randint(0, 10, (cfg.batch_size,), generator=gen), F.cross_entropy))
        elif cfg.model == "mlp":
            dims = mlp_dims(cfg.width, sum(cfg.blocks) or 1)
            out.append((torch.randn(cfg.batch_size, dims[0], generator=gen), torch.randn(cfg.batch_size, dims[-1], generator=gen),
                        F.mse_loss))
        else:
            tokens = torch.randint(0, VOCAB, (cfg.batch_size, cfg.image_size + 1), generator=gen)
            out.append((tokens[:, :-1], tokens[:, 1:], _lm_loss))
    return out


def _lm_loss(logits, target):
    import torch.nn.functional as F

    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def cnn(width: int, blocks: tuple[int, ...]):
    """ResNet-like: stem, stages of basic blocks (stride 2 between stages), pooling, linear head."""
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu1 = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu2 = nn.ReLU(inplace=True)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            identity = x if self.down is None else self.down(x)
            y = self.relu1(self.bn1(self.conv1(x)))
            return self.relu2(self.bn2(self.conv2(y)) + identity)

    class DemoNet(nn.Module):
        def __init__(self):
            super().__init__()
            w = width
            self.stem = nn.Sequential(nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True))
            layers, cin = [], w
            for stage, n in enumerate(blocks):
                cout = w * 2**stage
                for j in range(n):
                    layers.append(Block(cin, cout, 2 if (j == 0 and stage > 0) else 1))
                    cin = cout
            self.layers = nn.Sequential(*layers)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.flatten = nn.Flatten()
            self.fc = nn.Linear(cin, 10)

        def forward(self, x):
            return self.fc(self.flatten(self.pool(self.layers(self.stem(x)))))

    return DemoNet()


def mlp_dims(width: int, depth: int) -> list[int]:
    return [max(8, int(MLP_WIDTHS[i % len(MLP_WIDTHS)] * width / 768)) for i in range(depth + 1)]


def mlp(width: int, depth: int):
    """``depth`` Linear+ReLU layers whose widths cycle through MLP_WIDTHS scaled by ``width`` / 768."""
    import torch.nn as nn

    dims = mlp_dims(width, depth)
    layers = []
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers)


VOCAB = 2048


def transformer(d_model: int, layers: int):
    """Token embedding + ``layers`` pre-norm attention blocks (4 heads, 4x MLP) + vocabulary head.
    Every parameter sits in a leaf module (Linear, LayerNorm, Embedding)."""
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = nn.LayerNorm(d_model)
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)
            self.norm2 = nn.LayerNorm(d_model)
            self.up = nn.Linear(d_model, 4 * d_model)
            self.act = nn.GELU()
            self.down = nn.Linear(4 * d_model, d_model)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, 4, d // 4).permute(2, 0, 3, 1, 4)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(att)
            return x + self.down(self.act(self.up(self.norm2(x))))

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, d_model)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, VOCAB)

        def forward(self, tokens):
            return self.head(self.norm(self.blocks(self.embed(tokens))))

    return TinyLM()
