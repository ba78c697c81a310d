"""One experiment's stages, shared by every engine: read, build, train, assemble; an OOM is a result.

The stages, in the order `measure` runs them:
- `readers`: the tensor ledger and the memory reader (CUDA allocator or the ledger) under the setup's cap;
- `load`: the model (wrapped, for a distributed rank), in the `load` phase; then its optimizer;
- `trainmem.measure.train.train`: the loop, with its probe around every phase;
- `read_memory`: the composition at the peak;
- `new_result` / `finish`: the result row, before and after the numbers;
- `oom_record`: what an out-of-memory says (phase, bytes requested, peak reached).

`measure` composes them for trainmem's own loop, in this process: the isolated worker, each gloo rank
(`trainmem.measure.gloo`) and each fake-group rank (`trainmem.measure.fake_rank`) call it with their micro-batches.
The Trainer engine (`trainmem.integrations.trainer`) drives the same stages from Trainer's callbacks.
This module imports none of them, so that none of them has to import back from above (`engines.py`
chooses between them, `runner.py` isolates the process).
"""

from __future__ import annotations

import contextlib
import platform
import traceback
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch

from trainmem.config.setup import TrainSetup, lora_targets_note
from trainmem.config.specs import ModelSpec
from trainmem.errors import SetupError
from trainmem.hardware.gpus import find_gpu
from trainmem.result import Result, empty_memory
from trainmem.version import stamp

from . import emulation
from .build import build_model, build_optimizer, materialise, trainable_parameters
from .ledger import (
    CudaReader,
    LedgerReader,
    StateBytes,
    TensorLedger,
    requested_bytes,
    state_bytes,
)
from .train import Probe, TrainLog, train

