"""Frozen parameters' memory: dagprof's predicted peak per rank against the measured one, on a LoRA fine-tune, and the step.

The job is ``bench/fsdp_fresh/lora_finetune.py`` (base weights frozen, adapters on modules with children) on 2 gloo
ranks, its first block trained (``-0``) or frozen whole (``-1``), under FSDP2 and DDP. Each row is a ``dagprof whatif
--json`` answer's peak (rank 0, ``--optimizer-state adam``): FSDP as profiled, DDP from the FSDP profile, FSDP from the
DDP profile, against the same configuration's unprofiled run (``--memory``: ``bench/heap_peak.py``, the most of its
steps after the first); beside it the predicted step against the measured step of the target wrapper's profile (its
own iteration, as ``bench/bench_fsdp.py --part 7`` compares). ``lora_finetune.py --wrap fsdp`` calls ``fully_shard`` at its
default (the root kept gathered after forward), as ``--data-parallel fsdp`` predicts. Offline on the vendored runs by
default (``tests/data/lora``: no job); ``--record DIR`` runs
the 4 profiles and 4 measured jobs here first, then ``dagprof calibrate --fsdp`` (2 ranks, loopback) into ``DIR/link.json``;
where a folder has that file, FSDP from the DDP profile is also predicted on it (``whatif --link-model``: FSDP2's costs as
measured). ``--before CHECKOUT`` prints another tree's predictions beside.

    .venv/bin/python bench/bench_lora_memory.py [--record DIR | --offline DIR] [--before CHECKOUT]
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

from whatif_cli import Refused, whatif_json

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "fsdp_fresh" / "lora_finetune.py"
JOB = ["--width", "128", "--layers", "2", "--batch", "4", "--seq", "32", "--steps", "8"]
ROWS = [("fsdp", [], "fsdp", "FSDP as profiled"), ("fsdp", ["--data-parallel", "ddp"], "ddp", "DDP from the FSDP profile"),
        ("ddp", ["--data-parallel", "fsdp"], "fsdp", "FSDP from the DDP profile")]


def record(out: pathlib.Path) -> None:
    """The 4 profiles and the 4 measured jobs (their peaks into ``measured-peaks.json``, as ``tests/data/lora``'s)."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    peaks: dict[str, dict[str, list[int]]] = {}
    for wrap in ("fsdp", "ddp"):
        for frozen in (0, 1):
            args = [*JOB, "--wrap", wrap, "--freeze-blocks", str(frozen)]
            mem = out / f"mem-{wrap}-{frozen}"
            subprocess.run([*torchrun, str(SCRIPT), *args, "--memory", str(mem)], check=True)
            peaks[f"{wrap}-{frozen}"] = {str(r): json.loads(pathlib.Path(f"{mem}.{r}").read_text())["step_peak_bytes"] for r in (0, 1)}
            subprocess.run([sys.executable, "-m", "dagprof.cli.main", "profile", "--no-kineto", "--steps", "4:7", "-o",
                            str(out / f"{wrap}-{frozen}"), "--", *torchrun, str(SCRIPT), *args], check=True)
    (out / "measured-peaks.json").write_text(json.dumps({"step_peak_bytes": peaks}))
    subprocess.run([sys.executable, "-m", "dagprof.cli.main", "calibrate", "-o", str(out / "link.json"), "--fsdp", "--max-mb", "4"], check=True)


def whatif(src: pathlib.Path, run: pathlib.Path, extra: list[str]) -> dict | str:
    """The what-if's ``--json`` answer by the dagprof in ``src``, or its one-line refusal."""
    try:
        return whatif_json(str(run), *extra, "--optimizer-state", "adam", src=str(src))
    except Refused as e:
        return f"refused: {str(e)[:60]}"


def cell(name: str, answer: dict | str, measured_mib: float, measured_ms: float) -> str:
    """One tree's prediction of a row: rank 0's peak (MiB) and the step (ms), each with its error against the measured."""
    if isinstance(answer, str):
        return f"{name} {answer}"
    row = answer["scenarios"][0]
    mib, ms = row["memory_per_rank"]["0"]["total_mb"], row["predicted_iter_ms"]
    return f"{name} {mib:.2f} MiB ({100 * (mib / measured_mib - 1):+.1f} %), {ms:.1f} ms ({100 * (ms / measured_ms - 1):+.1f} %)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", metavar="DIR", help="run the jobs here into DIR first (default: the vendored tests/data/lora)")
    ap.add_argument("--offline", metavar="DIR", help="the runs a --record kept in DIR, predicted again (no job run)")
    ap.add_argument("--before", metavar="CHECKOUT", help="a tree holding src/ whose predictions go beside")
    args = ap.parse_args()
    data = pathlib.Path(args.record or args.offline or ROOT / "tests" / "data" / "lora")
    if args.record:
        data.mkdir(parents=True, exist_ok=True)
        record(data)
    peaks = json.loads((data / "measured-peaks.json").read_text())["step_peak_bytes"]
    trees = [("this", ROOT / "src")] + ([("before", pathlib.Path(args.before) / "src")] if args.before else [])
    print(f"peak memory per rank and step, predicted against measured, {data} (load {os.getloadavg()[0]:.2f})")
    link = data / "link.json"
    rows = ROWS + ([("ddp", ["--data-parallel", "fsdp", "--link-model", str(link)], "fsdp", "FSDP from DDP, calibrated")] if link.exists() else [])
    for frozen in (0, 1):
        for wrap, extra, target, what in rows:
            measured = max(max(steps[1:]) for steps in peaks[f"{target}-{frozen}"].values()) / 2**20
            step = whatif(trees[0][1], data / f"{target}-{frozen}", [])
            ms = step["measured_iter_ms"] if isinstance(step, dict) else float("nan")
            cells = [cell(name, whatif(src, data / f"{wrap}-{frozen}", extra), measured, ms) for name, src in trees]
            print(f"  first block {'frozen' if frozen else 'trained'}, {what:26} measured {measured:6.2f} MiB, {ms:.1f} ms: {'; '.join(cells)}")


if __name__ == "__main__":
    main()
