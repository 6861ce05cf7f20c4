"""Ranks pinned to cores (taskset, mpirun --bind-to core): each rank's affinity set recorded, and the models that price
core sharing read which ranks share cores from the sets, not "N ranks on the fewest cores one had"."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys

import msgspec
import pytest
from testdata import DATA

from dagprof.analysis.operand_stall import stall_note, stall_risk, thread_share
from dagprof.errors import DagprofError
from dagprof.graph.build import build_graph, host_cpus, pinned_groups
from dagprof.graph.meta import CoreGroup
from dagprof.passes.overlap import core_bound_slowdown
from dagprof.pipeline import open_run
from dagprof.search.scenario import Scenario
from dagprof.search.whatif import evaluate
from dagprof.traces import cpu_sets
from dagprof.traces.dagprof_run import read_run

CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def test_cpu_lists_read_back_as_written():
    assert cpu_sets.cpu_list({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8" and cpu_sets.cpu_list(set()) == ""
    assert cpu_sets.cores("0-2,5,7-8") == {0, 1, 2, 5, 7, 8} and cpu_sets.cores("") == frozenset()


def _with_sets(run, sets: list[str]):
    """``run`` with its ranks on one host, rank r's affinity set ``sets[r]``."""
    ranks = [dataclasses.replace(t, host="h", meta=msgspec.structs.replace(t.meta, cpu_set=s, cpus=len(cpu_sets.cores(s))))
             for t, s in zip(run.ranks, sets)]
    return dataclasses.replace(run, ranks=ranks)


def test_ranks_whose_sets_overlap_contend_and_a_rank_alone_on_its_cores_does_not():
    run = read_run(DATA / "fsdp" / "hsdp-conv")  # 4 ranks
    apart = _with_sets(run, ["0-1", "1-2", "4", "6-7"])  # 0 and 1 overlap; 2 and 3 alone
    assert host_cpus(apart) == {"h": CoreGroup(4, 6)} and pinned_groups(apart) == {"h": (CoreGroup(2, 3), CoreGroup(1, 1), CoreGroup(1, 2))}
    same = _with_sets(run, ["0-3"] * 4)  # one set for all: not pinned apart
    assert host_cpus(same) == {"h": CoreGroup(4, 4)} and pinned_groups(same) == {}
    chain = _with_sets(run, ["0-1", "1-2", "2-3", "0"])
    assert host_cpus(chain) == {"h": CoreGroup(4, 4)} and pinned_groups(chain) == {}  # a chain of overlaps is one group


def test_a_rank_file_without_the_set_reads_as_before():
    """``tests/data/fsdp/hsdp-conv`` was recorded before the set: 4 ranks on 2 cores, one group."""
    run = read_run(DATA / "fsdp" / "hsdp-conv")
    assert {t.meta.cpu_set for t in run.ranks} == {""} and {t.meta.cpus for t in run.ranks} == {2}
    g = build_graph(run)
    assert g.meta.host_cpus == {"vm": CoreGroup(4, 2)} and g.meta.pinned_groups == {} and g.meta.core_groups("vm") == (CoreGroup(4, 2),)
    assert g.meta.pinned_said("vm") == "" and core_bound_slowdown(g) == 1.0


@pytest.mark.parametrize("cpu_set,said", [("0", "holds 1 cores but cpus says 2"), ("0-x", "cpu_set")])
def test_a_damaged_set_is_one_line_naming_the_file(tmp_path, cpu_set, said):
    folder = tmp_path / "run"
    shutil.copytree(DATA / "fsdp" / "hsdp-conv", folder)
    path = folder / "rank1.json"
    doc = json.loads(path.read_text())
    doc["cpu_set"] = cpu_set
    path.write_text(json.dumps(doc))
    with pytest.raises(DagprofError) as e:
        read_run(folder)
    assert said in str(e.value) and "rank1.json" in str(e.value) and "\n" not in str(e.value)


def test_the_stall_note_of_pinned_ranks():
    """``tf-jax/pmap-host`` (2 ranks on 2 cores, recorded before the set) with the ranks pinned apart: a rank alone on
    one core still stalls behind its own poller; one on two cores has a core per thread."""
    g = open_run(str(DATA / "tf-jax" / "pmap-host")).graph
    one = g.replace(meta=g.meta.replace(pinned_groups={"vm": (CoreGroup(1, 1), CoreGroup(1, 1))}))
    assert stall_risk(one).hosts == ("vm",) and thread_share(one) is None
    assert "vm: 2 ranks x 2 threads on 2 cores (pinned apart: 1 rank on 1 core, 1 rank on 1 core)" in stall_note(one)
    two = g.replace(meta=g.meta.replace(host_cpus={"vm": CoreGroup(2, 4)}, pinned_groups={"vm": (CoreGroup(1, 2), CoreGroup(1, 2))}))
    assert stall_risk(two) is None and core_bound_slowdown(two) == 0.0


