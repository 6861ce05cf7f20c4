"""Closed forms of the S-SGD DAG model (Shi, Wang, Chu, Li 2018), steady-state iteration time.

Per worker: I/O and H2D (one loader), forward F_1..F_L, backward B_L..B_1, update U on the
compute device; all-reduce groups on one shared channel, in backward order.

- no overlap:  t = t_io + t_h2d + t_f + t_b + t_c + t_u
- I/O prefetch: t = max(t_io + t_h2d, t_f + t_b + t_c + t_u)
- wait-free back-propagation (times from the start of backward, layer l = 1..L):
  tau_b(L) = 0, tau_b(l) = tau_b(l+1) + t_b(l+1);
  tau_c(L) = t_b(L), tau_c(l) = max(tau_c(l+1) + t_c(l+1), tau_b(l) + t_b(l));
  t = max(t_io + t_h2d, t_f + tau_c(1) + t_c(1) + t_u)
- grouped (fused, merged): the same recurrence over groups, a group ready when the
  backward of its lowest layer ends (after the whole backward when comm does not overlap).
Non-overlapped communication: the part of backward+comm beyond t_b.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..traces.layerwise import LayerProfile
from .schedule import Policy, Schedule


@dataclass(frozen=True)
class Prediction:
    iter_us: float  # steady-state iteration time
    comm_exposed_us: float  # communication not hidden behind backward
    comm_us: float  # total all-reduce time on the channel
    compute_us: float  # forward + backward + update of one worker


def wfbp_tau(backward_us: np.ndarray, comm_us: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The paper's recurrences, indexed by forward layer (0 = first layer): when B_l and C_l start."""
    n = len(backward_us)
    tau_b, tau_c = np.zeros(n), np.zeros(n)
    tau_c[n - 1] = backward_us[n - 1]
    for l in range(n - 2, -1, -1):
        tau_b[l] = tau_b[l + 1] + backward_us[l + 1]
        tau_c[l] = max(tau_c[l + 1] + comm_us[l + 1], tau_b[l] + backward_us[l])
    return tau_b, tau_c


def channel_finish_us(ready_us: np.ndarray, comm_us: np.ndarray) -> float:
    """End of the last of one channel's messages, served in the given order."""
    t = 0.0
    for r, c in zip(ready_us.tolist(), comm_us.tolist()):
        t = max(t, r) + c
    return t


def closed_form(profile: LayerProfile, schedule: Schedule) -> Prediction:
    t_f = float(profile.forward_or_zero().sum())
    t_b = float(profile.backward_us.sum())
    if schedule.policy == Policy.WFBP:
        tau_b, tau_c = wfbp_tau(profile.backward_us, schedule.comm_us[::-1])  # groups are layers, backward order
        backward_comm = float(tau_c[0] + schedule.comm_us[-1])
    else:
        if schedule.overlap_comm:
            start_b = t_b - np.cumsum(profile.backward_us)  # B_l starts once B_L..B_{l+1} ran
            ready = start_b[schedule.group_lo] + profile.backward_us[schedule.group_lo]
        else:
            ready = np.full(schedule.num_groups, t_b)
        backward_comm = max(t_b, channel_finish_us(ready, schedule.comm_us))
    compute = t_f + t_b + profile.update_us
    busy = t_f + backward_comm + profile.update_us
    load = profile.io_us + profile.h2d_us
    iteration = max(load, busy) if schedule.prefetch_io else load + busy
    return Prediction(iteration, max(backward_comm - t_b, 0.0), float(schedule.comm_us.sum()), compute)
