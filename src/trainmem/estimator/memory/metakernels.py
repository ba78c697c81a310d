"""Meta kernels answered from a cache: an operator that makes new tensors from others gives outputs of the same
shapes, strides and dtypes whenever its inputs have the same, so each distinct call runs its meta kernel once.

    >>> import torch
    >>> cache = MetaKernels()
    >>> x = torch.empty((4, 8), device="meta")
    >>> a = cache(torch.ops.aten.mul.Tensor, (x, x), {})
    >>> b = cache(torch.ops.aten.mul.Tensor, (x, x), {})
    >>> (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype), cache.hits
    (True, 1)

A simulated step runs tens of thousands of operators on the meta device, most of them in decoder layers alike,
and a meta kernel is Python (torch._refs, torch._meta_registrations), about a third of a millisecond each: the
step's time was mostly theirs. FakeTensorMode keeps such a cache for the same reason
(torch/_subclasses/fake_tensor.py, `_dispatch_impl`'s `_cached_dispatch_impl`).

Only calls whose outputs cannot depend on anything the key leaves out are cached: operators whose schema writes no
argument and returns fresh tensors (no alias annotation), called on plain strided meta tensors; the key is the
operator, each tensor's (shape, stride, storage offset, dtype) and every other argument with its type (1 and 1.0
promote differently). An output is made again as `torch.empty_strided` only where that reproduces it exactly
(storage bytes included, which the ledger counts); a call whose output it cannot reproduce runs its kernel every time.
"""

from __future__ import annotations

from typing import Any

import torch

_UNCACHEABLE = object()


def _fresh(func: Any) -> bool:
    """Whether `func`'s schema writes no argument and returns only new tensors."""
    schema = func._schema
    if any(a.alias_info is not None for a in schema.arguments):
        return False
    return bool(schema.returns) and all(r.alias_info is None and str(r.type) == "Tensor" for r in schema.returns)


def _key(x: Any) -> Any:
    """A hashable description of an argument, or raises TypeError for one the cache does not take."""
    if isinstance(x, torch.Tensor):
        if x.device.type != "meta" or x.layout != torch.strided or type(x) not in (torch.Tensor, torch.nn.Parameter):
            raise TypeError
        return (x.shape, x.stride(), x.storage_offset(), x.dtype)
    if isinstance(x, (list, tuple)):
        return (type(x), *map(_key, x))
    if x is None or isinstance(x, (bool, int, float, str, torch.dtype, torch.device, torch.memory_format,
                                   torch.layout)):
        return (type(x), x)
    raise TypeError


def _remake(out: Any) -> Any:
    """How to make `out` (a tensor or tuple of tensors) again, or _UNCACHEABLE where empty_strided would not."""
    outs = out if isinstance(out, tuple) else (out,)
    made = []
    for t in outs:
        if (not isinstance(t, torch.Tensor) or type(t) is not torch.Tensor or t.layout != torch.strided
                or t.device.type != "meta" or t.storage_offset() != 0 or t.is_conj() or t.is_neg()):
            return _UNCACHEABLE
        again = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        if again.untyped_storage().nbytes() != t.untyped_storage().nbytes():
            return _UNCACHEABLE
        made.append((tuple(t.shape), t.stride(), t.dtype))
    return (isinstance(out, tuple), tuple(made))


class MetaKernels:
    """`func(*args, **kwargs)` on meta tensors, each distinct call's meta kernel run once (module docstring)."""

    def __init__(self) -> None:
        self.cache: dict[Any, Any] = {}
        self.fresh: dict[Any, bool] = {}
        self.hits = 0

    def __call__(self, func: Any, args: tuple, kwargs: dict) -> Any:
        fresh = self.fresh.get(func)
        if fresh is None:
            fresh = self.fresh[func] = isinstance(func, torch._ops.OpOverload) and _fresh(func)
        if not fresh:
            return func(*args, **kwargs)
        try:
            key = (func, _key(args), _key(tuple(kwargs.items())) if kwargs else ())
        except TypeError:
            return func(*args, **kwargs)
        how = self.cache.get(key)
        if how is None:
            out = func(*args, **kwargs)
            inputs = {t.untyped_storage()._cdata for t in _tensors(args, kwargs)}
            how = _remake(out)
            if how is not _UNCACHEABLE:
                outs = out if isinstance(out, tuple) else (out,)
                storages = {t.untyped_storage()._cdata for t in outs}
                if len(storages) != len(outs) or storages & inputs:
                    how = _UNCACHEABLE
            self.cache[key] = how
            return out
        if how is _UNCACHEABLE:
            return func(*args, **kwargs)
        self.hits += 1
        is_tuple, made = how
        outs = tuple(torch.empty_strided(shape, stride, dtype=dtype, device="meta") for shape, stride, dtype in made)
        return outs if is_tuple else outs[0]


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    out = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(t for t in a if isinstance(t, torch.Tensor))
    return out


__all__ = ["MetaKernels"]
