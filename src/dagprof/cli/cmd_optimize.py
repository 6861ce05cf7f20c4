"""``dagprof optimize RUN [--verify -- CMD]``: search a strategy by replay, write it, and measure it on the real job."""
from __future__ import annotations

import argparse
import sys

from ..collect.jobs.verify import ROUNDS
from ..errors import DagprofError
from ..progress import bar, shown
from ..search.optimize import POWERSGD_RANKS, WORTH_APPLYING_PCT
from ..search.shared_cores import TERM
from ..traces.run_schema import FSDP2_API, REPLICATE_API
from ..units import count, parse_size
from .common import (
    add_out_argument,
    add_profiled_bandwidth_argument,
    add_run_arguments,
    bandwidth,
    comma_list,
    finite_non_negative,
    outputs,
    positive_int,
    seconds,
)
from .terminal import escape, wrap_lines

HELP = "search bucket layout, compression, partition, recomputation by replay; write a strategy; --verify measures it"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_arguments(p)
    add_out_argument(p, "strategy.json, verification logs and codec-costs.json (read again by the next --allow-lossy run here)")
    p.add_argument("--budget", type=seconds, default=30.0, metavar="SECONDS", help="search time budget (default 30, at most a week)")
    p.add_argument("--seed", type=int, default=0, help="search seed: the same seed proposes the same candidates (default 0)")
    p.add_argument("--allow-lossy", action="store_true", help="also try gradient compression (fp16, bf16, PowerSGD): changes the numerics")
    p.add_argument("--powersgd-ranks", type=comma_list(positive_int), default=None,
                   help=f"PowerSGD ranks to try with --allow-lossy (default {','.join(map(str, POWERSGD_RANKS))})")
    p.add_argument("--accumulate", type=positive_int, default=1, metavar="K",
                   help="also try K micro-batches per optimizer step (no_sync): changes the effective batch")
    p.add_argument("--memory-budget", default=None, metavar="SIZE", help="per-rank memory limit, e.g. 2GB or 512MB (MB = MiB = 2^20 bytes; adds recomputation)")
    p.add_argument("--optimizer-state", default="momentum", choices=["sgd", "momentum", "adam"],
                   help="optimizer state per parameter, for the memory estimate (default momentum: one copy)")
    p.add_argument("--overlap-slowdown", type=finite_non_negative, default=None, metavar="S",
                   help="compute runs (1 + S x overlap) slower beside in-flight collectives (default: as measured in the run, else in "
                        "--link-model, else 0)")
    p.add_argument("--link-model", default=None, metavar="FILE",
                   help="a dagprof calibrate --overlap file measured on the job's cluster: how much an in-flight collective slows "
                        "compute and what small all-reduces chained by callbacks (PowerSGD's) take, where the run measured none")
    add_profiled_bandwidth_argument(p)
    p.add_argument("--raw", action="store_true",
                   help="search from the op times as profiled (default: the profiler's own cost, measured on the run, removed first)")
    p.add_argument("--verify", action="store_true", help="run the command after -- with defaults and with the strategy, interleaved")
    p.add_argument("--rounds", type=positive_int, default=None, help=f"verification rounds, each runs both (default {ROUNDS})")
    p.add_argument("--ranks", type=positive_int, default=None, help="start the command once per rank yourself (it is one rank's command)")
    p.add_argument("--emulate", type=bandwidth, default=None, metavar="RATE",
                   help="with --ranks, as root: run the ranks in network namespaces joined by a RATE link (e.g. 200Mbit)")
    p.set_defaults(cmd=[])  # the training command for --verify: everything after -- (cli.main keeps it from our parser)
    p.epilog = "verify: dagprof optimize RUN --verify [--ranks N [--emulate 200Mbit]] -- COMMAND ..."


