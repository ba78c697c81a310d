"""The values a simulated step reads on the host: a CPU twin of every tensor made from the batch alone (masks,
positions, lengths), so that where the model reads one (`.item()`, `bool()`, `nonzero`, `.tolist()`, `.cpu()`) it
gets what the GPU run would give.

    >>> import torch
    >>> ids = torch.zeros((2, 8), dtype=torch.long, device="meta")
    >>> with HostValues() as host:
    ...     host.give(ids, torch.zeros((2, 8), dtype=torch.long))
    ...     mask = torch.ones((2, 8), dtype=torch.long, device="meta")
    ...     bool(mask.bool().all()), int((ids == 0).sum())
    (True, 16)

Meta tensors hold no values, so a forward that reads one on the host stops there. transformers does so in a few
places whose values depend on the batch only, which the simulation knows (its dummy batch is all zeros): masking
`_ignore_causal_mask_sdpa` asks whether the padding mask it made with `torch.ones` is all ones (OPT, BioGPT, the
BART family), XLM takes the longest length with `.item()`, Qwen4-Exp's sparse-attention indexer `nonzero`s the
causal mask per query. A twin computed beside each meta operator, on the CPU with every dispatch mode off (the
ledger counts none of it), answers those exactly, wherever the next transformers release adds such a read.

One assumption covers the MoE blocks that copy per-expert token counts to the host (JetMoE's `.tolist()`,
Aria's `.cpu()`, LongCat-Flash's `nonzero` of the hit experts): a router's `topk` over logits no twin holds gets
balanced indices (`_route`: row r takes experts (r*k + j) mod n), from which the counts follow. `balanced` says
whether a host read used it, so that the estimate states it. transformers' grouped experts (3-D expert weights,
`grouped_mm`) read nothing on the host: their memory does not depend on the routing, and no assumption is made.

Known limitations: twins are kept for tensors of at most `LIMIT` elements (batch-sized data; activations depend
on weights and never get one); a value that depends on weights in any other way (BLT's entropy patching) has no
twin, and its read raises `UnknownValue`, which the estimate turns into a note and the analytic method.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

from .metakernels import MetaKernels

LIMIT = 1 << 20
"""Largest tensor (elements) given a twin: a batch of 128 x 8192 token ids and what is made from it (1M int64
elements, 8 MB on the CPU); a (batch, 1, s, s) mask beyond it gets none (no read of one has been seen)."""

aten = torch.ops.aten

_READS = {aten._local_scalar_dense.default: "`.item()`", aten.nonzero.default: "`nonzero`",
          aten.equal.default: "`torch.equal`", aten.is_nonzero.default: "`bool()`"}
"""Operators that read values on the host (and `_to_copy` to the CPU: `.cpu()`, `.tolist()`)."""


class UnknownValue(RuntimeError):
    """A forward read a value that depends on data the simulation does not have."""


class HostValues(TorchDispatchMode):
    """CPU twins of the batch's meta tensors (see the module docstring); enter it inside the ledger."""

    def __init__(self) -> None:
        super().__init__()
        self.twins: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.routed: WeakIdKeyDictionary = WeakIdKeyDictionary()
        """Meta tensors whose twin follows from the balanced-routing assumption (`_route`)."""
        self.balanced = False
        """Whether a host read answered from the balanced-routing assumption."""
        self.kernels = MetaKernels()
        """The meta kernels of the operators no twin follows, each distinct call run once (`metakernels`)."""

    def give(self, meta: torch.Tensor, values: torch.Tensor) -> None:
        """`values` (on the CPU) are what `meta` holds (the dummy batch)."""
        self.twins[meta] = values

    def _twin(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == "meta":
            return self.twins[x]
        if isinstance(x, torch.device) and x.type == "meta":
            return torch.device("cpu")
        return x

    def _route(self, args: tuple, kwargs: dict, out: Any) -> None:
        """The indices of a top-k over values no twin holds (an MoE router's logits): balanced routing, row r
        taking columns (r*k + j) mod n for j < k, so that each expert gets the same share of the tokens."""
        x, k = args[0], args[1]
        dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
        indices = out[1]
        if x.dim() == 0 or dim not in (-1, x.dim() - 1) or indices.numel() > LIMIT:
            return
        with _disable_current_modes():
            rows = indices.numel() // max(k, 1)
            twin = ((torch.arange(rows)[:, None] * k + torch.arange(k)) % x.shape[-1]).reshape(indices.shape)
        self.twins[indices] = twin
        self.routed[indices] = True

    def _read(self, func: Any, args: tuple, kwargs: dict, metas: list[torch.Tensor]) -> Any:
        """A host read of meta tensors, answered from their twins."""
        if any(t in self.routed for t in metas):
            self.balanced = True
        if func is aten._local_scalar_dense.default:
            return self.twins[args[0]].item()
        if func is aten._to_copy.default:
            return self.twins[args[0]].to(dtype=kwargs.get("dtype") or args[0].dtype, copy=True)
        with _disable_current_modes():
            value = func(*tree_map(self._twin, args), **tree_map(self._twin, kwargs))
        if not isinstance(value, torch.Tensor):
            return value
        out = torch.empty(value.shape, dtype=value.dtype, device="meta")  # counted by the ledger
        self.twins[out] = value
        if any(t in self.routed for t in metas):
            self.routed[out] = True
        return out

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        metas = _metas(args, kwargs)
        known = all(t in self.twins for t in metas)
        to_host = (func is aten._to_copy.default and kwargs.get("device") is not None
                   and torch.device(kwargs["device"]).type == "cpu")
        if metas and (func in _READS or to_host):
            if not known:
                what = _READS.get(func, "a copy to the host")
                raise UnknownValue(f"the model's forward reads a value that depends on its data ({what} of a "
                                   f"{tuple(metas[0].shape)} tensor), which the meta device cannot know")
            return self._read(func, args, kwargs, metas)
        if not known:  # most operators of a step: they read weights or activations
            if func is aten.topk.default:
                out = func(*args, **kwargs)
                self._route(args, kwargs, out)
            elif any(t in self.twins for t in metas):  # a twinned tensor written from unknown values: stale
                out = func(*args, **kwargs)
                self._forget(func, args, out)
            else:  # no value to follow: only the outputs' shapes matter, which the cache knows
                out = self.kernels(func, args, kwargs)
            return out
        out = func(*args, **kwargs)
        made = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and _is_meta(t)]
        values = None
        if made and all(t.numel() <= LIMIT for t in made):
            try:
                with _disable_current_modes():
                    values = func(*tree_map(self._twin, args), **tree_map(self._twin, kwargs))
            except Exception:  # an operator the CPU does not take as called for CUDA (histc of ints): no twin
                values = None
        if values is None:
            self._forget(func, args, out)
            return out
        routed = any(t in self.routed for t in metas)
        for t, v in zip(made, tree_flatten(values)[0]):
            if isinstance(v, torch.Tensor):
                self.twins[t] = v
                if routed:
                    self.routed[t] = True
        return out

    def _forget(self, func: Any, args: tuple, out: Any) -> None:
        """Drop the twins of what `func` made or wrote without a twin of its own: they are stale."""
        written = [a for a, s in zip(args, func._schema.arguments)
                   if s.alias_info is not None and s.alias_info.is_write and isinstance(a, torch.Tensor)]
        for t in written + [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]:
            self.twins.pop(t, None)
            self.routed.pop(t, None)


