"""trainmem: plan, measure and explain GPU memory when fine-tuning causal language models.

    >>> import trainmem
    >>> spec = trainmem.ModelSpec.resolve("tiny-gpt-neox")
    >>> result = trainmem.run(spec, trainmem.TrainSetup(batch_size=2, seq_len=32))
    >>> result.status, result.memory["peak_allocated"] > 0
    ('ok', True)

`estimate` and `Breakdown` load on first use (PEP 562), because the estimator imports torch and
torch-free parts such as `trainmem.output.report` must stay importable, and fast, without it.
"""

from typing import Any

from .config.setup import TrainSetup, from_training_arguments
from .config.sources import load_setup
from .config.specs import PRESETS, ModelSpec
from .errors import SetupError
from .experiment import gpu_memory_experiment
from .hardware.gpus import CATALOG as GPUS
from .hardware.gpus import GPU, find_gpu
from .isolation.runner import run
from .measure.verify import verify_accumulation
from .result import Result, read_rows
from .search.maxbatch import max_batch
from .search.plan import Plan, make_plan
from .search.sweep import Sweep
from .version import __version__

__all__ = ["ModelSpec", "TrainSetup", "Result", "SetupError", "run", "estimate", "Breakdown", "gpu_memory_experiment",
           "from_training_arguments", "GPU", "GPUS", "find_gpu", "PRESETS", "verify_accumulation", "Sweep",
           "max_batch", "make_plan", "Plan", "load_setup", "read_rows", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("estimate", "Breakdown"):
        from . import estimator

        return getattr(estimator, name)
    raise AttributeError(f"module 'trainmem' has no attribute {name!r}")
