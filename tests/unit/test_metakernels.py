"""The meta-kernel cache gives what the kernel gives, and runs the kernel wherever its outputs could differ."""

from __future__ import annotations

import torch

from trainmem.estimator.memory.metakernels import MetaKernels

aten = torch.ops.aten


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.shape, a.stride(), a.dtype, a.untyped_storage().nbytes()) == (
        b.shape, b.stride(), b.dtype, b.untyped_storage().nbytes())


def test_a_repeated_call_is_answered_from_the_cache_exactly() -> None:
    cache = MetaKernels()
    x = torch.empty((3, 5), device="meta", dtype=torch.bfloat16)
    w = torch.empty((7, 5), device="meta", dtype=torch.bfloat16).t()
    for _ in range(2):
        out = cache(aten.mm.default, (x, w), {})
        assert _same(out, aten.mm.default(x, w))
    assert cache.hits == 1
    stats = cache(aten.native_layer_norm.default, (x, [5], None, None, 1e-5), {})
    again = cache(aten.native_layer_norm.default, (x, [5], None, None, 1e-5), {})
    assert cache.hits == 2 and isinstance(again, tuple)
    assert all(_same(a, b) for a, b in zip(again, stats))


def test_the_key_tells_an_int_from_a_float_and_a_stride_from_another() -> None:
    cache = MetaKernels()
    ints = torch.empty((4,), device="meta", dtype=torch.long)
    assert cache(aten.add.Tensor, (ints, 1), {}).dtype == torch.long
    assert cache(aten.mul.Tensor, (ints, 2), {}).dtype == torch.long
    assert cache(aten.mul.Tensor, (ints, 2.0), {}).dtype == torch.float32  # 2 == 2.0, promoted apart
    x = torch.empty((4, 6), device="meta")
    assert cache(aten.exp.default, (x.t(),), {}).stride() == aten.exp.default(x.t()).stride() == (1, 6)
    assert cache(aten.exp.default, (x,), {}).stride() == (6, 1)


def test_views_and_writes_run_their_kernel() -> None:
    cache = MetaKernels()
    x = torch.empty((4, 6), device="meta")
    for _ in range(2):
        view = cache(aten.t.default, (x,), {})
        assert view.untyped_storage()._cdata == x.untyped_storage()._cdata  # an alias, not a fresh tensor
        assert cache(aten.add_.Tensor, (x, x), {}) is x
    assert cache.hits == 0