@pytest.fixture(scope="module")
def pinned_run(tmp_path_factory):
    """A real 2-rank gloo DDP job under ``dagprof profile``, each rank pinned by taskset to a core of its own."""
    from dagprof.cli.main import main

    if len(CORES) < 2 or not shutil.which("taskset"):
        pytest.skip("needs 2 cores and taskset")
    out = tmp_path_factory.mktemp("pinned")
    pin = f"exec taskset -c $(( $LOCAL_RANK ? {CORES[1]} : {CORES[0]} )) {sys.executable} -m dagprof.collect.jobs.demo_train --small --steps 6"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--no-python", "sh", "-c", pin]
    assert main(["profile", "-o", str(out), "--steps", "2:4", "--no-kineto", "--"] + cmd) == 0
    return str(out)


def test_a_pinned_job_records_each_ranks_core_and_is_not_read_as_sharing_one(pinned_run):
    run = read_run(pinned_run)
    assert [(t.meta.cpus, t.meta.cpu_set) for t in run.ranks] == [(1, str(CORES[0])), (1, str(CORES[1]))]
    g = open_run(pinned_run).graph
    host = run.ranks[0].host
    assert g.meta.host_cpus == {host: CoreGroup(2, 2)} and g.meta.pinned_groups == {host: (CoreGroup(1, 1), CoreGroup(1, 1))}
    assert g.meta.crowded_hosts(1) == [] and g.meta.crowded_hosts(2) == [host] and g.meta.crowded_hosts(2, among_ranks=True) == []
    assert core_bound_slowdown(g) == 1.0  # each rank's compute and gloo thread on its one core
    notes = evaluate(g, [Scenario(bandwidth="100Mbit")], tolerance_pct=None)["notes"]
    assert not [n for n in notes if "shared 1 core" in n or "--cores 1" in n]
    # had they been pinned two to a core, the note says so, with the host's groups
    two = g.replace(meta=g.meta.replace(host_cpus={host: CoreGroup(3, 2)}, pinned_groups={host: (CoreGroup(2, 1), CoreGroup(1, 1))}))
    said = [n for n in evaluate(two, [Scenario(bandwidth="100Mbit")], tolerance_pct=None)["notes"] if "shared 1 core" in n]
    assert len(said) == 1 and said[0].startswith(f"2 ranks shared 1 core on host {host} (pinned apart: 2 ranks on 1 core, 1 rank on 1 core)")


def test_an_unpinned_job_records_the_whole_set_and_reads_as_before(small_ddp_run):
    run = read_run(small_ddp_run)
    assert {(t.meta.cpus, t.meta.cpu_set) for t in run.ranks} == {(len(CORES), cpu_sets.cpu_list(set(CORES)))}
    g = build_graph(run)
    assert g.meta.host_cpus == {run.ranks[0].host: CoreGroup(2, len(CORES))} and g.meta.pinned_groups == {}


def test_horovod_ranks_pinned_apart_are_not_crowded():
    """``tests/data/horovod/early-epoch`` (2 ranks on 2 cores) pinned apart: a rank's spinning wait takes its own core
    only, from no other rank's compute (the confined testbed's 2 hosts read "2 ranks on 1 core" before the sets)."""
    from dagprof.passes.horovod import crowded_hosts

    g = open_run(str(DATA / "horovod" / "early-epoch")).graph
    assert crowded_hosts(g) == ["vm"]
    apart = g.replace(meta=g.meta.replace(pinned_groups={"vm": (CoreGroup(1, 1), CoreGroup(1, 1))}))
    assert crowded_hosts(apart) == []
    assert not [n for n in evaluate(apart, [Scenario(bandwidth="100Mbit")], tolerance_pct=None)["notes"] if "Horovod threads" in n]
    two = g.replace(meta=g.meta.replace(host_cpus={"vm": CoreGroup(3, 2)}, pinned_groups={"vm": (CoreGroup(2, 1), CoreGroup(1, 1))}))
    said = [n for n in evaluate(two, [Scenario(bandwidth="100Mbit")], tolerance_pct=None)["notes"] if "Horovod threads" in n]
    assert len(said) == 1 and "(vm: 3 ranks on 2 cores (pinned apart: 2 ranks on 1 core, 1 rank on 1 core))" in said[0]