Reader = CudaReader | LedgerReader


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def environment(device: str, reader: Any = None) -> dict[str, Any]:
    """Versions, platform and device of this process, recorded in every measured row so that it can be
    compared with rows from other machines (and, on CUDA, the context the reader saw outside the allocator)."""
    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           **{p: _version(p) for p in ("torch", "transformers", "peft", "accelerate",
                                                       "bitsandbytes")}}
    env.update(stamp())
    env["device"] = device
    if device == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env.update(gpu=props.name, gpu_total_memory=props.total_memory, cuda=torch.version.cuda,
                   cuda_context=getattr(reader, "context", None))
    else:
        env.update(cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return env


def readers(device: torch.device, live_state: Callable[[], StateBytes],
            cap: int | None) -> tuple[TensorLedger, Reader]:
    """The tensor ledger and the reader of peaks, both under `cap` bytes.

    On the CPU the ledger is the allocator: it enforces the cap (a real OOM at the crossing allocation)
    and the reader reads it. On CUDA the caching allocator gives the peaks and is capped through its
    memory fraction; the ledger only splits the peak by kind.
    """
    on_cpu = device.type == "cpu"
    ledger = TensorLedger(live_state, cap=cap if on_cpu else None)
    reader: Reader = LedgerReader(ledger) if on_cpu else CudaReader(device)
    if cap is not None and not on_cpu:
        reader.cap(cap)
    return ledger, reader


def load(spec: ModelSpec, setup: TrainSetup, device: str, precision: str, ledger: TensorLedger,
         wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
         on_meta: bool = False) -> tuple[torch.nn.Module, dict]:
    """The model (wrapped by `wrap`, for a distributed rank) and what the row records about it. On the
    CPU the build runs inside the ledger, so that what loading allocates is counted (and capped).
    `on_meta` (an FSDP2 rank, as torchtitan builds one): the model is built and wrapped on the meta device,
    which holds nothing, and only what `materialise` allocates, this rank's shards, is counted."""
    counted = ledger if device == "cpu" else contextlib.nullcontext()
    if on_meta:
        base = build_model(spec, setup, "meta", precision)
        trainable, total = trainable_parameters(base)
        model = wrap(base) if wrap else base
        with counted:
            materialise(model, device)
    else:
        with counted:
            base = build_model(spec, setup, device, precision)
            trainable, total = trainable_parameters(base)
            model = wrap(base) if wrap else base
    described = {"trainable_parameters": trainable, "loaded_parameters": total,
                 "attention": getattr(base.config, "_attn_implementation", None)}
    return model, described


def read_memory(probe: Probe, ledger: TensorLedger, device: str) -> dict[str, int]:
    """The composition at the peak. On CUDA the allocator's peak is authoritative and `other` absorbs
    what the ledger cannot see (cuBLAS workspace, allocator rounding); on the CPU the ledger's is."""
    mem = empty_memory()
    mem.update(ledger.peak_split)
    peak = probe.peak_allocated if device == "cuda" else ledger.peak
    parts = mem["weights"] + mem["gradients"] + mem["optimizer"] + mem["activations"]
    mem["other"] = max(peak - parts, 0)
    mem["peak_allocated"] = peak
    mem["peak_reserved"] = probe.peak_reserved if device == "cuda" else peak
    mem["device_used"] = probe.device_used
    return mem


def oom_record(err: BaseException, probe: Probe, ledger: TensorLedger) -> dict[str, Any]:
    """What an out-of-memory tells: the phase it hit, the allocation that failed, the peak reached."""
    return {"phase": probe.current, "tried_to_allocate": requested_bytes(err),
            "peak_allocated": probe.peak_allocated or ledger.peak, "message": str(err).splitlines()[0]}


def new_result(spec: ModelSpec, setup: TrainSetup, env: dict[str, Any], status: str = "ok") -> Result:
    """A measurement row for this setup (device and precision already resolved), before any number."""
    return Result(kind="measurement", status=status, setup=setup.to_dict(), model=spec.describe(),
                  effective_batch=setup.effective_batch, env=env)


def finish(result: Result, probe: Probe, ledger: TensorLedger, log: TrainLog, device: str) -> Result:
    """Put what the probe, the ledger and the loop's log hold into the row: phases, memory at the peak,
    the seed's model states, losses and throughput."""
    result.phases = probe.phases
    result.steps_done = log.steps_done
    result.losses = log.losses
    result.model_states = log.model_states.to_dict()
    result.throughput = log.throughput()
    result.memory = read_memory(probe, ledger, device)
    result.peak_phase = ledger.peak_phase
    return result


def notes(setup: TrainSetup, result: Result, log: TrainLog) -> list[str]:
    """What a reader of the row must know to trust its numbers: a learning rate tuned for another batch,
    throughput that includes probed steps, a loss that overflowed."""
    out = [setup.lr_note()] if setup.lr_note() else []
    if result.status == "ok" and setup.steps <= 2:
        out.append("throughput includes the probed steps (ledger overhead); use --steps 3 or more")
    if result.status == "ok" and any(l != l for l in log.losses):
        out.append("loss became NaN/inf (pure fp16 training overflows easily); memory is unaffected")
    return out


def measure(spec: ModelSpec, setup: TrainSetup, device: str, precision: str, batches: list,
            wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
            follow: Callable[[TensorLedger], Any] | None = None, env: dict | None = None,
            on_meta: bool = False,
            make_optimizer: Callable[[torch.nn.Module], Any] | None = None) -> Result:
    """Build, train and measure on these micro-batches with trainmem's loop, in this process.

    Args:
        device, precision: already resolved (`cuda`/`cpu`, never `auto`).
        batches: the micro-batches this process trains on (a rank passes its share).
        wrap: a distributed rank's model wrapper (DDP, FSDP2's `fully_shard`).
        follow: a context, given the ledger, that lets it see storage the dispatcher does not (FSDP2's resizes).
        env: more environment for the row (backend, rank, world size).
        on_meta: build and wrap on the meta device, then materialise only what the wrapped model keeps (`load`).
        make_optimizer: the wrapped model's optimizer, for a wrapper that makes its own (DeepSpeed's engine); else
            `build_optimizer` over the trainable parameters.
    Returns:
        The row: status `ok`, `oom` (with `oom_record`) or `error` (with the traceback). A SetupError
        found while building is raised, not returned: it is the caller's input that is wrong.
    """
    # `cuda`: the current device, with its index (a rank under torchrun sets its LOCAL_RANK's)
    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    held: dict[str, Any] = {"model": None, "optimizer": None}

    def live_state() -> StateBytes:
        return StateBytes(0, 0, 0) if held["model"] is None else state_bytes(held["model"], held["optimizer"])

    # with CUDA, --gpu CARD runs that card's program (workspaces, SDPA kernels), not only its capacity;
    # its cuBLAS workspace is set before CUDA starts here
    card = find_gpu(setup.gpu) if device == "cuda" and setup.gpu else None
    cap = setup.cap_bytes(precision)
    emulated = emulation.prepare(card, cap) if card is not None else None
    ledger, reader = readers(dev, live_state, cap)
    if isinstance(reader, CudaReader) and cap is None:
        reader.cap(reader.total)  # an earlier capped run in this process must not cap this one
    result = new_result(spec, setup.replace(device=device, precision=precision),
                        {**environment(device, reader), **(env or {})})
    probe = Probe(reader, ledger, model=None)  # type: ignore[arg-type]
    log = TrainLog()
    try:
        with follow(ledger) if follow else contextlib.nullcontext():
            probe.begin("load")
            model, described = load(spec, setup, device, precision, ledger, wrap, on_meta)
            held["model"] = probe.model = model
            probe.end()
            result.model.update(described)
            held["optimizer"] = optimizer = (make_optimizer or (lambda m: build_optimizer(m, setup)))(model)
            ledger.adopt([p for p in model.parameters()] + list(model.buffers()))
            with emulation.kernels(card) if card is not None else contextlib.nullcontext():
                train(model, optimizer, batches, setup, dev, probe, log, precision)
    except torch.OutOfMemoryError as e:
        probe.close()
        result.status = "oom"
        result.oom = oom_record(e, probe, ledger)
    except SetupError:
        raise
    except Exception:  # the run failed for a reason other than memory: report it, do not crash
        result.status = "error"
        result.error = traceback.format_exc()
    finish(result, probe, ledger, log, device)
    if emulated is not None:
        result.env["emulated"] = emulated
    result.notes.extend(notes(setup, result, log))
    result.notes.extend(n for n in [lora_targets_note(spec, setup)] if n)
    held.clear()
    return result


__all__ = ["environment", "readers", "load", "read_memory", "oom_record", "new_result", "finish",
           "notes", "measure"]
