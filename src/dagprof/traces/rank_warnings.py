"""A warning every rank gives alike, said once: the ranks named and each figure as the ranks' range (a 4-rank job's
evaluation pass was four near-identical lines in ``analyze``, ``replay`` and the report)."""
from __future__ import annotations

import re

from .completeness import spans

_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?!\d)|\d+(?:\.\d+)?")
# a rank's own line: "rank 2: ..." (the readers' per-rank notes) or "rank2.json: ..." (a warning about one rank file)
_RANK_PREFIX = re.compile(r"rank(?: |(?=\d))(\d+)(\.[\w.]+)?: ")


def merged_figures(texts: list[str]) -> list[str]:
    """Each of ``texts`` with every figure written as the range over the texts that read the same but for their figures
    (``12283`` and ``12285 ms`` -> ``12283-12285 ms`` in both); texts alike come out equal."""
    figures: dict[str, list[list[float]]] = {}
    for text in texts:
        figures.setdefault(_NUMBER.sub("#", text), []).append([_value(x) for x in _NUMBER.findall(text)])
    out = []
    for text in texts:
        ranges = iter(zip(*figures[_NUMBER.sub("#", text)]))
        out.append(_NUMBER.sub(lambda m: _span(m.group(0), next(ranges)), text))
    return out


def merge_rank_warnings(texts: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``texts`` with the lines two or more ranks give in the same words but for the rank and figures said once, where
    the first of them was: ``ranks 0-3: <text, figures as ranges>``; and each merged line -> the ranks' own lines."""
    groups: dict[tuple[str, str], list[tuple[int, str, str]]] = {}
    for text in texts:
        m = _RANK_PREFIX.match(text)
        if m:
            rest = text[m.end():]
            groups.setdefault((m.group(2) or "", _NUMBER.sub("#", rest)), []).append((int(m.group(1)), rest, text))
    out: list[str] = []
    detail: dict[str, list[str]] = {}
    done: set[str] = set()
    for text in texts:
        m = _RANK_PREFIX.match(text)
        group = groups[(m.group(2) or "", _NUMBER.sub("#", text[m.end():]))] if m else []
        if len({r for r, _, _ in group}) < 2:
            out.append(text)
            continue
        if text in done:
            continue
        suffix = m.group(2) or ""
        file = f" (rank*{suffix})" if suffix not in ("", ".json") else ""
        line = f"ranks {spans(sorted({r for r, _, _ in group}))}{file}: {merged_figures([rest for _, rest, _ in group])[0]}"
        out.append(line)
        detail[line] = [t for _, _, t in group]
        done.update(detail[line])
    return out, detail


def _value(text: str) -> float:
    return float(text.replace(",", ""))


def _span(text: str, values: tuple[float, ...]) -> str:
    """A figure as the ranks' range, written as the rank's own was (its decimals, its thousands' commas): ``12283-12285``,
    or one value."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    sep = "," if "," in text else ""
    lo, hi = (f"{v:{sep}.{decimals}f}" for v in (min(values), max(values)))
    return lo if lo == hi else f"{lo}-{hi}"
