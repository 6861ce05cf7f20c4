"""A DDP loop that validates at the top of a step, then all-reduces its validation loss (issue 16): the call is the job's
own, not a gradient bucket, though the evaluation's forwards (under ``torch.no_grad``) ran before it in that step."""
import numpy as np
from testdata import DATA

from dagprof.passes.link_fit import link_fit
from dagprof.pipeline import load, open_run
from dagprof.traces.events import Kind
from dagprof.traces.parallelism import Dim, _trained_forwards

DNA = DATA / "ddp-fresh" / "dna-val-own"  # bench/ddp_fresh/layerdrop_dna.py, 2 layers: a 4 B validation loss all-reduced in step 5


def test_the_validation_loss_after_an_evaluation_pass_is_the_jobs_own():
    g = open_run(DNA).graph
    shared = (g.kind == Kind.COMM) & (g.rank < 0)
    metric = np.flatnonzero(shared & (g.nbytes == 4))
    assert len(metric) == 1 and g.dim[metric[0]] == Dim.JOB  # read "DP" before
    buckets = shared & (g.nbytes > 4)
    assert buckets.sum() == 5 and (g.dim[buckets] == Dim.DP).all()  # one 302 kB bucket a step, 5 steps
    assert link_fit(g).collectives == 5  # the metric out of the link fit


def test_the_evaluation_forwards_do_not_open_the_training_step():
    trace = load(DNA).ranks[0]
    ev = trace.events
    main = np.array([lane.main for lane in trace.lanes], dtype=bool)[ev.lane]
    trained = _trained_forwards(ev, main)
    metric = int(ev.step[np.flatnonzero(ev.nbytes == 4)[0]])
    fwd = (ev.kind == Kind.FORWARD) & main & (ev.step == metric)
    assert trained[fwd].sum() < fwd.sum()  # the evaluation's forwards dropped
    call = float(ev.start[np.flatnonzero(ev.nbytes == 4)[0]])
    assert float(ev.start[fwd].min()) < call < float(ev.start[fwd & trained].min())
    other = (ev.kind == Kind.FORWARD) & main & (ev.step != metric) & (ev.layer >= 0)
    bwd_layers = {(int(s), int(la)) for s, la in zip(ev.step[ev.kind == Kind.BACKWARD], ev.layer[ev.kind == Kind.BACKWARD])}
    answered = np.array([(int(s), int(la)) in bwd_layers for s, la in zip(ev.step[other], ev.layer[other])], dtype=bool)
    assert (trained[other] == answered).all()  # the training steps: every forward of a layer a backward ran in
