"""The in-place paths ATen takes only when no dispatch mode is on, put back for the simulation.

ATen skips some in-place shortcuts when a tensor is "subclass-like" (`at::isTensorSubclassLike`), and under any
Python dispatch mode every tensor is. The simulation runs under its TensorLedger, a dispatch mode, and so do the
steps `trainmem run` probes; a user's run has none. Two such shortcuts move memory in a training step:

- **Gradient accumulation in autograd's engine.** Where two gradients flow into one tensor (the residual
  stream, a tensor used twice, tied weights), the engine adds them in the consumer's InputBuffer
  (torch/csrc/autograd/input_buffer.cpp, `accumulate`): in place, `old.add_(new)`, when grad mode is off and
  the engine holds the only reference to the first gradient and to its storage, a dense plain tensor; out of
  place, `old + new` (one more buffer), otherwise.
- **The attention mask in the math SDPA path** (aten/src/ATen/native/transformers/attention.cpp): added to the
  scores in place, `attn.add_(mask)`, instead of into a new scores-sized buffer.

In H200 allocator traces of fp32 runs (docs/lab) a run's unprobed steps reserved one more
logits-sized segment than its probed ones. On the CPU, a training step under a plain dispatch mode allocates
the extra buffers of both, and with `InPlace` applied allocates what the step without a mode allocates
(tests/unit/test_inplace.py compares the two with the profiler).

`InPlace.watch` finds the engine's accumulations (each `add` between a node's post-hook and the next node's
pre-hook, hooks put on the graph before `backward`); `InPlace.math_attention` marks the math path's call.
References are counted as the engine counts them, less what the dispatch into Python adds, measured once
(`dispatch_counts`) on a graph whose accumulation is in place.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_ADD = torch.ops.aten.add.Tensor


def _counts(t: torch.Tensor) -> tuple[int, int]:
    """References to the tensor and to its storage, as seen from inside `__torch_dispatch__`."""
    return t._use_count(), torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: its elements fill its storage span in some order of the dimensions."""
    expected = 1
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True


class _EngineMarks:
    """Knows when autograd's engine is accumulating: `watch` hooks a graph's nodes before its `backward`."""

    def __init__(self) -> None:
        self.between = False
        """True after a node has returned its gradients and before the next node runs: the engine is adding
        them into the next nodes' buffers."""

    def watch(self, root: Any) -> None:
        """Hook every node of the graph below `root` (a loss's `grad_fn`), before its `backward`."""
        seen, stack = set(), [root]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            node.register_prehook(self._enter)
            if node.next_functions:  # not on AccumulateGrad: a post-hook changes when it steals a gradient
                node.register_hook(self._leave)
            stack.extend(n for n, _ in node.next_functions)

    def _enter(self, grad_outputs: Any) -> None:
        self.between = False

    def _leave(self, grad_inputs: Any, grad_outputs: Any) -> None:
        self.between = True


class InPlace(_EngineMarks):
    """Marks where ATen would add in place without a mode; `add` rewrites those calls, from inside a mode's
    `__torch_dispatch__`."""

    def __init__(self) -> None:
        super().__init__()
        self.in_math_attention = False
        self.enabled = True
        """Whether the adds are rewritten: a step run without a mode (`trainmem run`'s probed steps have one)."""
        self.sole = dispatch_counts()
        """`_counts` of a gradient only the engine holds."""

    @contextlib.contextmanager
    def math_attention(self) -> Iterator[None]:
        """Around a call of the math SDPA path, whose one `add` is the mask's."""
        self.in_math_attention = True
        try:
            yield
        finally:
            self.in_math_attention = False

    def add(self, func: Any, args: tuple) -> torch.Tensor | None:
        """The first operand, added to in place, where `func(*args)` is an `add` that ATen does in place
        without a mode; None where the operator should run as it is."""
        if not self.enabled or func is not _ADD or not all(isinstance(t, torch.Tensor) for t in args[:2]):
            return None
        old, new = args[0], args[1]
        if self.in_math_attention:
            return old.add_(new)
        if not self.between or torch.is_grad_enabled() or old.layout != torch.strided:
            return None
        if _counts(old) != self.sole or not _dense(old):
            return None
        return old.add_(new)


class _Sole(TorchDispatchMode):
    def __init__(self, watcher: _EngineMarks):
        super().__init__()
        self.watcher, self.seen = watcher, []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.watcher.between and func is _ADD:
            self.seen.append(_counts(args[0]))
        return func(*args, **(kwargs or {}))


@functools.cache
def dispatch_counts() -> tuple[int, int]:
    """`_counts` of a gradient that only the engine's buffer holds, seen from inside a dispatch mode: the two
    gradients of `x` in `x.exp() + x.exp()` are fresh products, the first held by the buffer alone."""
    from torch.utils._python_dispatch import _disable_current_modes

    watcher = _EngineMarks()
    with _disable_current_modes(), torch.enable_grad():
        x = torch.empty(4, device="meta", requires_grad=True)
        loss = (x.exp() + x.exp()).sum()
        watcher.watch(loss.grad_fn)
        with _Sole(watcher) as mode:
            loss.backward()
    if len(mode.seen) != 1:
        raise RuntimeError(f"trainmem: autograd accumulated {len(mode.seen)} times where it adds once; "
                           "this PyTorch's engine differs from the one trainmem's simulation knows")
    return mode.seen[0]
