#!/bin/bash
# `whatif --reshard-after-forward off` of the two fresh FSDP2 scripts against the jobs run with it, in interleaved rounds
# (run from the repository root, as root or not; each round under the machine-wide lock):
#   bench/fsdp_fresh/reshard_off_rounds.sh OUT ROUNDS
# Per round: each job profiled as written (dagprof profile), then run unprofiled as written and with the what-if's setting
# (intra_reshard: --reshard false; prefetch_offload: --keep-gathered), each median step logged with the load; then each
# round's profile predicted (the what-if's step over the model of the profiled run) beside the measured ratio.
set -e
OUT=$1; ROUNDS=${2:-2}
export PYTHONPATH=$PWD/src
step() { echo "load $(cut -d' ' -f1 /proc/loadavg) $*: $(torchrun --standalone --nproc-per-node "$@" --steps 16 2>/dev/null | grep -o 'median step [0-9.]* ms')"; }
for R in $(seq 1 "$ROUNDS"); do
  O=$OUT/r$R; mkdir -p "$O"
  flock /tmp/dagprof-measure.lock bash -c "$(declare -f step); set -e
    python -m dagprof.cli.main profile -o $O/intra -- torchrun --standalone --nproc-per-node 4 bench/fsdp_fresh/intra_reshard.py --steps 12 >/dev/null 2>&1
    echo 'round $R intra'; step 4 bench/fsdp_fresh/intra_reshard.py --reshard 2; step 4 bench/fsdp_fresh/intra_reshard.py --reshard false
    python -m dagprof.cli.main profile -o $O/vit -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/prefetch_offload.py --steps 12 --save-every 1000 >/dev/null 2>&1
    echo 'round $R vit'; step 2 bench/fsdp_fresh/prefetch_offload.py --save-every 1000; step 2 bench/fsdp_fresh/prefetch_offload.py --save-every 1000 --keep-gathered"
  for job in intra vit; do
    python -m dagprof.cli.main whatif "$O/$job" --reshard-after-forward off --allow-model-error --json 2>/dev/null | python -c "
import json, sys; d = json.load(sys.stdin); s = d['scenarios'][0]
print('round $R $job: predicted off / as profiled %.3f (model of the profiled run %+.1f %%), peak off %.2f MiB'
      % (s['predicted_iter_ms'] / d['model_iter_ms'], d['model_error_pct'], s['memory_per_rank']['0']['total_mb']))"
  done
done
