"""Overlap policies of synchronous SGD and the gradient groups each one all-reduces.

A ``Schedule`` is everything the closed forms and the DAG need for one worker count:
whether the next iteration's I/O is prefetched, whether a group's all-reduce may start
as soon as its gradients exist (else after the whole backward), and the groups, each a
contiguous run of layers, listed in BACKWARD order (group 0 holds the last layers).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ..traces.layerwise import LayerProfile
from .comm import CommModel


class Policy(str, enum.Enum):
    SEQUENTIAL = "sequential"  # I/O, H2D, forward, backward, all-reduces, update: nothing overlaps
    IO_OVERLAP = "io-overlap"  # next iteration's I/O + H2D prefetched during compute
    WFBP = "wfbp"  # + wait-free back-propagation: layer l's all-reduce overlaps backward of l-1..1
    FUSED = "fused"  # + one all-reduce of all gradients after backward (Horovod/DDP with one big bucket)
    MG_WFBP = "mg-wfbp"  # + WFBP with small layers merged where it shortens the iteration (optimal DP)


@dataclass(frozen=True)
class Schedule:
    policy: Policy
    workers: int
    prefetch_io: bool
    overlap_comm: bool
    group_lo: np.ndarray  # first (lowest) forward layer index of each group, backward order
    group_hi: np.ndarray  # one past its last layer
    comm_us: np.ndarray  # all-reduce time of each group

    @property
    def num_groups(self) -> int:
        return len(self.comm_us)


def make_schedule(profile: LayerProfile, policy: Policy, workers: int, comm: CommModel) -> Schedule:
    policy = Policy(policy)
    n = profile.num_layers
    layer_comm = comm.layer_us(profile.grad_bytes, workers)
    prefetch = policy != Policy.SEQUENTIAL
    if policy == Policy.FUSED:
        lo, hi = np.array([0]), np.array([n])
        cost = comm.allreduce_us(np.array([profile.params_bytes]), workers)
    elif policy == Policy.MG_WFBP:
        lo, hi, cost = merge_groups(profile.backward_us, profile.grad_bytes, layer_comm, lambda b: comm.allreduce_us(b, workers))
    else:
        lo = np.arange(n - 1, -1, -1)
        hi, cost = lo + 1, layer_comm[lo]
    overlap = policy in (Policy.WFBP, Policy.MG_WFBP)
    return Schedule(policy, workers, prefetch, overlap, lo.astype(np.int64), hi.astype(np.int64), np.asarray(cost, dtype=float))


def merge_groups(backward_us: np.ndarray, grad_bytes: np.ndarray, layer_comm_us: np.ndarray, allreduce_us) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Partition layers into contiguous all-reduce groups that finish communication earliest.

    Dynamic programme over backward order (MG-WFBP, Shi et al. 2019, solved exactly):
    best[j] = min_i max(best[i], ready(j)) + cost(i..j), where the group of backward
    positions i..j-1 is ready when its last position's backward ends. ``max(x, r) + c`` is
    non-decreasing in x, so the earliest finish of a prefix is all a later group needs.
    A single layer costs its (possibly measured) ``layer_comm_us``; a merged group costs
    ``allreduce_us(total bytes)``. O(L^2) cost evaluations, vectorised per j.
    """
    n = len(backward_us)
    order = np.arange(n - 1, -1, -1)  # backward position -> forward layer index
    ready = np.cumsum(backward_us[order])  # backward position k's gradients exist at ready[k]
    cum_bytes = np.concatenate([[0], np.cumsum(grad_bytes[order])]).astype(float)
    best = np.zeros(n + 1)
    choice = np.zeros(n + 1, dtype=np.int64)
    cost_of = np.zeros(n + 1)
    for j in range(1, n + 1):
        i = np.arange(j)
        cost = np.asarray(allreduce_us(cum_bytes[j] - cum_bytes[i]), dtype=float)
        cost[j - 1] = layer_comm_us[order[j - 1]]
        finish = np.maximum(best[i], ready[j - 1]) + cost
        k = int(np.argmin(finish))  # ties: the fewest, largest groups first
        best[j], choice[j], cost_of[j] = finish[k], k, cost[k]
    bounds, costs, j = [], [], n
    while j > 0:
        bounds.append((choice[j], j))
        costs.append(cost_of[j])
        j = choice[j]
    bounds.reverse()
    costs.reverse()
    pos = np.array(bounds)
    lo = order[pos[:, 1] - 1]  # lowest forward layer = last backward position of the group
    hi = order[pos[:, 0]] + 1
    return lo, hi, np.array(costs)
