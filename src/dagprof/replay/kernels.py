"""Numba kernels of the compiled replayer (imported lazily: only when numba is used).

The event loop is the reference one (``python_engine``) on flat arrays: two kinds of
array-backed binary heap (completions keyed by (end, id), one ready queue per
device keyed by (order, id), each a segment of one buffer). Keys are unique per
node, so any correct heap pops in exactly the reference order.

The whole simulator state is kept in arrays so that ``incremental`` can rebuild
the state at a time t0 from a previous run and continue the same loop.
Kernels trust their inputs: numba does no bounds checking, so callers validate
(``Graph.lint``) before calling.
"""
from __future__ import annotations

import numpy as np
from numba import njit


def _jit(fn=None, **options):
    """``njit(cache=True)``; without a writable cache location, plain ``njit``."""
    if fn is None:
        return lambda f: _jit(f, **options)
    try:
        return njit(cache=True, **options)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return njit(**options)(fn)


@_jit
def _less(key, a, b):
    ka = key[a]
    kb = key[b]
    return ka < kb or (ka == kb and a < b)


@_jit
def _push(heap, base, size, v, key):
    i = size
    while i > 0:
        p = (i - 1) >> 1
        u = heap[base + p]
        if _less(key, v, u):
            heap[base + i] = u
            i = p
        else:
            break
    heap[base + i] = v


@_jit
def _pop(heap, base, size, key):
    top = heap[base]
    size -= 1
    if size > 0:
        v = heap[base + size]
        i = 0
        while True:
            c = 2 * i + 1
            if c >= size:
                break
            if c + 1 < size and _less(key, heap[base + c + 1], heap[base + c]):
                c += 1
            u = heap[base + c]
            if _less(key, u, v):
                heap[base + i] = u
                i = c
            else:
                break
        heap[base + i] = v
    return top


@_jit
def _sort_small(a, k):
    if k > 32:
        a[:k] = np.sort(a[:k])
        return
    for i in range(1, k):
        x = a[i]
        j = i - 1
        while j >= 0 and a[j] > x:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = x


@_jit(inline="always")  # inlined into the event loop: ~20 % faster
def _make_ready(v, t, nev, ndirty, device, dur, gap, order, gate, pgate, start, end, disp, ev,
                qbuf, qoff, qlen, dirty_flag, dirty_list):
    """A node whose predecessors all ended: run it (no device) or queue it; returns (nev, ndirty)."""
    pgate[v] = gate[v]
    disp[v] = t
    d = device[v]
    if d < 0:
        start[v] = t + gap[v]
        end[v] = start[v] + dur[v]
        _push(ev, 0, nev, v, end)
        return nev + 1, ndirty
    _push(qbuf, qoff[d], qlen[d], v, order)
    qlen[d] += 1
    if not dirty_flag[d]:
        dirty_flag[d] = True
        dirty_list[ndirty] = d
        ndirty += 1
    return nev, ndirty


@_jit(inline="always")  # inlined into the event loop: ~20 % faster
def _dispatch(t, nev, ndirty, capacity, dur, gap, order, ready, gate, start, end, disp, ev,
              busy, freed, qbuf, qoff, qlen, dirty_flag, dirty_list):
    """Start queued nodes on every touched device, devices in id order; returns nev."""
    _sort_small(dirty_list, ndirty)
    for i in range(ndirty):
        d = dirty_list[i]
        dirty_flag[d] = False
        base = qoff[d]
        while qlen[d] > 0 and busy[d] < capacity[d]:
            v = _pop(qbuf, base, qlen[d], order)
            qlen[d] -= 1
            if ready[v] < t and freed[d] >= 0:
                gate[v] = freed[d]
            disp[v] = t
            start[v] = t + gap[v]
            end[v] = start[v] + dur[v]
            busy[d] += 1
            _push(ev, 0, nev, v, end)
            nev += 1
    return nev


