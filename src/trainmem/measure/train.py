"""The training loop, flat and top to bottom, with a memory probe around every phase.

Per optimizer step: take the next accumulation window, count its label tokens, then for each
micro-batch run forward (loss = sum of token losses / tokens in the window) and backward; then step and
zero the gradients with `set_to_none=True`, so they are freed rather than kept as zeros. The first
`probe_steps` steps are probed phase by phase (Adam creates its state in step 1, so step 2 is the first
steady step); later steps run without the ledger on CUDA and give the throughput.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from trainmem.config.setup import TrainSetup

from .accumulation import endless_windows, label_tokens, micro_batch_loss
from .data import Sample
from .ledger import CudaReader, LedgerReader, StateBytes, TensorLedger, state_bytes

PROBE_STEPS = 2
"""Steps `train` probes under the ledger by default: Adam's states appear in the first, the second is steady.
Under the ledger's dispatch mode ATen skips some in-place adds (`estimator.inplace`), so the simulate method
mirrors this count."""


@dataclass
class Probe:
    """Reads memory at the end of each phase and resets the peak at its start."""

    reader: CudaReader | LedgerReader
    ledger: TensorLedger
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    phases: list[dict[str, Any]] = field(default_factory=list)
    current: str = "load"
    recording: bool = True
    peak_allocated: int = 0
    peak_reserved: int = 0
    device_used: int = 0

    def begin(self, phase: str) -> None:
        """Start a phase; unrecorded phases only keep their name (for OOM reports) and cost nothing."""
        self.current = phase
        self.ledger.set_phase(phase)
        if self.recording:
            self.reader.reset_peak()

    def end(self) -> StateBytes | None:
        """Read the phase: allocator or ledger counters, and the bytes of weights/grads/states."""
        if not self.recording:
            return None
        r = self.close()
        s = state_bytes(self.model, self.optimizer)
        self.phases.append({"phase": self.current, "allocated": r.allocated, "reserved": r.reserved,
                            "peak_allocated": r.peak_allocated, "peak_reserved": r.peak_reserved,
                            "device_used": r.device_used, **s.to_dict()})
        return s

    def close(self) -> Any:
        """Fold the peaks since the last reset into the run's peaks (also after unrecorded steps)."""
        r = self.reader.read()
        self.peak_allocated = max(self.peak_allocated, r.peak_allocated)
        self.peak_reserved = max(self.peak_reserved, r.peak_reserved)
        self.device_used = max(self.device_used, r.device_used)
        return r


@dataclass
class TrainLog:
    """What the loop did, filled as it goes so that an OOM keeps it: steps, losses, step times and tokens, the
    seed's model states."""
    steps_done: int = 0
    losses: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)
    timed_from: int = 0
    """Index of the first step whose time counts for throughput (the first unprobed one)."""
    model_states: StateBytes = field(default_factory=lambda: StateBytes(0, 0, 0))

    def time_after_probes(self, probe_steps: int, steps: int) -> None:
        """Time throughput from the first unprobed step of `steps` (the probe's ledger slows the probed
        ones); from the last step when every step is probed, from the first when there is only one."""
        self.timed_from = min(probe_steps, steps - 1) if steps > probe_steps else 0

    def throughput(self) -> dict[str, float | int | None]:
        """Tokens per second and step time over the unprobed steps (the probe's ledger slows the first ones)."""
        times, toks = self.step_times[self.timed_from:], self.step_tokens[self.timed_from:]
        if not times:
            return {"tokens_per_s": None, "step_time_s": None, "step_time_median_s": None, "timed_steps": 0}
        # the mean is kept as it always was; the median resists one slow step (a GC pause, a late kernel load)
        return {"tokens_per_s": sum(toks) / sum(times), "step_time_s": sum(times) / len(times),
                "timed_steps": len(times), "step_time_median_s": statistics.median(times)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: list[Sample], setup: TrainSetup,
          device: torch.device, probe: Probe, log: TrainLog, precision: str,
          probe_steps: int = PROBE_STEPS) -> TrainLog:
    """Run `setup.steps` optimizer steps; fills `log` as it goes so an OOM keeps what was done."""
    from .build import AUTOCAST_DTYPES

    amp_dtype = AUTOCAST_DTYPES.get(precision)
    scaler = torch.amp.GradScaler(device.type) if precision == "amp-fp16" else None
    probe.optimizer = optimizer
    ledger_always = device.type == "cpu"  # on the CPU the ledger is the allocator
    log.time_after_probes(probe_steps, setup.steps)
    stream = endless_windows(batches, setup.grad_accum)

    for step in range(1, setup.steps + 1):
        window = next(stream)
        window_tokens = sum(label_tokens(b) for b in window)
        probing = step <= probe_steps
        probe.recording = probing
        tracking = probe.ledger if (probing or ledger_always) else contextlib.nullcontext()
        _sync(device)
        t0 = time.perf_counter()
        step_loss, tokens = torch.zeros((), device=device), 0
        with tracking:
            for k, batch in enumerate(window, 1):
                name = f"step{step}.micro{k}"
                probe.begin(f"{name}.forward")
                batch = {key: v.to(device, non_blocking=True) for key, v in batch.items()}
                tokens += int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()
                with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    loss = micro_batch_loss(model, batch, window_tokens)
                probe.end()

                probe.begin(f"{name}.backward")
                (scaler.scale(loss) if scaler is not None else loss).backward()
                step_loss += loss.detach().float()  # no host sync per micro-batch
                del loss, batch  # free the graph's last handle before the next forward
                probe.end()

            probe.begin(f"step{step}.optimizer")
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            # The seed's moment: after the step, before zero_grad, weights + gradients + states coexist.
            states = probe.end()
            if states is not None:
                log.model_states = states
            optimizer.zero_grad(set_to_none=True)
        _sync(device)
        log.step_times.append(time.perf_counter() - t0)
        log.step_tokens.append(tokens)
        loss_value = float(step_loss)
        log.losses.append(loss_value if math.isfinite(loss_value) else float("nan"))
        log.steps_done = step
    probe.close()
    return log
