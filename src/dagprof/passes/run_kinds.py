"""The graph of a run, by the run's kind: the one table that says which builder makes it and what is fitted after.

A new kind of job (another framework's layout, a new parallelism) adds one ``RunKind`` here; the
pipeline and every other caller build through ``build_run_graph`` and never branch on the kind.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..align.one_clock import on_one_clock
from ..graph.build import build_graph
from ..graph.build_ps import build_ps_graph
from ..graph.dag import Graph
from ..graph.replay_result import ReplayResult
from ..traces.events import Run
from .comm import fit_ps_link
from .link_fit import with_gloo_pace

Replayer = Callable[[Graph], ReplayResult]


@dataclass(frozen=True)
class RunKind:
    name: str
    recognises: Callable[[Run], bool]
    # (run, steps, step_marker, replayer) -> (the run on the clock its graph uses, the graph)
    build: Callable[[Run, range | None, str | None, Replayer], tuple[Run, Graph]]


def _parameter_server(run: Run, steps: range | None, step_marker: str | None, replayer: Replayer) -> tuple[Run, Graph]:
    """Processes on one clock and no collectives to align by; the link rate is fitted to the measured exchanges."""
    return run, fit_ps_link(build_ps_graph(run, steps=steps), replayer)


def _collective(run: Run, steps: range | None, step_marker: str | None, replayer: Replayer) -> tuple[Run, Graph]:
    """Ranks aligned by their shared collectives (DDP, FSDP, Horovod, TF, JAX, hybrid meshes)."""
    run, matching = on_one_clock(run)  # kept: the measured timeline is written on this clock
    return run, with_gloo_pace(build_graph(run, steps=steps, matching=matching, step_marker=step_marker), replayer)


KINDS = (
    RunKind("parameter server", lambda run: run.meta.ps is not None, _parameter_server),
    RunKind("collective", lambda run: True, _collective),  # the rest: last
)


def run_kind(run: Run) -> RunKind:
    return next(k for k in KINDS if k.recognises(run))


def build_run_graph(run: Run, replayer: Replayer, steps: range | None = None, step_marker: str | None = None) -> tuple[Run, Graph]:
    """``run``'s graph by its kind's builder; also the run on the clock the graph uses (for the measured timeline).

    ``replayer`` is ``dagprof.replay.replay`` (a kind may fit its model by replay; passes sit below the replay layer).
    """
    return run_kind(run).build(run, steps, step_marker, replayer)
