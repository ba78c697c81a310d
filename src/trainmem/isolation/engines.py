"""Which engine runs an experiment in this process: trainmem's loop, `transformers.Trainer`, TRL's `SFTTrainer`,
CPU ranks over gloo, or one FSDP2 rank (or DeepSpeed ZeRO rank) through the fake process group.

Every engine measures with the stages of `trainmem.measure.stages`; this module only chooses between them, so it
sits above all of them and none imports it back. `runner.run` calls `execute` in a fresh process (the
worker) or, with `isolate=False`, here.
"""

from __future__ import annotations

import gc

from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.errors import SetupError
from trainmem.result import Result


def execute(spec: ModelSpec, setup: TrainSetup) -> Result:
    """Validate the setup against the model (a no-op when it already was) and run it in this process.

    Raises SetupError for bad input (every problem at once, this machine's with the setup's), returns a
    Result otherwise (`oom` and `error` included).
    """
    try:
        checked = setup.validate(spec)
    except SetupError as e:
        raise SetupError(e.problems + _machine_problems(spec, setup)) from None
    return execute_validated(spec, checked)


def _machine_problems(spec: ModelSpec, setup: TrainSetup) -> list[str]:
    """This machine's problems with a setup that has problems of its own, where they can be told apart
    (a field of the wrong type leaves them to the next try)."""
    from trainmem.measure.build import environment_problems

    try:
        device = setup.resolved_device()
        return environment_problems(setup, device, setup.resolved_precision(spec, device))
    except (TypeError, ValueError, KeyError, AttributeError):
        return []


def execute_validated(spec: ModelSpec, setup: TrainSetup) -> Result:
    """Run a setup `TrainSetup.validate` accepted for `spec` (the worker's job: its parent validated it).

    Only what depends on this machine is checked here, in the process that will use it: CUDA,
    bitsandbytes, the dtypes this CPU can train in, a cap larger than the card.
    """
    import torch

    from trainmem.measure.build import environment_problems

    device = setup.resolved_device()
    precision = setup.resolved_precision(spec, device)
    problems = environment_problems(setup, device, precision)
    if problems:
        raise SetupError(problems)
    setup = setup.resolved(spec)
    if setup.engine == "deepspeed":  # one ZeRO rank (or each in turn) through the fake process group
        from trainmem.measure.deepspeed import measure_deepspeed

        return measure_deepspeed(spec, setup, device, precision)
    if setup.shard == "fsdp" and (device == "cuda" or setup.rank is not None):
        # one rank (or each in turn) in this process through the fake process group: always on CUDA,
        # on the CPU when --rank asks for it
        from trainmem.measure.fake_rank import measure_emulated

        return measure_emulated(spec, setup, device, precision)
    if setup.distributed:  # CPU ranks over gloo (environment_problems allows no other)
        from trainmem.measure.gloo import execute_distributed

        return execute_distributed(spec, setup, device, precision)
    if setup.engine == "trainer":
        from trainmem.integrations.trainer import train_with_trainer

        return train_with_trainer(spec, setup, device, precision)
    if setup.engine == "sft":
        from trainmem.integrations.sft import train_with_sft

        return train_with_sft(spec, setup, device, precision)
    result = _loop(spec, setup, device, precision)
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return result


def _loop(spec: ModelSpec, setup: TrainSetup, device: str, precision: str) -> Result:
    """trainmem's own loop over the whole data set, in this process."""
    from trainmem.measure.data import load_dataset, micro_batches
    from trainmem.measure.stages import measure

    samples, pad_id = load_dataset(spec, setup)
    result = measure(spec, setup, device, precision, micro_batches(samples, setup.batch_size, pad_id))
    result.notes.extend(_data_notes(setup, len(samples)))
    return result


def _data_notes(setup: TrainSetup, samples: int) -> list[str]:
    """Say when the data, not the flags, set the micro-batch: the numbers are about what really ran."""
    if setup.data is None and samples > setup.num_samples:
        return [f"--num-samples {setup.num_samples} is below --batch-size {setup.batch_size}: "
                f"made {samples} dummy samples so each micro-batch is full"]
    if setup.data is not None and samples < setup.batch_size:
        return [f"--data has {samples} samples, fewer than --batch-size {setup.batch_size}: "
                f"every micro-batch held only {samples}"]
    return []


__all__ = ["execute", "execute_validated"]
