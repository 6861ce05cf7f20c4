"""An FSDP2 job with explicit prefetch, ``CPUOffloadPolicy``, a root ``output_dtype`` and ``model.unshard()`` called by
hand before each forward (``bench/fsdp_fresh/prefetch_offload.py``, 2 ranks, 3 blocks: ``tests/data/fsdp-fresh/vit-offload``).
The hand-called unshard's all-gather was recorded as a backward one (FSDP2 leaves the unit IDLE there), and offload
was not recorded: the peak per rank now says what it counts where units offload."""
from __future__ import annotations

import json
from collections import Counter

from testdata import DATA

from dagprof.cli.main import main
from dagprof.traces.dagprof_run import read_run

RUN = DATA / "fsdp-fresh" / "vit-offload"


def test_collectives_as_the_job_ran_them():
    info = read_run(RUN).ranks[0].meta.fsdp
    names = [u.name for u in info.units]
    seen = Counter((names[c.unit], c.kind, c.phase, names[c.prefetched_by] if c.prefetched_by >= 0 else "") for c in info.collectives)
    steps = seen[("<root>", "reduce_scatter", "backward", "")]
    assert steps == 5
    assert seen[("<root>", "all_gather", "forward", "")] == steps  # model.unshard(async_op=True) before forward: a forward all-gather
    # set_modules_to_forward_prefetch(blocks[i+1:i+3]): blocks.0 prefetches blocks.1 and blocks.2
    assert seen[("blocks.1", "all_gather", "forward", "blocks.0")] == seen[("blocks.2", "all_gather", "forward", "blocks.0")] == steps
    assert all(u.offload and u.param_dtype == "bfloat16" and u.reduce_dtype == "float32" for u in info.units)
    block = next(u for u in info.units if u.name == "blocks.0")
    gather = next(c for c in info.collectives if c.unit == names.index("blocks.0") and c.kind == "all_gather")
    assert gather.nbytes == block.numel * 2 and gather.dtype == "bfloat16"  # the gathered bytes in the parameter dtype


def test_offload_said_with_the_peak(capsys):
    assert main(["whatif", str(RUN), "--reshard-after-forward", "off", "--allow-model-error", "--json", "--no-trace"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenarios"][0]["memory_per_rank"]
    assert any("CPUOffloadPolicy" in n for n in out["notes"])
