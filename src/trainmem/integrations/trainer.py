"""trainmem inside a `transformers.Trainer` run: `MemoryCallback`, and the `--engine trainer` experiment.

The callback measures the Trainer's own steps with the readers `trainmem run` uses. Phases come from
the Trainer's events plus two hooks on the model: a forward pre-hook starts `stepN.microK.forward`, the
forward hook ends it and starts `.backward`; `on_substep_end` (or `on_pre_optimizer_step` for the last
micro-batch) ends the backward, and `on_optimizer_step` ends `stepN.optimizer`, right after the step
and before `zero_grad`, the moment whose weights + gradients + optimizer states are `model_states`.

The first `probe_steps` steps are recorded phase by phase. For them (on the CPU, where the ledger is
the allocator, for every step) the tensor ledger, a TorchDispatchMode, is entered in `on_step_begin`
and left in `on_step_end`: the Trainer calls both on the thread that runs forward, backward and the step
between them, and autograd carries the mode into its backward threads, so the ledger sees every tensor
of the step. On CUDA the caching allocator gives the peaks (`CudaReader.read` synchronizes).

Where `--engine trainer` differs from trainmem's loop (memory aside, the loss is the same: both divide
the window's summed token loss by its label tokens after the causal shift, Trainer through
`num_items_in_batch`): Trainer builds its optimizer over weight-decay groups with a linear-decay
scheduler, clips gradients to `max_grad_norm` 1.0 (norm temporaries in the last backward phase),
and shuffles the samples (equal-length dummy rows: the same memory).
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import torch
from transformers import TrainerCallback

from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.measure import stages as core
from trainmem.measure.ledger import (
    StateBytes,
    gradient_tensors,
    optimizer_tensors,
    state_bytes,
    weight_tensors,
)
from trainmem.measure.train import Probe, TrainLog
from trainmem.result import Result

LOG_KEYS = ("peak_allocated", "weights", "gradients", "optimizer", "activations", "device_used")
"""Figures added to the Trainer's logs as `trainmem/<key>` (bytes), so they reach its reporters."""


def _optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer inside accelerate's AcceleratedOptimizer (its `.optimizer`)."""
    return getattr(optimizer, "optimizer", optimizer)


def spec_of(model: torch.nn.Module, name: str | None = None) -> ModelSpec:
    """A ModelSpec for a model in hand: its config, random-weight semantics (memory needs no values)."""
    config = model.config.to_dict()
    return ModelSpec(name=name or config.get("_name_or_path") or config["model_type"], config=config,
                     source="config")


