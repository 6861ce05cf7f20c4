"""ZeRO-1 (``ZeroRedundancyOptimizer``) under another worker count: each rank steps only the parameters it owns.

Its optimizer step is elementwise over the owned parameters (AdamW: a few passes over each), so a rank's step is
taken to scale with the bytes it owns; on N ranks torch assigns parameters largest first, each to the rank that owns
the fewest elements so far (``_partition_parameters``), which ``shard_bytes`` repeats on the recorded sizes. The
broadcasts that follow carry every parameter once whatever N is, so they keep their count and sizes; their price on
N ranks is the link model's (``passes.comm``) for gloo's broadcast tree (``costmodel.topology.broadcast_factor``: twice an
all-reduce of their bytes on 4 ranks). On the namespace testbed (200 Mbit/s per port, ``bench/ddp_fresh/zero1_workers.py``)
2-rank profiles of ``zero1_adam.py`` predicted the 4-rank job's step -4 to +6 % off in 4 rounds (pricing each broadcast
as an all-reduce of its bytes: -27 to -33 %), the 3-rank job's +4 to +16 % (before: -5 to -15 %). Not modelled: the
step's broadcasts overlap in part: in profiled 3- and 4-rank jobs they took 1.6 and 2.65 times the 2-rank job's, where
one broadcast alone takes 2 and 3 (the model's). A likely cause, not yet measured per port: gloo runs two collectives of
one group at once (its two worker threads; in ``zero1_overlap.py``'s hooks at 1 Gbit/s a 2.3 MB all-reduce ran 70 ms
while two 1 MB broadcasts completed inside it), and on a switch two owners' broadcasts leave by different ports, where
the group's one channel (``graph.shared_collectives``) serves one collective at a time; modelling it needs two slots per
gloo group with each port's contention, which every gloo graph would then go through (not re-checked: not done).
"""
from __future__ import annotations

from ..graph.dag import Graph
from ..traces.events import Kind
from ..traces.run_schema import ZeroInfo
from ..units import MB


def shard_bytes(zero: ZeroInfo, workers: int) -> list[int]:
    """Bytes each of ``workers`` ranks would own: the profiled partition at its own size; else torch's greedy one over
    the recorded parameters (one bucket per owner, ``parameters_as_bucket_view``, cannot be re-split: even shares, a guess
    that ``even_share_note`` says)."""
    if workers == zero.world_size:
        return [sum(n for o, n in zip(zero.owners, zero.nbytes) if o == r) for r in range(workers)]
    if _bucketed(zero):
        return [sum(zero.nbytes) // workers] * workers
    owned = [0] * workers
    for n in sorted(zero.nbytes, reverse=True):
        owned[owned.index(min(owned))] += n
    return owned


def _bucketed(zero: ZeroInfo) -> bool:
    """One broadcast per owner: its bucket (``parameters_as_bucket_view``; the collector sums each owner's parameters into
    one), whose parameters' sizes are not recorded. A job with one parameter per owner reads the same."""
    return 0 < len(set(zero.owners)) == len(zero.nbytes)


def even_share_note(zero: ZeroInfo | None, workers: list[int]) -> list[str]:
    """Where ``shard_bytes`` takes even shares (other worker counts of a bucketed ZeRO-1), said with the count of buckets:
    torch partitions the parameters inside them, largest first, which the record does not list."""
    other = sorted({w for w in workers if zero is not None and w != zero.world_size})
    if not other or not _bucketed(zero):
        return []
    return [f"--workers {','.join(map(str, other))}: ZeroRedundancyOptimizer broadcast one bucket per owner ({len(zero.nbytes)} of "
            f"{sum(zero.nbytes) / MB:.1f} MB, parameters_as_bucket_view): the parameters inside are not recorded, so each rank's "
            "shard is taken as an even share and its optimizer step scaled by that (torch assigns whole parameters, largest first: "
            "the largest shard, and so the step, may be larger)"]


def scale_zero_step(g: Graph, zero: ZeroInfo, profiled: int, workers: int, stands_for: dict[int, list[int]]) -> Graph:
    """``g`` (already resized to ``workers`` ranks) with each rank's optimizer step scaled from the shard its profiled
    rank owned to the largest shard among the ranks it stands for (``stands_for``: rank -> the what-if's ranks)."""
    was, now = shard_bytes(zero, profiled), shard_bytes(zero, workers)
    dur = g.dur.copy()
    update = g.kind == Kind.UPDATE
    for r, ranks in stands_for.items():
        if was[r % profiled] > 0:
            dur[update & (g.rank == r)] *= max(now[c] for c in ranks) / was[r % profiled]
    return g.replace(dur=dur)


def zero_state_share(g: Graph) -> float:
    """The share of the optimizer state the fullest rank keeps: its shard's bytes over the model's under ZeRO-1, else 1."""
    zero = g.meta.zero
    if zero is None or not sum(zero.nbytes):
        return 1.0
    return max(shard_bytes(zero, int(g.meta.world_size or zero.world_size))) / sum(zero.nbytes)
