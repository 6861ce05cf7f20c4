"""Bytes and operands of each collective of an XLA program, from the ``HloProto`` JAX's profiler stores per program.

A process's trace says when each ``all-reduce.N`` ran, not how much it moved; the program says, in the
instruction's result shape (a tuple for a combined all-reduce: XLA's CPU client runs one gloo collective per
operand, ``analysis.operand_stall``). Decoded with the XPlane wire reader;
fields of ``xla/service/hlo.proto`` and ``xla/xla_data.proto``:
HloProto.hlo_module = 1; HloModuleProto.computations = 3; HloComputationProto.instructions = 2;
HloInstructionProto.name = 1, opcode = 2, shape = 3, metadata = 7, id = 35, operand_ids = 36, called_computation_ids = 38,
replica_groups = 49,
collective_device_list = 87, and 93 (the device groups as mesh axes: {1: mesh {1: axis {1: name, 2: size}}, 2: axis
{1: index}}, as JAX 0.10 writes them); HloComputationProto.id = 5; OpMetadata.op_name = 2;
ShapeProto.element_type = 2, dimensions = 3, tuple_shapes = 4.

A collective's bytes are as the events carry them (``CommKind.event_bytes``): an all-gather's its result (the gathered
total), any other's its operands (a reduce-scatter's whole input, N times its result's one shard).
Its name need not say what it is: JAX names a ``shard_map``'s ``lax.all_gather`` ``all_gather.9``, ``psum_scatter``
``reduce_scatter.21``, a ``psum`` with check_vma ``psum_invariant.7``; its ``opcode`` does.

An instruction's ``op_name`` ends in the JAX primitive it was lowered from: a collective the user wrote
(``lax.all_to_all``, ``psum``) names itself, one XLA's SPMD partitioner inserted to reshard an array names the op it
partitioned (``.../transpose(jvp())/broadcast_in_dim``).
"""
from __future__ import annotations

from dataclasses import dataclass

from .xplane_decode import _varint, fields

# xla.PrimitiveType -> bytes per element (PRED, S8..S64, U8..U64, F16, F32, F64, C64, BF16, C128, S4/U4 rounded up, F8 kinds)
_ELEMENT_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 2, 8: 4, 9: 8, 10: 2, 11: 4, 12: 8, 15: 8, 16: 2, 18: 16,
                  19: 1, 20: 1, 21: 1, 22: 1, 23: 1, 24: 1, 25: 1, 26: 1, 27: 1, 28: 1, 29: 1}
COLLECTIVE_OPCODES = ("all-reduce", "all-reduce-start", "all-gather", "all-gather-start", "reduce-scatter", "all-to-all",
                      "collective-permute", "collective-permute-start", "collective-broadcast")


@dataclass(frozen=True)
class HloCollective:
    """One collective instruction: its bytes (``CommKind.event_bytes``), its operands (the result tuple's arrays; 1 if not
    a tuple), and whether a ``while`` runs it (``lax.scan``, ``fori_loop``): once per iteration, not once per run of the program."""

    opcode: str  # ``all-gather``, ``reduce-scatter``, ``all-reduce-start``...
    nbytes: int
    operands: int
    in_loop: bool = False
    origin: str = ""  # the JAX primitive its metadata names (``all_to_all``, ``dot_general``); "" when none
    devices: str = ""  # its device groups as the program writes them ("" when not written): equal for collectives of one group


def _operands(buf: bytes, start: int, stop: int) -> int:
    return max(sum(1 for num, wt, _ in fields(buf, start, stop) if num == 4 and wt == 2), 1)


def _shape_bytes(buf: bytes, start: int, stop: int) -> int:
    elem, dims, tuple_bytes, has_tuple = 0, [], 0, False
    for num, wt, v in fields(buf, start, stop):
        if num == 2 and wt == 0:
            elem = v
        elif num == 3 and wt == 0:
            dims.append(v)
        elif num == 3 and wt == 2:  # packed
            pos = v[0]
            while pos < v[1]:
                d, pos = _varint(buf, pos)
                dims.append(d)
        elif num == 4 and wt == 2:
            has_tuple = True
            tuple_bytes += _shape_bytes(buf, *v)
    if has_tuple:
        return tuple_bytes
    n = 1
    for d in dims:
        n *= d
    return n * _ELEMENT_BYTES.get(elem, 0)


def _ints(buf: bytes, wt: int, v) -> list[int]:
    """A repeated integer field's values in one occurrence, packed (wire type 2) or not."""
    if wt == 0:
        return [v]
    out, pos = [], v[0]
    while pos < v[1]:
        x, pos = _varint(buf, pos)
        out.append(x)
    return out


def _origin(buf: bytes, start: int, stop: int) -> str:
    """The primitive an ``OpMetadata``'s op_name ends in (``jit(f)/transpose(jvp())/dot_general`` -> ``dot_general``)."""
    name = next((buf[v[0]:v[1]].decode("utf-8", "replace") for num, wt, v in fields(buf, start, stop) if num == 2 and wt == 2), "")
    return name.rpartition("/")[2].strip("()")


