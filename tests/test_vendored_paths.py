"""Vendored runs name what a fresh clone has: a manifest's recorded command points at the repo's own script
(``bench/...``), not at the recording machine's folders, which no other checkout holds."""
from __future__ import annotations

import json
import os

from testdata import DATA


def test_no_vendored_manifest_records_a_machine_path():
    found = [f"{m.relative_to(DATA)}: {a}" for m in sorted(DATA.rglob("manifest.json"))
             for a in json.loads(m.read_text()).get("argv") or [] if isinstance(a, str) and os.path.isabs(a)]
    assert not found, found
