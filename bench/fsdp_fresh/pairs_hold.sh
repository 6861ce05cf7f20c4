#!/bin/bash
# DDP/FSDP2 pairs of user scripts recorded in ONE exclusive hold of the machine-wide lock (dp-excl), as many rounds as fit
# in BUDGET seconds (each round every script's DDP and FSDP job profiled one after the other, the order alternating round
# by round), then every round judged offline under a shared hold (dp-shared; judge_pairs.py: the FSDP step predicted from
# the DDP profile against the FSDP job's) by this checkout and by BEFORE (a tree holding src/). SCRIPTS is one script or
# several separated by commas (each round then interleaves them; their rounds under OUT/NAME/, NAME the script's file name
# without .py); each takes --wrap ddp|fsdp and --steps and prints its rank 0's "median step X ms" (e.g. conv_vae.py).
# After each script's two profiled jobs, the same two configurations run again unprofiled (ddp.after.log, fsdp.after.log,
# the same order): the job measured afterwards that judge_pairs.py holds every prediction against, so the conversion's
# miss reads beside what the same job's own profile misses (the identity cell).
# usage (from the repository root): bench/fsdp_fresh/pairs_hold.sh SCRIPTS OUT BUDGET_S BEFORE [SCRIPT ARGS...]
# (a round takes 4 jobs a script, ~30 s: BUDGET_S 360 holds ~6 minutes)
set -u
SCRIPTS=$1; OUT=$2; BUDGET=$3; BEFORE=$4; shift 4
PY=${PYTHON:-python}
HERE=$PWD
mkdir -p "$OUT"
dp-excl env PYTHONPATH="$HERE/src" PY="$PY" OUT="$OUT" SCRIPTS="$SCRIPTS" BUDGET="$BUDGET" ARGS="$*" bash -c '
  echo "held $(date -u +%T) load $(cut -d" " -f1-3 /proc/loadavg)"
  k=0; last=0
  while [ $((SECONDS + last)) -lt "$BUDGET" ]; do  # no round started that the last one says would overrun
    k=$((k + 1)); t0=$SECONDS; o="ddp fsdp"; [ $((k % 2)) = 0 ] && o="fsdp ddp"
    for s in ${SCRIPTS//,/ }; do
      d="$OUT/r$k"; [ "$SCRIPTS" = "$s" ] || d="$OUT/$(basename "$s" .py)/r$k"; mkdir -p "$d"
      for w in $o; do
        timeout 100 "$PY" -m dagprof.cli.main profile --no-kineto --steps 4:8 -o "$d/$w" -- "$PY" -m torch.distributed.run \
          --standalone --nproc-per-node 2 "$s" --wrap "$w" --steps 12 $ARGS > "$d/$w.log" 2>&1
      done
      for w in $o; do
        timeout 100 "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 "$s" --wrap "$w" --steps 12 $ARGS \
          > "$d/$w.after.log" 2>&1
      done
    done
    last=$((SECONDS - t0))
    echo "round $k done $(date -u +%T) load $(cut -d" " -f1-3 /proc/loadavg)"
  done
  echo "released $(date -u +%T) load $(cut -d" " -f1-3 /proc/loadavg)"'
ROUNDS=("$OUT"/r*); [ -e "${ROUNDS[0]}" ] || ROUNDS=("$OUT"/*/r*)
for tree in "$HERE" "$BEFORE"; do  # offline, but CPU for minutes: a shared hold, so timed runs waiting go first
  echo "$tree: $(dp-shared "$PY" bench/fsdp_fresh/judge_pairs.py --src "$tree/src" "${ROUNDS[@]}" | tail -3)"
done
