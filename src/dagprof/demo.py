"""``dagprof demo``: the whole product on an embedded job, end to end, on this machine.

A real multi-process gloo DDP training of a small CNN (DDP's default buckets) is profiled, its
global graph replayed and explained, what-ifs answered, a strategy searched by replay, applied to
the real job and measured against the defaults in interleaved rounds, and everything written to
one report. As root the ranks run in an emulated 2-host cluster (network namespaces joined by a
``tc tbf`` link, 200 Mbit/s unless told otherwise), where communication matters as it does between
real hosts; without root they talk over loopback, where it is a few percent of the step.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable

from .analysis.interval import StepStatistic, measured_step_us
from .closeloop import BASELINE_WARNING, Checked, Found, check_strategy, defaults_stand, find_strategy, hosts
from .collect.jobs.verify import ROUNDS
from .costmodel import preset
from .errors import DagprofError
from .pipeline import Profiled, open_run, write_outputs
from .report.html import ReportInputs, html_table
from .report.svg import speedup_chart
from .search.optimize import Options
from .search.scenario import Scenario
from .search.shared_cores import NOTED
from .search.whatif import MODEL_TOLERANCE_PCT, evaluate
from .sgd import CommModel, Policy, predict
from .traces.layerwise import layer_profile_from_run
from .units import MB

WHATIF_BANDWIDTHS = ["10Gbit", "1Gbit", "100Mbit"]
WHATIF_WORKERS = [8, 64, 4096]
OUTLOOK_WORKERS = [1, 2, 4, 8, 16, 32, 64]
OUTLOOK_NET = "10gbe"
POLICY_WORDS = {"sequential": "nothing overlaps: input, forward, backward, every all-reduce, update, one after another",
                "io-overlap": "the next batch's input loaded during compute",
                "wfbp": "io-overlap, and each layer's all-reduce starts as soon as its gradient is ready, during the rest of backward",
                "fused": "io-overlap, and one all-reduce of all gradients after backward (one big bucket)",
                "mg-wfbp": "wfbp with small layers' gradients merged where that shortens the iteration (what DDP's buckets do)"}
NEXT_HTML = ("<p>A strategy found here fits the demo's model only. On your training: <code>dagprof profile -o runs/exp1 -- torchrun "
             "--nproc-per-node 2 train.py</code> (or <code>dagprof.profile(...)</code> in the loop), then <code>dagprof report runs/exp1</code>; "
             "<code>dagprof optimize runs/exp1 --verify -- torchrun ... train.py</code> searches and measures a strategy for it, and "
             "<code>dagprof.apply(ddp_model, \"strategy.json\")</code> applies the file it writes in your script (README, docs/optimize.md).</p>")
LOOPBACK_NOTE = ("no root here, so the ranks talk over loopback, where the gradient all-reduce is a few percent of the step: "
                 "there is little for any strategy to gain (run as root to emulate a 2-host cluster with a slow link)")


@dataclass
class DemoSettings:
    out_dir: str = "dagprof-demo"
    world_size: int = 2
    link: str | None = "200Mbit"  # emulated link between the ranks (root); None: loopback
    steps: int = 14
    profile_steps: tuple[int, int] = (5, 13)  # after DDP's bucket rebuild and warm-up
    verify: bool = True  # apply the strategy to the real job and measure it
    verify_steps: int = 5  # timed steps per phase (after 3 warm-up steps), phases alternate inside one job
    rounds: int = ROUNDS
    budget_s: float = 10.0
    allow_lossy: bool = True  # the demo trains on synthetic data; a real job opts in (optimize --allow-lossy)
    small: bool = False  # a tiny model (tests)
    model: str = "cnn"


def run_demo(s: DemoSettings, say: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> dict:
    from .collect.jobs.netns import python_module, run_ranks

    out = os.path.abspath(s.out_dir)
    run_dir = os.path.join(out, "run")
    train = python_module("dagprof.collect.jobs.demo_train", "--model", s.model, *(["--small"] if s.small else []))
    with hosts(s.world_size, s.link, tag=f"dpd{os.getpid() % 100000}") as on:
        ranks_on, where = on.cluster, on.where
        # the folder is named at the end: here it is still the staged one, which moves to the output folder when the demo ends
        say(f"[1/5] profiling a real {s.world_size}-rank gloo DDP training with DDP's default buckets on {where}")
        run_ranks(train + ["--steps", str(s.steps), "--profile", run_dir, "--profile-steps", f"{s.profile_steps[0]}:{s.profile_steps[1]}"],
                  s.world_size, os.path.join(out, "logs", "profile"), cluster=ranks_on)
        say("[2/5] building the global graph and replaying it")
        prof = open_run(run_dir)
        say("[3/5] what-ifs from the one profile")
        refused = None
        try:
            whatifs = _whatifs(prof)
        except DagprofError as e:  # the model misses the profiled run, so it predicts nothing: the report says why
            say(f"  {e}")
            whatifs, refused = [], str(e)
        lossy = "; gradient compression allowed, as the data are synthetic: --lossless forbids it" if s.allow_lossy else ""
        say(f"[4/5] searching a strategy by replay ({s.budget_s:g} s budget{lossy})")
        # on the emulated cluster its collectives cross the shaped link, not one host's loopback: the wire named, no shared-cores bounds
        wire = s.link if on.cluster is not None else None
        found = find_strategy(run_dir, Options(budget_s=s.budget_s, allow_lossy=s.allow_lossy, profiled_bandwidth=wire), out, raw=True)
        checked = None
        if s.verify and found.path is None:
            say("[5/5] nothing to apply: no strategy is predicted to gain beyond run-to-run noise, so DDP's defaults stand")
        elif s.verify:
            say(f"[5/5] applying it to the real job, measured against DDP's defaults in {s.rounds} interleaved rounds")
            checked = check_strategy(train + ["--steps", str(s.verify_steps)], found, out, s.rounds, s.world_size, ranks_on,
                                     say=lambda m: say("  " + m.strip()), in_process=True)
    outlook = _scaling_outlook(prof)
    notes = [] if on.refused is None else [LOOPBACK_NOTE]
    files = write_outputs(prof, out, _report(prof, found, checked, outlook, whatifs, where, notes, refused))
    return _summary(prof, found, checked, files, run_dir) | {"whatifs": whatifs, "scaling_outlook": outlook, "cluster": where, "notes": notes}


def _optimisation(found: Found, checked: Checked | None) -> dict:
    res = found.search
    d = res.to_dict()
    b, best = d["baseline"], d["best"]
    # the measured medians as the predictions beside them are written ("533.7 ms"), not a bare 533.69
    measured = {k: f"{v:,.1f} ms" for k, v in checked.to_dict().items() if k in ("measured_baseline_ms", "measured_strategy_ms")} if checked else {}
    rows = [["DDP defaults (profiled)", b["buckets"], b["codec"], b.get("interval", b["predicted_iter_ms"]), measured.get("measured_baseline_ms", "")],
            ["strategy found" if found.path else "best candidate (not written)", best["buckets"], best["codec"],
             best.get("interval", best["predicted_iter_ms"]), measured.get("measured_strategy_ms", "")]]
    columns = ["setup", "buckets", "codec", "predicted ms per step", "measured ms per step (median of rounds)"]
    if not checked:  # nothing applied: no measured column of empty cells
        rows, columns = [r[:-1] for r in rows], columns[:-1]
    summary = f"Strategy by replay ({res.replayed} candidates): {found.strategy.summary() if found.path else defaults_stand(res)}."
    if checked:
        summary += " " + verdict(checked)
    return {"table_columns": columns, "table": rows, "summary": summary}


def baseline_note(found: Found, prof: Profiled, checked: Checked | None) -> str:
    """Why the profiled setup's step is one figure in the headline, another in the search and a third in the rounds, in
    one line: the search prices every candidate on its own template of a step (``search.evaluate``) and sums the
    replayed steps by its statistic (a median step for DDP), held against the profiled steps' alike (``check_baseline``,
    whose warning this line says in words); the rounds are fresh runs of the job, hooks only, without Kineto."""
    res = found.search
    mean_us = prof.analysis.measured_us
    typical_us, statistic = measured_step_us(prof.graph, res.step_statistic)
    text = (f"the search puts the profiled setup at {res.baseline.iter_us / 1e3:.1f} ms per step: it replays a template of one step "
            f"(each op at its typical time) and takes the {statistic.value} step")
    if typical_us is not None and res.model_error_pct is not None:
        text += f", {res.model_error_pct:+.1f} % off the profiled steps' {statistic.value} ({typical_us / 1e3:.1f} ms"
        text += f"; their mean, measured above, {mean_us / 1e3:.1f} ms)" if statistic is StepStatistic.MEDIAN and mean_us else ")"
        if abs(res.model_error_pct) > MODEL_TOLERANCE_PCT:
            text += f", beyond {MODEL_TOLERANCE_PCT:g} %, so its predictions carry that error"
    if checked:
        text += f"; the rounds' {checked.to_dict()['measured_baseline_ms']:.1f} ms are fresh runs of the job without Kineto (hooks only)"
    return text


def interval_notes(notes: list[str]) -> list[str]:
    """The search's notes that say what its intervals hold beyond the replayed steps: the ``shared_cores`` bounds of the
    demo's own case (gloo ranks on one host's loopback), which widen the table's intervals well past the steps' spread."""
    return [n for n in notes if NOTED in n]


def verdict(checked: Checked) -> str:
    """The measured gain against the prediction, in words."""
    d = checked.to_dict()
    text = (f"Applied to the real job: {d['measured_baseline_ms']:.1f} ms -> {d['measured_strategy_ms']:.1f} ms per step, "
            f"measured speed-up {d['measured_speedup']:.2f}x (rounds {d['spread'][0]:.2f}-{d['spread'][1]:.2f}x), predicted {d['predicted_speedup']:.2f}x: ")
    text += "the gain is confirmed." if checked.confirmed else "NOT confirmed: some round measured no gain, or less than half the predicted one."
    if checked.departs:
        text += " Where the strategy run departed from the model: " + "; ".join(ln.strip() for ln in checked.where_it_departs()) + "."
    if (dropped := checked.verification.dropped_summary()) is not None:
        text += f" {dropped[0].upper()}{dropped[1:]}."
    return text


def _scaling_outlook(prof: Profiled) -> dict:
    """The S-SGD DAG model on this run's own layer timings, on a 10 GbE cluster of 1..64 workers."""
    layers = layer_profile_from_run(prof.run)
    scaling = predict(layers, OUTLOOK_WORKERS, CommModel(default=preset(OUTLOOK_NET), default_name="10GbE"), Policy.WFBP)
    policies = {p.value: [{"workers": r.workers, "iter_ms": r.iter_us / 1e3, "speedup": r.speedup} for r in rows] for p, rows in scaling.table.items()}
    return {"net": "10GbE", "layers": layers.num_layers, "grad_mb": layers.params_bytes / MB, "workers": scaling.workers, "policies": policies}


