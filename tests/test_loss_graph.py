"""The loss's backward (``collect.hooks.loss_graph``): what the graph from the model's output to the loss holds while its
backward runs, sized by ``dagprof.profile`` in one process on a live model."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dagprof.collect import profile  # noqa: E402
from dagprof.traces.dagprof_run import read_run  # noqa: E402
from dagprof.traces.run_schema import LOSS_BACKWARD, MODEL_OUTPUT  # noqa: E402

BATCH, SEQ, VOCAB = 4, 16, 1000
LOGITS = BATCH * SEQ * VOCAB * 4


class LM(torch.nn.Module):
    """An embedding and a head; ``with_loss``: the forward computes the loss itself (as Hugging Face models do)."""

    def __init__(self, with_loss: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head, self.with_loss = torch.nn.Embedding(VOCAB, 8), torch.nn.Linear(8, VOCAB), with_loss

    def forward(self, tokens):
        logits = self.head(self.embed(tokens))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()) if self.with_loss else logits


def saved(tmp_path, loss_of, with_loss=False, micro=1):
    model = LM(with_loss)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    original = torch.autograd.backward
    with profile(tmp_path, steps="1:3", model=model, kineto=False) as prof:
        for _ in range(4):
            for _ in range(micro):
                loss_of(model(tokens), tokens).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    assert torch.autograd.backward is original  # the patch is undone with the window
    return read_run(tmp_path).ranks[0].meta.layer_saved_bytes


def cross_entropy(logits, tokens):
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())


def test_cross_entropy_holds_three_logits_at_its_log_softmax_backward(tmp_path):
    """Its log-softmax output (saved), the gradient it takes and the one it hands to the logits: three logits' worth,
    beside the logits the script holds (``MODEL_OUTPUT``)."""
    got = saved(tmp_path, cross_entropy)
    assert got[MODEL_OUTPUT] == LOGITS and got[LOSS_BACKWARD] == 3 * LOGITS


def test_a_squared_error_holds_its_difference_and_two_gradients(tmp_path):
    """((out - y)**2).mean(): the pow saves the difference; its backward takes the mean's gradient (expanded to the
    output's size) and makes the difference's: three outputs' worth, then the subtraction hands the latter on."""
    target = torch.zeros(BATCH, SEQ, VOCAB)
    assert saved(tmp_path, lambda out, _: ((out - target) ** 2).mean())[LOSS_BACKWARD] == 3 * LOGITS


def test_gradient_accumulation_keeps_one_backwards_figure(tmp_path):
    """Each micro-batch's backward holds the same: the step's figure is one of them, not their sum."""
    assert saved(tmp_path, cross_entropy, micro=2)[LOSS_BACKWARD] == 3 * LOGITS


def test_a_loss_computed_inside_the_model_is_the_forwards(tmp_path):
    """The saved-tensor hook counted it already: nothing after the forward, so no figure (the model's peak as before)."""
    got = saved(tmp_path, lambda loss, _: loss, with_loss=True)
    assert LOSS_BACKWARD not in got and got["head"] > 0


class CopyLoss(torch.autograd.Function):
    """A user's fused loss: saves a copy of its input (``ctx.save_for_backward``), which no ``_saved_*`` attribute shows."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x.clone())
        return x.sum()

    @staticmethod
    def backward(ctx, grad):
        (copy,) = ctx.saved_tensors
        return grad * copy


def test_a_custom_functions_saved_tensors_count(tmp_path):
    """Its copy (saved) and the gradient it makes: two outputs' worth (the scalar it takes is too small to show)."""
    assert saved(tmp_path, lambda out, _: CopyLoss.apply(out))[LOSS_BACKWARD] == pytest.approx(2 * LOGITS, abs=64)
