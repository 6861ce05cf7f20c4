"""A real two-rank gloo DDP run profiled by dagprof -> LayerProfile -> ``dagprof sgd`` on the folder."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from dagprof.cli.main import main  # noqa: E402
from dagprof.traces.dagprof_run import read_run  # noqa: E402
from dagprof.traces.layerwise import layer_profile_from_run, read_layer_file  # noqa: E402


@pytest.fixture(scope="module")
def run_folder(small_ddp_run):
    return small_ddp_run


def test_profile_of_a_real_run(run_folder):
    run = read_run(run_folder)
    prof = layer_profile_from_run(run)
    assert prof is not None and prof.workers == 2 and prof.num_layers == len(run.ranks[0].layers)
    assert prof.names[0].startswith("stem") and prof.names[-1] == "fc"  # forward order
    assert (prof.forward_us >= 0).all() and (prof.backward_us >= 0).all()
    assert prof.forward_us.sum() > 0 and prof.backward_us.sum() > 0
    assert prof.params_bytes == sum(b.nbytes for b in run.ranks[0].buckets)
    assert prof.grad_bytes[prof.names.index("stem.0")] == 8 * 3 * 3 * 3 * 4  # conv 3->8, 3x3, fp32, no bias
    assert prof.grad_bytes[prof.names.index("layers.0.relu1")] == 0
    compute = prof.forward_us.sum() + prof.backward_us.sum() + prof.update_us
    assert 0 < compute <= prof.iter_us * 1.01  # the step minus communication calls and waits (mean of 2 steps)
    assert prof.meta.warnings == []
    assert read_layer_file(run_folder).names == prof.names


def test_sgd_cli_on_a_run_folder(run_folder, capsys):
    assert main(["sgd", run_folder, "--workers", "1,2,4", "--net", "1Gbit", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert [row["workers"] for row in r["rows"]] == [1, 2, 4]
    assert np.isfinite([row["iter_time_s"] for row in r["rows"]]).all()
    assert r["rows"][0]["speedup"] == 1.0


def test_per_step_tables_and_jitter(run_folder, capsys):
    prof = read_layer_file(run_folder)
    steps = prof.step_backward_us.shape[0]
    assert steps >= 2 and prof.step_forward_us.shape == (steps, prof.num_layers) and prof.step_update_us.shape == (steps,)
    assert np.allclose(np.median(prof.step_backward_us, axis=0), prof.backward_us)
    assert main(["sgd", run_folder, "--workers", "1,4", "--net", "1Gbit", "--jitter", "8", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["jitter_samples"] == 8 and any("drawn at random" in n for n in r["notes"])
    assert all(np.isfinite(row["iter_time_s"]) and row["iter_time_s"] > 0 for row in r["rows"])