def _outlook_html(o: dict) -> str:
    head = ["workers"] + [f"{p} ms" for p in o["policies"]]
    rows = [[n] + [o["policies"][p][i]["iter_ms"] for p in o["policies"]] for i, n in enumerate(o["workers"])]
    intro = (f"<p>The layer-wise DAG model of synchronous SGD (Shi et al. 2018) on this run's {o['layers']} layers and "
             f"{o['grad_mb']:.1f} MB of gradients, on a {o['net']} ring: predicted iteration time per overlap policy.</p>"
             f"<ul class='legend'>{''.join(f'<li><code>{p}</code>: {POLICY_WORDS[p]}</li>' for p in o['policies'] if p in POLICY_WORDS)}</ul>")
    return intro + html_table(head, rows) + speedup_chart(o["workers"], o["policies"], title=f"speed-up on {o['net']}")


def _whatifs(prof: Profiled) -> list[dict]:
    """Other links, more workers, no overlap and a faster device, from this one profile."""
    scenarios = [Scenario(bandwidth=b) for b in WHATIF_BANDWIDTHS]
    scenarios += [Scenario(workers=n, bandwidth="10Gbit") for n in WHATIF_WORKERS]
    scenarios += [Scenario(compute_speed=2.0), Scenario(compute_speed=2.0, bandwidth="1Gbit")]
    # raw here and in find_strategy: the demo's steps on a shared machine swing more than the profiler costs
    rows = [r.to_json() for r in evaluate(prof.graph, scenarios, measured_us=prof.analysis.measured_us, raw=True)["scenarios"]]
    keep = ("workers", "bandwidth", "compute_speed", "predicted_iter_ms", "interval", "speedup_vs_profiled", "scaling_efficiency")
    return [{k: r[k] for k in keep} for r in rows]


