"""``whatif --mesh RxS``: FSDP2's HSDP layout, checked collective by collective against real recordings of both layouts
(``fsdp/fsdp4``: 1x4, ``fsdp/hsdp``: 2x2, the same job; ``fsdp/hsdp-2x3`` and ``hsdp-3x2``: 6 ranks, replicate and shard
degrees that differ, so a layout that swapped them would not pass)."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from testdata import DATA

from dagprof.cli.main import main
from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph
from dagprof.graph.build_fsdp import Passes, allreduce_equivalent_bytes, check_fsdp_edges, fsdp_collectives, issuers, mesh_of
from dagprof.passes.fsdp_mesh import parse_mesh, scale_fsdp_workers, set_mesh, step_scale, with_mesh
from dagprof.search.fsdp_memory import fsdp_peak
from dagprof.traces.dagprof_run import read_run
from dagprof.traces.events import Kind

FSDP = DATA / "fsdp"
FSDP4, HSDP = FSDP / "fsdp4", FSDP / "hsdp"
HSDP23, HSDP32 = FSDP / "hsdp-2x3", FSDP / "hsdp-3x2"
PAIRS = [(FSDP4, HSDP, (2, 2)), (HSDP, FSDP4, (1, 4)), (HSDP23, HSDP32, (3, 2)), (HSDP32, HSDP23, (2, 3))]


def graph(path):
    return build_graph(read_run(path))


def layout(g) -> Counter:
    """One step's FSDP collectives: kind, unit, prefetcher, pass, the ranks of its group and its bytes."""
    in_pass, first = Passes(g), min(int(g.step[c.node]) for c in fsdp_collectives(g))
    out = Counter()
    for c in fsdp_collectives(g):
        if int(g.step[c.node]) == first:
            ranks = issuers(g, c.node)
            phase = in_pass.is_forward(c.node, min(ranks)) if c.kind.label == "all_gather" else None
            out[(c.kind.label, c.unit, c.prefetched_by, phase, tuple(sorted(ranks)), int(g.nbytes[c.node]))] += 1
    return out


@pytest.mark.parametrize("source, target, mesh", PAIRS)
def test_the_predicted_layout_has_the_recorded_collectives_and_orderings(source, target, mesh):
    """1x4 -> 2x2 adds an all-reduce of each reduce-scattered shard across replicas; 2x2 -> 1x4 removes them; 2x3 <-> 3x2
    regroups both (shard groups of 3 ranks become 2, replicate groups of 2 become 3): every collective's kind, unit,
    prefetcher, pass, group and bytes as the real recording of the target layout has them."""
    g, real = graph(source), graph(target)
    m = set_mesh(g, *mesh)
    assert layout(m) == layout(real)
    assert mesh_of(m) == mesh_of(real) == mesh
    assert check_fsdp_edges(m) == check_fsdp_edges(real)
    for r in range(real.world_size):  # each rank's program: its collectives' enqueues and waits in the recorded order
        ops = [m.node_name(v).partition(".")[2] for v in np.flatnonzero((m.rank == r) & (m.step == m.meta.steps[0])
               & np.isin(m.kind, [Kind.COMM_ENQUEUE, Kind.COMM_WAIT]))[np.argsort(m.order[(m.rank == r) & (m.step == m.meta.steps[0])
               & np.isin(m.kind, [Kind.COMM_ENQUEUE, Kind.COMM_WAIT])], kind="stable")]]
        rec = real.rank == r
        sel = np.flatnonzero(rec & (real.step == real.meta.steps[0]) & np.isin(real.kind, [Kind.COMM_ENQUEUE, Kind.COMM_WAIT]))
        assert ops == [real.node_name(v).partition(".")[2] for v in sel[np.argsort(real.order[sel], kind="stable")]]


@pytest.mark.parametrize("source, target, mesh", PAIRS)
def test_the_predicted_memory_is_the_target_profiles(source, target, mesh):
    """The shards per rank scale with the shard degree: the memory model of the prediction is that of the target's own profile."""
    predicted, real = fsdp_peak(with_mesh(graph(source), *mesh)), fsdp_peak(graph(target))
    assert {r: round(p.total) for r, p in predicted.items()} == {r: round(p.total) for r, p in real.items()}


# the most bytes of any rank over steps 1-5 of a fresh 6-step run of the 6-rank recordings' configuration in each layout
# (bench/fsdp_train.py ... --memory [--hsdp R], loopback, 2026-12-03; a rank's steps varied by 2-10 %)
MEASURED_6 = {(1, 6): 1414304, (2, 3): 1582656, (3, 2): 1884384}


