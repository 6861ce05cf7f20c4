"""``bench/fsdp_fresh/convert_categories.py`` on a vendored LoRA pair (``tests/data/lora``): the conversion it splits is
``whatif --data-parallel fsdp --raw``'s (the same step), its optimizer the DDP profile's times DTensor's ratio, its busy
time split without remainder, and the time blocked on each kind of collective part of the idle and wake-ups (no timing)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from testdata import DATA

from dagprof.costmodel.fsdp_costs import optimizer_ratio
from dagprof.passes.data_parallel import _stepped_params, _unit_sizes, layer_params, user_units
from dagprof.pipeline import open_run

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "fsdp_fresh"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from convert_categories import categories, converted  # noqa: E402

SRC = os.path.join(os.path.dirname(__file__), "..", "src")


def test_the_converted_lora_pair_split_as_whatif_converts_it():
    ddp, fsdp = str(DATA / "lora" / "ddp-0"), str(DATA / "lora" / "fsdp-0")
    conv, job, plain = categories(converted(ddp)), categories(open_run(fsdp).graph), categories(open_run(ddp).graph)
    done = subprocess.run([sys.executable, "-m", "dagprof.cli.main", "whatif", ddp, "--data-parallel", "fsdp", "--raw", "--no-trace",
                           "--allow-model-error", "--json"], capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONPATH=SRC))
    assert conv["step"] == pytest.approx(json.loads(done.stdout)["scenarios"][0]["predicted_iter_ms"], rel=1e-6)
    g = open_run(ddp).graph
    tensors = len(_stepped_params(g))
    nbytes = sum(_unit_sizes(user_units(g.layers, layer_params(g)), g.meta.layer_grad_bytes).values())
    assert conv["optimizer"] == pytest.approx(plain["optimizer"] * optimizer_ratio(None, g.meta.torch_minor, tensors, nbytes, 2), rel=1e-6)
    for r in (conv, job):
        assert r["busy"] == pytest.approx(r["layers"] + r["fsdp host"] + r["other host"])
        assert r["all-gather"] > 0 and r["reduce-scatter"] > 0
        assert 0 < r["AG blocked"] + r["RS blocked"] <= r["idle"] + r["wake-ups"] + 1e-9  # where the lanes' idle and wake-ups go
    assert conv["fsdp host"] > 0 and plain["fsdp host"] == 0  # FSDP2's hooks and copy-outs: none in a DDP profile
