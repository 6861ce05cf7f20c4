#!/bin/bash
# dagprof.apply on FSDP2 jobs of two fully_shard roots, measured: each job as written (A) and with the strategy
# `dagprof optimize` wrote from its profile (B: `--strategy FILE`, the script's own dagprof.apply([first, second], FILE)),
# interleaved A B / B A, rank 0's median step of 16 logged with the load. Inside the measuring lock, one call a hold:
#   dp-excl bash bench/fsdp_fresh/roots_apply_rounds.sh OUT ROUNDS gan=GAN_STRATEGY a2c=A2C_STRATEGY
# then bench/fsdp_fresh/roots_apply_judge.py OUT --profile gan=RUN a2c=RUN (the prediction beside the measured ratio).
O=$1; R=$2; shift 2; mkdir -p "$O"
export PYTHONPATH=$PWD/src
declare -A ARGS=([gan]="bench/fsdp_fresh/gan_two_roots.py --batch 64" [a2c]="bench/fsdp_fresh/actor_critic.py")
declare -A STRATEGY
for kv in "$@"; do STRATEGY[${kv%%=*}]=${kv#*=}; done
step() { local name=$1; shift
  echo "$name load $(cut -d' ' -f1 /proc/loadavg) $(timeout 100 .venv/bin/torchrun --standalone --nproc-per-node 2 "$@" --steps 16 2>/dev/null | grep -o 'median step [0-9.]* ms')" >> "$O/steps.txt"; }
echo "start $(date -u +%T) $(uptime)" >> "$O/steps.txt"
for r in $(seq 1 "$R"); do
  for job in "${!STRATEGY[@]}"; do
    read -r -a a <<< "${ARGS[$job]}"
    order="A B"; [ $((r % 2)) = 0 ] && order="B A"
    for c in $order; do
      if [ "$c" = A ]; then step "$job A $r" "${a[@]}"; else step "$job B $r" "${a[@]}" --strategy "${STRATEGY[$job]}"; fi
    done
  done
done
echo "end $(date -u +%T) $(uptime)" >> "$O/steps.txt"
