#!/bin/bash
# `whatif --workers 2` and `--workers 8` of intra_reshard.py (each block reshard_after_forward=2) profiled on 4 ranks, against
# the same script run unprofiled on 2 ranks (FSDP2 makes the int True there: the same 2-rank backward all-gathers, no
# post-forward shard) and on 4, in interleaved rounds (run from the repository root; each round under the machine-wide lock).
# 4 ranks on this 2-core machine share the cores, 2 do not: the profile's op times carry that contention, so the 2-rank
# prediction is short of what the profile alone can say (the ratio columns say how much).
#   bench/fsdp_fresh/intra_workers_rounds.sh OUT ROUNDS
set -e
OUT=$1; ROUNDS=${2:-2}
export PYTHONPATH=$PWD/src
step() { echo "load $(cut -d' ' -f1 /proc/loadavg) ranks $1: $(torchrun --standalone --nproc-per-node "$@" --steps 16 2>/dev/null | grep -o 'median step [0-9.]* ms')"; }
for R in $(seq 1 "$ROUNDS"); do
  O=$OUT/r$R; mkdir -p "$O"
  flock /tmp/dagprof-measure.lock bash -c "$(declare -f step); set -e
    python -m dagprof.cli.main profile --no-kineto -o $O/intra -- torchrun --standalone --nproc-per-node 4 bench/fsdp_fresh/intra_reshard.py --steps 12 >/dev/null 2>&1
    echo 'round $R'; step 2 bench/fsdp_fresh/intra_reshard.py; step 4 bench/fsdp_fresh/intra_reshard.py"
  python -m dagprof.cli.main whatif "$O/intra" --workers 2,4,8 --allow-model-error --json --no-trace 2>/dev/null | python -c "
import json, sys; d = json.load(sys.stdin); s = {x['workers']: x for x in d['scenarios']}
print('round $R: model of the profiled run %.1f ms (%+.1f %%); predicted 2 ranks %.1f ms (%.3f of 4), 8 ranks %.1f ms; peak 2 / 4 ranks %.2f / %.2f MiB'
      % (d['model_iter_ms'], d['model_error_pct'], s[2]['predicted_iter_ms'], s[2]['predicted_iter_ms'] / s[4]['predicted_iter_ms'],
         s[8]['predicted_iter_ms'], s[2]['memory_per_rank']['0']['total_mb'], s[4]['memory_per_rank']['0']['total_mb']))"
done