def run(args: argparse.Namespace) -> dict:
    from ..closeloop import defaults_stand, find_strategy
    from ..search.optimize import Options

    cmd = args.cmd
    if cmd and not args.verify:
        raise DagprofError("a command after -- is only run with --verify")
    if args.verify and not cmd:
        raise DagprofError("--verify needs the training command after --, e.g. -- torchrun --nproc-per-node 2 train.py")
    if args.emulate and args.ranks is None:
        raise DagprofError("--emulate starts one process per rank: give --ranks N")
    alone = [(f, needs) for f, given, needs in (("--rounds", args.rounds, "--verify"), ("--emulate", args.emulate, "--verify"),
                                                ("--ranks", args.ranks, "--verify"), ("--powersgd-ranks", args.powersgd_ranks, "--allow-lossy"))
             if given is not None and not getattr(args, needs[2:].replace("-", "_"))]
    if alone:  # alone it changed nothing, and the answer looked like one that had used it
        raise DagprofError(f"is read only with {alone[0][1]}: give both", alone[0][0])
    opts = Options(budget_s=args.budget, seed=args.seed, allow_lossy=args.allow_lossy, powersgd_ranks=tuple(args.powersgd_ranks or POWERSGD_RANKS),
                   accumulate=args.accumulate, memory_budget=None if args.memory_budget is None else parse_size(args.memory_budget, "--memory-budget"),
                   optimizer_state=args.optimizer_state, overlap_slowdown=args.overlap_slowdown, link_model=args.link_model,
                   profiled_bandwidth=args.profiled_bandwidth,
                   progress=_search_bar(args.budget) if shown() else None)
    with outputs(args.out, args.run) as staged:
        found = find_strategy(args.run, opts, staged.path, args.steps, args.step_marker, args.allow_missing_ranks, raw=args.raw,
                              kept_dir=staged.final)
        res = found.search
        if found.path is None and res.memory_reason:  # a budget nothing fits: refused, as an FSDP search refuses it
            raise DagprofError(res.memory_reason, "--memory-budget")
        if found.path is None:  # nothing to write, nothing to verify
            line = defaults_stand(res, found.profile.graph.meta.ddp_label) + ("; nothing to verify" if args.verify else "")
            return searched(found) | {"strategy_file": None, "summary": line, "recommendation": line, "verification": None}
        result = searched(found) | {"strategy_file": found.path}
        fsdp = found.profile.graph.meta.fsdp
        if args.verify and fsdp is not None and fsdp.api != FSDP2_API:
            raise DagprofError(f"--verify applies a strategy to fully_shard (FSDP2) jobs; this is a {fsdp.api} (FSDP1) job, whose "
                               "sharding is set when it is wrapped: apply the plan by hand (see the recommendation without --verify)", args.run)
        if args.verify:
            result["verification"] = verify_strategy(cmd, found, staged.path, args.rounds or ROUNDS, args.ranks, args.emulate)
    result = staged.final_path(result)
    fsdp = found.profile.graph.meta.fsdp
    hybrid = fsdp is not None and any(len(u.mesh) == 2 for u in fsdp.units)  # HSDP: (replicate, shard)
    replicated = found.profile.graph.meta.ddp_api == REPLICATE_API
    return result | {"recommendation": recommendation(res, result["strategy_file"], None if fsdp is None else fsdp.api, hybrid, replicated)}


def searched(found) -> dict:
    """The search's answer with the run's own warnings first, as every command that reads a run gives them (an evaluation
    pass in the window, a rank's lost steps: the search stands on those op times too)."""
    d = found.search.to_dict()
    return d | {"warnings": [str(w) for w in found.profile.warnings] + list(d["warnings"])}


def verify_strategy(cmd: list[str], found, out: str, rounds: int, ranks: int | None, emulate: str | None) -> dict:
    """Measured speed-up of the strategy (interleaved rounds) beside the prediction."""
    from ..closeloop import check_strategy, hosts

    say = (lambda m: print(escape(m), file=sys.stderr)) if sys.stderr.isatty() else (lambda m: None)
    with hosts(ranks, emulate) as on:
        if emulate and on.refused:
            raise DagprofError(f"--emulate {on.refused}")
        return check_strategy(cmd, found, out, rounds, ranks, on.cluster, say).to_dict()