@pytest.mark.parametrize("source", [HSDP23, HSDP32])
def test_the_predicted_memory_against_measured_runs(source):
    """Each layout's peak per rank predicted from a profile of another, against that layout run with ``--memory``: within
    10 % (1x6 -1.9 %, 2x3 +3.5 %, 3x2 +0.2 %)."""
    g = graph(source)
    for mesh, measured in MEASURED_6.items():
        predicted = max(m.total for m in fsdp_peak(with_mesh(g, *mesh)).values())
        assert predicted == pytest.approx(measured, rel=0.10), (mesh, predicted, measured)


def test_groups_price_their_own_ranks():
    """A ring on k ranks moves (k-1)/k of the bytes per link: 1x4's all-gathers 3/4 of the gathered bytes, 2x2's 1/2, each
    HSDP all-reduce a whole shard's on 2 ranks (all-reduce-equivalent bytes at the priced world size)."""
    g = graph(FSDP4)
    m = set_mesh(g, 2, 2)
    for graph_, n in ((g, 4), (m, 2)):
        for c in fsdp_collectives(graph_):
            k = 2 if graph_ is m else 4
            share = ((k - 1) / k) / ((n - 1) / n)
            factor = {"all_gather": 0.5, "reduce_scatter": 1.0, "all_reduce": 1.0}[c.kind.label]
            assert allreduce_equivalent_bytes(graph_, np.array([c.node]))[0] == pytest.approx(graph_.nbytes[c.node] * factor * share)
    assert {c.kind.label for c in fsdp_collectives(m)} == {"all_gather", "reduce_scatter", "all_reduce"}


def test_the_optimizer_steps_on_the_new_shards():
    g = graph(HSDP)
    m = set_mesh(g, 1, 4)
    upd = g.kind == Kind.UPDATE
    # hooks only: the step split as torch 2.13's measured DTensor step splits it, its per-tensor part kept
    assert 0.5 < step_scale(g, 2, 4, None) < 1.0
    assert m.dur[m.kind == Kind.UPDATE].sum() == pytest.approx(g.dur[upd].sum() * step_scale(g, 2, 4, None))


def test_a_new_shard_degree_without_fsdp_costs_says_what_the_step_leaves_out(capsys):
    """Scaled by bytes alone, the step of many small tensors is predicted short (the MoE reviewer job's 1x4): said."""
    assert main(["whatif", str(HSDP), "--mesh", "1x4,2x2", "--no-trace", "--allow-model-error", "--json"]) == 0
    notes = [n for n in json.loads(capsys.readouterr().out)["notes"] if "shard degree" in n]
    assert len(notes) == 1 and notes[0].startswith("a shard degree of 4 (profiled 2)") and "calibrate --fsdp" in notes[0]
    assert main(["whatif", str(HSDP), "--workers", "8", "--no-trace", "--allow-model-error", "--json"]) == 0  # grows R only
    assert not [n for n in json.loads(capsys.readouterr().out)["notes"] if "shard degree" in n]


def test_workers_on_hsdp_grow_the_replicate_dimension():
    g = graph(HSDP)
    m = scale_fsdp_workers(g, 8)
    assert mesh_of(m) == (4, 2) and m.world_size == 8
    groups = Counter(tuple(sorted(issuers(m, c.node))) for c in fsdp_collectives(m) if c.kind.label == "all_reduce")
    assert set(groups) == {(0, 2, 4, 6), (1, 3, 5, 7)}
    check_fsdp_edges(m)
    assert set_mesh(g, 2, 2) is g
    with pytest.raises(DagprofError, match="multiple of the shard degree 2"):
        scale_fsdp_workers(g, 5)


