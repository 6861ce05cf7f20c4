"""Findings and labels speak each framework's language and suggest only what dagprof can do for it."""
import pytest
from testdata import DATA

from dagprof.pipeline import default_out, open_run


@pytest.mark.parametrize("run,framework,advice", [
    ("tf/fit", "tensorflow", "bytes_per_pack"), ("tf-jax/mlp", "jax", "whatif"), ("mxnet", "mxnet", "ps:K"),
    ("horovod/fused", "horovod", "--fusion-mb"), ("run_schema/v1", None, "dagprof optimize"),
])
def test_findings_suggest_only_what_dagprof_does_for_the_framework(run, framework, advice):
    p = open_run(str(DATA / run))
    assert p.graph.meta.framework == framework
    text = " ".join(f.detail for f in p.findings)
    assert advice in text
    if framework is not None:  # dagprof optimize re-buckets PyTorch DDP only
        assert "optimize" not in text and "bucket" not in text


def test_parameter_server_messages_are_push_pull_of_a_key():
    p = open_run(str(DATA / "mxnet"))
    labels = [name for name, _ in p.analysis.path.top_ops]
    assert any(name.startswith("push/pull key ") for name in labels) and not any("all-reduce" in name for name in labels)
    names = {k.key: k.name for k in p.graph.meta.ps.keys}  # each key with the parameter it carries
    assert all(name.endswith(f" ({names[int(name.split()[2])]})") for name in labels if name.startswith("push/pull key "))
    assert "all-reduce" not in " ".join(f.detail for f in p.findings)


@pytest.mark.parametrize("run", ["mxnet", "tf/loop", "tf-jax/mlp", "horovod/fused"])
def test_outputs_of_a_framework_run_go_to_its_folder(run):
    assert default_out(DATA / run) == str(DATA / run)


@pytest.mark.parametrize("run,framework,advice", [
    ("tf/loop", "tensorflow", "bytes_per_pack"), ("tf-jax/mlp", "jax", "whatif"), ("mxnet/user_convnet", "mxnet", "ps:K"),
    ("horovod/sparse-gru", "horovod", "--fusion-mb"),
])
def test_optimize_refuses_a_framework_run_in_one_line_saying_what_dagprof_does_for_it(capsys, tmp_path, run, framework, advice):
    """It answered an MXNet run with "was the model wrapped in DistributedDataParallel?" and a Horovod one with "no
    parameter of the DDP buckets belongs to a profiled layer"."""
    import shutil

    from dagprof.cli.main import main

    folder = shutil.copytree(DATA / run, tmp_path / "run")
    assert main(["optimize", str(folder), "--budget", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"this is a {framework} run" in err and advice in err and "DDP bucket" not in err


def test_a_run_whose_all_reduces_ran_inside_a_loop_is_not_sent_to_whatif():
    """``tf-jax/scan-rnn``: whatif refuses it (its gradients are all-reduced inside the scan's loop op), so the finding on
    exposed communication says why and what the script can change instead of suggesting whatif."""
    text = " ".join(f.detail for f in open_run(str(DATA / "tf-jax" / "scan-rnn")).findings)
    assert "20 data-parallel collectives a step per rank (5.34 MiB) ran inside XLA loops" in text and "check_vma=False" in text
    assert "whatif" not in text


def test_all_reduces_a_jit_scan_runs_in_every_iteration_are_counted_from_its_program(capsys):
    """``tf-jax/lstm-lm-jit`` (``bench/frameworks/jax_lstm_lm_remat.py``: a ``lax.scan`` LSTM under plain ``jit`` with a
    batch-sharded ``NamedSharding``): XLA's partitioner all-reduces the LSTM weights' gradient in each of the scan's 32
    iterations, most of them timed as ops of their own; the finding counted only the few nested in the loop op ("1 more
    all-reduces a step") and blamed shard_map. The program's HLO tells every one a ``while`` runs. The 4 of 128 (all
    ranks) the loop op timed, as XLA ran their iterations inline, are ops of their own too since that loop's body runs
    after it in most steps (``traces.tf_xplane._Reader._split_loops``)."""
    p = open_run(str(DATA / "tf-jax" / "lstm-lm-jit"))
    assert p.graph.meta.parallel.in_loop_dp == (32 * 2 * 2, 32 * 2 * 2 * 1314816)  # 32 a step, 2 steps, 2 ranks
    assert p.graph.meta.parallel.looped_dp == (0, 0)
    text = " ".join(f.detail for f in p.findings)
    assert "32 data-parallel collectives a step per rank (40.12 MiB) ran inside XLA loops" in text and "jit's partitioner" in text
    assert "timed only as their loop op" not in text
    from dagprof.cli.main import main

    assert main(["optimize", str(DATA / "tf-jax" / "lstm-lm-jit"), "--budget", "1"]) == 2  # nor sends it to whatif, which refuses it
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "32 data-parallel collectives a step" in err and "whatif" not in err


@pytest.mark.parametrize("run,root,mha", [("fsdp-fresh/tiedlm-wake", "FSDPTiedLM", False), ("ddp-fresh/mha-accum", "Classifier", True)])
def test_a_gap_between_layers_names_the_root_s_own_code_not_an_untimed_attention(run, root, mha):
    """A model's own parameters (a DETR's queries, a tied LM's table) sit under its class name: the gap held its forward's
    own lines and the loss, where the finding told a fresh profile to be taken again to time an nn.MultiheadAttention.
    An old profile whose attention was not timed as one layer keeps that advice."""
    gap = [f.detail for f in open_run(str(DATA / run)).findings if f.detail.startswith("forward between timed layers")]  # other:forward, in words
    assert gap and f"the root {root}'s forward" in gap[0]
    assert ("nn.MultiheadAttention" in gap[0]) is mha


def test_diff_breaks_a_parameter_servers_communication_down_by_key_and_parameter():
    """diff's "one bucket at a time" read "bucket 7" on a DeepFM's batch 256 -> 512 (2026-12-06): a server's keys, named."""
    import numpy as np

    from dagprof.analysis.diff.attribution import _dimension
    from dagprof.traces.events import Kind

    g = open_run(str(DATA / "mxnet")).graph
    pa = np.flatnonzero(g.kind == Kind.COMM)
    by, labels = _dimension(g, pa, np.ones(len(pa), bool), "communication")
    names = {k.key: k.name for k in g.meta.ps.keys}
    assert by == "key" and all(lab == f"key {b} ({names[b]})" for lab, b in zip(labels, g.bucket[pa].tolist()) if b >= 0)
