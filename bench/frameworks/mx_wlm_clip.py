"""A user's MXNet script: a word-level LSTM language model (Embedding, 2-layer ``gluon.rnn.LSTM``, Dropout, a Dense
decoder over the vocabulary) trained by truncated backpropagation through time, hybridized, ``dist_sync``, as in
Gluon's word_language_model example.
Habits it exercises that the other MXNet scripts do not: the exchange split out of ``trainer.step`` into
``trainer.allreduce_grads()``, ``gluon.utils.clip_global_norm`` over the summed gradients, then
``trainer.update(batch)`` (the reason users set ``update_on_kvstore=False``: clipping needs the whole gradient
before the update), the hidden state carried from one step to the next and ``detach()``-ed, a long token stream
cut into ``bptt``-long slices (``batchify`` as the example writes it, each worker its own stream), the loss read back
(``asscalar``) every step for the perplexity, plain SGD with a decaying learning rate set by ``trainer.set_learning_rate``.
The dagprof lines are marked. Run it under the launcher::

    dagprof profile --mxnet-ps servers=1,workers=2 -o RUN --steps 4:9 -- python mx_wlm_clip.py
"""
import argparse
import math

import mxnet as mx
from mxnet import autograd, gluon, nd

from dagprof.collect import mxnet_ps  # dagprof (1/3)

VOCAB, EMBED, HIDDEN, LAYERS = 2000, 64, 128, 2


class RNNModel(gluon.HybridBlock):
    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.drop = gluon.nn.Dropout(0.2)
            self.encoder = gluon.nn.Embedding(VOCAB, EMBED)
            self.rnn = gluon.rnn.LSTM(HIDDEN, LAYERS, dropout=0.2, input_size=EMBED)
            self.decoder = gluon.nn.Dense(VOCAB, in_units=HIDDEN, flatten=False)

    def hybrid_forward(self, F, inputs, *state):
        emb = self.drop(self.encoder(inputs))
        output, state = self.rnn(emb, list(state))
        return self.decoder(self.drop(output)), state

    def begin_state(self, batch_size):
        return self.rnn.begin_state(batch_size=batch_size)


def batchify(stream, batch_size):
    n = stream.shape[0] // batch_size
    return stream[: n * batch_size].reshape((batch_size, n)).T  # (time, batch)


ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=14)
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--bptt", type=int, default=20)
ap.add_argument("--clip", type=float, default=0.25)
args = ap.parse_args()

kv = mx.kv.create("dist_sync")
mx.random.seed(3 + kv.rank)
stream = nd.random.randint(0, VOCAB, shape=((args.steps + 2) * args.bptt * args.batch,)).astype("float32")
train = batchify(stream, args.batch)

model = RNNModel()
model.initialize(mx.init.Xavier())
model.hybridize()
params = model.collect_params()
trainer = gluon.Trainer(params, "sgd", {"learning_rate": 20.0, "momentum": 0.0, "wd": 0}, kvstore=kv, update_on_kvstore=False)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

hidden = model.begin_state(args.batch)
lr = 20.0
with mxnet_ps.profile(trainer, model) as prof:  # dagprof (2/3)
    for step, i in enumerate(range(0, train.shape[0] - 1 - args.bptt, args.bptt)):
        if step >= args.steps:
            break
        data, target = train[i: i + args.bptt], train[i + 1: i + 1 + args.bptt]
        hidden = [h.detach() for h in hidden]
        with autograd.record():
            output, hidden = model(data, *hidden)
            loss = loss_fn(output.reshape((-3, -1)), target.reshape((-1,)))
        loss.backward()
        trainer.allreduce_grads()
        grads = [p.grad() for p in params.values() if p.grad_req != "null"]
        gluon.utils.clip_global_norm(grads, args.clip * args.bptt * args.batch)
        trainer.update(args.bptt * args.batch)
        if kv.rank == 0:
            print(f"step {step}: ppl {math.exp(loss.mean().asscalar()):.1f}", flush=True)
        if step and step % 6 == 0:
            lr *= 0.5
            trainer.set_learning_rate(lr)
        prof.step()  # dagprof (3/3)
