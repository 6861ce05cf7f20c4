"""How a TF or JAX profile's names say what an op is: a collective's kind, forward, backward or update, and the layer.

TF node names carry the model's scopes (``sequential_1/conv1_1/Relu``, ``gradient_tape/...``, an optimizer's scope);
XLA thunks carry HLO instruction names (``all-reduce-start.3``) and the compiled program's HLO gives their bytes.
Kept apart from ``tf_xplane`` (which walks the planes and lines) because these rules change with TF and Keras versions.
"""
from __future__ import annotations

import re

from .events import CommKind, Kind
from .xla_hlo import HloCollective, collectives
from .xplane_decode import WireError, XPlane, XSpace

TF_COLLECTIVES = {
    "CollectiveReduce": CommKind.ALL_REDUCE, "CollectiveReduceV2": CommKind.ALL_REDUCE, "CollectiveReduceV3": CommKind.ALL_REDUCE,
    "CollectiveGather": CommKind.ALL_GATHER, "CollectiveGatherV2": CommKind.ALL_GATHER,
    "CollectiveReduceScatterV2": CommKind.REDUCE_SCATTER,
    "CollectiveBcastSend": CommKind.BROADCAST, "CollectiveBcastRecv": CommKind.BROADCAST,
    "CollectiveBcastSendV2": CommKind.BROADCAST, "CollectiveBcastRecvV2": CommKind.BROADCAST,
    "CollectiveAllToAllV2": CommKind.ALL_TO_ALL, "CollectiveAllToAllV3": CommKind.ALL_TO_ALL,
    "NcclAllReduce": CommKind.ALL_REDUCE,
}
_XLA_COLLECTIVE = re.compile(r"^(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute|collective-broadcast)(-start)?\b")
_XLA_KINDS = {"all-reduce": CommKind.ALL_REDUCE, "all-gather": CommKind.ALL_GATHER, "reduce-scatter": CommKind.REDUCE_SCATTER,
              "all-to-all": CommKind.ALL_TO_ALL, "collective-permute": CommKind.SEND_RECV, "collective-broadcast": CommKind.BROADCAST}
# an optimizer's default name scope: its class name (tf-keras), snake-cased in Keras 3 (AdamW: ``adam_w``)
OPTIMIZER = re.compile(r"^(sgd|adam|adam_?w|adamax|nadam|rmsprop|adagrad|adadelta|adafactor|ftrl|lamb|lion|muon|momentum|optimizer|"
                       r"multi_optimizer|schedule_free_adam_?w|gradientdescent|loss_scale_optimizer)(_\d+)?$", re.I)
_PACKING = {"ConcatV2", "Concat", "Pack", "SplitV", "Split", "Unpack"}


def program_collectives(space: XSpace, meta: XPlane) -> dict[int, dict[str, HloCollective]]:
    """program id -> {collective instruction: its bytes and operands}, from the ``Hlo Proto`` JAX stores per compiled program."""
    out: dict[int, dict[str, HloCollective]] = {}
    for mid in meta.event_names:
        st = space.metadata_stats(meta, mid)
        hlo, prog = st.get("Hlo Proto"), st.get("program_id")
        if isinstance(hlo, bytes) and isinstance(prog, int):
            try:
                out[prog] = collectives(hlo)
            except (WireError, IndexError):
                continue  # a program we cannot read keeps its collectives' bytes unknown
    return out


def collective_kind(full: str, op_type: str, opcode: str = "") -> CommKind:
    """The collective a TF op (its type) or an XLA thunk runs: its instruction's ``opcode`` in the program where known
    (``xla_hlo.HloCollective``: JAX may name it after its primitive, ``reduce_scatter.21``), else its name; UNKNOWN: none."""
    if op_type:
        return TF_COLLECTIVES.get(op_type, CommKind.UNKNOWN)
    m = _XLA_COLLECTIVE.match(opcode or full)
    return _XLA_KINDS[m.group(1)] if m else CommKind.UNKNOWN


