"""Chapter 9: the tiled attention as a real kernel, FlashAttention-2 in Triton.

``attention_tiled`` (``core/tiled.py``) proved the algorithm exact, but each of its
tiles is a handful of separate torch calls launched from Python. Here the same tiles
are Triton programs (``core/triton_kernels.py``, read top to bottom): one GPU block
holds a query tile and its running max, sum and output in registers while it walks
over the key tiles, and the backward recomputes the weights from Q, K and the saved
log-sum-exp instead of storing them. The ``"triton"`` path of :func:`attention`.

Where it runs:

* on a CUDA GPU, compiled (float32, float16, bfloat16; float32 products in full IEEE
  precision, not TF32, so that it equals the manual path to round-off);
* on the CPU under Triton's interpreter, which runs each program in NumPy: set
  ``TRITON_INTERPRET=1`` in the environment before ``triton`` is first imported (the
  package imports it only at the first call of this path). Slow, but the same kernel,
  line for line. Half-precision inputs are computed in float32 there (the interpreter
  has no bfloat16 arithmetic);
* on the ``meta`` device, and under ``torch.compile``, as two opaque operators
  (``torch.ops.course_attn.flash_attention_forward`` and ``..._backward``) with their
  output shapes, so a model traces in one graph.

Without the ``triton`` package (macOS, Windows, a torch without it) the package
imports as usual and this path raises a ``ModuleNotFoundError`` saying how to get it.

It supports everything the other paths do: a boolean mask of any shape that broadcasts
to ``(..., T_q, T_k)`` (key padding, the causal mask, a sliding window), ``is_causal``
(bottom-right aligned; key blocks in the future are skipped), an additive ``bias``
(with its gradient), dropout (a counter-based random number per weight, redrawn in the
backward, so its mask differs from the other paths' for the same seed), any ``T``,
``T_q != T_k``, and head sizes up to 128 (smaller ones are padded to 16 in registers).
"""

import importlib.util
import math
import os

import torch
from torch import Tensor

from .._validation import (
    check_attention_args,
    check_head_sizes_at_most,
    check_power_of_two_block,
)

__all__ = [
    "MAX_TRITON_HEAD_SIZE",
    "TRITON_FOUND",
    "attention_triton",
    "default_triton_blocks",
    "triton_attention",
]

#: Whether the ``triton`` package is installed (it is not imported until first use).
TRITON_FOUND = importlib.util.find_spec("triton") is not None
#: The largest ``d_k`` and ``d_v`` the kernel takes: a tile row lives in registers.
MAX_TRITON_HEAD_SIZE = 128

_NO_TRITON = ("impl='triton' needs the triton package, which is not installed. It comes "
              "with PyTorch's CUDA build on Linux (pip install torch), or on its own: "
              "pip install triton (Linux only; on macOS and Windows use impl='sdpa').")
_NO_INTERPRETER = ("impl='triton' got CPU tensors, and Triton's interpreter is off: compiled "
                   "Triton kernels run on a CUDA GPU. To run the kernel on the CPU (slowly), "
                   "set os.environ['TRITON_INTERPRET'] = '1' before triton is first imported "
                   "(in a notebook, before the first impl='triton' call), or move the "
                   "tensors to a GPU.")


def default_triton_blocks(head_size: int, dtype: torch.dtype) -> tuple[int, int]:
    """``(block_q, block_k)`` the kernel uses when none are given (Chapter 9).

    64 x 64 tiles in half precision; 32 x 32 in float32 and float64 once a head is
    wider than 64, so that a program's tiles fit a small GPU's shared memory (a T4's
    64 KiB).
    """
    if dtype in (torch.float16, torch.bfloat16) or head_size <= 64:
        return 64, 64
    return 32, 32


def _require_a_kernel_device(device: torch.device) -> None:
    """Raise unless a kernel can run on ``device`` (no checks on meta: shapes only)."""
    if not TRITON_FOUND:
        raise ModuleNotFoundError(_NO_TRITON)
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise RuntimeError(_NO_INTERPRETER)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"impl='triton' runs on CUDA tensors (or CPU ones under Triton's "
                         f"interpreter), got tensors on {device}")


