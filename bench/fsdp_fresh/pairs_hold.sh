#!/bin/bash
# DDP/FSDP2 pairs of a user script recorded in ONE exclusive hold of the machine-wide lock (dp-excl), as many rounds as fit
# in BUDGET seconds (each round the DDP and the FSDP job profiled one after the other, the order alternating), then every
# round judged offline under a shared hold (dp-shared; judge_pairs.py: the FSDP step predicted from the DDP profile against
# the FSDP job's) by this checkout and by BEFORE (a tree holding src/). SCRIPT takes --wrap ddp|fsdp and --steps (e.g.
# conv_vae.py, gru_tagger.py).
# usage (from the repository root): bench/fsdp_fresh/pairs_hold.sh SCRIPT OUT BUDGET_S BEFORE [SCRIPT ARGS...]
set -u
SCRIPT=$1; OUT=$2; BUDGET=$3; BEFORE=$4; shift 4
PY=${PYTHON:-python}
HERE=$PWD
mkdir -p "$OUT"
dp-excl env PYTHONPATH="$HERE/src" PY="$PY" OUT="$OUT" SCRIPT="$SCRIPT" BUDGET="$BUDGET" ARGS="$*" bash -c '
  echo "held $(date -u +%T) load $(cut -d" " -f1-3 /proc/loadavg)"
  k=0
  while [ $SECONDS -lt $((BUDGET - 150)) ]; do  # a round takes about 2 x 60 s: none started that would overrun
    k=$((k + 1)); o="ddp fsdp"; [ $((k % 2)) = 0 ] && o="fsdp ddp"; mkdir -p "$OUT/r$k"
    for w in $o; do
      timeout 100 "$PY" -m dagprof.cli.main profile --no-kineto --steps 4:8 -o "$OUT/r$k/$w" -- "$PY" -m torch.distributed.run \
        --standalone --nproc-per-node 2 "$SCRIPT" --wrap "$w" --steps 12 $ARGS > "$OUT/r$k/$w.log" 2>&1
    done
    echo "round $k done $(date -u +%T) load $(cut -d" " -f1-3 /proc/loadavg)"
  done
  echo "released $(date -u +%T) load $(cut -d" " -f1-3 /proc/loadavg)"'
for tree in "$HERE" "$BEFORE"; do  # offline, but CPU for minutes: a shared hold, so timed runs waiting go first
  echo "$tree: $(dp-shared "$PY" bench/fsdp_fresh/judge_pairs.py --src "$tree/src" "$OUT"/r* | tail -1)"
done
