#!/usr/bin/env bash
# What produced docs/run-chapter-h200.md, docs/run-overhead-h200.md and the estimator validation:
# run from the repo root on the GPU machine with OUT set to a folder.
# Two calls: `bash benchmarks/gpu_session.sh` (GPU tests, validation, overhead), then `CHAPTER=1 bash ...`.
# bitsandbytes comes as a wheel in .whl/ (the GPU image has none).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/src || exit
export PYTHONUNBUFFERED=1
set -o pipefail
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/gpu.txt
python3 -c "import torch,transformers,peft,accelerate,bitsandbytes;print(torch.__version__,transformers.__version__,peft.__version__,accelerate.__version__,bitsandbytes.__version__, torch.cuda.get_device_properties(0).total_memory)" | tee -a $OUT/gpu.txt
[ "${CHAPTER:-0}" = 1 ] || timeout 120 python3 -m pytest -q tests/gpu -p no:cacheprovider 2>&1 | tail -15 | tee $OUT/gpu-tests.txt
[ "${CHAPTER:-0}" = 1 ] || timeout 300 python3 benchmarks/validate.py measure $OUT 2>&1 | grep -v Warning | tail -45
[ "${CHAPTER:-0}" = 1 ] && timeout 400 python3 benchmarks/chapter.py $OUT 2>&1 | tail -25
[ "${CHAPTER:-0}" = 1 ] || timeout 100 python3 benchmarks/overhead.py $OUT 2>&1 | tail -12
