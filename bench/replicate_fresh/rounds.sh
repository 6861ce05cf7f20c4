#!/bin/bash
# One round of workers what-ifs on the replicate() scripts, measured against the jobs themselves. Run from the repository
# root inside the measuring lock, one or two rounds a hold:   dp-excl bash bench/replicate_fresh/rounds.sh OUT/r1
# Per script, in a shuffled order: the 2-rank job profiled as a user would (dagprof profile, Kineto on), and the same job
# under DistributedDataParallel (the script's --ddp: the control), in a shuffled order; then run unprofiled as written
# (2 ranks) and at 4 ranks on the machine's cores, in a shuffled order, each rank 0's median step logged with the load. Predict afterwards (no lock): bench/replicate_fresh/judge.py OUT/r* [--src TREE/src].
set -e
O=$1; mkdir -p "$O"
PY=${PYTHON:-.venv/bin/python}
TR="$(dirname "$PY")/torchrun"
export PYTHONPATH=$PWD/src
step() {  # NAME CELL NPROC SCRIPT: rank 0's median step of an unprofiled run
  echo "$1 $2 load $(cut -d' ' -f1 /proc/loadavg) $(timeout 100 "$TR" --standalone --nproc-per-node "$3" "$4" --steps 16 2>/dev/null | grep -o 'median step [0-9.]* ms')" >> "$O/steps.txt"
}
uptime >> "$O/steps.txt"
for job in $(printf '%s\n' wavenet_accum realnvp_tabular | shuf); do
  script=bench/replicate_fresh/$job.py
  for wrap in $(printf '%s\n' replicate ddp | shuf); do
    case $wrap in
      replicate) timeout 120 "$PY" -m dagprof.cli.main profile -o "$O/$job" -- "$TR" --standalone --nproc-per-node 2 "$script" --steps 12 > "$O/$job.profile.log" 2>&1 ;;
      ddp) timeout 120 "$PY" -m dagprof.cli.main profile -o "$O/$job.ddp" -- "$TR" --standalone --nproc-per-node 2 "$script" --steps 12 --ddp > "$O/$job.ddp.profile.log" 2>&1 ;;
    esac
  done
  for cell in $(printf '%s\n' as w4 | shuf); do
    case $cell in
      as) step "$job" as 2 "$script" ;;
      w4) step "$job" w4 4 "$script" ;;
    esac
  done
done
uptime >> "$O/steps.txt"
