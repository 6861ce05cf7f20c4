#!/bin/bash
# `whatif --units merge:all` (fully_shard on the root only) of the fresh MAE script against the job run so, in interleaved
# rounds on loopback (run from the repository root; the timed part under ONE exclusive hold of the machine-wide lock):
#   bench/fsdp_fresh/mae_units_rounds.sh OUT ROUNDS
# Per round: the job profiled as written (dagprof profile; per-block units, the encoder's resharded, the decoder's kept
# gathered), then run unprofiled as written and with --units root (the order alternating by round), each median step logged
# with the load; then each round's profile predicted against the --units root job's median: by the what-if's step over the
# model of the profiled run times the as-written job's median, and by the what-if's own step (its 90 % interval beside),
# with the peak memory. `mae_units_rounds.sh OUT ROUNDS --offline` predicts the kept rounds again.
set -e
OUT=$1; ROUNDS=${2:-3}
[ "$3" = --offline ] && OFFLINE=1  # predict the kept rounds in OUT again, no job
export PYTHONPATH=$PWD/src
ARGS="--steps 20 --epoch-steps 100"  # no evaluation between the timed steps
step() { echo "load $(cut -d' ' -f1 /proc/loadavg) $*: $(torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/mae_pretrain.py $ARGS "$@" 2>/dev/null | grep -o 'median step [0-9.]* ms')"; }
mkdir -p "$OUT"
[ -n "$OFFLINE" ] || dp-excl bash -c "$(declare -f step); ARGS='$ARGS'; set -e; echo held \$(date -u +%T) \$(uptime)
  for R in \$(seq 1 $ROUNDS); do
    python -m dagprof.cli.main profile -o $OUT/r\$R -- torchrun --standalone --nproc-per-node 2 bench/fsdp_fresh/mae_pretrain.py $ARGS >/dev/null 2>&1
    echo \"round \$R\"
    if [ \$((R % 2)) = 1 ]; then step --units blocks; step --units root; else step --units root; step --units blocks; fi
  done; echo released \$(date -u +%T) \$(uptime)" | tee "$OUT/rounds.txt"
for R in $(seq 1 "$ROUNDS"); do
  python -m dagprof.cli.main whatif "$OUT/r$R" --units merge:all --allow-model-error --json 2>/dev/null | python -c "
import json, re, sys
d = json.load(sys.stdin); s = d['scenarios'][0]
txt = open('$OUT/rounds.txt').read().split('round $R')[1].split('round ')[0]
med = {u: float(re.search(r'--units ' + u + r': median step ([0-9.]+)', txt).group(1)) for u in ('blocks', 'root')}
ratio = s['predicted_iter_ms'] / d['model_iter_ms']
pred = ratio * med['blocks']
print('round $R: merge:all / as profiled predicted %.3f, measured %.3f; root-only step by the ratio %.1f ms (%+.1f %%), whatif\'s own '
      '%.1f ms (%.1f-%.1f, %+.1f %%), measured %.1f; model of the profiled run %+.1f %%, peak merge:all %.2f MiB'
      % (ratio, med['root'] / med['blocks'], pred, 100 * (pred / med['root'] - 1), s['predicted_iter_ms'], s['lo_ms'], s['hi_ms'],
         100 * (s['predicted_iter_ms'] / med['root'] - 1), med['root'], d['model_error_pct'], s['memory_per_rank']['0']['total_mb']))"
done
