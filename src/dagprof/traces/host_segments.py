"""What a rank's main thread was doing, as its trace says, cut into labelled segments: the framework overhead on the critical
path (gaps between ops) is broken down by them (``analysis.overhead``).

A TF trace's main thread holds nested host ranges (``TraceMe``): eager ops (``EagerLocalExecute: IteratorGetNext``, the
dataset iterator; ``EagerLocalExecute: PrintV2``), a ``tf.function``'s Python side (``train_step``) and its graph's run
(``EagerLocalExecute: __inference_train_step_3859``), its tracing (``tf.function-graph_building``: a retrace). Each moment
takes one label from the ranges open then (``tf_label``); a moment no range covers is untraced Python.
"""
from __future__ import annotations

import re

import msgspec
import numpy as np

UNTRACED = "untraced host time (Python)"
_EAGER = "EagerLocalExecute: "
_FUNCTION = re.compile(r"^__inference_(.+?)_\d+$")
_TRACING = "tf.function-graph_building"


class HostSegments(msgspec.Struct, frozen=True):
    """A thread's time cut into segments, each with the label of what its trace recorded then (on the rank's clock, us,
    in order; a moment in none is untraced: ``UNTRACED``)."""

    start: list[float]
    end: list[float]
    label: list[int]  # index into labels
    labels: list[str]


def tf_label(open_names: list[str]) -> str:
    """One label from the names of the ranges open at a moment, outermost first: a tf.function's tracing wins; else the
    outermost eager op (its type; a tf.function's graph run by the function's name); else the innermost range's name."""
    if any(n.startswith(_TRACING) for n in open_names):
        return "tf.function tracing (graph building)"
    for n in open_names:
        if n.startswith(_EAGER):
            op = n[len(_EAGER):]
            m = _FUNCTION.match(op)
            return f"tf.function {m.group(1)}: its graph's run" if m else f"eager op {op}"
    return f"host range {open_names[-1]}"


def flatten(r0: np.ndarray, r1: np.ndarray, names: list[str], label=tf_label) -> HostSegments:
    """Nested ranges [r0, r1) of one thread -> segments, each labelled by ``label`` of the ranges open over it (outermost
    first); moments no range covers are left out (``analysis.overhead`` counts them as ``UNTRACED``). Ranges that overlap
    without nesting are cut at the outer one's end."""
    order = np.lexsort((-(r1 - r0), r0))
    stack: list[tuple[float, str]] = []  # (end, name), outermost first
    starts: list[float] = []
    ends: list[float] = []
    label_ids: list[int] = []
    labels: dict[str, int] = {}

    def emit(a: float, b: float) -> None:
        if b <= a or not stack:
            return
        lab = labels.setdefault(label([n for _, n in stack]), len(labels))
        if label_ids and label_ids[-1] == lab and ends[-1] == a:
            ends[-1] = b
        else:
            starts.append(a)
            ends.append(b)
            label_ids.append(lab)

    t = -np.inf
    for k in order.tolist():
        a, b = float(r0[k]), float(r1[k])
        while stack and stack[-1][0] <= a:  # close what ended before this one starts
            emit(t, stack[-1][0])
            t = max(t, stack.pop()[0])
        emit(t, a)
        t = a
        stack.append((min(b, stack[-1][0]) if stack else b, names[k]))
    while stack:
        emit(t, stack[-1][0])
        t = max(t, stack.pop()[0])
    return HostSegments(starts, ends, label_ids, list(labels))