def recommendation(res, path: str, fsdp_api: str | None = None, hybrid: bool = False, replicated: bool = False) -> str:
    """``hybrid``: an FSDP1 HYBRID_SHARD job, whose strategies that keep or reshard a unit keep its replicas too (SHARD_GRAD_OP
    would shard it over every rank: another layout than the one searched); ``replicated``: the job's DDP is the composable
    replicate()'s (``dagprof.apply`` takes the module given to it)."""
    if res.memory_reason:
        return res.memory_reason
    if fsdp_api is not None and fsdp_api != FSDP2_API:  # FSDP1 fixes a unit's sharding when it is wrapped
        kept, resharded = ("_HYBRID_SHARD_ZERO2", "HYBRID_SHARD") if hybrid else ("SHARD_GRAD_OP", "FULL_SHARD")
        return (f"wrap the units as {path!r} says: FullyShardedDataParallel(..., sharding_strategy=ShardingStrategy.{kept}) "
                f"for a unit kept gathered after forward, {resharded} for one resharded, MixedPrecision(reduce_dtype=...) for the reduce "
                "dtype (dagprof.apply configures fully_shard models only)")
    roots = res.strategy().fsdp.roots if res.to_dict().get("fsdp") else 0
    model = ("replicated_model" if replicated else "ddp_model") if not roots else "fsdp_model" if roots == 1 else \
        f"[{', '.join(f'root{k}' for k in range(roots))}]"
    each = (f" (each fully_shard root, in the order the job first runs them forward: {', '.join(f'root{k}' for k in range(roots))})"
            if roots > 1 else "")
    return f"dagprof.apply({model}, {path!r}) before training{each}, or verify it: dagprof optimize RUN --verify -- CMD"


def _search_bar(budget_s: float):
    """The search's progress callback: a bar over its time budget, with what it has replayed so far."""
    total = max(1, round(budget_s))
    b = bar(total, "searching", unit="s")
    shown_s = 0

    def show(p) -> None:
        nonlocal shown_s
        now = min(int(p.elapsed_s), total)
        if now > shown_s:
            b.update(now - shown_s)
            shown_s = now
        b.set_postfix_str(f"{p.replayed} replayed, best {p.best_ms:.1f} ms (profiled {p.baseline_ms:.1f} ms)", refresh=False)
        if p.elapsed_s >= p.budget_s:
            b.close()

    return show


def to_text(r: dict) -> str:
    lines = _fsdp_table(r) if r.get("fsdp") else _ddp_table(r)
    b, best = r["baseline"], r["best"]
    if "interval" in best:
        lines.append(f"predicted {best['interval']} per step with the strategy; profiled setup {b['interval']} (each step replayed)")
    lines.append(f"search: {count(r['candidates_replayed'], 'candidate')} replayed in {r['search_seconds']:.1f} s")
    lines += [f"warning: {w}" for w in r["warnings"]]
    lines += [f"note: {n}" for n in r["notes"]]
    if r["strategy_file"] is None:
        return wrap_lines(lines + [r["recommendation"]])
    lines += [f"strategy: {r['summary']}", *[f"caveat: {c}" for c in r["caveats"]], f"written: {r['strategy_file']}",
              f"recommendation: {r['recommendation']}"]
    if r.get("verification"):
        lines += verification_lines(r["verification"])
        if r.get("fsdp"):
            lines.append(f"  peak memory per rank predicted {b['memory']['total_mb']:.2f} -> {best['memory']['total_mb']:.2f} MB; --verify "
                         "times the steps only (bench/bench_fsdp.py --part 6 measures the peak on CPU)")
    return wrap_lines(lines)


