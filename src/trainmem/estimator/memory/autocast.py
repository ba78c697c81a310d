"""CUDA autocast on the meta device, for the simulate method.

Autocast is a dispatcher key of real CUDA (and CPU) tensors; meta tensors take neither path, so a
simulated `amp-*` step would run everything in fp32. `CudaAutocast` is a `TorchFunctionMode` that
applies CUDA autocast's cast policy itself, above autograd as the real key sits, so the casts are
recorded by autograd and the half copies are what matmuls save for backward:

- the op lists are CUDA's in PyTorch's `aten/src/ATen/autocast_mode.h` (AT_FORALL_LOWER_PRECISION_FP,
  AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE, AT_FORALL_PROMOTE; the same lists in torch 2.5-2.13),
  matched by the Python function's name (`F.linear` and `Tensor.__matmul__` reach `aten::linear` and
  `aten::matmul`); composite Python functions whose first aten op is in a list take that op's policy
  (`cross_entropy` starts with `log_softmax`, which runs in fp32);
- `cached_cast`'s weight cache (autocast_mode.cpp): a lower-precision cast of an fp32 leaf that requires
  grad (a trainable parameter) is made once per autocast region and held until the region ends, so every
  trainable matmul weight has a half copy alive until the end of forward, also under checkpointing,
  where nothing else keeps it; frozen weights (LoRA's base) are cast at each use and live only as long
  as autograd saves them.

Gradient checkpointing recomputes each layer in backward under the autocast state of its forward, with
a fresh cache (`torch.utils.checkpoint` re-enters `torch.autocast`): `recompute_context` gives
`checkpoint` that context. GradScaler (amp-fp16) is not simulated: it scales the loss and unscales the
gradients in place, a few scalars.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

LOWER_PRECISION = frozenset({
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "__matmul__",
    "__rmatmul__", "einsum", "mm", "mv", "vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
    "multi_dot", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "scaled_dot_product_attention",
})
FP32 = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow", "__pow__", "__rpow__", "softplus", "layer_norm", "group_norm",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "hinge_embedding_loss",
    "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "cross_entropy",  # composite: log_softmax (fp32) then nll_loss (fp32)
})
FP32_SET_OPT_DTYPE = frozenset({
    "prod", "softmax", "log_softmax", "cumprod", "cumsum", "vector_norm", "matrix_norm", "sum",
})
PROMOTE = frozenset({
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sample", "index_put",
    "tensordot", "scatter_add",
})

_ACTIVE: list[CudaAutocast] = []


def _eligible(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64


class CudaAutocast(TorchFunctionMode):
    """`torch.autocast("cuda", dtype)` for meta tensors: one instance is one autocast region, and its
    weight-cast cache lives as long as the region."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __enter__(self) -> CudaAutocast:
        _ACTIVE.append(self)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        _ACTIVE.remove(self)
        self._cache.clear()  # autocast_decrement_nesting() == 0: clear_autocast_cache()

    def cast(self, x: Any, dtype: torch.dtype) -> Any:
        """`cached_cast`: eligible floating tensors to `dtype`, fp32 trainable leaves cached."""
        if not _eligible(x) or x.dtype == dtype:
            return x
        cacheable = dtype == self.dtype and x.dtype == torch.float32 and x.is_leaf and x.requires_grad
        if not cacheable:
            return x.to(dtype)
        hit = self._cache.get(id(x))
        if hit is None or hit[0] is not x:
            hit = (x, x.to(dtype))
            self._cache[id(x)] = hit
        return hit[1]

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in LOWER_PRECISION:
            args, kwargs = tree_map(lambda x: self.cast(x, self.dtype), (args, kwargs))
        elif name in FP32:
            args, kwargs = tree_map(lambda x: self.cast(x, torch.float32), (args, kwargs))
        elif name in FP32_SET_OPT_DTYPE:
            explicit = kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args)
            if args and _eligible(args[0]) and not explicit:
                kwargs = {**kwargs, "dtype": torch.float32}
        elif name in PROMOTE:
            floats = [x for x in tree_flatten((args, kwargs))[0] if _eligible(x)]
            if floats:
                widest = floats[0].dtype
                for x in floats[1:]:
                    widest = torch.promote_types(widest, x.dtype)
                args, kwargs = tree_map(lambda x: self.cast(x, widest), (args, kwargs))
        return func(*args, **kwargs)


def active() -> CudaAutocast | None:
    """The innermost simulated autocast region, for stand-ins that no function mode sees."""
    return _ACTIVE[-1] if _ACTIVE else None


def region(dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    """An autocast region for `dtype`, or nothing when the setup does not autocast."""
    return CudaAutocast(dtype) if dtype is not None else contextlib.nullcontext()


def recompute_context(dtype: torch.dtype) -> Callable[[], tuple[Any, Any]]:
    """`context_fn` for non-reentrant checkpointing: forward as is (already in the region), recompute in
    a region of its own, as `torch.utils.checkpoint` re-enters autocast for it."""
    return lambda: (contextlib.nullcontext(), CudaAutocast(dtype))
