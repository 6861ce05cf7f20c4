"""Where the vendored reference data lives (tests/data, see its README): tests never read outside the repository."""
import re
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
KINETO_PUBLIC = DATA / "kineto-public"
KINETO_CORPUS = DATA / "kineto-corpus"
GLOO_WINDOWS = DATA / "gloo-windows"
TF_RECSYS_RAGGED = DATA / "tf" / "recsys-ragged"


def at_testbed_wire(run: Path, rate: float = 1e9):
    """The graph of a vendored testbed round profiled on the shaped loopback at ``rate`` bit/s, marked with that wire as the
    benches' what-ifs to 200 Mbit/s mark it (``bench/shaped_loopback.rate_models``): the graph the link fit reads. The
    caller has ``bench/`` on ``sys.path``, as every test that reads ``shaped_loopback``."""
    from shaped_loopback import rate_models

    from dagprof.pipeline import open_run
    from dagprof.search.scenario import profiled_at

    g = open_run(run).graph
    return profiled_at(g, rate_models(g, str(run), rate, 200e6).settings)


def recsys_logged_ids() -> dict[int, list[int]]:
    """step -> the history ids each worker of ``TF_RECSYS_RAGGED`` looked up, as the script logged them (``log<R>.txt``)."""
    out: dict[int, list[int]] = {}
    for r in (0, 1):
        for m in re.finditer(r"^step (\d+) history ids (\d+)", (TF_RECSYS_RAGGED / f"log{r}.txt").read_text(), re.M):
            out.setdefault(int(m.group(1)), [0, 0])[r] = int(m.group(2))
    return out


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


def load_refused(path, *needles: str) -> str:
    """``load(path)`` refuses in one line (no traceback) that holds every one of ``needles``; that line."""
    import pytest

    from dagprof.errors import DagprofError
    from dagprof.traces.load import load

    with pytest.raises(DagprofError) as err:
        load(path)
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text
    for n in needles:
        assert n in text, text
    return text


def cli_json(capsys, *argv) -> tuple:
    """``dagprof ARGV`` in this process: its exit code, its last stdout line as JSON (None where it is none) and its stderr."""
    import json  # noqa: PLC0415

    from dagprof.cli.main import main  # noqa: PLC0415

    rc = main(list(argv))
    out, err = capsys.readouterr()
    try:
        return rc, json.loads(out.strip().splitlines()[-1]), err
    except (ValueError, IndexError):
        return rc, None, err


def folded_lines(text: str, prefix: str) -> list[str]:
    """The lines of a command's text that begin with ``prefix`` (after their indent), each joined with the lines
    ``cli.terminal.wrap_lines`` folded it into (indented four columns deeper), whitespace normalised: a phrase a test
    holds is found wherever the terminal's width folded it."""
    rows = text.splitlines()
    out = []
    for i, ln in enumerate(rows):
        indent = len(ln) - len(ln.lstrip(" "))
        if not ln[indent:].startswith(prefix):
            continue
        parts = [ln]
        for nxt in rows[i + 1:]:
            if not (nxt.startswith(" " * (indent + 4)) and nxt[indent + 4:indent + 5] not in ("", " ")):
                break
            parts.append(nxt)
        out.append(" ".join(" ".join(parts).split()))
    return out


def worker_results(worker: str, out: Path, ranks: int = 2) -> list[dict]:
    """Run ``worker`` (a test's own script, ``python WORKER OUT``) on ``ranks`` gloo ranks and read the ``rank<R>.json`` each
    wrote in ``out``: the real-job tests of ``dagprof.apply``."""
    import json
    import os
    import sys

    from dagprof.collect.jobs.netns import run_ranks

    run_ranks([sys.executable, worker, str(out)], ranks, str(out), env={"PYTHONPATH": os.pathsep.join(sys.path)}, timeout_s=600)
    return [json.load(open(out / f"rank{r}.json")) for r in range(ranks)]
