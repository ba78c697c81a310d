"""The Mamba kernels path (`--mamba-path kernels`) on the meta device: stand-ins with the allocations and saved
tensors of mamba-ssm's and causal-conv1d's autograd Functions (`hardware.cuda.MAMBA_SOURCE`), put where
transformers' modeling module calls them, so that no mamba-ssm, causal-conv1d or Triton is needed where the
estimate runs.

transformers (5.x) binds each Mamba function when its modeling module is imported: mamba-ssm's where it imports,
else a PyTorch fallback, on any device. In training (no cache) a mixer calls, by family
(`hardware.cuda.MAMBA_FAMILIES`):
- `split`: `mamba_split_conv1d_scan_combined` (`ops/triton/ssd_combined.py` `MambaSplitConv1dScanCombinedFn`):
  the depthwise convolution, the chunked scan, the gated RMSNorm and the output projection in one Function,
  which saves its input (the in-projection's output), the scan's output before the norm, and an fp32 value per
  row and group; backward recomputes the convolution, the norm's output and the chunk states. The PyTorch
  fallback returns None and the mixer runs its chunked scan instead;
- `inner`: `mamba_inner_fn` (`ops/selective_scan_interface.py` `MambaInnerFn`, checkpoint level 1): saves a
  contiguous copy of the projection, x_proj's output, B and C, the scan's fp32 chunk states and output;
  recomputes the convolution and delta in backward;
- `scan`: transformers' own convolution and projections around `causal_conv1d_fn`
  (`causal_conv1d_interface.py` `CausalConv1dFn`: saves its input) and `selective_scan_fn` (`SelectiveScanFn`:
  saves contiguous copies of u, delta, B, C and z, the fp32 chunk states and the output).
"""

from __future__ import annotations

import contextlib
import math
import sys
from typing import Any, Iterator

import torch

from trainmem.hardware.cuda import MAMBA_FAMILIES

from . import autocast

SCAN_CHUNK = 2048
"""`selective_scan_cuda`'s sequence chunk: its fp32 intermediates hold 2 * dstate values per chunk and channel."""


def _empty(shape: tuple[int, ...], dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=like.device)


def _half(*tensors: Any) -> list[Any]:
    """Tensors cast to the autocast dtype where a region is active (`custom_fwd` runs the Function under the
    caller's autocast state and the Functions cast their weights themselves), else as they are."""
    region = autocast.active()
    if region is None:
        return list(tensors)
    return [t.to(region.dtype) if t is not None and t.dtype != region.dtype else t for t in tensors]


def _splits(batch: int, chunks: int, heads: int, groups: int, sms: int) -> int:
    """`nsplits` of the scan's dB, dC and dCB kernels: heads of a group split over programs to fill the SMs."""
    ratio = heads // groups
    per_program = max(min(math.ceil(batch * chunks * heads / sms), ratio), 1)
    return math.ceil(ratio / per_program)


