"""A user's MXNet script: a keyword spotter over synthetic 40-band log-mel frames (two per-frame Dense layers with
LayerNorm, mean and max pooled over time side by side, a wide Dense bottleneck, a Dense head over 12 keywords),
hybridized, ``dist_sync``.

Habits it exercises that the other 2-bit scripts do not: a ``HybridBlock`` with a ``hybrid_forward`` of its own
(its backward runs as engine bulks), the exchange as one list push and one list pull a step over keys in reverse
model order (``kv.push(keys, grads)``), the parameters' values sent to ``kv.init`` through numpy, SGD with momentum
and weight decay on the servers, a 1.6 MB Dense weight beside small ones, and no per-step sync of the user's own (the
loss is read every eighth step). Tried first and left out: a Conv1D front end, whose weights' pulls MXNet 1.9.1 fails
under 2-bit compression at the step's ``waitall`` ("Check failed: !is_view", hybridized or not). Run it under the
launcher (``dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:9 -- python mx_kws_2bit.py``).
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon, nd

from dagprof.collect import mxnet_ps  # dagprof (1/3)

BANDS, FRAMES, WORDS = 40, 32, 12

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--batch", type=int, default=16)
args = ap.parse_args()



class Spotter(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.frame1 = gluon.nn.Dense(64, flatten=False)
            self.norm1 = gluon.nn.LayerNorm()
            self.frame2 = gluon.nn.Dense(64, flatten=False)
            self.norm2 = gluon.nn.LayerNorm()
            self.wide = gluon.nn.Dense(3200, activation="relu")
            self.drop = gluon.nn.Dropout(0.2)
            self.head = gluon.nn.Dense(WORDS)

    def hybrid_forward(self, F, mel):
        h = F.relu(self.norm1(self.frame1(F.transpose(mel, axes=(0, 2, 1)))))  # (batch, frames, 64)
        h = F.relu(self.norm2(self.frame2(h))) + h
        pooled = F.concat(F.mean(h, axis=1), F.max(h, axis=1), dim=1)
        return self.head(self.drop(self.wide(pooled)))


kv = mx.kv.create("dist_sync")
rng = np.random.default_rng(7 + kv.rank)
words = rng.integers(0, WORDS, args.batch)
# each keyword lights up its own bands in the middle frames, over noise
mel = rng.normal(0, 1, (args.batch, BANDS, FRAMES)).astype("float32")
for i, w in enumerate(words):
    mel[i, 3 * w: 3 * w + 4, FRAMES // 4: 3 * FRAMES // 4] += 2.0
x, y = nd.array(mel), nd.array(words)

mx.random.seed(11)
net = Spotter()
net.initialize(mx.init.Xavier())
net.hybridize()
net(x)
params = [p for p in net.collect_params().values() if p.grad_req != "null"]
kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.02, momentum=0.9, wd=1e-4, rescale_grad=1.0 / (args.batch * kv.num_workers)))
keys = list(reversed(range(len(params))))
kv.init(keys, [nd.array(params[k].data().asnumpy()) for k in keys])
kv._barrier()  # every key stored on the servers before the first push
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

with mxnet_ps.profile(kv, net, params=params) as prof:  # dagprof (2/3)
    for step in range(args.steps):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        kv.push(keys, [params[k].grad() for k in keys])
        kv.pull(keys, out=[params[k].data() for k in keys])
        prof.step()  # dagprof (3/3)
        if kv.rank == 0 and step % 8 == 7:
            print(f"step {step}: loss {float(loss.mean().asnumpy()):.4f}", flush=True)
print(f"worker {kv.rank}: done")