@_jit
def init_state(indptr, succ, device, dur, gap, order, capacity, indeg, ready, gate, pgate, start, end,
               disp, ev, counters, busy, freed, qbuf, qoff, qlen, dirty_flag, dirty_list):
    """Fresh state at time 0: in-degrees, sources made ready in id order, dispatched."""
    n = len(dur)
    for k in range(len(succ)):
        indeg[succ[k]] += 1
    nev, ndirty = 0, 0
    for v in range(n):
        if indeg[v] == 0:
            nev, ndirty = _make_ready(v, 0.0, nev, ndirty, device, dur, gap, order, gate, pgate, start, end, disp,
                                      ev, qbuf, qoff, qlen, dirty_flag, dirty_list)
    nev = _dispatch(0.0, nev, ndirty, capacity, dur, gap, order, ready, gate, start, end, disp, ev,
                    busy, freed, qbuf, qoff, qlen, dirty_flag, dirty_list)
    counters[0] = 0
    counters[1] = nev


@_jit
def run(indptr, succ, device, dur, gap, order, capacity, indeg, ready, gate, pgate, start, end,
        disp, done_order, ev, counters, busy, freed, qbuf, qoff, qlen, dirty_flag, dirty_list):
    """The event loop from the given state until no event is left; returns nodes completed.

    ``counters`` = [nodes completed, entries in the completion heap]; no device is dirty between calls.
    """
    ndone = counters[0]
    nev = counters[1]
    while nev > 0:
        t = end[ev[0]]
        ndirty = 0
        while nev > 0 and end[ev[0]] == t:
            u = _pop(ev, 0, nev, end)
            nev -= 1
            done_order[ndone] = u
            ndone += 1
            d = device[u]
            if d >= 0:
                busy[d] -= 1
                freed[d] = u
                if not dirty_flag[d]:
                    dirty_flag[d] = True
                    dirty_list[ndirty] = d
                    ndirty += 1
            eu = end[u]
            for k in range(indptr[u], indptr[u + 1]):
                v = succ[k]
                if eu >= ready[v]:
                    ready[v] = eu
                    gate[v] = u
                indeg[v] -= 1
                if indeg[v] == 0:
                    nev, ndirty = _make_ready(v, t, nev, ndirty, device, dur, gap, order, gate, pgate, start, end,
                                              disp, ev, qbuf, qoff, qlen, dirty_flag, dirty_list)
        nev = _dispatch(t, nev, ndirty, capacity, dur, gap, order, ready, gate, start, end, disp, ev,
                        busy, freed, qbuf, qoff, qlen, dirty_flag, dirty_list)
    counters[0] = ndone
    counters[1] = nev
    return ndone


@_jit
def _preds(v, pindptr, pred, ovr, ov_ptr, ov_pred):
    """v's predecessors as (array, lo, hi): its override row if it has one, else the base CSR row."""
    r = ovr[v]
    if r >= 0:
        return ov_pred, ov_ptr[r], ov_ptr[r + 1]
    return pred, pindptr[v], pindptr[v + 1]


@_jit
def changed_pred_rows(changed, slot, pindptr, pred, ovr, ov_ptr, ov_pred, indptr_new, succ_new):
    """New predecessor rows of the changed nodes, as a small CSR in the order of ``changed``.

    A changed node's new predecessors: its current unchanged predecessors (their
    successor rows did not change) plus the changed nodes that list it as a successor
    now. ``slot[v]`` = v's index in ``changed``, -1 for unchanged nodes.
    """
    m = len(changed)
    cnt = np.zeros(m + 1, dtype=np.int64)
    for i in range(m):
        arr, lo, hi = _preds(changed[i], pindptr, pred, ovr, ov_ptr, ov_pred)
        for k in range(lo, hi):
            if slot[arr[k]] < 0:
                cnt[i + 1] += 1
    for u in changed:
        for k in range(indptr_new[u], indptr_new[u + 1]):
            j = slot[succ_new[k]]
            if j >= 0:
                cnt[j + 1] += 1
    ptr = np.cumsum(cnt)
    rows = np.empty(ptr[m], dtype=pred.dtype)
    fill = ptr[:m].copy()
    for i in range(m):
        arr, lo, hi = _preds(changed[i], pindptr, pred, ovr, ov_ptr, ov_pred)
        for k in range(lo, hi):
            if slot[arr[k]] < 0:
                rows[fill[i]] = arr[k]
                fill[i] += 1
    for u in changed:
        for k in range(indptr_new[u], indptr_new[u + 1]):
            j = slot[succ_new[k]]
            if j >= 0:
                rows[fill[j]] = u
                fill[j] += 1
    return ptr, rows


