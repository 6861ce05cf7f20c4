"""``dagprof profile``'s summary names each rank's gradient collectives for what they are: DDP's buckets, Horovod's fused
all-reduces, and none for FSDP (its units are not buckets)."""
from __future__ import annotations

from dagprof.cli.cmd_profile import to_text


def _result(**kind: bool) -> dict:
    rank = {"rank": 0, "host": "h", "steps": [5, 9], "layers": 7, "buckets": 3, "iteration_ms": 12.0, "unprofiled_iteration_ms": None}
    return {"run": "RUN", "exit_status": 0, "world_size": 2, "ranks": [rank], "warnings": [], **kind}


def test_each_kind_of_job_names_its_collectives() -> None:
    assert "3 buckets, iteration" in to_text(_result(ddp=True, fsdp=False, horovod=False))
    assert "3 fused all-reduces, iteration" in to_text(_result(ddp=False, fsdp=False, horovod=True))
    fsdp = to_text(_result(ddp=False, fsdp=True, horovod=False))
    assert "bucket" not in fsdp and "7 layers, iteration" in fsdp
