"""Where the vendored reference data lives (tests/data, see its README): tests never read outside the repository."""
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
KINETO_PUBLIC = DATA / "kineto-public"
KINETO_CORPUS = DATA / "kineto-corpus"
GLOO_WINDOWS = DATA / "gloo-windows"


def copy_fixture(tmp_path: Path, fixture: str) -> Path:
    """A writable copy of a vendored run folder, to damage."""
    import shutil

    run = tmp_path / Path(fixture).name
    shutil.copytree(DATA / fixture, run)
    return run


def edit_json(path: Path, edit) -> None:
    """Apply ``edit`` to a JSON file's document in place, gzipped or not, as it was."""
    import gzip
    import json

    raw = path.read_bytes()
    gz = raw[:2] == b"\x1f\x8b"
    doc = json.loads(gzip.decompress(raw) if gz else raw)
    edit(doc)
    text = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(text) if gz else text)
