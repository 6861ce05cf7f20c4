#!/bin/bash
# One round of FSDP2 what-ifs on jobs of two fully_shard roots (GAN, DINO student + EMA teacher, actor-critic), measured
# against the jobs run with the what-if's setting. Run from the repository root inside the measuring lock, one round a
# hold:   dp-excl bash bench/fsdp_fresh/roots_rounds.sh OUT/r1 [JOB...]   (JOB: gan, dino, a2c; default all three, about
# 5 minutes a hold with the ddp cell: dino alone, then gan and a2c, keeps each hold near 2-3 minutes)
# Per script, in a shuffled order: the 2-rank job profiled as written (dagprof profile), then run unprofiled as written,
# with every unit's reshard_after_forward off, at 4 ranks on the machine's cores, and with each trained model in its own
# DistributedDataParallel (--ddp), each rank 0's median step logged
# with the load. Predict afterwards (no lock): bench/fsdp_fresh/roots_judge.py OUT/r* [--src TREE/src].
set -e
O=$1; mkdir -p "$O"
PY=${PYTHON:-.venv/bin/python}
export PYTHONPATH=$PWD/src
declare -A ARGS=([gan]="bench/fsdp_fresh/gan_two_roots.py --batch 64" [dino]="bench/fsdp_fresh/dino_ema_teacher.py --batch 4 --local-crops 2"
                 [a2c]="bench/fsdp_fresh/actor_critic.py")
step() {  # NAME NPROC ARGS...: rank 0's median step of an unprofiled run
  local name=$1 n=$2; shift 2
  echo "$name load $(cut -d' ' -f1 /proc/loadavg) $(timeout 150 "$(dirname "$PY")/torchrun" --standalone --nproc-per-node "$n" "$@" --steps 16 2>/dev/null | grep -o 'median step [0-9.]* ms')" >> "$O/steps.txt"
}
uptime >> "$O/steps.txt"
shift
for job in $(printf '%s\n' "${@:-gan dino a2c}" | tr ' ' '\n' | shuf); do
  read -r -a a <<< "${ARGS[$job]}"
  timeout 200 "$PY" -m dagprof.cli.main profile --no-kineto --steps 4:9 -o "$O/$job" -- "$(dirname "$PY")/torchrun" --standalone \
    --nproc-per-node 2 "${a[@]}" --steps 10 > "$O/$job.profile.log" 2>&1
  for cell in $(printf '%s\n' as off w4 ddp | shuf); do
    case $cell in
      as) step "$job as" 2 "${a[@]}" ;;
      off) step "$job off" 2 "${a[@]}" --reshard off ;;
      w4) step "$job w4" 4 "${a[@]}" ;;
      ddp) step "$job ddp" 2 "${a[@]}" --ddp ;;
    esac
  done
done
uptime >> "$O/steps.txt"
