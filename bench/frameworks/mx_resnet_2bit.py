"""A user's MXNet script: a small pre-activation ResNet (He et al. 2016: a 3x3 stem, three stages of two residual blocks,
BatchNorm-ReLU before each convolution, a 1x1 strided projection where a stage halves the map, global average pooling,
a Dense head) on synthetic 32x32 images, hybridized, ``dist_sync``.

Habits it exercises that the other MXNet scripts do not: the workers' gradients pushed with MXNet's 2-bit gradient
compression (``kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})``: each push carries 2 bits an
element, the rest kept on the worker as a residual, the servers decompress and the pulls carry the full weights), so
the exchange is a hand-written ``kv.push``/``kv.pull`` per parameter (MXNet 1.9.1's ``gluon.Trainer`` refuses
compression on ``dist_sync``: "Compression not supported with PushPull"), Nesterov momentum (``"nag"``) with a
``MultiFactorScheduler`` set on the kvstore, residual blocks as ``HybridBlock`` subclasses with a shortcut, a
``gluon.data.DataLoader`` over an ``ArrayDataset`` with ``last_batch="rollover"``, and an ``mx.metric.Accuracy`` read
every 4 steps (MXNet's own errors met on the way are in the comments below). Run it under the launcher
(``dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:9 -- python mx_resnet_2bit.py``).
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from dagprof.collect import mxnet_ps  # dagprof (1/3)

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--no-compression", action="store_true", help="push the gradients uncompressed")
args = ap.parse_args()

CLASSES = 10


class PreActBlock(gluon.HybridBlock):
    """BN-ReLU-conv twice, the input added back (through a strided 1x1 projection where the shape changes)."""

    def __init__(self, channels, stride, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.bn1 = gluon.nn.BatchNorm()
            self.conv1 = gluon.nn.Conv2D(channels, 3, stride, 1, use_bias=False)
            self.bn2 = gluon.nn.BatchNorm()
            self.conv2 = gluon.nn.Conv2D(channels, 3, 1, 1, use_bias=False)
            self.proj = gluon.nn.Conv2D(channels, 1, stride, use_bias=False) if stride != 1 else None

    def hybrid_forward(self, F, x):
        h = F.relu(self.bn1(x))
        shortcut = self.proj(h) if self.proj is not None else x
        h = self.conv2(F.relu(self.bn2(self.conv1(h))))
        return h + shortcut


class PreActResNet(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.stem = gluon.nn.Conv2D(16, 3, 1, 1, use_bias=False)
            self.stages = gluon.nn.HybridSequential()
            for channels, stride in ((16, 1), (32, 2), (64, 2)):
                self.stages.add(PreActBlock(channels, stride), PreActBlock(channels, 1))
            self.bn = gluon.nn.BatchNorm()
            self.pool = gluon.nn.GlobalAvgPool2D()
            self.head = gluon.nn.Dense(CLASSES)

    def hybrid_forward(self, F, x):
        return self.head(self.pool(F.relu(self.bn(self.stages(self.stem(x))))))


kv = mx.kv.create("dist_sync")
rng = np.random.default_rng(100 + kv.rank)
labels = rng.integers(0, CLASSES, args.batch * 6)
images = (rng.standard_normal((len(labels), 3, 32, 32)) + labels[:, None, None, None] * 0.1).astype(np.float32)
loader = gluon.data.DataLoader(gluon.data.ArrayDataset(images, labels.astype(np.float32)), batch_size=args.batch,
                               shuffle=True, last_batch="rollover")

mx.random.seed(7)
net = PreActResNet()
net.initialize(mx.init.MSRAPrelu())
net.hybridize(static_alloc=True)
if not args.no_compression:
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})  # before kv.init, as MXNet asks
schedule = mx.lr_scheduler.MultiFactorScheduler(step=[8, 12], factor=0.3, base_lr=0.05)
kv.set_optimizer(mx.optimizer.NAG(learning_rate=0.05, momentum=0.9, wd=5e-4, lr_scheduler=schedule,
                                  rescale_grad=1.0 / (args.batch * kv.num_workers)))
x0, _ = next(iter(loader))
net(x0)  # the parameters' shapes, before kv.init
params = [p for p in net.collect_params().values() if p.grad_req != "null"]
keys = list(range(len(params)))
# after a hybridized forward the conv weights are in MKLDNN's layout, which kv.init cannot send ("We can't generate TBlob for
# MKLDNN data"; the init push failed unseen and the servers later aborted on the first compressed push: "init 3 first")
kv.init(keys, [mx.nd.array(p.data().asnumpy()) for p in params])
mx.nd.waitall()
kv._barrier()  # no worker pushes before every key is stored on the servers
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
metric = mx.metric.Accuracy()


def batches():
    while True:
        yield from loader


with mxnet_ps.profile(kv, net, params=params) as prof:  # dagprof (2/3): keys numbered as pushed below
    for step, (x, y) in zip(range(args.steps), batches()):
        with autograd.record():
            out = net(x)
            loss = loss_fn(out, y)
        loss.backward()
        for key, p in enumerate(params):
            kv.push(key, p.grad(), priority=-key)
            kv.pull(key, out=p.data(), priority=-key)
        metric.update([y], [out])
        prof.step()  # dagprof (3/3)
        if step % 4 == 3 and kv.rank == 0:
            print(f"step {step}: loss {loss.mean().asscalar():.4f} accuracy {metric.get()[1]:.3f}", flush=True)
            metric.reset()
print(f"worker {kv.rank}: done")