@torch.library.custom_op("course_attn::flash_attention_forward", mutates_args=())
def _forward_op(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
                seed: Tensor | None, n_heads: int, is_causal: bool, scale: float,
                dropout_p: float, block_q: int, block_k: int) -> tuple[Tensor, Tensor]:
    """The forward kernel as one operator: ``(out (BH, T_q, d_v), lse (BH, T_q))``."""
    _require_a_kernel_device(q.device)
    from .triton_kernels import flash_forward  # imports triton, on first use only

    return flash_forward(q, k, v, mask, bias, seed, n_heads, is_causal, scale, dropout_p,
                         block_q, block_k)


@_forward_op.register_fake
def _forward_shapes(q, k, v, mask, bias, seed, n_heads, is_causal, scale, dropout_p,
                    block_q, block_k):
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return q.new_empty(q.shape[0], q.shape[1], v.shape[2]), \
        q.new_empty(q.shape[0], q.shape[1], dtype=lse_dtype)


@torch.library.custom_op("course_attn::flash_attention_backward", mutates_args=())
def _backward_op(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                 mask: Tensor | None, bias: Tensor | None, seed: Tensor | None, n_heads: int,
                 is_causal: bool, scale: float, dropout_p: float, block_q: int, block_k: int,
                 bias_grad: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward kernels as one operator: ``(dq, dk, dv, dbias)``; ``dbias (BH, T_q,
    T_k)`` when ``bias_grad``, else empty."""
    _require_a_kernel_device(q.device)
    from .triton_kernels import flash_backward

    grad_q, grad_k, grad_v, grad_bias = flash_backward(
        grad_out, q, k, v, out, lse, mask, bias, seed, n_heads, is_causal, scale, dropout_p,
        block_q, block_k, bias_grad)
    return grad_q, grad_k, grad_v, grad_bias if grad_bias is not None else lse.new_empty(0)


@_backward_op.register_fake
def _backward_shapes(grad_out, q, k, v, out, lse, mask, bias, seed, n_heads, is_causal, scale,
                     dropout_p, block_q, block_k, bias_grad):
    grad_bias = lse.new_empty(q.shape[0], q.shape[1], k.shape[1]) if bias_grad \
        else lse.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), grad_bias


class _FlashAttention(torch.autograd.Function):
    """The kernels wired into autograd: the backward recomputes, it stores no weights."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
                seed: Tensor | None, n_heads: int, is_causal: bool, scale: float,
                dropout_p: float, block_q: int, block_k: int) -> Tensor:
        out, lse = _forward_op(q, k, v, mask, bias, seed, n_heads, is_causal, scale,
                               dropout_p, block_q, block_k)
        ctx.save_for_backward(q, k, v, out, lse, mask, bias, seed)
        ctx.config = (n_heads, is_causal, scale, dropout_p, block_q, block_k)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse, mask, bias, seed = ctx.saved_tensors
        bias_grad = bool(ctx.needs_input_grad[4])
        grad_q, grad_k, grad_v, grad_bias = _backward_op(grad_out, q, k, v, out, lse, mask,
                                                         bias, seed, *ctx.config, bias_grad)
        grad_bias = grad_bias.view(bias.shape) if bias_grad else None  # (B, H, T_q, T_k)
        return grad_q, grad_k, grad_v, None, grad_bias, None, None, None, None, None, None, None