@_jit
def merge_preds(pindptr, pred, ovr, ov_ptr, ov_pred):
    """One predecessor CSR from the base rows and the override rows."""
    n = len(pindptr) - 1
    ip = np.zeros(n + 1, dtype=np.int64)
    for v in range(n):
        arr, lo, hi = _preds(v, pindptr, pred, ovr, ov_ptr, ov_pred)
        ip[v + 1] = ip[v] + hi - lo
    out = np.empty(ip[n], dtype=pred.dtype)
    for v in range(n):
        arr, lo, hi = _preds(v, pindptr, pred, ovr, ov_ptr, ov_pred)
        out[ip[v]:ip[v + 1]] = arr[lo:hi]
    return ip, out


@_jit
def first_time_changed(ready, end, rows_ptr, rows, changed):
    """t0: the earliest time a changed node could become ready in the old or the new run.

    min over changed c of min(old ready time of c, max old end over c's NEW
    predecessors ``rows``) -- before t0 the two runs consult only unchanged data.
    """
    t0 = np.inf
    for i in range(len(changed)):
        r = 0.0
        for k in range(rows_ptr[i], rows_ptr[i + 1]):
            r = max(r, end[rows[k]])
        t0 = min(t0, ready[changed[i]], r)
    return t0


@_jit
def completed_before(done_order, end, t0):
    """Number of completions (a prefix of done_order) that happened before t0."""
    lo, hi = 0, len(done_order)
    while lo < hi:
        mid = (lo + hi) >> 1
        if end[done_order[mid]] < t0:
            lo = mid + 1
        else:
            hi = mid
    return lo


@_jit
def restore_state(t0, k0, pindptr, pred, ovr, ov_ptr, ov_pred, pos, device, order, capacity, indeg, ready, gate, pgate, start,
                  end, disp, done_order, ev, counters, busy, freed, qbuf, qoff, qlen):
    """Turn the final state of the old run into the state at the start of time t0.

    Nodes completed before t0 (done_order[:k0]) are final; of the rest (the late
    nodes), those dispatched before t0 are in flight, those ready before t0 wait in
    their device queue, the others wait for predecessors (counted in the new graph).
    ``pos`` is each node's index in the old done_order. Device queues must be empty.
    """
    n = len(end)
    busy[:] = 0
    freed[:] = -1
    qlen[:] = 0
    counters[0] = k0
    counters[1] = 0
    need = 0
    want = np.zeros(len(busy), dtype=np.bool_)
    for i in range(k0, n):
        v = done_order[i]
        d = device[v]
        if d >= 0 and not want[d]:
            want[d] = True
            need += 1
        if disp[v] < t0:  # in flight: keeps its times and gate
            _push(ev, 0, counters[1], v, end)
            counters[1] += 1
            if d >= 0:
                busy[d] += 1
        elif ready[v] < t0:  # ready, queued on its device (all predecessors final)
            gate[v] = pgate[v]
            _push(qbuf, qoff[d], qlen[d], v, order)
            qlen[d] += 1
        else:
            r = 0.0
            g = -1
            best = -1
            cnt = 0
            arr, lo, hi = _preds(v, pindptr, pred, ovr, ov_ptr, ov_pred)
            for k in range(lo, hi):
                u = arr[k]
                p = pos[u]
                if p >= k0:
                    cnt += 1
                elif p > best:
                    best = p
                    g = u
                    r = end[u]
            indeg[v] = cnt
            ready[v] = r
            gate[v] = g
    i = k0 - 1
    while need > 0 and i >= 0:
        u = done_order[i]
        d = device[u]
        if d >= 0 and want[d] and freed[d] < 0:
            freed[d] = u
            need -= 1
        i -= 1


@_jit
def rows_differ(n, ip_a, succ_a, ip_b, succ_b, out):
    """Mark nodes whose successor rows differ (as sets in CSR order) and every endpoint of those rows."""
    for u in range(n):
        a0, a1, b0, b1 = ip_a[u], ip_a[u + 1], ip_b[u], ip_b[u + 1]
        same = (a1 - a0) == (b1 - b0)
        if same:
            for k in range(a1 - a0):
                if succ_a[a0 + k] != succ_b[b0 + k]:
                    same = False
                    break
        if not same:
            out[u] = True
            for k in range(a0, a1):
                out[succ_a[k]] = True
            for k in range(b0, b1):
                out[succ_b[k]] = True
