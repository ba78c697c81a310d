"""Memory readers: what is live, by whom, and at the peak.

Two sources, used together:
- The CUDA caching allocator (`torch.cuda.memory_*`): authoritative allocated/reserved bytes and peaks
  on a GPU; `cudaMemGetInfo` for what the whole device uses (context and non-PyTorch memory included).
- A `TensorLedger`, a `TorchDispatchMode` that sees every tensor storage the training step creates and
  when it dies. It is the allocator on the CPU (where PyTorch keeps no statistics), splits the peak into
  weights, gradients, optimizer states, activations and other on both devices, and can enforce a memory
  cap on the CPU so that an OOM happens for real, at the allocation that crosses the cap.

`torch.distributed._tools.MemTracker` does a similar split but registers gradient hooks on every
parameter and fails on frozen ones (LoRA), hence this small ledger.
"""

from __future__ import annotations

import functools
import re
import resource
import weakref
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary


class CapExceeded(torch.OutOfMemoryError):
    """Raised by the ledger when a new storage would cross the memory cap (a real OOM on the CPU)."""

    def __init__(self, requested: int, live: int, cap: int):
        self.requested = requested
        super().__init__(f"memory cap of {cap} bytes exceeded: tried to allocate {requested} bytes "
                         f"with {live} bytes live")


def requested_bytes(err: BaseException) -> int | None:
    """The size of the allocation that failed, from our ledger or from PyTorch's CUDA OOM text."""
    if isinstance(err, CapExceeded):
        return err.requested
    m = re.search(r"Tried to allocate ([\d.]+) (GiB|MiB|KiB|B)", str(err))
    if not m:
        return None
    return int(float(m.group(1)) * {"GiB": 1024**3, "MiB": 1024**2, "KiB": 1024, "B": 1}[m.group(2)])


# --- bytes held by the model's own objects ------------------------------------------------------

def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor that holds this process's bytes: a DTensor's local shard (FSDP2 parameters, their
    gradients and optimizer states are DTensors; the wrapper itself has no storage of its own).
    Read without dispatching an operator, so the ledger sees nothing new."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


_META = torch.device("meta")
"""Compared whole: reading a device's `type` costs more than the rest of a storage's key together."""


def _unique_bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        t = local_tensor(t)  # DTensor: count the rank's shard, not the global size
        st = t.untyped_storage()
        # Meta storages (the estimator's simulation) all have address 0: tell them apart by identity,
        # which PyTorch keeps stable for a live storage.
        # Fake storages (the sharded simulation) have no address to read either.
        n = st.nbytes()
        key = (id(st) if st.device == _META or _is_fake(t) else st.data_ptr() or id(st), n)
        if key not in seen:
            seen.add(key)
            total += n
    return total