def attention_triton(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *,
                     is_causal: bool = False, scale: float | None = None,
                     dropout_p: float = 0.0, bias: Tensor | None = None,
                     block_q: int | None = None, block_k: int | None = None,
                     ) -> tuple[Tensor, None]:
    """:func:`triton_attention` without its checks: the ``"triton"`` path of ``attention()``.

    Same signature as the other paths (Chapter 9; ``course_attn.core.attention``), so a
    layer can call it; returns ``(out, None)``: the weights are never formed. Raises a
    ``ModuleNotFoundError`` where triton is not installed.
    """
    if not TRITON_FOUND:
        raise ModuleNotFoundError(_NO_TRITON)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    t_q, t_k, d_k, d_v = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    # The kernels see two batch axes, (B, H): the batch x head index of a program picks
    # its rows of Q, K, V and, through their strides, its slice of the mask and the bias.
    n_b = math.prod(batch[:-1]) if len(batch) > 1 else 1
    n_h = batch[-1] if batch else 1
    dtype = q.dtype
    # The interpreter has no bfloat16 arithmetic: half precision is float32 on the CPU.
    work = (torch.float32 if q.device.type == "cpu" and dtype in (torch.float16, torch.bfloat16)
            else dtype)
    q = q.expand(*batch, t_q, d_k).reshape(n_b * n_h, t_q, d_k).to(work).contiguous()
    k = k.expand(*batch, t_k, d_k).reshape(n_b * n_h, t_k, d_k).to(work).contiguous()
    v = v.expand(*batch, t_k, d_v).reshape(n_b * n_h, t_k, d_v).to(work).contiguous()
    if mask is not None:
        mask = mask.expand(*batch, t_q, t_k).reshape(n_b, n_h, t_q, t_k)  # a view if it can
    if bias is not None:  # autograd sums the gradient of a broadcast bias back to its shape
        bias = bias.to(work).expand(*batch, t_q, t_k).reshape(n_b, n_h, t_q, t_k)
    seed = (torch.randint(0, 2**62, (1,), dtype=torch.int64, device=q.device)
            if dropout_p > 0.0 else None)  # drawn from torch's generator, never read here
    default_q, default_k = default_triton_blocks(max(d_k, d_v), work)
    out = _FlashAttention.apply(q, k, v, mask, bias, seed, n_h, is_causal, float(scale),
                                float(dropout_p), block_q or default_q, block_k or default_k)
    return out.reshape(*batch, t_q, d_v).to(dtype), None  # (..., T_q, d_v)


def triton_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    bias: Tensor | None = None,
    block_q: int | None = None,
    block_k: int | None = None,
) -> Tensor:
    """FlashAttention-2 in Triton: chapter 9's tiles as GPU programs (Chapter 9).

    Args:
        q, k, v: ``(..., T_q, d_k)``, ``(..., T_k, d_k)``, ``(..., T_k, d_v)``; batch
            dimensions broadcast; ``d_k, d_v <= 128``.
        mask: boolean, broadcastable to ``(..., T_q, T_k)``, ``True`` = may attend.
        is_causal: also apply the bottom-right causal mask; key blocks wholly in a
            query block's future are never loaded.
        scale: multiplies the scores; ``None`` means ``1 / sqrt(d_k)``.
        dropout_p: dropout on the attention weights (0 = none), by a random number of
            each weight's position and a seed from torch's generator, redrawn in the
            backward.
        bias: optional float tensor broadcastable to ``(..., T_q, T_k)``, added to the
            scaled scores (ALiBi, say); differentiable.
        block_q, block_k: rows of queries and keys per tile, powers of two >= 16
            (``None``: :func:`default_triton_blocks`).

    Returns:
        ``(..., T_q, d_v)``, equal to chapter 4's ``scaled_dot_product_attention`` up to
        round-off, zero for a query with no allowed key. Differentiable.
    """
    q, k, v, mask, scale, bias = check_attention_args(
        q, k, v, mask, is_causal=is_causal, scale=scale, dropout_p=dropout_p, bias=bias)
    check_head_sizes_at_most(q, v, MAX_TRITON_HEAD_SIZE, "impl='triton'")
    for value, name in ((block_q, "block_q"), (block_k, "block_k")):
        if value is not None:
            check_power_of_two_block(value, name)
    out, _ = attention_triton(q, k, v, mask, is_causal=is_causal, scale=scale,
                              dropout_p=dropout_p, bias=bias, block_q=block_q,
                              block_k=block_k)
    return out
