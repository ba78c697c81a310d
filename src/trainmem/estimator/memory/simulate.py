"""The simulate method: the real Hugging Face model's training step on the meta device, tracked by the
same TensorLedger that `trainmem run` uses, so every tensor a forward, backward and optimizer step creates
is counted with no storage and no GPU.

CUDA-specific choices are modelled explicitly, because the meta device would otherwise take CPU paths:
- `standins.cuda_choices`: SDPA with the fused kernels' memory, dropout's 1-byte mask, MoE experts'
  grouped_mm in any dtype, and the values a forward reads on the host;
- AdamW runs with `foreach=True`, the CUDA default, whose temporaries are part of the step peak;
- each cuBLAS handle allocates its workspace on its first matrix product: the forward thread's in the
  first forward, autograd's in the first backward.
The ledger records every allocation and free in order, from the model's construction on (a tied output
head is allocated and freed there, as on the GPU), so that `allocator.replay` can turn the run into the
caching allocator's reserved bytes as a fresh `trainmem run` process would see them.
bitsandbytes has no meta kernels: `quantized.py` holds stand-ins with its allocations (QLoRA's 4-bit
load and layers, 8-bit AdamW). Autocast (`amp-*`), which meta tensors do not take, runs through
`autocast.CudaAutocast`, CUDA's cast policy applied by a function mode around each forward.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor

from trainmem.config.optimizers import OPTIMIZERS
from trainmem.config.setup import TrainSetup
from trainmem.config.specs import ModelSpec
from trainmem.hardware import cuda
from trainmem.hardware.gpus import GPU
from trainmem.measure.accumulation import micro_batch_loss
from trainmem.measure.ledger import StateBytes, StateReader, TensorLedger, gradient_bytes, state_bytes
from trainmem.measure.train import PROBE_STEPS

from . import autocast, liger, mamba, quantized, states, trlhead
from .inplace import InPlace
from .standins import cuda_choices

_DEVICE = torch.ops.prim.device.default
_MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
            torch.ops.aten.baddbmm.default}


class CudaKernels:
    """What CUDA kernels allocate that no dispatch shows, seen in H200 allocator traces (torch 2.11):
    - temporaries: the embedding backward's fp32 per-segment partial sums, (n // 10 + min(n, vocabulary))
      rows of the hidden size for n token ids; the fp32 softmax backward over attention probabilities
      (4-D: the math SDPA path, eager attention) allocates one more buffer of its output's size, freed
      before it returns (H200 trace of mistral-7b QLoRA b4 s2048, docs/lab: four 2 GiB buffers live at
      the peak where the meta decomposition has three);
    - the math SDPA path's `_safe_softmax` (one operator to a dispatch mode) allocates, after its output, a
      boolean copy of its input's `== -inf` test and the per-row reduction of it, freed before it returns
      (H200 trace of llama-3.2-3b QLoRA b4 s2496, docs/lab: a 570 MiB block per layer beside the 2.2 GiB
      probabilities, which the meta run lacked);
    - each cuBLAS handle's workspace (`cuda.cublas_workspace`, `cuda.CUBLAS_HANDLES`), held from the
      handle's first matrix product on: the forward thread's and autograd's backward thread's."""

    def __init__(self, ledger: TensorLedger, workspace: int = cuda.cublas_workspace((9, 0))):
        self.ledger = ledger
        self.workspace = workspace
        self.handles: set[str] = set()

    def __call__(self, func: Any, args: tuple, out: Any) -> list[int]:
        if func in _MATMULS:
            thread = "backward" if self.ledger.phase.endswith("backward") else "forward"
            if thread not in self.handles:
                self.handles.add(thread)
                self.ledger.hold(self.workspace)
        if func is torch.ops.aten._softmax_backward_data.default and out.dim() == 4 and out.dtype == torch.float32:
            return [out.untyped_storage().nbytes()]
        if func is torch.ops.aten._safe_softmax.default:
            return [out.numel(), out.numel() // max(out.shape[-1], 1)]
        if func is torch.ops.aten.embedding_dense_backward.default:
            grad, indices, num_weights = args[0], args[1], args[2]
            n = indices.numel()
            return [4 * (n // 10 + min(n, num_weights)) * grad.shape[-1]]
        return []


class GradientWatch:
    """The bytes of the model's live gradients for the ledger's backward splits (`TensorLedger.gradients`), read
    again only where they may have changed: after autograd accumulated into a parameter's `.grad` (its
    post-accumulate hook) or in a new phase (the optimizer's `zero_grad` drops them). A backward makes thousands of
    allocations and accumulates a few hundred gradients; walking the model at each allocation cost a fifth of a
    simulation."""

    def __init__(self, ledger: TensorLedger, held: dict[str, Any]):
        self.ledger, self.held = ledger, held
        self.value, self.read_in, self.dirty = 0, None, True

    def watch(self, params: list[torch.Tensor]) -> None:
        for p in params:
            p.register_post_accumulate_grad_hook(self._touch)

    def _touch(self, param: torch.Tensor) -> None:
        self.dirty = True

    def __call__(self) -> int:
        if self.held["model"] is None:
            return 0
        if self.dirty or self.read_in != self.ledger.phase:
            self.value, self.read_in, self.dirty = gradient_bytes(self.held["model"]), self.ledger.phase, False
        return self.value


STEPS = 3
"""Optimizer steps simulated: the states appear in the first, the second is the first steady one, and the
third starts from the blocks the second left, as `trainmem run`'s default three steps do. Two are not
enough: a Qwen3 amp-fp16 run emulating a T4 ran out of memory in its third step (docs/lab), which a replay
of two steps cannot show. The first `train.PROBE_STEPS` run ATen's in-place adds out of place,
as `trainmem run`'s probed steps do; the later ones, which the replay repeats, in place, as a user's run does
(`inplace`)."""


class SimulatedLedger(TensorLedger):
    """The recording ledger with the in-place adds its own dispatch mode would turn off put back (`inplace`)."""

    def __init__(self, state: Callable[[], StateBytes]):
        super().__init__(state)
        self.inplace = InPlace()
        self.balanced_routing = False
        """Whether the step's host reads needed the balanced-routing assumption (`hostvalues.ROUTING_BALANCED`)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is _DEVICE and type(args[0]) is FakeTensor:
            # a fake tensor's `device`, which C++ asks of it as an operator: over half of a sharded step's
            # dispatches (autograd's engine asks of every tensor it meets); answered as FakeTensorMode answers
            # it, with no tensor made, instead of through the ledger's and HostValues' modes
            return args[0].fake_device
        done = self.inplace.add(func, args)
        return done if done is not None else super().__torch_dispatch__(func, types, args, kwargs)


def model_builder(spec: ModelSpec, setup: TrainSetup, precision: str, card: GPU) -> Callable[[TensorLedger], Any]:
    """How simulate builds the model, recorded as `trainmem run` builds it on the GPU: constructed on the
    device; under QLoRA constructed, saved and freed unrecorded (`build.build_model` empties the cache and
    resets the peaks after it), then loaded 4-bit, cast by peft, cache emptied, adapters added."""
    if setup.peft != "qlora":
        return lambda ledger: states.meta_model(spec, setup, precision)
    from trainmem.measure.build import AUTOCAST_DTYPES, WEIGHT_DTYPES, lora_config

    base = states.meta_model(spec, setup.replace(peft="none"), precision)  # built before recording starts
    dtype = WEIGHT_DTYPES[precision]
    compute = dtype if dtype != torch.float32 else AUTOCAST_DTYPES.get(precision, torch.float32)
    return lambda ledger: quantized.qlora_model(base, lora_config(setup, spec), compute, ledger, card.capacity)


def train_mode(model: Any, setup: TrainSetup, amp: torch.dtype | None) -> None:
    """Training mode as `trainmem run` sets it: checkpointing non-reentrant where asked (its recompute under
    the forward's autocast), dropout on."""
    if setup.checkpointing:
        kwargs: dict[str, Any] = {"use_reentrant": False}
        if amp is not None:
            kwargs["context_fn"] = autocast.recompute_context(amp)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.train()


def steady_start(ledger: TensorLedger) -> int | None:
    """Where in a recording ledger's events the last simulated step begins: the steady step the allocator
    replay repeats (`allocator.replay_steps`)."""
    return ledger.marks.get(f"step{STEPS}.micro1.forward")


def simulate_step(build: Callable[[TensorLedger], Any], setup: TrainSetup,
                  precision: str | None = None,
                  workspace: int = cuda.cublas_workspace((9, 0)),
                  flash: bool = True, device: str = "meta",
                  follow: Callable[[TensorLedger], Any] | None = None,
                  sms: int = 132, splits: bool = False) -> tuple[TensorLedger, StateBytes]:
    """Build the model with `build` (on the meta device, given the ledger for what no operator shows),
    then `STEPS` optimizer steps (states appear in the first) of the setup's accumulation, all under one
    recording ledger. Under `amp-*` each forward (loss included, as `train.train` does) runs in an
    autocast region. `workspace`: bytes per cuBLAS handle; `flash`: the card has the flash kernel; `sms`: its
    SMs (the rows of Liger's RMSNorm partial weight gradients under `--kernels liger`, `liger.patched`);
    `splits`: the ledger also keeps each allocation's split (`TensorLedger.splits`, for `compose`). A
    sharded simulation (`sharded.py`) passes `device="cpu"` (fake CPU tensors) and `follow`, the context
    that routes FSDP2's storage resizes through the ledger."""
    from trainmem.measure.build import AUTOCAST_DTYPES

    amp = AUTOCAST_DTYPES.get(precision or setup.precision)

    held: dict[str, Any] = {"model": None, "optimizer": None}
    reader = StateReader()  # read at every allocation of a backward and an optimizer step where `splits`

    def states() -> StateBytes:
        if held["model"] is None:
            return StateBytes(0, 0, 0)
        return reader(held["model"], held["optimizer"], ledger.phase)

    ledger = SimulatedLedger(states).record(splits)  # events for the allocator replay
    # FSDP2 sets its sharded gradients itself, which no autograd hook reports: read at every allocation there
    ledger.gradients = (GradientWatch(ledger, held) if follow is None else
                        lambda: reader.gradient_bytes(held["model"], ledger.phase) if held["model"] is not None else 0)
    ledger.kernels = CudaKernels(ledger, workspace)
    ledger.set_phase("build")
    with contextlib.ExitStack() as stack:
        stack.enter_context(reader)
        if follow is not None:
            stack.enter_context(follow(ledger))
        return _steps(build, setup, amp, ledger, device, held, flash, sms)


def _steps(build: Callable[[TensorLedger], Any], setup: TrainSetup, amp: Any, ledger: SimulatedLedger,
           device: str, held: dict[str, Any], flash: bool, sms: int) -> tuple[TensorLedger, StateBytes]:
    from trainmem.measure.build import build_optimizer

    with ledger:
        held["model"] = model = build(ledger)
    ledger.adopt(list(model.parameters()) + list(model.buffers()))  # any the build did not create itself
    train_mode(model, setup, amp)
    params = [p for p in model.parameters() if p.requires_grad]
    if isinstance(ledger.gradients, GradientWatch):
        ledger.gradients.watch(params)
    row = OPTIMIZERS[setup.optimizer]
    if row.meta_foreach is not None:
        # foreach is the CUDA default for AdamW; the fused kernel has no meta implementation and, like a
        # per-tensor loop, no step temporaries beyond one tensor's
        optimizer = torch.optim.AdamW(params, lr=setup.lr, foreach=row.meta_foreach)
    elif row.eight_bit:
        optimizer = quantized.AdamW8bit(params, lr=setup.lr, paged=row.paged)
    else:
        optimizer = build_optimizer(model, setup)
    held["optimizer"] = optimizer
    ids = torch.zeros((setup.batch_size, setup.seq_len), dtype=torch.long, device=device)
    batch = {"input_ids": ids, "labels": ids}
    tokens = setup.grad_accum * setup.batch_size * (setup.seq_len - 1)
    final = StateBytes(0, 0, 0)
    sft = setup.engine == "sft"  # TRL's fused LM head; under Liger's kernels too, whose fused loss TRL turns off
    kernels = liger.patched(model, sms, loss=not sft) if setup.kernels == "liger" else contextlib.nullcontext()
    head = trlhead.patched(model) if sft else contextlib.nullcontext()
    mixers = mamba.patched(model, sms) if setup.mamba_path == "kernels" else contextlib.nullcontext()
    with cuda_choices(setup.attention, flash, ledger.inplace, zeros=(ids,), sms=sms) as host, kernels, head, mixers, \
            ledger:
        for step in range(1, STEPS + 1):
            ledger.inplace.enabled = step > PROBE_STEPS
            for k in range(1, setup.grad_accum + 1):
                ledger.set_phase(f"step{step}.micro{k}.forward")
                with autocast.region(amp):
                    loss = micro_batch_loss(model, batch, tokens)
                ledger.set_phase(f"step{step}.micro{k}.backward")
                if ledger.inplace.enabled:
                    ledger.inplace.watch(loss.grad_fn)
                loss.backward()
                del loss
            ledger.set_phase(f"step{step}.optimizer")
            optimizer.step()
            final = state_bytes(model, optimizer)
            optimizer.zero_grad(set_to_none=True)
    ledger.balanced_routing = host.balanced
    return ledger, final
