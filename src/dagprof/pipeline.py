"""The Python API behind the commands: load -> graph -> replay -> analysis -> report files."""
from __future__ import annotations

import os
from dataclasses import dataclass

from .align.clocks import ClockAlignment
from .align.one_clock import alignment_of
from .analysis import Analysis, analyze
from .analysis.findings import Finding, findings
from .graph.dag import Graph
from .passes.average_steps import average_steps
from .passes.run_kinds import build_run_graph
from .replay import replay
from .report.chrome_trace import LARGE_TRACE_EVENTS
from .report.html import ReportInputs, write_report
from .report.merged_trace import write_merged_trace
from .report.timeline import write_replay_trace
from .traces.events import Run
from .traces.formats import MXNET_MANIFEST
from .traces.load import load
from .traces.rank_warnings import merge_rank_warnings
from .traces.run_schema import MANIFEST


@dataclass
class Profiled:
    """A loaded run with its graph, replay and analysis, ready for what-ifs and reports."""

    run: Run
    graph: Graph
    analysis: Analysis
    findings: list[Finding]
    alignment: ClockAlignment | None = None  # None: one rank, or ranks that share no collective

    @property
    def warnings(self) -> list[str]:
        """What the readers noticed but could work around (a short step window, no DDP buckets...), a warning that
        several ranks give alike once for them (``rank_warnings``)."""
        return merge_rank_warnings(self._warnings())[0]

    @property
    def rank_warnings(self) -> dict[str, list[str]]:
        """Each warning of ``warnings`` said once for several ranks -> the ranks' own lines (kept in ``--json``)."""
        return merge_rank_warnings(self._warnings())[1]

    def _warnings(self) -> list[str]:
        seen = self.run.meta.warning_texts()
        seen += [w for w in self.graph.meta.warnings if w not in seen]
        for t in self.run.ranks:
            seen += [str(w) for w in t.meta.warnings if str(w) not in seen]
        return seen

    def to_dict(self) -> dict:
        clocks = None if self.alignment is None else {
            "offset_us": self.alignment.offset_us, "residual_skew_us": self.alignment.residual_us, "collectives_used": self.alignment.instances_used}
        return self.analysis.to_dict() | {"findings": [f.to_dict() for f in self.findings], "warnings": self.warnings,
                                          "warnings_per_rank": self.rank_warnings, "clock_alignment": clocks,
                                          "partial": self.run.meta.partial}


def open_run(path: str | os.PathLike[str], steps: range | None = None, engine: str = "auto", template: bool = False,
             step_marker: str | None = None, allow_missing_ranks: bool = False) -> Profiled:
    """Load, align, build and replay a run.

    The graph keeps every profiled step with its own measured op times, so what-ifs apply to each
    real step and their predictions keep its step-to-step variation. ``template`` replaces each op's
    time by its mean over the steps (dPRO's averaged replay): smoother, but on a machine whose load
    swings it predicts short, since the mean of each step's slowest path exceeds the slowest path
    of mean times. ``step_marker`` names the annotation that opens each iteration in a trace without
    ``ProfilerStep`` markers (without either, the profiled window is one iteration). A run that
    lacks ranks of its job (or holds some cut short) is refused unless ``allow_missing_ranks``.
    """
    run = load(path, allow_missing_ranks=allow_missing_ranks)
    run, graph = build_run_graph(run, replay, steps=steps, step_marker=step_marker)
    if template:
        graph = average_steps(graph, replay)
    a = analyze(graph, replay(graph, engine=engine))
    return Profiled(run, graph, a, findings(a), alignment_of(run))


OUT_FOLDER = "dagprof-out"
_INPUT_SUFFIXES = (".json.gz", ".json", ".csv", ".log", ".txt")


def default_out(path: str | os.PathLike[str]) -> str:
    """Where a command writes when no ``-o`` is given.

    Inside a dagprof run folder (the run is ours, and its outputs belong with it); for anything
    else (trace files, a folder of them, a layer file: the user's, maybe shared, maybe read-only)
    ``./dagprof-out/<input name>`` in the working directory, never beside the input.
    """
    p = os.path.abspath(os.fspath(path))
    if os.path.isdir(p) and any(os.path.exists(os.path.join(p, m)) for m in (MANIFEST, MXNET_MANIFEST)):  # TF/JAX/Horovod use MANIFEST
        return p
    name = os.path.basename(p.rstrip(os.sep)) or "input"
    for suffix in _INPUT_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return os.path.join(os.getcwd(), OUT_FOLDER, name)


def traces_skipped(p: Profiled, asked: bool) -> str | None:
    """The one line saying why the Perfetto traces are not written (None: they are): above
    ``LARGE_TRACE_EVENTS`` measured events they cost more than the rest of the command, so only when asked."""
    n = sum(len(t.events.start) for t in p.run.ranks)
    if asked or n <= LARGE_TRACE_EVENTS:
        return None
    return f"Perfetto traces not written: {n:,} events (over {LARGE_TRACE_EVENTS:,}); --write-traces writes them"


def write_outputs(p: Profiled, out_dir: str, report: ReportInputs | None = None, traces: bool = True) -> dict[str, str]:
    """replay.trace.json (predicted) and measured.trace.json (all ranks, aligned) when ``traces``, and report.html, in ``out_dir``."""
    files = {}
    inp = report or ReportInputs(p.analysis, p.findings)
    inp.warnings = p.warnings
    if traces:
        files["replay_trace"] = write_replay_trace(os.path.join(out_dir, "replay.trace.json"), p.graph, p.analysis.result,
                                                   p.analysis.path.nodes)
        files["measured_trace"], _ = write_merged_trace(os.path.join(out_dir, "measured.trace.json"), p.run)  # aligned once, by open_run
        inp.links.setdefault("replayed timeline (Perfetto)", "replay.trace.json")
        inp.links.setdefault("measured timeline, all ranks on one clock (Perfetto)", "measured.trace.json")
    files["report"] = write_report(os.path.join(out_dir, "report.html"), inp)
    return files