def test_the_cli_row_and_refusals(capsys):
    assert main(["whatif", str(FSDP4), "--mesh", "1x4,2x2", "--no-trace", "--allow-model-error", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["scenarios"]
    assert [r["mesh"] for r in rows] == ["1x4", "2x2"] and all(r["peak_memory_mb"] > 0 for r in rows)
    assert rows[1]["peak_memory_mb"] > rows[0]["peak_memory_mb"]  # half the shards each
    for argv, why in ((["--mesh", "4x1"], "shard dimension of one rank"), (["--mesh", "2x2", "--workers", "8"], "--mesh with --workers"),
                      (["--mesh", "2x2"], "FSDP1")):
        run = FSDP / "fsdp1" if why == "FSDP1" else FSDP4
        assert main(["whatif", str(run), *argv, "--no-trace", "--allow-model-error"]) == 2
        err = capsys.readouterr().err
        assert why in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ValueError, match="RxS"):
        parse_mesh("2by2")


@pytest.mark.parametrize("run, hint", [(FSDP4, "--data-parallel ddp answers replication\n"), (HSDP, "not from this HSDP one")])
def test_replication_only_sends_an_hsdp_profile_nowhere_that_refuses_it(capsys, run, hint):
    """``--mesh 4x1`` points at ``--data-parallel ddp``, which refuses an HSDP profile: there the line says so."""
    assert main(["whatif", str(run), "--mesh", "4x1", "--no-trace", "--allow-model-error"]) == 2
    err = capsys.readouterr().err
    assert hint in err and len(err.strip().splitlines()) == 1


def test_there_and_back_replays_the_profile_where_no_arrivals_were_measured():
    """1x4 -> 2x2 -> 1x4 gives the 1x4 graph's replay back where the graph holds no measured times: every wait (joins, exit
    lags) is carried, none invented, and a warning says so."""
    from dagprof.analysis import job_iteration_us
    from dagprof.passes.comm import retime_collectives
    g = retime_collectives(graph(FSDP4))  # every collective priced by the link fitted to them, as the what-ifs price them
    g = g.replace(meta=g.meta.replace(provenance=None))
    m = set_mesh(g, 2, 2)
    assert any("no measured arrivals" in w for w in m.meta.warnings)
    assert job_iteration_us(set_mesh(m, 1, 4)) == pytest.approx(job_iteration_us(g), rel=1e-9)


def release_us(g) -> dict[str, float]:
    """Each kind's mean release of a rank behind its group's first rank out (its waits' overhead after the transfer), us."""
    out: dict[str, list[float]] = {}
    for c in fsdp_collectives(g):
        out.setdefault(c.kind.label, []).extend(float(g.gap[v]) for v in g.successors(c.node).tolist() if g.rank[v] >= 0)
    return {k: float(np.mean(v)) for k, v in out.items()}


def test_a_smaller_group_releases_behind_its_own_first_rank_out():
    """1x4 -> 2x2: each rank's measured lag behind the first rank out is taken behind the first of its new group: every
    kind's releases come nearer the real 2x2 recording's than the 1x4 profile's carried as they were (the recording:
    all-gather 1.93 ms, reduce-scatter 1.77, all-reduce 1.87; carried 2.33, 3.08, 3.08)."""
    g, real = graph(FSDP4), release_us(graph(HSDP))
    got, carried = release_us(set_mesh(g, 2, 2)), release_us(g) | {"all_reduce": release_us(g)["reduce_scatter"]}
    for kind, us in real.items():
        assert abs(got[kind] - us) < abs(carried[kind] - us), kind


def test_a_per_step_graphs_joins_get_no_wait():
    """Only an averaged join lacks its late rank's turns (``passes.average_steps``); a per-step graph's joins wait for each
    step's own arrivals, so regrouped they get no added wait either way."""
    for path, mesh in ((FSDP4, (2, 2)), (HSDP, (1, 4))):
        m = set_mesh(graph(path), *mesh)
        assert not m.gap[m.kind == Kind.SYNC].any()


def test_fewer_ranks_leave_no_collective_behind():
    m = set_mesh(graph(HSDP), 1, 2)  # one replica of the 2x2 job
    assert m.world_size == 2 and all(set(issuers(m, c.node)) == {0, 1} for c in fsdp_collectives(m))
    check_fsdp_edges(m)


def test_rings_merged_from_profiled_groups_are_said():
    """2x2 -> 1x4 runs 4-rank rings each holding two profiled 2-rank ones, 3x2 -> 2x3 3-rank rings holding a profiled pair:
    how their ranks wait and leave in the longer ring is not measured, one line says so; regrouping into rings no longer
    than the profiled ones (1x4 -> 2x2, 2x3 -> 3x2: replicate rings of 3 from pairs across other ranks) says nothing."""
    from dagprof.passes.fsdp_mesh import merged_rings_note
    note = merged_rings_note(graph(HSDP), 1, 4)
    assert note and "shard groups of 4" in note and "\n" not in note
    assert "shard groups of 3" in merged_rings_note(graph(HSDP32), 2, 3)
    assert merged_rings_note(graph(FSDP4), 2, 2) is None and merged_rings_note(graph(HSDP23), 3, 2) is None


def test_a_longer_ring_hides_more_of_its_all_gathers_behind_a_late_rank():
    """3x2 -> 1x6 on the 200 Mbit/s testbed (``fsdp/testbed-3x2-200mbit``): while a rank of a 6-rank ring is late the other
    links move their first segments (``costmodel.gloo_ring``), so from the ranks' own measured arrivals the all-gathers
    take less than the bytes per link at the link fitted to the 2-rank ones; the reduce-scatters (gloo's all-reduce ring,
    each receive posted before its send) hide less. On loopback no wire shows in the fitted link (its collectives do not
    grow with their bytes): nothing is hidden there."""
    from dagprof.passes.comm import current_topology

    def per_link(g, mesh):
        link, m, out = current_topology(g), set_mesh(g, *mesh), {}
        for c in fsdp_collectives(m):
            n = len(issuers(m, c.node))
            wire = (1 if c.kind.label == "all_gather" else 2) * (n - 1) / n * float(m.nbytes[c.node]) * link.for_kind(c.kind.label).inter.beta_us_per_byte
            out.setdefault(c.kind.label, []).append(float(m.dur[c.node]) / wire if wire else np.nan)
        return {k: float(np.mean(v)) for k, v in out.items()}
    got = per_link(graph(FSDP / "testbed-3x2-200mbit"), (1, 6))
    assert got["all_gather"] < 0.95 and got["all_gather"] < got["reduce_scatter"] - 0.05
    assert all(np.isnan(v) for v in per_link(graph(HSDP32), (1, 6)).values())


def test_one_replica_drops_fsdps_all_reduces_not_the_jobs_own():
    """1x4 from 2x2 removes the all-reduces FSDP ran across replicas; an all-reduce of the job's own (``CommRole.JOB``:
    a loss all-reduced for a log line, a save's barrier) stays: the kind alone does not tell them apart."""
    from dagprof.traces.events import CommKind, CommRole

    g = graph(HSDP)
    shared = np.flatnonzero((g.kind == Kind.COMM) & (g.rank < 0) & (g.comm_kind == CommKind.ALL_REDUCE))
    job = int(shared[0])
    g.role[job] = CommRole.JOB
    m = set_mesh(g, 1, 4)
    kept = np.flatnonzero((m.kind == Kind.COMM) & (m.rank < 0) & (m.comm_kind == CommKind.ALL_REDUCE))
    names = {m.node_name(v): int(m.role[v]) for v in kept}
    assert names.get(g.node_name(job)) == CommRole.JOB
    assert not {g.node_name(v) for v in shared if v != job} & set(names)


@pytest.mark.parametrize("source, mesh", [(FSDP4, (2, 2)), (HSDP, (1, 4))])
def test_the_layouts_joins_transfers_and_issues_carry_their_calls_kind_and_role(source, mesh):
    """Each collective ``--mesh`` rebuilds on the layout's groups, its join too, has its call's kind and the profiled
    collective's role, as the graph builder gives both; the all-reduce it adds after each reduce-scatter (1x4 -> 2x2) is
    an all-reduce, its issue too: none is told by a name later."""
    from dagprof.traces.events import CommKind, CommRole

    g = graph(source)
    m = set_mesh(g, *mesh)
    comm = np.flatnonzero((m.kind == Kind.COMM) & (m.rank < 0))
    for v in comm.tolist():
        joins = [int(p) for p in m.predecessors(v).tolist() if m.kind[p] == Kind.SYNC]
        assert joins and all(m.comm_kind[j] == m.comm_kind[v] and m.role[j] == m.role[v] for j in joins)
    replicas = {CommKind.ALL_REDUCE} if mesh[0] > 1 else set()
    assert set(m.comm_kind[comm].tolist()) == {CommKind.ALL_GATHER, CommKind.REDUCE_SCATTER} | replicas
    assert (m.role[comm] == CommRole.PLAIN).all()
    issues = np.flatnonzero((m.kind == Kind.COMM_ENQUEUE) & (m.rank >= 0))
    added = [v for v in issues.tolist() if m.node_name(v).split(".", 1)[1].startswith("fsdp all_reduce ")]
    assert len(added) == 2 * int((m.comm_kind[comm] == CommKind.ALL_REDUCE).sum())  # each rank's, in its replica group of 2
    assert all(m.comm_kind[v] == CommKind.ALL_REDUCE for v in added)