def _report(prof: Profiled, found: Found, checked: Checked | None, outlook: dict, whatifs: list[dict], where: str, notes: list[str],
            whatif_refused: str | None) -> ReportInputs:
    inp = ReportInputs(prof.analysis, prof.findings, title=f"dagprof demo: {prof.graph.world_size}-rank gloo DDP on {where}", whatifs=whatifs,
                       whatif_refused=whatif_refused)
    inp.optimisation = _optimisation(found, checked)
    inp.sections.append(("Scaling outlook (S-SGD DAG model)", _outlook_html(outlook)))
    inp.links["profiled run folder"] = "run"
    if found.path:
        inp.links["strategy (dagprof.apply)"] = os.path.basename(found.path)
    inp.source = "run"  # the staged folder the graph names moves to the output folder when the demo ends
    # one line each under the summary, not one paragraph of five sentences
    done = " The demo did: the summary above has what it measured." if checked else ""  # for a warning that asks to measure (--verify)
    warnings = [f"Warning: {w}.{done if '--verify' in w else ''}" for w in found.search.warnings if not w.startswith(BASELINE_WARNING)]
    base = baseline_note(found, prof, checked)
    caveats = [f"Caveat: {c}." for c in found.search.to_dict()["caveats"]]  # a lossy strategy's, as the terminal says them
    inp.optimisation["notes"] = ([notes[0][0].upper() + notes[0][1:] + "."] if notes else []) + caveats + [base[0].upper() + base[1:] + "."] \
        + [f"The intervals: {n}." for n in interval_notes(found.search.notes)] + warnings
    inp.sections.append(("On your own job", NEXT_HTML))
    return inp


def _summary(prof: Profiled, found: Found, checked: Checked | None, files: dict, run_dir: str) -> dict:
    a = prof.analysis.to_dict()
    return {
        "measured_iter_ms": a["measured_iter_ms"],
        "predicted_iter_ms": a["predicted_iter_ms"],
        "error_pct": a["error_pct"],
        "per_rank": a["per_rank"],
        "critical_path_per_iter": a["critical_path_per_iter"],
        "findings": [f.to_dict() for f in prof.findings],
        "warnings": prof.warnings,
        "optimisation": found.search.to_dict() | {"strategy_file": found.path, "applied": checked.to_dict() if checked else None,
                                                  "baseline_note": baseline_note(found, prof, checked)}
                        | ({} if found.path else {"summary": defaults_stand(found.search)}),
        "files": files | {"run": run_dir} | ({"strategy": found.path} if found.path else {}),
    }