def classify(node: str, op_type: str) -> tuple[Kind, str]:
    """Kind and op scope from a TF node name (XLA thunk names carry none: KERNEL). The scope becomes a
    layer, or none, once every op has been seen (``layer_names``); FORWARD is provisional until then."""
    if not op_type:
        return Kind.KERNEL, ""
    parts = node.split("/")
    backward = parts[0] in ("gradient_tape", "gradients")
    if backward:
        parts = parts[1:]
    loop = next((k for k in range(1, len(parts) - 1) if _LOOP.match(parts[k])), None)
    if loop is not None:  # a layer's own loop (a Keras RNN's ``while``): its body's ops are the layer's
        backward = backward or any(x in ("gradient_tape", "gradients") for x in parts[loop:])
        parts = parts[:loop] + parts[-1:]
    if parts and OPTIMIZER.match(parts[0]):
        return (Kind.MEMCPY if op_type in _PACKING else Kind.UPDATE), ""
    scope = "/".join(parts[:-1])
    if backward:
        return Kind.BACKWARD, scope
    return (Kind.FORWARD if scope else Kind.OTHER), scope


# a loop inside a layer: its body's ops are named after the loop's scope again, e.g. a Keras 3 GRU's backward
# ``functional_1/encoder_1/while/functional_1/encoder_1/while_grad/body/_307/gradient_tape/.../gru_cell_1/MatMul``
# (once a layer of its own: 25 layers for a 5-layer seq2seq)
_LOOP = re.compile(r"^(while|while_grad)(_\d+)?$")
# lower-case scopes Keras and TF open for one op (a layer's ``convolution``, ``einsum``, its bias ``add``; in a subclassed
# model's own ``call``, a ``strided_slice``), numbered ``_1``, ``_2`` when repeated
_OP_SCOPE = re.compile(r"^(convolution|embedding_lookup|einsum|add|mul|sub|truediv|strided_slice|concat|dropout|random_uniform|transpose|split)(_\d+)?$")


def _op_scope_stripped(parts: list[str]) -> list[str]:
    """A scope less the op scopes at its end (TF names ops in CamelCase: MatMul, BiasAdd, Conv2D); model/layer stay."""
    while len(parts) > 2 and _is_op_scope(parts[-1]):
        parts = parts[:-1]
    return parts


def _is_op_scope(part: str) -> bool:
    return part[:1].isupper() or bool(_OP_SCOPE.match(part))


def layer_names(scopes: dict[str, tuple[bool, bool]]) -> dict[str, str]:
    """Op scope -> its layer ('' when none), from ``scopes``: scope -> (has a gradient op, reads a variable).

    A model is a top-level scope with both (a loss has gradients but no variables, a metric variables
    but no gradients, an assert neither). A layer with weights is where a variable is read, less the
    op scopes; an op belongs to the deepest such layer above it, so nested blocks keep their layers;
    other ops (pooling, activations) to their own scope less its op scopes; an op scope right under the model
    (a subclassed model's own ``call``: a slice, a cast) is no layer.
    """
    tops = lambda i: {s.split("/")[0] for s, flags in scopes.items() if flags[i]}  # noqa: E731
    models = tops(0) & tops(1)
    weighted = {"/".join(_op_scope_stripped(s.split("/"))) for s, (_, reads) in scopes.items()
                if reads and s.count("/") >= 1 and s.split("/")[0] in models}
    out = {}
    for s in scopes:
        parts = s.split("/")
        if parts[0] not in models or len(parts) < 2:
            out[s] = ""
            continue
        own = _op_scope_stripped(parts)
        out[s] = next(("/".join(parts[:k]) for k in range(len(parts), 1, -1) if "/".join(parts[:k]) in weighted),
                      "" if len(own) == 2 and _is_op_scope(own[1]) else "/".join(own))
    return out
