#!/bin/bash
# DDP/FSDP2 pairs of user scripts recorded in ONE exclusive hold of the machine-wide lock (dp-excl), as many rounds as fit
# in BUDGET seconds (each round every script's DDP and FSDP job profiled one after the other, the order alternating round
# by round), then every round judged offline under a shared hold (dp-shared; judge_pairs.py: the FSDP step predicted from
# the DDP profile against the FSDP job's) by this checkout and by BEFORE (a tree holding src/). SCRIPTS is one script or
# several separated by commas (each round then interleaves them; their rounds under OUT/NAME/, NAME the script's file name
# without .py); each takes --wrap ddp|fsdp and --steps (e.g. conv_vae.py, gru_tagger.py).
# usage (from the repository root): bench/fsdp_fresh/pairs_hold.sh SCRIPTS OUT BUDGET_S BEFORE [SCRIPT ARGS...]
set -u
SCRIPTS=$1; OUT=$2; BUDGET=$3; BEFORE=$4; shift 4
PY=${PYTHON:-python}
HERE=$PWD
mkdir -p "$OUT"
dp-excl env PYTHONPATH="$HERE/src" PY="$PY" OUT="$OUT" SCRIPTS="$SCRIPTS" BUDGET="$BUDGET" ARGS="$*" bash -c '
  echo "held $(date -u +%T) load $(cut -d" " -f1-3 /proc/loadavg)"
  k=0
  while [ $SECONDS -lt $((BUDGET - 150)) ]; do  # a pair takes up to 2 x 60 s: no round started that would overrun much
    k=$((k + 1)); o="ddp fsdp"; [ $((k % 2)) = 0 ] && o="fsdp ddp"
    for s in ${SCRIPTS//,/ }; do
      d="$OUT/r$k"; [ "$SCRIPTS" = "$s" ] || d="$OUT/$(basename "$s" .py)/r$k"; mkdir -p "$d"
      for w in $o; do
        timeout 100 "$PY" -m dagprof.cli.main profile --no-kineto --steps 4:8 -o "$d/$w" -- "$PY" -m torch.distributed.run \
          --standalone --nproc-per-node 2 "$s" --wrap "$w" --steps 12 $ARGS > "$d/$w.log" 2>&1
      done
    done
    echo "round $k done $(date -u +%T) load $(cut -d" " -f1-3 /proc/loadavg)"
  done
  echo "released $(date -u +%T) load $(cut -d" " -f1-3 /proc/loadavg)"'
ROUNDS=("$OUT"/r*); [ -e "${ROUNDS[0]}" ] || ROUNDS=("$OUT"/*/r*)
for tree in "$HERE" "$BEFORE"; do  # offline, but CPU for minutes: a shared hold, so timed runs waiting go first
  echo "$tree: $(dp-shared "$PY" bench/fsdp_fresh/judge_pairs.py --src "$tree/src" "${ROUNDS[@]}" | tail -1)"
done
