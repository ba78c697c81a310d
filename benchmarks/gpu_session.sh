#!/usr/bin/env bash
# What produced the GPU tables in docs/: run from the repo root on the GPU machine with OUT set to a folder.
#   bash benchmarks/gpu_session.sh             GPU tests, estimator validation, overhead (first session)
#   CHAPTER=1 bash benchmarks/gpu_session.sh   the chapter's seven runs, uncapped and under a T4 cap
#   SWEEP=1 bash benchmarks/gpu_session.sh     GPU tests, allocator traces, `trainmem sweep --preset chapter --gpu T4`
#   MAXBATCH=1 bash benchmarks/gpu_session.sh  `trainmem max-batch` confirmed with real runs, 3 cards x 3 methods
#   MAXBATCH="T4:qlora ..." with SWEEP=1           those max-batch combinations alongside the sweep (their caps
#                                                  and the sweep's T4 cap together stay under the card)
#   HELD_OUT="held-out-11 14 15 16" bash benchmarks/gpu_session.sh   GPU tests and matmul_alignment.py (GPU_TESTS=0
#                                                  skips both), then
#                                                  those rows of a validate.py set, each in its own process
#   ZERO=1 bash benchmarks/gpu_session.sh      zero_ranks_gpu.py's ten DeepSpeed ranks (ZERO_ROWS: some), one at a
#                                                  time, each in its own process, then GPU tests (GPU_TESTS=0: not)
# bitsandbytes comes as a wheel in .whl/ (the GPU image has none).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/src || exit
export PYTHONUNBUFFERED=1
set -o pipefail
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/gpu.txt
python3 -c "import torch,transformers,peft,accelerate,bitsandbytes;print(torch.__version__,transformers.__version__,peft.__version__,accelerate.__version__,bitsandbytes.__version__, torch.cuda.get_device_properties(0).total_memory)" | tee -a $OUT/gpu.txt
if [ "${CHAPTER:-0}" = 1 ]; then
  timeout 400 python3 benchmarks/chapter.py $OUT 2>&1 | tail -25
elif [ "${SWEEP:-0}" = 1 ]; then
  if [ -n "${MAXBATCH:-}" ]; then timeout 560 python3 benchmarks/maxbatch_gpu.py $OUT $MAXBATCH > $OUT/max-batch.log 2>&1 & fi
  timeout 220 python3 -m trainmem sweep --preset chapter --gpu T4 --method both --out $OUT/sweep.jsonl 2>&1 | tail -20
  timeout 180 python3 benchmarks/allocator_trace.py $OUT ${TRACES:-} 2>&1 | grep -v Warning | tail -12
  timeout 150 python3 -m pytest -q tests/gpu -p no:cacheprovider 2>&1 | tail -15 | tee $OUT/gpu-tests.txt
  wait
elif [ -n "${HELD_OUT:-}" ]; then
  if [ "${GPU_TESTS:-1}" = 1 ]; then
    timeout 150 python3 -m pytest -q tests/gpu -p no:cacheprovider 2>&1 | tail -15 | tee $OUT/gpu-tests.txt
    timeout 60 python3 benchmarks/matmul_alignment.py $OUT 2>&1 | tail -20  # UNALIGNED_SLOWDOWN, measured
  fi
  set -- $HELD_OUT
  timeout ${HELD_OUT_TIMEOUT:-420} python3 benchmarks/validate.py "$1" $OUT "${@:2}" 2>&1 | grep -v Warning | tail -40
elif [ "${ZERO:-0}" = 1 ]; then
  python3 -c "import deepspeed; print('deepspeed', deepspeed.__version__)" 2>&1 | tail -1 | tee -a $OUT/gpu.txt
  # one rank at a time: ten at once share the card's memory and run out of it (tried: eight of ten)
  timeout ${ZERO_TIMEOUT:-420} python3 benchmarks/zero_ranks_gpu.py $OUT --set ${ZERO_SET:-1} ${ZERO_ROWS:-0 1 2 3 4 5 6 7 8 9} > $OUT/zero-ranks.log 2>&1
  grep '^| [0-9]' $OUT/zero-ranks.log | sort -u -t'|' -k2,2n -k6,6 | tee $OUT/zero-ranks-rows.md
  if [ "${GPU_TESTS:-1}" = 1 ]; then
    timeout 200 python3 -m pytest -q tests/gpu -p no:cacheprovider 2>&1 | tail -15 | tee $OUT/gpu-tests.txt
  fi
elif [ "${MAXBATCH:-0}" = 1 ]; then
  timeout 570 python3 benchmarks/maxbatch_gpu.py $OUT 2>&1 | tail -12
else
  timeout 120 python3 -m pytest -q tests/gpu -p no:cacheprovider 2>&1 | tail -15 | tee $OUT/gpu-tests.txt
  timeout 300 python3 benchmarks/validate.py measure $OUT 2>&1 | grep -v Warning | tail -45
  timeout 100 python3 benchmarks/overhead.py $OUT 2>&1 | tail -12
fi
