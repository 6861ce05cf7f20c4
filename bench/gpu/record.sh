#!/bin/bash
# Record real CUDA traces of bench/gpu/cuda_train.py with dagprof on a GPU machine (one prepared run; see README there).
# Each configuration: one unprofiled run (its step times and max_memory_allocated) and one `dagprof profile` of it.
# Usage: OUT=DIR [CONFIGS='fsdp nccl 1,ddp gloo 2'] bash bench/gpu/record.sh   (DIR gets runs.tgz; WRAP BACKEND RANKS each)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD/src"
PY=${PY:-python3}
RUNS=/tmp/gpu-runs; rm -rf "$RUNS"; mkdir -p "$RUNS"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
IFS=, read -ra CONFIGS <<< "${CONFIGS:-ddp nccl 1,fsdp nccl 1,ddp gloo 2,fsdp gloo 2}"
for cfg in "${CONFIGS[@]}"; do
  set -- $cfg; name=$1-$2-$3
  launch=($PY -m torch.distributed.run --standalone --nproc-per-node "$3" bench/gpu/cuda_train.py --wrap "$1" --backend "$2")
  echo "== $name unprofiled"; timeout 150 "${launch[@]}" --steps 30 --stats "$RUNS/$name.plain.json" > "$RUNS/$name.plain.log" 2>&1
  echo "rc=$? $(tail -c 300 "$RUNS/$name.plain.log" | tr '\n' ' ' | tail -c 300)"
  echo "== $name profiled"; timeout 200 $PY -m dagprof.cli.main profile -o "$RUNS/$name" --steps 10:15 -- "${launch[@]}" --steps 20 \
    --stats "$RUNS/$name.prof.json" > "$RUNS/$name.prof.log" 2>&1
  echo "rc=$? $(tail -c 300 "$RUNS/$name.prof.log" | tr '\n' ' ' | tail -c 300)"
  du -sh "$RUNS/$name" 2>/dev/null
done
tar czf "$OUT/runs.tgz" -C "$RUNS" . && ls -la "$OUT"
