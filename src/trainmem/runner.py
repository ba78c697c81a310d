"""One experiment, isolated: build, train a few steps, measure; OOM and failures become results.

`run()` starts a fresh Python process per experiment by default (`python -m trainmem.worker`), so no
memory from an earlier experiment leaks into the next one (the seed's QLoRA run started with 0.945 GB
left over from a previous cell) and a crash cannot take the caller down. `execute()` is the same
experiment in the current process; the worker calls it.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import traceback
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from .errors import SetupError
from .result import Result, empty_memory
from .setup import TrainSetup
from .specs import ModelSpec


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def environment(device: str, reader: Any = None) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           **{p: _version(p) for p in ("torch", "transformers", "peft", "accelerate",
                                                       "bitsandbytes")}}
    from . import __version__

    env["trainmem"] = __version__
    env["device"] = device
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_total_memory=props.total_memory, cuda=torch.version.cuda,
                   cuda_context=getattr(reader, "context", None))
    else:
        env.update(cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return env


def execute(spec: ModelSpec, setup: TrainSetup) -> Result:
    """Run the experiment here and now. Raises SetupError for bad input, returns a Result otherwise."""
    import torch

    from .build import environment_problems
    from .data import load_dataset, micro_batches

    device = setup.resolved_device()
    precision = setup.resolved_precision(spec, device)
    problems = setup.problems(spec) + environment_problems(setup, device, precision)
    if problems:
        raise SetupError(problems)
    setup = setup.resolved(spec)
    if setup.shard == "fsdp" and (device == "cuda" or setup.rank is not None):
        # one rank (or each in turn) in this process through the fake process group: always on CUDA,
        # on the CPU when --rank asks for it
        from .fake_group import measure_emulated

        return measure_emulated(spec, setup, device, precision)
    if setup.gpus > 1 or setup.shard != "none":  # CPU ranks over gloo (environment_problems allows no other)
        from .distributed import execute_distributed

        return execute_distributed(spec, setup, device, precision)
    if setup.engine == "trainer":
        from .integrations.trainer import train_with_trainer

        return train_with_trainer(spec, setup, device, precision)
    samples, pad_id = load_dataset(spec, setup)
    result = measure(spec, setup, device, precision, micro_batches(samples, setup.batch_size, pad_id))
    result.notes.extend(_data_notes(setup, len(samples)))
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
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


def measure(spec: ModelSpec, setup: TrainSetup, device: str, precision: str, batches: list,
            wrap: Any = None, follow: Any = None, env: dict | None = None) -> Result:
    """Build, train and measure on these micro-batches: the experiment shared by one process and by each
    rank of a distributed run (which passes its model wrapper, a context that lets the ledger follow
    FSDP's storage resizes, and its rank's environment)."""
    import torch

    from . import emulation
    from .build import build_model, build_optimizer, trainable_parameters
    from .gpus import find_gpu
    from .measure import CudaReader, LedgerReader, StateBytes, TensorLedger, requested_bytes, state_bytes
    from .train import Probe, TrainLog, train

    dev = torch.device("cuda:0" if device == "cuda" else "cpu")
    cap = setup.cap_bytes()
    held: dict[str, Any] = {"model": None, "optimizer": None}

    def live_state() -> StateBytes:
        if held["model"] is None:
            return StateBytes(0, 0, 0)
        return state_bytes(held["model"], held["optimizer"])

    ledger = TensorLedger(live_state, cap=cap if device == "cpu" else None)
    # with CUDA, --gpu CARD runs that card's program (workspaces, SDPA kernels), not only its capacity
    card = find_gpu(setup.gpu) if device == "cuda" and setup.gpu else None
    emulated = emulation.prepare(card) if card is not None else None
    reader = CudaReader(dev) if device == "cuda" else LedgerReader(ledger)
    if device == "cuda":  # uncapped too: an earlier capped run in this process must not cap this one
        reader.cap(cap if cap is not None else reader.total)
    resolved = setup.replace(device=device, precision=precision).to_dict()
    result = Result(kind="measurement", status="ok", setup=resolved, model=spec.describe(),
                    effective_batch=setup.effective_batch, env={**environment(device, reader), **(env or {})})
    probe = Probe(reader, ledger, model=None)  # type: ignore[arg-type]
    log = TrainLog()
    try:
        with follow(ledger) if follow else contextlib.nullcontext():
            probe.begin("load")
            with ledger if device == "cpu" else contextlib.nullcontext():
                base = build_model(spec, setup, device, precision)
                trainable, total = trainable_parameters(base)
                held["model"] = model = wrap(base) if wrap else base
            probe.model = model
            probe.end()
            result.model.update(trainable_parameters=trainable, loaded_parameters=total,
                                attention=getattr(base.config, "_attn_implementation", None))
            held["optimizer"] = optimizer = build_optimizer(model, setup)
            ledger.adopt([p for p in model.parameters()] + list(model.buffers()))
            with emulation.kernels(card) if card is not None else contextlib.nullcontext():
                train(model, optimizer, batches, setup, dev, probe, log, precision)
    except torch.OutOfMemoryError as e:
        probe.close()
        result.status = "oom"
        result.oom = {"phase": probe.current, "tried_to_allocate": requested_bytes(e),
                      "peak_allocated": probe.peak_allocated or ledger.peak, "message": str(e).splitlines()[0]}
    except SetupError:
        raise
    except Exception:  # the run failed for a reason other than memory: report it, do not crash
        result.status = "error"
        result.error = traceback.format_exc()
    result.phases = probe.phases
    result.steps_done = log.steps_done
    result.losses = log.losses
    result.model_states = log.model_states.to_dict()
    result.throughput = log.throughput()
    result.memory = memory_at_peak(probe, ledger, device)
    result.peak_phase = ledger.peak_phase
    if emulated is not None:
        result.env["emulated"] = emulated
    if setup.lr_note():
        result.notes.append(setup.lr_note())
    if result.status == "ok" and setup.steps <= 2:
        result.notes.append("throughput includes the probed steps (ledger overhead); use --steps 3 or more")
    if result.status == "ok" and any(l != l for l in log.losses):
        result.notes.append("loss became NaN/inf (pure fp16 training overflows easily); memory is unaffected")
    held.clear()
    return result


def memory_at_peak(probe: Any, ledger: Any, device: str) -> dict[str, int]:
    """The composition at the peak; on CUDA the allocator's peak is authoritative and `other`
    absorbs what the ledger cannot see (cuBLAS workspace, allocator rounding)."""
    mem = empty_memory()
    mem.update(ledger.peak_split)
    peak = probe.peak_allocated if device == "cuda" else ledger.peak
    parts = mem["weights"] + mem["gradients"] + mem["optimizer"] + mem["activations"]
    mem["other"] = max(peak - parts, 0)
    mem["peak_allocated"] = peak
    mem["peak_reserved"] = probe.peak_reserved if device == "cuda" else peak
    mem["device_used"] = probe.device_used
    return mem


def run(spec: ModelSpec | str, setup: TrainSetup | None = None, isolate: bool = True,
        timeout: float | None = None) -> Result:
    """Measure one setup. With `isolate` (default) it runs in a fresh process."""
    spec = ModelSpec.resolve(spec) if isinstance(spec, str) else spec
    setup = (setup or TrainSetup()).validate(spec)
    if not isolate:
        return execute(spec, setup)
    with tempfile.TemporaryDirectory(prefix="trainmem-") as tmp:
        job, out = os.path.join(tmp, "job.json"), os.path.join(tmp, "result.json")
        with open(job, "w") as f:
            json.dump({"spec": {"name": spec.name, "config": spec.config, "source": spec.source,
                                "path": spec.path}, "setup": setup.to_dict()}, f)
        try:
            proc = subprocess.run([sys.executable, "-m", "trainmem.worker", job, out],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return _failed(spec, setup, f"the experiment ran past {timeout} s and was stopped")
        if not os.path.exists(out):
            return _failed(spec, setup, f"the worker process died (exit {proc.returncode}):\n"
                                        + "\n".join(proc.stderr.splitlines()[-20:]))
        with open(out) as f:
            row = json.load(f)
    if row.get("status") == "invalid":
        raise SetupError(row["problems"])
    return Result.from_dict(row)


def _failed(spec: ModelSpec, setup: TrainSetup, why: str) -> Result:
    return Result(kind="measurement", status="error", setup=setup.to_dict(), model={"name": spec.name},
                  effective_batch=setup.effective_batch, error=why)