class MemoryCallback(TrainerCallback):
    """Measure a Trainer run's memory; `result` holds the same object as `trainmem run` writes.

    `out` appends the result (and, with `compare_estimate`, the estimate's row) to a JSONL file.
    `compare_estimate` runs `trainmem.estimator` for the same arguments and model and puts the relative
    errors (estimate / measured - 1) in `relative_error`; note the estimate is for a CUDA GPU.
    `cap` limits memory to that many bytes (the allocator's fraction on CUDA, the ledger on the CPU),
    so that a smaller card's OOM happens here; call `failed` with what `trainer.train()` raised.
    `engine` names who trains in the result's setup (`trainer`, or `sft` for TRL's SFTTrainer).
    Pass the callback with `attach(trainer)` rather than `callbacks=[...]` when TensorBoard or W&B
    should get the figures: Trainer calls reporters' `on_log` before user callbacks'.
    """

    def __init__(self, out: str | None = None, compare_estimate: bool = False, probe_steps: int = 2,
                 spec: ModelSpec | None = None, method: str = "auto", cap: int | None = None,
                 engine: str = "trainer"):
        self.out, self.compare_estimate, self.probe_steps, self.engine = out, compare_estimate, probe_steps, engine
        self.spec, self.method, self.cap = spec, method, cap
        self.result: Result | None = None
        self.estimate: Result | None = None
        self.relative_error: dict[str, float] = {}

    def attach(self, trainer: Any) -> MemoryCallback:
        """Put this callback first, so that reporting callbacks see the figures it adds to the logs."""
        trainer.callback_handler.callbacks.insert(0, self)
        return self

    # --- Trainer events -----------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        self.model, self.optimizer = model, _optimizer(optimizer)
        self.device = next(model.parameters()).device
        self.ledger, self.reader = core.readers(self.device, self._live_state, self.cap)
        self.probe = Probe(self.reader, self.ledger, model, self.optimizer)
        self.log, self.steps_seen, self.in_step, self.pending = TrainLog(), 0, False, {}
        self.seq_len = self.batch_size = self.tokens = self.micro = 0
        self.hooks = [model.register_forward_pre_hook(self._forward_begins, with_kwargs=True),
                      model.register_forward_hook(self._forward_ends, with_kwargs=True)]
        self.ledger.adopt(weight_tensors(model))
        self.probe.begin("load")
        self.probe.end()

    def on_step_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> None:
        self.steps_seen += 1
        self.step, self.micro, self.tokens, self.in_step = state.global_step + 1, 0, 0, True
        self.probe.optimizer = self.optimizer = _optimizer(optimizer)
        self.probe.recording = probing = self.steps_seen <= self.probe_steps
        # On the CPU the ledger is the allocator (and enforces `cap`), so it tracks every step, as in `run`.
        self.tracking = probing or self.device.type == "cpu"
        if self.tracking:
            self.ledger.adopt(weight_tensors(self.model) + gradient_tensors(self.model)
                              + optimizer_tensors(self.optimizer))
            self.ledger.__enter__()
        if not probing:
            self.reader.reset_peak()
        self.t0 = time.perf_counter()

    def _forward_begins(self, module: Any, args: tuple, kwargs: dict) -> None:
        if not self.in_step:
            return
        self._end_backward()
        self.micro += 1
        ids = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(ids, torch.Tensor):
            self.batch_size, self.seq_len = max(self.batch_size, ids.shape[0]), max(self.seq_len, ids.shape[-1])
            mask = kwargs.get("attention_mask")
            self.tokens += int(mask.sum()) if isinstance(mask, torch.Tensor) else ids.numel()
        self.probe.begin(f"step{self.step}.micro{self.micro}.forward")

    def _forward_ends(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        if self.in_step:
            self.probe.end()
            self.probe.begin(f"step{self.step}.micro{self.micro}.backward")

    def _end_backward(self) -> None:
        if self.probe.current.endswith(".backward"):
            self.probe.end()
            self.probe.current = f"step{self.step}.micro{self.micro}.done"

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_backward()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_backward()
        self.probe.begin(f"step{self.step}.optimizer")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        states = self.probe.end()
        if states is not None:
            self.log.model_states = states

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.in_step = False
        if self.tracking:
            self.ledger.__exit__(None, None, None)
        self.probe.close()
        self.log.step_times.append(time.perf_counter() - self.t0)
        self.log.step_tokens.append(self.tokens)
        self.log.steps_done = state.global_step
        self.pending = {f"trainmem/{k}": v for k, v in self._memory().items() if k in LOG_KEYS}

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if logs is None:
            return
        if "loss" in logs:
            self.log.losses.append(float(logs["loss"]))
        if self.pending:
            logs.update(self.pending)
            # Trainer.log appended its copy of `logs` to the history just before calling on_log.
            if state.log_history:
                state.log_history[-1].update(self.pending)
            self.pending = {}

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None,
                     train_dataloader: Any = None, **kwargs: Any) -> None:
        for h in self.hooks:
            h.remove()
        self.result = self._result(args, state, model, train_dataloader)
        if self.compare_estimate:
            self._compare()
        if self.out:
            self.result.append_to(self.out)
            if self.estimate is not None:
                self.estimate.append_to(self.out)

    def failed(self, err: BaseException, args: Any, state: Any, model: Any) -> Result:
        """Turn an exception raised out of `trainer.train()` into a result, as `trainmem run` does:
        status `oom` (with the phase and the allocation that failed) or `error` (with the traceback)."""
        import traceback

        if not hasattr(self, "probe"):  # it failed before training began: nothing was measured
            raise err
        if self.in_step and self.tracking:
            self.ledger.__exit__(None, None, None)
        self.in_step = False
        for h in self.hooks:
            h.remove()
        self.probe.close()
        self.result = self._result(args, state, model, None)
        if not isinstance(err, torch.OutOfMemoryError):
            self.result.status = "error"
            self.result.error = "".join(traceback.format_exception(err))
            return self.result
        self.result.status = "oom"
        self.result.oom = core.oom_record(err, self.probe, self.ledger)
        return self.result

    # --- the result ---------------------------------------------------------------------------
    def _live_state(self) -> StateBytes:
        return state_bytes(self.model, self.optimizer)

    def _memory(self) -> dict[str, int]:
        return core.read_memory(self.probe, self.ledger, self.device.type)

    def _result(self, args: Any, state: Any, model: Any, loader: Any) -> Result:
        from trainmem.measure.build import trainable_parameters

        dataset = getattr(loader, "dataset", None)
        more: dict[str, Any] = {"device": self.device.type, "steps": int(state.max_steps), "engine": self.engine}
        if self.seq_len:
            more["seq_len"] = self.seq_len
        if dataset is not None and hasattr(dataset, "__len__"):
            more["num_samples"] = len(dataset)
        self.setup = TrainSetup.from_training_arguments(args, model, **more)
        self.spec = self.spec or spec_of(model)
        trainable, total = trainable_parameters(model)
        log = self.log
        log.time_after_probes(self.probe_steps, len(log.step_times))
        result = core.new_result(self.spec, self.setup, core.environment(self.device.type, self.reader))
        result.model.update(trainable_parameters=trainable, loaded_parameters=total,
                            attention=getattr(model.config, "_attn_implementation", None))
        return core.finish(result, self.probe, self.ledger, log, self.device.type)

    def _compare(self) -> None:
        from trainmem.estimator import estimate

        assert self.result is not None
        self.estimate = estimate(self.spec, self.setup, self.method).to_result()
        measured, predicted = self.result.memory, self.estimate.memory
        self.relative_error = {k: predicted[k] / measured[k] - 1 for k in measured if measured[k] > 0}
        err = self.relative_error.get("peak_allocated")
        if err is not None:
            where = "a CUDA GPU; this run is on the CPU" if self.device.type == "cpu" else "this GPU"
            self.result.notes.append(f"trainmem estimate ({self.estimate.method}) of peak_allocated: "
                                     f"{err:+.1%} against the measurement (the estimate models {where})")