def _mesh_devices(buf: bytes, start: int, stop: int) -> str:
    """Mesh-axes device groups as "axis_0=2 {axis_0}": the mesh's axes of more than one device and the axes the groups
    span, so that one group written over meshes of different rank (``['axis_0'=2]``, ``['axis_0'=2,'axis_1'=1]``) compares equal."""
    axes: list[tuple[str, int]] = []
    chosen: list[tuple[int, str]] = []  # axis index, and its sub-axis as written ("" the whole axis)
    for num, wt, v in fields(buf, start, stop):
        if num == 1 and wt == 2:
            for n2, w2, axis in fields(buf, *v):
                if n2 == 1 and w2 == 2:
                    name = next((buf[a[0]:a[1]].decode("utf-8", "replace") for n3, w3, a in fields(buf, *axis) if n3 == 1 and w3 == 2), "")
                    axes.append((name, next((a for n3, w3, a in fields(buf, *axis) if n3 == 2 and w3 == 0), 1)))
        elif num == 2 and wt == 2:
            ref = list(fields(buf, *v))
            chosen.append((next((a for n2, w2, a in ref if n2 == 1 and w2 == 0), 0),
                           next((buf[a[0]:a[1]].hex() for n2, w2, a in ref if n2 == 2 and w2 == 2), "")))
    mesh = " ".join(f"{n}={k}" for n, k in axes if k > 1)
    span = ",".join(axes[i][0] + (f"[{sub}]" if sub else "") for i, sub in chosen if 0 <= i < len(axes) and axes[i][1] > 1)
    return f"{mesh} {{{span}}}"


def collectives(hlo_proto: bytes) -> dict[str, HloCollective]:
    """Instruction name -> opcode, bytes, operands and loop membership of every collective instruction of the program."""
    found: list[tuple[str, str, int, int, int, str, str, list[int]]] = []  # name, opcode, bytes, operands, computation id, origin, devices, operand ids
    shapes: dict[int, tuple[int, int]] = {}  # instruction id -> its shape's span
    calls: dict[int, set[int]] = {}  # computation id -> the computations its instructions call
    loops: set[int] = set()  # computations a ``while`` calls (its body and condition)
    buf = hlo_proto
    for num, wt, module in fields(buf, 0, len(buf)):
        if num != 1 or wt != 2:
            continue
        for n2, w2, comp in fields(buf, *module):
            if n2 != 3 or w2 != 2:
                continue
            cid = next((v for n3, w3, v in fields(buf, *comp) if n3 == 5 and w3 == 0), -1)
            for n3, w3, inst in fields(buf, *comp):
                if n3 != 2 or w3 != 2:
                    continue
                name = opcode = origin = ""
                shape = None
                iid = -1
                called: list[int] = []
                operand_ids: list[int] = []
                groups: list[str] = []
                for n4, w4, v in fields(buf, *inst):
                    if n4 == 1 and w4 == 2:
                        name = buf[v[0]:v[1]].decode("utf-8", "replace")
                    elif n4 == 2 and w4 == 2:
                        opcode = buf[v[0]:v[1]].decode("utf-8", "replace")
                    elif n4 == 3 and w4 == 2:
                        shape = v
                    elif n4 == 35 and w4 == 0:
                        iid = v
                    elif n4 == 36:
                        operand_ids += _ints(buf, w4, v)
                    elif n4 == 38:
                        called += _ints(buf, w4, v)
                    elif n4 == 7 and w4 == 2:
                        origin = _origin(buf, *v)
                    elif n4 == 93 and w4 == 2:
                        groups.append(_mesh_devices(buf, *v))
                    elif n4 in (49, 87) and w4 == 2:  # explicit groups or an iota list: compared as written
                        groups.append(buf[v[0]:v[1]].hex())
                calls.setdefault(cid, set()).update(called)
                if shape is not None:
                    shapes[iid] = shape
                if opcode == "while":
                    loops.update(called)
                if opcode in COLLECTIVE_OPCODES and shape is not None:
                    found.append((name, opcode, _shape_bytes(buf, *shape), _operands(buf, *shape), cid, origin, "|".join(groups), operand_ids))
    todo = list(loops)  # and what those call, transitively
    while todo:
        for c in calls.get(todo.pop(), ()):
            if c not in loops:
                loops.add(c)
                todo.append(c)
    out = {}
    for name, opcode, result, operands, cid, origin, devices, operand_ids in found:
        nbytes = result if opcode.startswith("all-gather") else _input_bytes(buf, shapes, operand_ids, result)
        out[name] = HloCollective(opcode, nbytes, operands, cid in loops, origin, devices)
    return out


def _input_bytes(buf: bytes, shapes: dict[int, tuple[int, int]], operand_ids: list[int], result: int) -> int:
    """The bytes of a collective's operands (its input); its result's where an operand's shape is not in the program."""
    if not operand_ids or any(i not in shapes for i in operand_ids):
        return result
    return sum(_shape_bytes(buf, *shapes[i]) for i in operand_ids)