def _scan_fwd(x: torch.Tensor, groups: int, state: int, chunk: int, z: bool) -> tuple[torch.Tensor, Any]:
    """`_mamba_chunk_scan_combined_fwd` for x (batch, seq, heads, headdim): its fp32 chunk cumsums and states,
    the passed states, CB, and the output (and the gated output where z is given); returns (out, out_x)."""
    b, s, h, p = x.shape
    nc = -(-s // chunk)
    dA_cumsum = _empty((b, h, nc, chunk), torch.float32, x)
    dt = _empty((b, h, nc, chunk), torch.float32, x)
    states = _empty((b, nc, h, p, state), torch.float32, x)
    passed = _empty((b, nc, h, p * state), x.dtype, x)  # out_dtype: C's dtype
    final = _empty((b, h, p * state), torch.float32, x)
    del states
    cb = _empty((b, nc, groups, chunk, chunk), torch.float32, x)
    out = torch.empty_like(x)
    out_x = torch.empty_like(x) if z else None
    del dA_cumsum, dt, passed, final, cb
    return out, out_x


def _scan_bwd(x: torch.Tensor, dt: torch.Tensor, groups: int, state: int, chunk: int, sms: int,
              z: bool) -> None:
    """`_mamba_chunk_scan_combined_bwd` with dx, ddt, dB, dC (and dz) given: what it allocates besides them."""
    b, s, h, p = x.shape
    nc = -(-s // chunk)
    dt_in = dt.clone()
    dA_cumsum = _empty((b, h, nc, chunk), torch.float32, x)
    dt_out = _empty((b, h, nc, chunk), torch.float32, x)
    cb = _empty((b, nc, groups, chunk, chunk), torch.float32, x)
    states = _empty((b, nc, h, p, state), torch.float32, x)
    passed = _empty((b, nc, h, p * state), torch.float32, x)
    del states
    extra = [_empty((b, s, h, p), x.dtype, x), _empty((b, s, h, p), x.dtype, x)] if z else []  # dout_x, outz
    dstates = _empty((b, nc, h, p, state), torch.float32, x)
    dstates_half = _empty((b, nc, h, p * state), x.dtype, x)
    states_half = _empty((b, nc, h, p * state), x.dtype, x)
    del dstates, passed
    ddt = _empty((b, h, nc, chunk), torch.float32, x)
    splits = _splits(b, nc, h, groups, sms)
    db = _empty((b, s, splits, groups, state), torch.float32, x)
    db_sum = _empty((b, s, groups, state), torch.float32, x)
    del db
    dc = _empty((b, s, splits, groups, state), torch.float32, x)
    dc_sum = _empty((b, s, groups, state), torch.float32, x)
    del dc
    dcb = _empty((b, nc, splits, groups, chunk, chunk), torch.float32, x)
    dcb_sum = _empty((b, nc, groups, chunk, chunk), torch.float32, x)
    del dcb
    dda = _empty((b, h, nc, chunk), torch.float32, x)
    del (dt_in, dA_cumsum, dt_out, cb, extra, dstates_half, states_half, ddt, db_sum, dc_sum, dcb_sum, dda)


class _SplitConv1dScan(torch.autograd.Function):
    """`MambaSplitConv1dScanCombinedFn` with the norm and output projection transformers passes (no
    initial states, no d_nonssm part)."""

    @staticmethod
    def forward(ctx: Any, zxbcdt: torch.Tensor, conv_w: torch.Tensor, conv_b: Any, dt_bias: torch.Tensor,
                A: torch.Tensor, D: torch.Tensor, chunk: int, norm_w: Any, out_w: torch.Tensor, out_b: Any,
                headdim: int, groups: int, sms: int) -> torch.Tensor:
        b, s, _ = zxbcdt.shape
        heads = D.shape[0]
        dim = heads * headdim
        state = (conv_w.shape[0] - dim) // groups // 2
        z, xbc, dt = torch.split(zxbcdt, [dim, dim + 2 * groups * state, heads], dim=-1)
        conv = torch.empty(b, s, xbc.shape[-1], dtype=zxbcdt.dtype, device=zxbcdt.device)  # channels-last out
        x = conv[..., :dim].view(b, s, heads, headdim)
        if norm_w is None:
            out, out_x = _scan_fwd(x, groups, state, chunk, z=True)
            saved_x, rstd = out_x, None
            y = out.view(b, s, dim)
            del out_x
        else:
            saved_x, _ = _scan_fwd(x, groups, state, chunk, z=False)
            y = torch.empty(b * s, dim, dtype=zxbcdt.dtype, device=zxbcdt.device)  # _layer_norm_fwd's out
            rstd = torch.empty(groups * b * s, dtype=torch.float32, device=zxbcdt.device)
        del conv, x, z, xbc, dt
        y, out_w, out_b = _half(y, out_w, out_b)
        result = torch.empty(b, s, out_w.shape[0], dtype=y.dtype, device=y.device)  # F.linear
        ctx.save_for_backward(zxbcdt, conv_w, conv_b, saved_x, A, D, dt_bias, norm_w, rstd, out_w, out_b)
        ctx.shape = (chunk, headdim, groups, state, sms)
        return result

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        zxbcdt, conv_w, conv_b, out, A, D, dt_bias, norm_w, rstd, out_w, out_b = ctx.saved_tensors
        chunk, headdim, groups, state, sms = ctx.shape
        b, s, _ = zxbcdt.shape
        heads = D.shape[0]
        dim = heads * headdim
        conv_dim = dim + 2 * groups * state
        recompute = torch.empty(b, s, dim, dtype=out.dtype, device=out.device)
        conv = torch.empty(b, s, conv_dim, dtype=zxbcdt.dtype, device=zxbcdt.device)
        dzxbcdt = torch.empty_like(zxbcdt)
        dxbc = torch.empty(b, s, conv_dim, dtype=zxbcdt.dtype, device=zxbcdt.device)
        dy = torch.empty(b, s, dim, dtype=dout.dtype, device=dout.device)  # F.linear(dout, W.t())
        dt = zxbcdt[..., -heads:]
        x = conv[..., :dim].view(b, s, heads, headdim)
        dnorm = None
        if norm_w is not None:
            dx_norm = torch.empty(b * s, dim, dtype=out.dtype, device=out.device)
            rows = math.ceil(sms * math.ceil(4 / min(max(_next_pow2(dim // groups) // 256, 1), 8)) / groups)
            partial = torch.empty(rows, dim, dtype=torch.float32, device=out.device)
            dnorm = partial.sum(0).to(norm_w.dtype)
            del partial, dy
            dy = dx_norm
        _scan_bwd(x, dt, groups, state, chunk, sms, z=norm_w is None)
        dout_w = torch.empty(out_w.shape, dtype=dout.dtype, device=dout.device)  # einsum over the batch
        dout_b = torch.empty(out_b.shape, dtype=dout.dtype, device=dout.device) if out_b is not None else None
        dconv_w = torch.empty(conv_w.shape, dtype=torch.float32, device=conv_w.device)  # causal_conv1d_bwd
        dconv_b = torch.empty(conv_b.shape, dtype=torch.float32, device=conv_w.device) if conv_b is not None else None
        small = [torch.empty(t.shape, dtype=torch.float32, device=t.device) for t in (dt_bias, A, D)]
        del recompute, conv, dxbc, dy, x
        return (dzxbcdt, dconv_w, dconv_b, small[0], small[1], small[2], None, dnorm, dout_w, dout_b,
                None, None, None)


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


class _CausalConv1d(torch.autograd.Function):
    """`CausalConv1dFn` (no initial or final states): saves x; out and dx like x, fp32 weight gradients."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: Any) -> torch.Tensor:
        if x.stride(2) != 1 and x.stride(1) != 1:
            x = x.contiguous()
        ctx.save_for_backward(x, weight, bias)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        x, weight, bias = ctx.saved_tensors
        if dout.stride(2) != 1 and dout.stride(1) != 1:
            dout = dout.contiguous()
        dx = torch.empty_like(x)
        dw = torch.zeros_like(weight, dtype=torch.float32)
        db = torch.zeros_like(bias, dtype=torch.float32) if bias is not None else None
        return dx, dw, db


class _SelectiveScan(torch.autograd.Function):
    """`SelectiveScanFn` with z (the gate) and variable B, C: saves contiguous u, delta, B, C, z, the fp32
    intermediates (batch, dim, ceil(seq / 2048), 2 * dstate) and the output before the gate."""

    @staticmethod
    def forward(ctx: Any, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor, D: Any, z: torch.Tensor, delta_bias: Any) -> torch.Tensor:
        u, delta, B, C, z = (t if t.stride(-1) == 1 else t.contiguous() for t in (u, delta, B, C, z))
        b, d, s = u.shape
        out = torch.empty_like(delta)
        states = torch.empty(b, d, -(-s // SCAN_CHUNK), 2 * A.shape[-1], dtype=A.dtype, device=u.device)
        out_z = torch.empty_like(z)
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, states, out)
        return out_z

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        u, delta, A, B, C, D, z, delta_bias, _, _ = ctx.saved_tensors
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        du, ddelta, dz = torch.empty_like(u), torch.empty_like(delta), torch.empty_like(z)
        dA = torch.zeros_like(A)
        dB = torch.zeros_like(B, dtype=torch.float32)
        dC = torch.zeros_like(C, dtype=torch.float32)
        dD = torch.zeros_like(D) if D is not None else None
        dbias = torch.zeros_like(delta_bias) if delta_bias is not None else None
        return du, ddelta, dA, dB, dC, dD, dz, dbias


class _MambaInner(torch.autograd.Function):
    """`MambaInnerFn` at checkpoint level 1 with variable B and C (no B/C/dt norms modelled: they are dstate
    and dt_rank wide)."""

    @staticmethod
    def forward(ctx: Any, xz: torch.Tensor, conv_w: torch.Tensor, conv_b: Any, x_proj_w: torch.Tensor,
                dt_proj_w: torch.Tensor, out_w: torch.Tensor, out_b: Any, A: torch.Tensor, D: Any,
                dt_bias: Any) -> torch.Tensor:
        x_proj_w, dt_proj_w, out_w, out_b = _half(x_proj_w, dt_proj_w, out_w, out_b)
        if xz.stride(-1) != 1:
            xz = xz.contiguous()
        b, d2, s = xz.shape
        d, n, r = d2 // 2, A.shape[-1], dt_proj_w.shape[1]
        dtype = x_proj_w.dtype
        conv = torch.empty(b, d, s, dtype=xz.dtype, device=xz.device)
        x_dbl = torch.empty(b * s, x_proj_w.shape[0], dtype=dtype, device=xz.device)
        delta = torch.empty(d, b * s, dtype=dtype, device=xz.device)
        B = torch.empty(b, 1, n, s, dtype=dtype, device=xz.device)
        C = torch.empty(b, 1, n, s, dtype=dtype, device=xz.device)
        out = torch.empty(b, d, s, dtype=delta.dtype, device=xz.device)
        states = torch.empty(b, d, -(-s // SCAN_CHUNK), 2 * n, dtype=A.dtype, device=xz.device)
        out_z = torch.empty(b, d, s, dtype=xz.dtype, device=xz.device)
        del conv, delta
        result = torch.empty(b, s, out_w.shape[0], dtype=out_z.dtype, device=xz.device)
        del out_z
        ctx.save_for_backward(xz, conv_w, conv_b, x_dbl, x_proj_w, dt_proj_w, out_w, A, B, C, D, dt_bias,
                              states, out)
        ctx.rank = r
        return result

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        xz, conv_w, conv_b, x_dbl, x_proj_w, dt_proj_w, out_w, A, B, C, D, dt_bias, _, _ = ctx.saved_tensors
        b, d2, s = xz.shape
        d = d2 // 2
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        conv = torch.empty(b, d, s, dtype=xz.dtype, device=xz.device)
        delta = torch.empty(d, b * s, dtype=x_dbl.dtype, device=xz.device)
        dxz = torch.empty_like(xz)
        dout_y = torch.empty(d, b * s, dtype=dout.dtype, device=xz.device)
        dconv = torch.empty(b, d, s, dtype=conv.dtype, device=xz.device)
        ddelta = torch.empty(b, d, s, dtype=delta.dtype, device=xz.device)
        dB, dC = torch.zeros_like(B, dtype=torch.float32), torch.zeros_like(C, dtype=torch.float32)
        out_z = torch.empty(b, d, s, dtype=xz.dtype, device=xz.device)
        dout_w = torch.empty(out_w.shape, dtype=dout.dtype, device=xz.device)
        del out_z, dout_y
        dx_dbl = torch.empty_like(x_dbl)
        db_rows = torch.empty(b * s, B.shape[2], dtype=torch.float32, device=xz.device)
        dc_rows = torch.empty(b * s, C.shape[2], dtype=torch.float32, device=xz.device)
        del dB, dC, db_rows, dc_rows
        ddt_w = torch.empty(dt_proj_w.shape, dtype=dt_proj_w.dtype, device=xz.device)
        dx_w = torch.empty(x_proj_w.shape, dtype=dx_dbl.dtype, device=xz.device)
        dconv_w = torch.empty(conv_w.shape, dtype=torch.float32, device=xz.device)
        dconv_b = torch.empty(conv_b.shape, dtype=torch.float32, device=xz.device) if conv_b is not None else None
        del conv, delta, dconv, ddelta, dx_dbl
        small = [torch.empty(t.shape, dtype=torch.float32, device=xz.device) if t is not None else None
                 for t in (A, D, dt_bias)]
        return dxz, dconv_w, dconv_b, dx_w, ddt_w, dout_w, None, small[0], small[1], small[2]


def _split(zxbcdt: torch.Tensor, conv_w: torch.Tensor, conv_b: Any, dt_bias: torch.Tensor, A: torch.Tensor,
           D: torch.Tensor, chunk_size: int, *args: Any, rmsnorm_weight: Any = None, outproj_weight: Any = None,
           outproj_bias: Any = None, headdim: int | None = None, ngroups: int = 1, **kwargs: Any) -> torch.Tensor:
    return _SplitConv1dScan.apply(zxbcdt, conv_w, conv_b, dt_bias, A, D, chunk_size, rmsnorm_weight,
                                  outproj_weight, outproj_bias, headdim, ngroups, _SMS[0])


def _inner(xz: torch.Tensor, conv_w: torch.Tensor, conv_b: Any, x_proj_w: torch.Tensor, dt_proj_w: torch.Tensor,
           out_w: torch.Tensor, out_b: Any, A: torch.Tensor, B: Any = None, C: Any = None, D: Any = None,
           delta_bias: Any = None, **kwargs: Any) -> torch.Tensor:
    return _MambaInner.apply(xz, conv_w, conv_b, x_proj_w, dt_proj_w, out_w, out_b, A, D, delta_bias)


def _conv(x: torch.Tensor, weight: torch.Tensor, bias: Any = None, activation: Any = None,
          **kwargs: Any) -> torch.Tensor:
    return _CausalConv1d.apply(x, weight, bias)


def _scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: Any = None,
          z: Any = None, delta_bias: Any = None, delta_softplus: bool = False, return_last_state: bool = False,
          **kwargs: Any) -> Any:
    out = _SelectiveScan.apply(u, delta, A, B, C, D, z, delta_bias)
    if return_last_state:  # a view of the saved intermediates in the kernel; training asks for none
        return out, torch.empty(u.shape[0], u.shape[1], A.shape[-1], dtype=A.dtype, device=u.device)
    return out


_SMS = [132]
STANDINS = {"split": {"mamba2_split_conv1d_scan_combined": _split},
            "inner": {"mamba_inner_fn": _inner},
            "scan": {"causal_conv1d_fn": _conv, "mamba_selective_scan": _scan}}
"""What each kind of mixer (`hardware.cuda.MAMBA_FAMILIES`) calls in training, by its name in the modeling
module, and the stand-in that replaces it."""


@contextlib.contextmanager
def patched(model: torch.nn.Module, sms: int) -> Iterator[None]:
    """The model's modeling module with mamba-ssm's and causal-conv1d's functions in place of its PyTorch
    fallbacks, as importing it with both installed binds them, for the duration; `sms`: the card's SMs (the
    scan's and norm's split reductions)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    module = sys.modules[type(base).__module__]
    names = STANDINS[MAMBA_FAMILIES[base.config.model_type]]
    kept = {name: getattr(module, name) for name in names}
    previous = _SMS[0]
    try:
        _SMS[0] = sms
        for name, fn in names.items():
            setattr(module, name, fn)
        yield
    finally:
        _SMS[0] = previous
        for name, fn in kept.items():
            setattr(module, name, fn)
