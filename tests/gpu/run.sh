#!/usr/bin/env bash
# NCCL/CUDA path check for a session that is lent a GPU (not part of CI: CI has no GPU).
# Usage on the device machine:  bash tests/gpu/run.sh   (writes results under $OUT or ./artifacts/gpu)
set -uo pipefail
out="${OUT:-artifacts/gpu}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -c "import torch" 2>/dev/null || { echo "torch missing on this machine"; exit 2; }
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$out/pip.log" 2>&1 || \
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
python3 -m lesson_lib doctor | tee "$out/doctor.json"
timeout 300 python3 tests/gpu/gpu_check.py "$out" 2>&1 | tee "$out/gpu_check.log"
rc=${PIPESTATUS[0]}
timeout 120 torchrun --standalone --nproc-per-node 1 -m lesson_lib run data-parallel --backend nccl \
  --steps 5 --json "$out/torchrun_nccl.json" 2>&1 | tee "$out/torchrun.log"
rc2=${PIPESTATUS[0]}
# Pipeline: one stage on CUDA; four stages on Gloo with 16 cores, where the wall-clock bubble is
# not distorted by ranks sharing cores (compare bubble_fraction with bubble_formula in the JSON).
timeout 120 python3 -m lesson_lib run pipeline --stages 1 --backend nccl --steps 5 \
  --json "$out/pipeline_cuda.json" 2>&1 | tee "$out/pipeline.log"
rc3=${PIPESTATUS[0]}
timeout 180 python3 -m lesson_lib run pipeline --stages 4 --microbatches 8 --schedule 1f1b --backend gloo \
  --steps 5 --json "$out/pipeline_gloo16.json" 2>&1 | tee -a "$out/pipeline.log"
rc4=${PIPESTATUS[0]}
echo "gpu_check rc=$rc torchrun rc=$rc2 pipeline rc=$rc3/$rc4"
exit $(( rc || rc2 || rc3 || rc4 ))
