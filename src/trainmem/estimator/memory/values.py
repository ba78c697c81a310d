"""The values a simulated step can know without storage: tensors filled with one constant.

A model's forward sometimes reads a tensor's value on the host (`.item()`, `bool(t)`, `x in t`): OPT, BioGPT,
the BART family and XLM ask whether an attention mask they made with `torch.ones` is all ones (transformers'
`_ignore_causal_mask_sdpa`); BERT-style models check whether the last input id is the pad token. Meta tensors
have no values, so such a forward stops. But the values these checks read are known: the dummy batch is all
zeros, and the masks are made with `ones`/`full`. `MetaValues` follows constant tensors through the operators
that keep them constant (views, casts, comparisons, reductions, scalar arithmetic) and answers `.item()` of
one; a value it does not know (a cumulative sum, a data-dependent index) raises `UnknownValue`, which the
estimate turns into a note and the analytic method.

    >>> import torch
    >>> with MetaValues():
    ...     mask = torch.ones((2, 8), dtype=torch.long, device="meta")
    ...     bool(mask.bool().all()), int(mask.sum())
    (True, 16)
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

_A = torch.ops.aten


class UnknownValue(RuntimeError):
    """A forward read a value that depends on data the simulation does not have."""


_SAME = {_A.view.default, _A._unsafe_view.default, _A.reshape.default, _A.slice.Tensor, _A.select.int,
         _A.expand.default, _A.unsqueeze.default, _A.squeeze.dim, _A.squeeze.dims, _A.squeeze.default,
         _A.permute.default, _A.transpose.int, _A.t.default, _A.alias.default, _A.detach.default,
         _A.clone.default, _A.index.Tensor, _A.index_select.default, _A.narrow.default, _A.as_strided.default,
         _A.repeat.default, _A.lift_fresh.default, _A.contiguous.default, _A.flatten.using_ints,
         _A.expand_as.default, _A.view_as.default, _A.unflatten.int, _A.repeat_interleave.self_int}
"""Operators whose output holds the values of their first input, rearranged."""

_COMPARE = {_A.eq: lambda a, b: a == b, _A.ne: lambda a, b: a != b, _A.lt: lambda a, b: a < b,
            _A.le: lambda a, b: a <= b, _A.gt: lambda a, b: a > b, _A.ge: lambda a, b: a >= b}
_ARITH = {_A.add: lambda a, b: a + b, _A.sub: lambda a, b: a - b, _A.mul: lambda a, b: a * b,
          _A.div: lambda a, b: a / b if b else math.nan, _A.rsub: lambda a, b: b - a,
          _A.logical_and: lambda a, b: bool(a) and bool(b), _A.logical_or: lambda a, b: bool(a) or bool(b),
          _A.bitwise_and: lambda a, b: a & b, _A.bitwise_or: lambda a, b: a | b}


class Uniform:
    """The values of `torch.rand`: somewhere in [0, 1). A comparison with a bound outside that range is known
    (OPT's layer drop, `torch.rand([]) < layerdrop` with `layerdrop=0.0`, is always False)."""

    low, high = 0.0, 1.0

    def compare(self, op: str, b: float) -> bool | None:
        if op in ("lt", "le"):
            return True if self.high <= b else False if self.low >= b else None
        if op in ("gt", "ge"):
            return True if self.low >= b and op == "ge" or self.low > b else False if self.high <= b else None
        return None


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, Uniform):
        return value
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point or dtype.is_complex:
        return float(value)
    return int(value)


class MetaValues(TorchDispatchMode):
    """Follows tensors of one constant value through a meta-device step (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.known: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def mark(self, tensor: torch.Tensor, value: Any) -> torch.Tensor:
        """Record that every element of `tensor` (made outside this mode, e.g. the dummy batch) is `value`."""
        self.known[tensor] = _cast(value, tensor.dtype)
        return tensor

    def _value(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return self.known.get(x, None)
        return x if isinstance(x, (bool, int, float)) else None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is _A._local_scalar_dense.default and args[0].is_meta:
            value = self._value(args[0])
            if value is None or isinstance(value, Uniform):
                raise UnknownValue("the model's forward reads a value that depends on its data "
                                   f"(`.item()` of a {tuple(args[0].shape)} tensor), which the meta device cannot know")
            return value
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            value = self._rule(func, args, kwargs, out)
            if value is not None:
                self.known[out] = _cast(value, out.dtype)
        return out

    def _rule(self, func: Any, args: tuple, kwargs: dict, out: torch.Tensor) -> Any:
        packet, name = func.overloadpacket, func.overloadpacket.__name__
        if name in ("ones", "ones_like", "new_ones"):
            return 1
        if name in ("zeros", "zeros_like", "new_zeros", "zero_"):
            return 0
        if name in ("full", "new_full", "full_like", "fill_", "fill"):
            value = kwargs.get("fill_value", args[1] if name in ("full", "full_like", "fill_", "fill") else args[2])
            return self._value(value)
        if name == "scalar_tensor":
            return args[0]
        if name in ("rand", "rand_like") or name == "uniform_" and args[1:3] in ((), (0.0, 1.0)):
            return Uniform()
        if func in _SAME or name in ("_to_copy", "to"):
            return self._value(args[0])
        if packet in _COMPARE or packet in _ARITH:
            a, b = self._value(args[0]), self._value(args[1]) if len(args) > 1 else None
            if isinstance(a, Uniform) and isinstance(b, (int, float)) and packet in _COMPARE:
                return a.compare(name, b)
            if a is None or b is None or isinstance(a, Uniform) or isinstance(b, Uniform):
                return None
            return (_COMPARE.get(packet) or _ARITH[packet])(a, b)
        if name in ("logical_not", "bitwise_not"):
            a = self._value(args[0])
            return None if a is None else (not a if isinstance(a, bool) or out.dtype == torch.bool else ~a)
        if name == "neg":
            a = self._value(args[0])
            return None if a is None else -a
        if name in ("all", "any"):
            a = self._value(args[0])
            return None if a is None or (name == "any" and args[0].numel() == 0) else bool(a)
        if name in ("amax", "amin", "max", "min") and len(args) == 1 or name in ("amax", "amin"):
            return self._value(args[0])
        if name == "sum":
            a = self._value(args[0])
            return None if a is None else a * (args[0].numel() // max(out.numel(), 1))
        return None


__all__ = ["MetaValues", "UnknownValue"]