def members(model: torch.nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """`model.parameters()` and `model.buffers()`, the same tensors in the same order (each module once, each
    tensor once), from one walk over the modules' own dicts instead of three: the simulate method's ledger
    reads the model's states at every allocation of a backward and an optimizer step (`TensorLedger.splits`),
    thousands of times a step."""
    return _members_of(_walk(model))


def _walk(model: torch.nn.Module) -> list[torch.nn.Module]:
    """`model.modules()`: each module once, in the same order, without `named_modules`' nested generators."""
    out: list[torch.nn.Module] = []
    done: set[int] = set()
    stack = [model]
    while stack:
        m = stack.pop()
        if id(m) in done:
            continue
        done.add(id(m))
        out.append(m)
        stack.extend(c for c in reversed(m._modules.values()) if c is not None)
    return out


def _members_of(modules: Iterable[torch.nn.Module]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    params: list[torch.Tensor] = []
    buffers: list[torch.Tensor] = []
    seen: set[int] = set()  # the parameters'; buffers() keeps a memo of its own
    seen_buffers: set[int] = set()
    for m in modules:
        for v in m._parameters.values():
            if v is not None and id(v) not in seen:
                seen.add(id(v))
                params.append(v)
        for v in m._buffers.values():
            if v is not None and id(v) not in seen_buffers:
                seen_buffers.add(id(v))
                buffers.append(v)
    return params, buffers


class StateReader:
    """`state_bytes(model, optimizer)` for a ledger that reads it at every allocation of a step (the simulate
    method's `TensorLedger.splits`): the modules are walked once and again only where they may have changed (a
    new `epoch`: the ledger's phase; a module registered anywhere, which torch's global module-registration hook
    reports; another model), and each read takes the parameters and buffers from those modules' own dicts, so that
    a parameter set or swapped since (FSDP2's sharded and unsharded parameters) counts as it is now. The modules
    are held by weak references: a module dropped from the model is not kept alive by the reader. Used as a
    context, which installs and removes the hook."""

    def __init__(self) -> None:
        self._modules: list[weakref.ref] | None = None
        self._key: tuple[int, Any] | None = None
        self._hook: Any = None

    def __enter__(self) -> StateReader:
        from torch.nn.modules.module import register_module_module_registration_hook

        self._hook = register_module_module_registration_hook(self._forget)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hook.remove()
        self._modules = None

    def _forget(self, module: torch.nn.Module, name: str, value: Any) -> None:
        self._modules = None

    def __call__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, epoch: Any = None
                 ) -> StateBytes:
        return _state_bytes(model, optimizer, self._members(model, epoch))

    def gradient_bytes(self, model: torch.nn.Module, epoch: Any = None) -> int:
        """`gradient_bytes(model)` from the modules walked for this epoch (their parameters' `.grad` only)."""
        seen: set[int] = set()
        grads = []
        for m in self._walked(model, epoch):
            for v in m._parameters.values():
                if v is not None and id(v) not in seen:
                    seen.add(id(v))
                    if v.grad is not None:
                        grads.append(v.grad)
        return _unique_bytes(grads)

    def _members(self, model: torch.nn.Module, epoch: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return _members_of(self._walked(model, epoch))

    def _walked(self, model: torch.nn.Module, epoch: Any) -> list[torch.nn.Module]:
        key = (id(model), epoch)
        if self._modules is None or self._key != key:
            self._modules, self._key = [weakref.ref(m) for m in _walk(model)], key
        return [m for m in (ref() for ref in self._modules) if m is not None]


def weight_tensors(model: torch.nn.Module, found: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
                   ) -> list[torch.Tensor]:
    """Parameters, buffers, the quantization state of bitsandbytes 4-bit weights, and the partition a
    DeepSpeed ZeRO-3 rank keeps of each parameter (`ds_tensor`; the parameter itself is empty between gathers).
    `found`: the model's `members`, where the caller has them."""
    params, buffers = found or members(model)
    out: list[torch.Tensor] = params + buffers
    for p in params:
        part = getattr(p, "ds_tensor", None)
        if isinstance(part, torch.Tensor):
            out.append(part)
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            out += [t for t in (qs.absmax, qs.code) if isinstance(t, torch.Tensor)]
            nested = getattr(qs, "state2", None)
            if nested is not None:
                out += [t for t in (nested.absmax, nested.code) if isinstance(t, torch.Tensor)]
    return out


def gradient_tensors(model: torch.nn.Module, params: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """The `.grad` tensors that exist now (None after `zero_grad(set_to_none=True)`). `params`: the model's
    parameters, where the caller has them."""
    return [p.grad for p in (members(model)[0] if params is None else params) if p.grad is not None]


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor the optimizer keeps as state (Adam's moments, 8-bit quantization maps, step counters)."""
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


@dataclass
class StateBytes:
    """Bytes held by the training state itself (the seed's optimizer and gradient figures)."""

    weights: int
    gradients: int
    optimizer: int

    def to_dict(self) -> dict[str, int]:
        """The three figures by name, as the row's `model_states` holds them."""
        return asdict(self)


def _is_fake(t: torch.Tensor) -> bool:
    return isinstance(t, _fake_tensor())


@functools.cache
def _fake_tensor() -> type:
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor


def gradient_bytes(model: torch.nn.Module) -> int:
    """Bytes of the gradients live now, each storage counted once."""
    return _unique_bytes(gradient_tensors(model))


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> StateBytes:
    """Bytes of weights, gradients and optimizer states live now, each storage counted once (tied weights, views)."""
    return _state_bytes(model, optimizer, members(model))


def _state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                 found: tuple[list[torch.Tensor], list[torch.Tensor]]) -> StateBytes:
    return StateBytes(_unique_bytes(weight_tensors(model, found)), _unique_bytes(gradient_tensors(model, found[0])),
                      _unique_bytes(optimizer_tensors(optimizer)) if optimizer is not None else 0)


# --- the ledger ------------------------------------------------------------------------------------

EMPTY_CACHE = "empty_cache"
"""The key of a recorded event that releases the allocator's cached free segments."""
STREAM = "stream"
"""The key of a recorded event whose bytes name the stream later allocations are made on (0: the default)."""


class TensorLedger(TorchDispatchMode):
    """Counts live storage bytes created by operators, with peaks and a split of the peak.

    Storages are tagged with the phase that created them; those made in `forward` are the activations
    (tensors saved for backward, logits and loss). At each new peak the ledger asks `state` for the
    bytes of weights, gradients and optimizer states live at that moment; the rest of the peak is
    `other` (backward and optimizer temporaries, inputs, recomputation under checkpointing).
    """

    def __init__(self, state: Callable[[], StateBytes], cap: int | None = None):
        super().__init__()
        self._state = state
        self._seen: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.cap = cap
        self.phase = "other"
        self.live = 0
        self.by_tag: dict[str, int] = defaultdict(int)
        self.peak = 0
        self.phase_peak = 0
        self.peak_split: dict[str, int] = {}
        self.peak_phase = ""
        self._cached_state: StateBytes | None = None
        self.events: list[tuple[int, int]] | None = None
        """With `record()`: (storage key, bytes) per allocation and (key, -1) per free, in order, for the
        allocator replay (`trainmem.estimator.memory.allocator`)."""
        self.marks: dict[str, int] = {}
        """With `record()`: the index in `events` at which each phase first began (the replay repeats the
        last simulated step from there)."""
        self._keys = 0
        self.holds: list[int] = []
        """The event keys of `hold`'s allocations (the cuBLAS workspaces), which another card's step resizes
        (`estimator.memory.workspace`)."""
        self.gradients: Callable[[], int] | None = None
        """The bytes of the gradients alone, where cheaper than `state` (read at each peak in backward)."""
        self.splits: dict[int, tuple[int, int, int, int]] | None = None
        """With `record(splits=True)`: per allocation event, the (weights, gradients, optimizer, activations)
        bytes that the peak's split would hold were that allocation a new peak (`_snapshot`), so that a composed
        step (`estimator.memory.compose`) can split a peak its cut models did not reach."""
        self.kernels: Callable[[Any, tuple, Any], Iterable[int]] | None = None
        """The simulate method's model of CUDA kernels, called after each operator: returns the bytes the
        kernel allocates and frees inside itself, which no dispatch shows (each counted for that moment,
        after the outputs), and may `hold` what it keeps."""

    def record(self, splits: bool = False) -> TensorLedger:
        """Also keep every allocation and free in order (`events`), for the estimator's allocator replay;
        with `splits`, also the split of the live bytes a peak at each allocation would have (`splits`)."""
        self.events = []
        if splits:
            self.splits = {}
        return self

    def adopt(self, tensors: Iterable[torch.Tensor], tag: str = "state") -> None:
        """Count storages that existed before the ledger started (weights, optimizer states)."""
        for t in tensors:
            self._register(t, tag, check_cap=False)

    def hold(self, n: int, tag: str = "other") -> None:
        """Count an allocation no operator shows that stays for the rest of the run (the simulate
        method's cuBLAS workspaces, which a CUDA kernel allocates on its first call)."""
        self.holds.append(self._new_key(n))
        self._add(tag, n)

    def empty_cache(self) -> None:
        """Record a `torch.cuda.empty_cache()` for the allocator replay (peft calls it after its fp32 casts)."""
        if self.events is not None:
            self.events.append((EMPTY_CACHE, 0))

    def use_stream(self, stream: int) -> None:
        """Record that the next allocations are made on `stream` (0: the default; FSDP2's collectives
        allocate on streams of their own, whose blocks the caching allocator keeps apart)."""
        if self.events is not None:
            self.events.append((STREAM, stream))

    def set_phase(self, phase: str) -> None:
        """Name the phase that the next allocations belong to (those of a `forward` phase count as activations)."""
        if self.events is not None:
            self.marks.setdefault(phase, len(self.events))
        self.phase = phase
        self.phase_peak = self.live
        self._cached_state = None

    def _register(self, t: torch.Tensor, tag: str, check_cap: bool = True) -> None:
        t = local_tensor(t)  # a DTensor's bytes are its local shard's
        if t.is_sparse:
            return
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        if st in self._seen:
            return
        n = st.nbytes()
        if check_cap and self.cap is not None and self.live + n > self.cap:
            raise CapExceeded(n, self.live, self.cap)
        cell = [tag, n, self._new_key(n)]  # what this storage counts now; `resized` changes it
        self._seen[st] = cell
        weakref.finalize(st, self._free_cell, cell)
        self._add(tag, n)

    def _new_key(self, n: int) -> int:
        self._keys += 1
        if self.events is not None:
            self.events.append((self._keys, n))
        return self._keys

    def resized(self, t: torch.Tensor, tag: str = "gathered") -> None:
        """Re-read the size of `t`'s storage after an in-place resize no operator shows (FSDP2 frees a
        gathered layer by resizing its storage to zero); it counts under `tag` from now on."""
        st = local_tensor(t).untyped_storage()
        cell = self._seen.get(st)
        if cell is None:
            self._register(t, tag)
            return
        self._free_cell(cell)
        cell[0], cell[1] = tag, st.nbytes()
        cell[2] = self._new_key(cell[1])
        self._add(tag, cell[1])

    def _add(self, tag: str, n: int) -> None:
        self.live += n
        self.by_tag[tag] += n
        if self.live > self.phase_peak:
            self.phase_peak = self.live
        if self._cached_state is None:
            self._cached_state = self._state()
        if self.live > self.peak:
            self.peak = self.live
            self._snapshot()
        if self.splits is not None and self.events:
            s = self._states_now()
            self.splits[len(self.events) - 1] = (s.weights, s.gradients, s.optimizer, self.by_tag.get("forward", 0))

    def _free_cell(self, cell: list[Any]) -> None:
        if self.events is not None:
            self.events.append((cell[2], -1))
        self._free(cell[0], cell[1])

    def _free(self, tag: str, n: int) -> None:
        self.live -= n
        self.by_tag[tag] -= n

    def restart_peak(self) -> None:
        """Forget the peak so far: the next allocation starts a new one (an emulated QLoRA FSDP2 rank, whose
        whole model is loaded before it is sharded, does this once it is sharded)."""
        self.peak = self.phase_peak = self.live
        self.peak_split, self.peak_phase = {}, self.phase

    def _states_now(self) -> StateBytes:
        """The weights, gradients and optimizer states a peak now splits off: all read again in the optimizer
        step, the gradients again in backward, and the rest as the phase's first allocation found them (no
        forward or backward changes the weights or states, but FSDP2 swaps a gathered layer's parameters in,
        which count as temporaries)."""
        s = self._cached_state
        if s is None or self.phase.endswith("optimizer"):
            s = self._cached_state = self._state()
        elif self.phase.endswith("backward"):
            grads = self.gradients() if self.gradients is not None else self._state().gradients
            s = self._cached_state = StateBytes(s.weights, grads, s.optimizer)
        return s

    def _snapshot(self) -> None:
        s = self._states_now()
        activations = self.by_tag.get("forward", 0)
        other = self.peak - s.weights - s.gradients - s.optimizer - activations
        self.peak_split = {"weights": s.weights, "gradients": s.gradients, "optimizer": s.optimizer,
                           "activations": activations, "other": max(other, 0)}
        self.peak_phase = self.phase

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        tag = "forward" if self.phase.endswith("forward") else self.phase
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._register(t, tag)
        if self.kernels is not None:
            for n in self.kernels(func, args, out):
                key = self._new_key(n)
                self._add("other", n)
                self._free("other", n)
                if self.events is not None:
                    self.events.append((key, -1))
        return out


# --- device-level readers ---------------------------------------------------------------------------

def process_peak_rss() -> int:
    """Peak resident memory of this process in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class Reading:
    """One read of a memory reader: now and peak, allocated and reserved, and what the whole device uses."""
    allocated: int
    reserved: int
    peak_allocated: int
    peak_reserved: int
    device_used: int


class CudaReader:
    """The caching allocator's counters and the device's own use (`cudaMemGetInfo`)."""

    def __init__(self, device: torch.device):
        self.device = device
        torch.cuda.init()
        torch.cuda.synchronize(device)
        self.total = torch.cuda.get_device_properties(device).total_memory
        # What the device holds beyond PyTorch's reservations right after start: the CUDA context.
        self.context = self.device_used() - torch.cuda.memory_reserved(device)

    def device_used(self) -> int:
        """Bytes the whole device uses now (`cudaMemGetInfo`): context, reserved and other processes' memory."""
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free

    def reset_peak(self) -> None:
        """Start a new peak: the allocator's peak statistics restart from what is allocated now."""
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    def read(self) -> Reading:
        """The allocator's counters and peaks, after a synchronize so that queued kernels have allocated."""
        torch.cuda.synchronize(self.device)
        d = self.device
        return Reading(torch.cuda.memory_allocated(d), torch.cuda.memory_reserved(d),
                       torch.cuda.max_memory_allocated(d), torch.cuda.max_memory_reserved(d),
                       self.device_used())

    def cap(self, cap_bytes: int) -> None:
        """Let the allocator reserve at most `cap_bytes` on this device (a smaller card's OOM)."""
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / self.total), self.device)


class LedgerReader:
    """CPU: the ledger is the allocator (no caching, so reserved == allocated); RSS for the device."""

    def __init__(self, ledger: TensorLedger):
        self.ledger = ledger
        self.context = 0

    def reset_peak(self) -> None:
        """Start a new peak at what the ledger holds now."""
        self.ledger.phase_peak = self.ledger.live

    def read(self) -> Reading:
        """The ledger's live bytes and peak (allocated = reserved on the CPU) and the process's peak RSS."""
        lg = self.ledger
        return Reading(lg.live, lg.live, lg.phase_peak, lg.phase_peak, process_peak_rss())
