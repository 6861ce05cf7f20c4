#!/bin/bash
# DDP -> FSDP on a held-out job, interleaved rounds: each round profiles SCRIPT (default the mixer, mixer_frozen.py; any script
# taking --wrap ddp|fsdp and --steps, e.g. resnet_ddp.py) as DDP and as FSDP2 in one hold of the machine-wide lock (the order
# alternating), then predicts the FSDP step from the DDP profile with this checkout and with BEFORE (a tree holding src/),
# against the FSDP profile's own measured step, and says whether the prediction's 90 % interval holds it.
# usage: [SCRIPT=bench/fsdp_fresh/resnet_ddp.py] bench/fsdp_fresh/mixer_rounds.sh OUT ROUNDS BEFORE   (from the repository root)
set -u
OUT=$1; ROUNDS=$2; BEFORE=$3
PY=${PYTHON:-python}
SCRIPT=${SCRIPT:-bench/fsdp_fresh/mixer_frozen.py}
HERE=$PWD
for k in $(seq 1 "$ROUNDS"); do
  o="ddp fsdp"; [ $((k % 2)) = 0 ] && o="fsdp ddp"
  mkdir -p "$OUT/r$k"
  # one hold of the lock for both jobs, so they meet the same machine (each job's profile within 200 s)
  flock /tmp/dagprof-measure.lock env PYTHONPATH="$HERE/src" PY="$PY" OUT="$OUT/r$k" SCRIPT="$SCRIPT" bash -c '
    echo "round '"$k"' $(date -u +%T) load $(cut -d" " -f1-3 /proc/loadavg)"
    for w in '"$o"'; do
      timeout 200 "$PY" -m dagprof.cli.main profile --no-kineto --steps 4:8 -o "$OUT/$w" -- "$PY" -m torch.distributed.run \
        --standalone --nproc-per-node 2 "$SCRIPT" --wrap "$w" --steps 12 > "$OUT/$w.log" 2>&1
    done
    echo "  done $(date -u +%T) load $(cut -d" " -f1-3 /proc/loadavg)"'
  for tree in "$HERE" "$BEFORE"; do
    echo "  $tree: $("$PY" bench/fsdp_fresh/judge_pairs.py --src "$tree/src" "$OUT/r$k" | head -1)"
  done
done
