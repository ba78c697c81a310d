#!/usr/bin/env bash
# The amp-bf16 DeepSpeed ranks of sets 1-4 measured again once the engine runs its own autocast (run from the repo
# root on the GPU machine with OUT set): the config check first (tests/gpu/test_deepspeed_cuda.py), the same check
# with the config's `torch_autocast` left out (what the engine did before), then each rank in its own process.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/src || exit
export PYTHONUNBUFFERED=1
python3 -m pytest -q tests/gpu/test_deepspeed_cuda.py -p no:cacheprovider 2>&1 | tail -3 | tee $OUT/autocast-test.txt
python3 - <<'PY' 2>&1 | tail -2 | tee -a $OUT/autocast-test.txt
from unittest import mock
import pytest, sys
from trainmem.measure import deepspeed as ds
plain = ds.ds_config
with mock.patch.object(ds, "ds_config", lambda *a: {k: v for k, v in plain(*a).items() if k != "torch_autocast"}):
    rc = pytest.main(["-q", "-p", "no:cacheprovider", "tests/gpu/test_deepspeed_cuda.py"])
print("without the config's torch_autocast, the check", "passes" if rc == 0 else "fails")
PY
for pick in "1 5" "2 3" "3 5" "4 4"; do
  set -- $pick
  timeout 150 python3 benchmarks/zero_ranks_gpu.py $OUT/set$1 --set $1 $2 2>&1 | grep '^| [0-9]' | sort -u
done
