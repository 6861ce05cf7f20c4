"""A user's MXNet script: a 2-layer ``gluon.rnn.GRU`` regressor over a multivariate series with a Dense head,
trained by a hand-written ``kv.push``/``kv.pull`` loop (no ``gluon.Trainer``) against a ``dist_sync`` kvstore
whose servers run a custom optimizer, 2 servers.

Habits it exercises that the other MXNet scripts do not: no Trainer at all (keys numbered by the user, in the
model's own order, ``kv.init`` of every parameter, a push and a pull per key with ``priority=-key`` so the
last layers go first), an optimizer class of the user's registered with ``mx.optimizer.register`` and set on
the kvstore with ``kv.set_optimizer`` (sent pickled to the servers, which import it from ``mx_kv_opt.py``
beside this script), L2 loss, imperative (not hybridized). The dagprof lines are marked. Run it under the
launcher::

    dagprof profile --mxnet-ps servers=2,workers=2 -o RUN --steps 4:9 -- python mx_kv_manual.py
"""
import argparse
import os
import sys

import mxnet as mx
from mxnet import autograd, gluon, nd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mx_kv_opt import ClippedSGD  # noqa: E402  (the servers unpickle it: a module, not __main__)

from dagprof.collect import mxnet_ps  # noqa: E402  dagprof (1/3)

FEAT, HIDDEN, SEQ = 16, 128, 40

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=14)
ap.add_argument("--batch", type=int, default=32)
args = ap.parse_args()

kv = mx.kv.create("dist_sync")
mx.random.seed(11)
kv.set_optimizer(ClippedSGD(learning_rate=0.01, clip=1.0, rescale_grad=1.0 / (args.batch * kv.num_workers)))

net = gluon.nn.Sequential()
with net.name_scope():
    net.add(gluon.rnn.GRU(HIDDEN, num_layers=2, layout="NTC"), gluon.nn.Dense(64, activation="tanh"), gluon.nn.Dense(1))
net.initialize(mx.init.Xavier())
x = nd.random.normal(shape=(args.batch, SEQ, FEAT))
y = nd.random.normal(shape=(args.batch, 1))
net(x)  # deferred shapes
params = [p for p in net.collect_params().values() if p.grad_req != "null"]
for key, p in enumerate(params):
    kv.init(key, p.data())
loss_fn = gluon.loss.L2Loss()

with mxnet_ps.profile(kv, net, params=params) as prof:  # dagprof (2/3): keys numbered as pushed below
    for _ in range(args.steps):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        for key, p in enumerate(params):
            kv.push(key, p.grad(), priority=-key)
            kv.pull(key, out=p.data(), priority=-key)
        prof.step()  # dagprof (3/3)
print(f"worker {kv.rank}: loss {loss.mean().asscalar():.4f}")