def _metas(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The meta tensors among an operator's arguments (in lists too: the foreach operators'), without a pytree
    walk: this runs for every operator of a simulated step."""
    out = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            if _is_meta(a):
                out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(t for t in a if isinstance(t, torch.Tensor) and _is_meta(t))
    return out


def _is_meta(t: torch.Tensor) -> bool:
    """`t.is_meta`, read from a fake tensor's own field: asked of a FakeTensor (a sharded simulation's every
    tensor), `is_meta` and `device` are operators dispatched to its mode, a few microseconds each."""
    return t.fake_device.type == "meta" if type(t) is FakeTensor else t.is_meta


ROUTING_BALANCED = ("routing: tokens spread evenly over the experts (balanced), an assumption: the model copies "
                    "its per-expert token counts to the host, which the meta device cannot know from the router's "
                    "weights; a skewed router can need more for its busiest expert")
"""The estimate's note where a host read answered from `_route`."""

ROUTING_FREE = ("routing: memory does not depend on it (transformers' grouped experts: every token-expert pair is "
                "one row of the grouped product)")
"""The estimate's note on a model with 3-D expert weights that needed no routing assumption."""

__all__ = ["HostValues", "UnknownValue", "ROUTING_BALANCED", "ROUTING_FREE", "LIMIT"]
