#!/bin/sh
# One exclusive hold of held-out Horovod testbed rounds (bench_frameworks.py --testbed --hosts, 1 Gbit/s profiled ->
# 200 Mbit/s measured, rounds interleaved as the bench runs them), with what a reader needs to tell a quiet hold: the
# load and every process at start and end (D.uptime, D.ps) and top each second beside (D.top: others' CPU). Stopped by
# SIGINT after LIMIT s (default 400), so the bench's namespaces are removed and the hold stays under 7 minutes.
#     DAGPROF_HOROVOD_VENV=VENV sh bench/horovod/hold_rounds.sh OUT/h1 hvd_simclr,hvd_vit_warmup 2 [LIMIT [--hog]]
# (--hog: each round also profiled beside a busy loop on host 1's core, bench_frameworks.py --hog)
# (as root, nothing else running on the cores; PYTHON: the repository's .venv/bin/python unless set)
set -u
D=$1; ONLY=$2; ROUNDS=$3; LIMIT=${4:-400}; HOG=${5:-}
cd "$(dirname "$0")/../.."
mkdir -p "$(dirname "$D")"
echo "start $(date -u +%T) $(uptime)" > "$D.uptime"
ps aux --sort=-%cpu > "$D.ps"
top -b -d 1 -c -w 400 > "$D.top" & T=$!
timeout -s INT "$LIMIT" env PYTHONPATH="$PWD/src" DAGPROF_HOROVOD_VENV="${DAGPROF_HOROVOD_VENV:?set it to the Horovod venv (bench/horovod/build_horovod.sh VENV)}" \
  "${PYTHON:-.venv/bin/python}" bench/bench_frameworks.py --testbed --hosts --only "$ONLY" --rate 1e9 \
  --other-rate 200e6 --rounds "$ROUNDS" $HOG --keep "$D" --json > "$D.json" 2> "$D.err"
echo "rc $?" >> "$D.err"
kill $T
ps aux --sort=-%cpu >> "$D.ps"
echo "end $(date -u +%T) $(uptime)" >> "$D.uptime"
