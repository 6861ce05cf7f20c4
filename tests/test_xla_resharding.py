"""XLA's resharding all-to-alls in a sharded JAX program (issue 21): labelled from what the program says.

``tf-jax/fsdp-conv`` (``bench/frameworks/jax_fsdp_conv.py``, parameters sharded ``P("dp")``) runs one all-to-all a
micro-batch that XLA's SPMD partitioner inserted (its HLO metadata: ``.../transpose(jvp())/broadcast_in_dim``) over the
device groups of the program's all-gathers and gradient all-reduce. It was labelled EP/CP, and ``whatif --workers``
refused the run.
"""
import dataclasses
import gzip

import msgspec
import pytest
from testdata import DATA

import dagprof
from dagprof.errors import DagprofError
from dagprof.passes import scale_workers
from dagprof.traces.events import CommKind
from dagprof.traces.parallelism import Dim, label_run
from dagprof.traces.tf_xplane_names import program_collectives
from dagprof.traces.xla_hlo import collectives
from dagprof.traces.xplane_decode import decode_xspace

FSDP = DATA / "tf-jax" / "fsdp-conv"


def test_the_program_names_what_each_collective_was_lowered_from_and_its_devices():
    path = next((FSDP / "rank0").rglob("*.xplane.pb.gz"))
    space = decode_xspace(gzip.decompress(path.read_bytes()), str(path))
    found = {name: c for prog in program_collectives(space, space.plane("/host:metadata")).values() for name, c in prog.items()}
    a2a = found["all-to-all.1"]
    assert (a2a.origin, a2a.devices, a2a.nbytes) == ("broadcast_in_dim", "axis_0=2 {axis_0}", 8192)
    # one group written over meshes of different rank (['axis_0'=2] and ['axis_0'=2,'axis_1'=1]) compares equal
    assert {c.devices for c in found.values()} == {"axis_0=2 {axis_0}"}


def test_resharding_all_to_all_over_the_data_parallel_devices_is_dp_and_scales():
    run = dagprof.load(FSDP)
    par, _ = label_run(run)
    assert par.dims == {Dim.DP} and not par.hybrid
    assert any("resharding all-to-all" in w for grp in par.groups for w in grp.evidence)
    g = dagprof.build_graph(run)
    assert scale_workers(g, 4).meta.world_size == 4  # was refused: "EP/CP collectives of group 0 (EP/CP)"


def _moved(run, devices: str, origin: str | None = None):
    """``run`` with its all-to-alls' device groups (and origin) rewritten."""
    ranks = []
    for t in run.ranks:
        info = t.meta.collectives
        a2a = {k for k, c in enumerate(info.kind) if c == CommKind.ALL_TO_ALL}
        info = msgspec.structs.replace(info, devices=[devices if k in a2a else d for k, d in enumerate(info.devices)],
                                       origin=[origin if k in a2a and origin else o for k, o in enumerate(info.origin)])
        ranks.append(dataclasses.replace(t, meta=msgspec.structs.replace(t.meta, collectives=info)))
    return dataclasses.replace(run, ranks=ranks)


def test_resharding_over_other_devices_is_unknown_and_workers_refused_saying_why():
    run = _moved(dagprof.load(FSDP), "axis_0=2 axis_1=2 {axis_1}")
    par, _ = label_run(run)
    assert Dim.UNKNOWN in par.dims and Dim.EP_CP not in par.dims
    with pytest.raises(DagprofError, match=r"XLA's resharding all-to-all \(partitioning broadcast_in_dim\) over other devices"):
        scale_workers(dagprof.build_graph(run), 4)


def test_an_all_to_all_the_user_wrote_stays_ep_cp():
    par, _ = label_run(_moved(dagprof.load(FSDP), "axis_0=2 {axis_0}", origin="all_to_all"))
    assert Dim.EP_CP in par.dims


def _field(num: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    def varint(x: int) -> bytes:
        out = bytearray()
        while True:
            out.append((x & 0x7F) | (0x80 if x > 0x7F else 0))
            x >>= 7
            if not x:
                return bytes(out)
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def _instruction(name: str, opcode: str, op_name: str, groups: list[list[int]]) -> bytes:
    shape = bytes([0x10, 11]) + _field(3, bytes([4, 4]))  # f32[4,4]
    return (_field(1, name.encode()) + _field(2, opcode.encode()) + _field(3, shape) + _field(7, _field(2, op_name.encode()))
            + b"".join(_field(49, _field(1, bytes(g))) for g in groups))


def test_explicit_replica_groups_tell_groups_apart():
    """As a compiled 2x2-mesh ``shard_map`` program writes them (``replica_groups={{0,1},{2,3}}``): a psum over one mesh
    axis, a user's ``all_to_all`` over the other."""
    comp = _field(2, _instruction("psum.1", "all-reduce", "jit(f)/shard_map/psum", [[0, 1], [2, 3]]))
    comp += _field(2, _instruction("all-to-all", "all-to-all", "jit(f)/shard_map/all_to_all", [[0, 2], [1, 3]]))
    found = collectives(_field(1, _field(3, comp)))
    assert (found["psum.1"].origin, found["all-to-all"].origin) == ("psum", "all_to_all")
    assert found["psum.1"].devices and found["psum.1"].devices != found["all-to-all"].devices
    assert found["psum.1"].nbytes == 64
