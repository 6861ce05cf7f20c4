"""FSDP1 names its gathered flat parameters to the saved-activation counter, as FSDP2 does: a layer that saves its
weight saves a view of its whole unit's gathered flat parameter. ``tests/data/fsdp/fsdp1-sgo-frozen``
(``bench/fsdp_fresh/fsdp1_sgo_frozen.py``: ``SHARD_GRAD_OP``, ``use_orig_params=True``, a frozen embedding in the root unit)
counted it as activations of the first layer to save it: the head's LayerNorm 2.03 MiB, the root's whole flat parameter,
beside the same parameters gathered (the 4-layer job's peak +5.0 % over its measured one, now -0.6 %)."""
from __future__ import annotations

from testdata import DATA

from dagprof.graph.build import build_graph
from dagprof.search.fsdp_memory import _Job, fsdp_peak
from dagprof.traces.dagprof_run import read_run

SGO = DATA / "fsdp" / "fsdp1-sgo-frozen"


def test_gathered_flat_parameters_saved_by_a_layer_are_no_activations():
    g = build_graph(read_run(SGO))
    fs = g.meta.fsdp
    units = {u.name: u for u in fs.units}
    gathered = fs.layer_saved_gathered_bytes
    assert gathered is not None and set(gathered) == {"head.0", "layers.0.norm1", "layers.1.norm1"}
    # each the unit's flat parameter padded to the 2 ranks (FSDP1 gathers it whole)
    assert gathered["head.0"] == 2 * units["<root>"].shard_bytes and gathered["layers.0.norm1"] == 2 * units["layers.0"].shard_bytes
    job = _Job(g, None, None)
    assert job.acts(["head.0"], units["<root>"]) < 4096  # its input (4 x 128 floats) and statistics, not the root's 2 MiB
    assert all(m.total > 0 for m in fsdp_peak(g).values())


def test_ddp_from_fsdp1_steps_plain_tensors_times_the_ranks(capsys):
    """FSDP1's optimizer steps plain tensors: under DDP each rank steps every parameter, the profiled step times the ranks.
    DDP -> FSDP2's DTensor-to-plain ratio (2.35 at torch 2.13 for this model) made the 4-layer job's DDP step 0.96 ms
    where it measured 3.98 (the FSDP1 step 2.26)."""
    import json

    import numpy as np

    from dagprof.cli.main import main
    from dagprof.passes.fsdp_to_ddp import fsdp_to_ddp
    from dagprof.traces.events import Kind

    g = build_graph(read_run(SGO))
    d = fsdp_to_ddp(g)
    before, after = (float(x.dur[x.kind == Kind.UPDATE].sum()) for x in (g, d))
    assert np.isclose(after, 2 * before)
    assert main(["whatif", str(SGO), "--data-parallel", "ddp", "--no-trace", "--json", "--allow-model-error"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("FSDP1's on plain tensor shards times the ranks" in n for n in notes) and not any("DTensor shards" in n for n in notes)


def test_the_job_collectives_warning_names_fsdp1s_own_clip():
    """FSDP1 steps no DTensor: the collectives it ran outside FSDP's calls after the backward are its ``clip_grad_norm_``'s
    (one all-reduce of the norm a step), which the warning named \"clip_grad_norm_'s on DTensor gradients\"."""
    import numpy as np

    from dagprof.traces.fsdp_run import _outside_text
    from dagprof.traces.run_schema import FSDP1_API, FSDP2_API, Rec

    records = np.array([[Rec.FWD_BEGIN, 0, 0, 100, 0], [Rec.BWD_END, 0, 0, 200, 0]], dtype=np.int64)
    steps = [(5, 0, 1000)]
    one = _outside_text([500], records, steps, FSDP1_API)
    assert "FSDP1's clip_grad_norm_ (its all-reduce of the norm)" in one and "DTensor gradients" not in one
    assert "clip_grad_norm_'s on DTensor gradients" in _outside_text([500], records, steps, FSDP2_API)
