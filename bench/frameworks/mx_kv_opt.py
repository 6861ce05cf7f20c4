"""The custom optimizer of ``mx_kv_manual.py``: SGD with each gradient's norm clipped, run by the kvstore's servers
(which unpickle it, so it lives in a module they can import, not in the training script's ``__main__``)."""
import mxnet as mx


@mx.optimizer.register
class ClippedSGD(mx.optimizer.Optimizer):
    def __init__(self, clip=1.0, **kw):
        super().__init__(**kw)
        self.clip = clip

    def create_state(self, index, weight):
        return None

    def update(self, index, weight, grad, state):
        lr = self._get_lr(index)
        g = grad * self.rescale_grad
        norm = g.norm().asscalar()  # mx.nd is not importable yet on a server (it serves inside `import mxnet`)
        if norm > self.clip:
            g = g * (self.clip / norm)
        weight[:] -= lr * g