def _ddp_table(r: dict) -> list[str]:
    """The profiled setup, the search's seeds and the best strategy: buckets, codec, pieces and time."""
    b, best = r["baseline"], r["best"]
    lines = [f"{'':<22} {'buckets':>8} {'codec':>16} {'pieces':>6} {'predicted ms':>13}"]
    for label, s in [("profiled setup", b)] + [("  seed", s) for s in r["seeds"][:6]] + [("best found", best)]:
        lines.append(f"{label:<22} {s['buckets']:>8} {s['codec']:>16} {s['parts']:>6} {s['predicted_iter_ms']:>13.1f}")
    if best["memory"]:
        lines.append(f"peak memory per rank (estimate): profiled {b['memory']['total_mb']:.0f} MB, strategy {best['memory']['total_mb']:.0f} MB")
    return lines


def _fsdp_table(r: dict) -> list[str]:
    """An FSDP search: the profiled setup and the best plan, each with its time and peak memory per rank."""
    b, best = r["baseline"], r["best"]
    lines = [f"{'':<15} {'predicted ms':>13} {'peak MB/rank':>13} {'reduce in':>9}  reshard_after_forward"]
    for label, s in (("profiled setup", b), ("best found", best)):
        lines.append(f"{label:<15} {s['predicted_iter_ms']:>13.1f} {s['memory']['total_mb']:>13.2f} {s['reduce_dtype']:>9}  {s['plan']}")
    if r["memory_budget_mb"] is not None:
        lines.append(f"memory budget {r['memory_budget_mb']:.2f} MB per rank: the best plan peaks at {best['memory']['total_mb']:.2f} MB "
                     f"({best['memory']['at']})")
    gr = r["unit_grouping"]
    if gr is not None:
        lines.append(f"unit grouping (wrap time, not in the strategy file): --units {gr['units']} predicted {gr['predicted_iter_ms']:.1f} ms "
                     f"({-gr['gain_pct']:+.1f} % against the profiled setup), peak {gr['memory']['total_mb']:.2f} MB/rank: {gr['wrap']}")
    elif r["unit_groupings_priced"]:
        lines.append(f"unit grouping: none of {r['unit_groupings_priced']} coarser groupings gains {WORTH_APPLYING_PCT:g} % "
                     f"{'within the memory budget ' if r['memory_budget_mb'] is not None else ''}on the profiled setup")
    return lines


def verification_lines(v: dict) -> list[str]:
    per = ", ".join(f"{m:.2f}x (predicted {p:.2f}x)" for m, p in zip(v["speedup_per_round"], v["predicted_speedup_per_round"]))
    return [f"verified over {count(v['rounds'], 'interleaved round')}: defaults {v['measured_baseline_ms']:.1f} ms, strategy "
            f"{v['measured_strategy_ms']:.1f} ms per step (each the median over the rounds)",
            f"  measured speed-up {v['measured_speedup']:.2f}x (the median of each round's own pair, run under the same load: "
            f"{v['spread'][0]:.2f}-{v['spread'][1]:.2f}x; not the ratio of the medians above); predicted "
            f"{v['predicted_speedup']:.2f}x from the searched profile: "
            + ("gain confirmed (every round gained, the median at least half the predicted gain)" if v["confirmed"] else "gain NOT confirmed"),
            f"  per round: {per}; median prediction error {v['median_prediction_error_per_round_pct']:+.1f} %",
            *([f"  the model's change: {v['predicted_change']}"] if v.get("predicted_change") else []),
            *([f"  {v['searched_profile_rank_load']}"] if v.get("searched_profile_rank_load") else []),
            *([f"  strategy measured {v['measured_strategy_ms']:.1f} ms per step against predicted {v['predicted_strategy']['interval']}: "
               f"{'inside' if v['strategy_inside_interval'] else 'OUTSIDE'} the interval"
               + (" (with the shared-cores bounds: see the note)" if TERM in v["predicted_strategy"]["interval_basis"]["terms"] else "")]
              if v.get("predicted_strategy") else []),
            *(["  where the strategy run departed from the model:"] + [f"    {ln}" for ln in v["where_it_departs"]]
              if v["where_it_departs"] else []),
            *([f"  {v['dropped_summary']}"] if v.get("dropped_summary") else [])]