# --- `trainmem run --engine trainer` ------------------------------------------------------------

class _Samples(torch.utils.data.Dataset):
    """trainmem's samples as a map-style torch Dataset (no `datasets` dependency)."""

    def __init__(self, samples: list[dict[str, torch.Tensor]]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.samples[i]


def train_with_trainer(spec: ModelSpec, setup: TrainSetup, device: str, precision: str) -> Result:
    """The experiment of `trainmem run`, trained by `transformers.Trainer` and measured by MemoryCallback."""
    from transformers import Trainer

    from trainmem.measure.build import build_model
    from trainmem.measure.data import collate, load_dataset

    samples, pad_id = load_dataset(spec, setup)
    model = build_model(spec, setup, device, precision)
    callback = MemoryCallback(spec=spec, cap=setup.cap_bytes(precision))
    with tempfile.TemporaryDirectory(prefix="trainmem-trainer-") as tmp:
        args = setup.replace(device=device, precision=precision).to_training_arguments(
            tmp, report_to=[], logging_steps=1, save_strategy="no", disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=_Samples(samples),
                          data_collator=lambda batch: collate(batch, pad_id))
        result = train_measured(trainer, callback, setup.replace(device=device, precision=precision))
    if setup.lr_note():
        result.notes.append(setup.lr_note())
    return result


def train_measured(trainer: Any, callback: MemoryCallback, setup: TrainSetup) -> Result:
    """Train `trainer` (a Trainer or a subclass: TRL's SFTTrainer) under `callback`; an OOM or another failure is
    a result, as with the loop. `setup`: as resolved (device, precision), recorded in the row."""
    callback.attach(trainer)
    try:
        trainer.train()
    except Exception as e:
        callback.failed(e, trainer.args, trainer.state, trainer.model)
    assert callback.result is not None
    callback.result.setup = setup.to_dict()
    return callback.result
