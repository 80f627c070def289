"""Chapter 9: the tiled attention as a real kernel, FlashAttention-2's algorithm in Triton.

``attention_tiled`` (``core/tiled.py``) proved the algorithm exact, but each of its
tiles is a handful of separate torch calls launched from Python. Here the same tiles
are Triton programs (``core/triton_kernels.py``, read top to bottom): one GPU block
holds a query tile and its running max, sum and output in registers while it walks
over the key tiles, and the backward recomputes the weights from Q, K and the saved
log-sum-exp instead of storing them. The ``"triton"`` path of :func:`attention`.

Where it runs:

* on a CUDA GPU, compiled (float32, float16, bfloat16; float32 products in full IEEE
  precision, not TF32, so that it equals the manual path to round-off; float64 in small
  tiles without the tensor cores, for ``gradcheck``: see :data:`FLOAT64_ON_CUDA`). Half
  precision without explicit ``block_q``/``block_k``, from 256 positions on, is tuned: the
  first call of each head size, length bucket and dtype times a few tile shapes
  (``triton.autotune``, seconds), later calls launch the fastest;
* on the CPU under Triton's interpreter, which runs each program in NumPy: set
  ``TRITON_INTERPRET=1`` in the environment before ``triton`` is first imported (the
  package imports it only at the first call of this path). Slow, but the same kernel,
  line for line. Half-precision inputs are computed in float32 there (the interpreter
  has no bfloat16 arithmetic);
* on the ``meta`` device, and under ``torch.compile``, as two opaque operators
  (``torch.ops.course_attn.flash_attention_forward`` and ``..._backward``) with their
  output shapes, so a model traces in one graph.

The backward comes in two kinds (``backward=``): ``"pair"`` (the default), two kernels
that each write only their own rows, so the gradients are the same to the bit on every
run, at the price of recomputing S = QKᵀ and dP = dO·Vᵀ in both (7 block products per
tile); and ``"atomic"``, FlashAttention-2's single pass (5 block products per tile), which
adds each key block's share of dQ with atomic float32 additions, whose order, and so the
last bits of dQ, changes from run to run. See ``core/triton_kernels.py``.

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
    check_choice,
    check_head_sizes_at_most,
    check_power_of_two_block,
)

__all__ = [
    "FLOAT64_ON_CUDA",
    "MAX_TRITON_HEAD_SIZE",
    "TRITON_BACKWARDS",
    "TRITON_FOUND",
    "attention_triton",
    "check_kernel_dtype",
    "default_triton_blocks",
    "triton_attention",
]

#: Whether the ``triton`` package is installed (it is not imported until first use).
TRITON_FOUND = importlib.util.find_spec("triton") is not None
#: The largest ``d_k`` and ``d_v`` the kernel takes: a tile row lives in registers.
MAX_TRITON_HEAD_SIZE = 128
#: The backward's kinds: ``"pair"`` (two kernels, no atomics, the same gradients to the bit on
#: every run; 7 block products per tile) and ``"atomic"`` (FlashAttention-2's single pass,
#: dQ added up with atomics; 5 block products per tile).
TRITON_BACKWARDS = ("pair", "atomic")
#: float64 on a CUDA GPU: ``True`` runs the kernel's float64 tiles, which multiply without
#: ``tl.dot`` (Triton has no float64 tensor-core product at these sizes: "fp64 don't support
#: largeK MMA") in 16 x 16 tiles; ``False`` refuses float64 CUDA tensors with a ``TypeError``
#: before anything compiles (float64 is for ``gradcheck``; use impl="manual" there).
FLOAT64_ON_CUDA = True

_NO_TRITON = ("impl='triton' needs the triton package, which is not installed. It comes "
              "with PyTorch's CUDA build on Linux (pip install torch), or on its own: "
              "pip install triton (Linux only; on macOS and Windows use impl='sdpa').")
_NO_INTERPRETER = ("impl='triton' got CPU tensors, and Triton's interpreter is off: compiled "
                   "Triton kernels run on a CUDA GPU. To run the kernel on the CPU (slowly), "
                   "set os.environ['TRITON_INTERPRET'] = '1' before triton is first imported "
                   "(in a notebook, before the first impl='triton' call), or move the "
                   "tensors to a GPU.")


def default_triton_blocks(head_size: int, dtype: torch.dtype) -> tuple[int, int]:
    """``(block_q, block_k)`` the kernel uses when none are given and it does not tune
    (Chapter 9).

    64 x 64 tiles in half precision; 32 x 32 in float32 once a head is wider than 64, so
    that a program's tiles fit a small GPU's shared memory (a T4's 64 KiB); 16 x 16 in
    float64, whose tiles multiply without the tensor cores (a (16, d, 16) product in
    registers).
    """
    if dtype == torch.float64:
        return 16, 16
    if dtype in (torch.float16, torch.bfloat16) or head_size <= 64:
        return 64, 64
    return 32, 32


def check_kernel_dtype(dtype: torch.dtype, device: torch.device,
                       float64_on_cuda: bool | None = None) -> None:
    """Refuse float64 on a CUDA GPU when :data:`FLOAT64_ON_CUDA` (or ``float64_on_cuda``)
    says so, with a ``TypeError`` naming ``q`` (Chapter 9). Checked before any compilation."""
    allowed = FLOAT64_ON_CUDA if float64_on_cuda is None else float64_on_cuda
    if dtype == torch.float64 and device.type == "cuda" and not allowed:
        raise TypeError("impl='triton' on a CUDA GPU takes float32, float16 or bfloat16 "
                        "tensors: q has dtype torch.float64. Use impl='manual' for float64 "
                        "(gradcheck), or set course_attn.core.triton_attention."
                        "FLOAT64_ON_CUDA = True to run the kernel's float64 tiles")


def _require_a_kernel(q: Tensor) -> None:
    """Raise unless a kernel can run on ``q``'s device and dtype (no checks on meta)."""
    if not TRITON_FOUND:
        raise ModuleNotFoundError(_NO_TRITON)
    if q.is_cuda:  # (is_cuda, not device.type: no device object is made on every call)
        if q.dtype == torch.float64:
            check_kernel_dtype(q.dtype, q.device)
    elif not q.is_cpu:
        raise ValueError(f"impl='triton' runs on CUDA tensors (or CPU ones under Triton's "
                         f"interpreter), got tensors on {q.device}")
    elif os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise RuntimeError(_NO_INTERPRETER)


def _traced(q: Tensor) -> bool:
    """Whether this call is traced (meta tensors, ``torch.compile``) rather than run: then the
    kernels go through their registered operators, which know their output shapes."""
    return q.is_meta or torch.compiler.is_compiling()


def _forward_run(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
                 seed: Tensor | None, is_causal: bool, scale: float, dropout_p: float,
                 block_q: int, block_k: int, tune: bool) -> tuple[Tensor, Tensor]:
    """The forward kernel: ``(out (B, H, T_q, d_v), lse (B * H, T_q))``."""
    _require_a_kernel(q)
    from .triton_kernels import flash_forward  # imports triton, on first use only

    return flash_forward(q, k, v, mask, bias, seed, is_causal, scale, dropout_p, block_q,
                         block_k, tune)


_forward_op = torch.library.custom_op("course_attn::flash_attention_forward", _forward_run,
                                      mutates_args=())


@_forward_op.register_fake
def _forward_shapes(q, k, v, mask, bias, seed, is_causal, scale, dropout_p, block_q, block_k,
                    tune):
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    return q.new_empty(*q.shape[:3], v.shape[3]), \
        q.new_empty(q.shape[0] * q.shape[1], q.shape[2], dtype=lse_dtype)


def _backward_run(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                  mask: Tensor | None, bias: Tensor | None, seed: Tensor | None,
                  is_causal: bool, scale: float, dropout_p: float, block_q: int, block_k: int,
                  tune: bool, bias_grad: bool, atomic_dq: bool,
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward kernels: ``(dq, dk, dv, dbias)``; ``dbias (B * H, T_q, T_k)`` when
    ``bias_grad``, else empty."""
    _require_a_kernel(q)
    from .triton_kernels import flash_backward

    grad_q, grad_k, grad_v, grad_bias = flash_backward(
        grad_out, q, k, v, out, lse, mask, bias, seed, is_causal, scale, dropout_p, block_q,
        block_k, tune, bias_grad, atomic_dq)
    return grad_q, grad_k, grad_v, grad_bias if grad_bias is not None else lse.new_empty(0)


_backward_op = torch.library.custom_op("course_attn::flash_attention_backward", _backward_run,
                                       mutates_args=())


@_backward_op.register_fake
def _backward_shapes(grad_out, q, k, v, out, lse, mask, bias, seed, is_causal, scale,
                     dropout_p, block_q, block_k, tune, bias_grad, atomic_dq):
    grad_bias = lse.new_empty(lse.shape[0], q.shape[2], k.shape[2]) if bias_grad \
        else lse.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), grad_bias


class _FlashAttention(torch.autograd.Function):
    """The kernels wired into autograd: the backward recomputes, it stores no weights.

    Run directly when tensors are real (a registered operator costs about 10 µs of Python
    per call), through the operators when traced.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
                seed: Tensor | None, is_causal: bool, scale: float, dropout_p: float,
                block_q: int, block_k: int, tune: bool, atomic_dq: bool) -> Tensor:
        run = _forward_op if _traced(q) else _forward_run
        out, lse = run(q, k, v, mask, bias, seed, is_causal, scale, dropout_p, block_q,
                       block_k, tune)
        ctx.save_for_backward(q, k, v, out, lse, mask, bias, seed)
        ctx.config = (is_causal, scale, dropout_p, block_q, block_k, tune)
        ctx.atomic_dq = atomic_dq
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse, mask, bias, seed = ctx.saved_tensors
        bias_grad = bool(ctx.needs_input_grad[4])
        is_causal, scale, dropout_p, block_q, block_k, tune = ctx.config
        run = _backward_op if _traced(q) else _backward_run
        grad_q, grad_k, grad_v, grad_bias = run(
            grad_out, q, k, v, out, lse, mask, bias, seed, is_causal, scale, dropout_p,
            block_q, block_k, tune, bias_grad, ctx.atomic_dq)
        grad_bias = grad_bias.view(bias.shape) if bias_grad else None  # (B, H, T_q, T_k)
        return (grad_q, grad_k, grad_v, None, grad_bias, None, None, None, None, None, None,
                None, None)


def _as_heads(x: Tensor, batch: torch.Size, n_b: int, n_h: int) -> Tensor:
    """``x (..., T, d)`` broadcast to ``batch`` and seen as ``(B, H, T, d)``: a view unless
    several broadcast batch axes must merge."""
    x = x.expand(*batch, *x.shape[-2:])
    return x.reshape(n_b, n_h, *x.shape[-2:])


def attention_triton(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *,
                     is_causal: bool = False, scale: float | None = None,
                     dropout_p: float = 0.0, bias: Tensor | None = None,
                     block_q: int | None = None, block_k: int | None = None,
                     backward: str = "pair") -> tuple[Tensor, None]:
    """:func:`triton_attention` without its checks: the ``"triton"`` path of ``attention()``.

    Same signature as the other paths (Chapter 9; ``course_attn.core.attention``), so a
    layer can call it; returns ``(out, None)``: the weights are never formed. Raises a
    ``ModuleNotFoundError`` where triton is not installed.

    A model calls it once per layer, so it does as little as it can before the launch:
    ``(B, H, T, d)`` inputs (a model's, whatever their strides) go to the kernels as they
    are, no mask is built for ``is_causal``, nothing is copied unless the head dimension is
    strided or batch axes must be broadcast and merged.
    """
    if not TRITON_FOUND:
        raise ModuleNotFoundError(_NO_TRITON)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    t_q, t_k = q.shape[-2], k.shape[-2]
    batch = q.shape[:-2]
    if q.dim() == 4 and k.shape[:2] == batch and v.shape[:2] == batch:
        n_b, n_h = batch  # a model's call: (B, H, T, d) each, nothing to broadcast
    else:  # the kernels see two batch axes, (B, H); the mask's and bias's strides follow
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        n_b = math.prod(batch[:-1]) if len(batch) > 1 else 1
        n_h = batch[-1] if batch else 1
        q, k, v = (_as_heads(x, batch, n_b, n_h) for x in (q, k, v))
    dtype = q.dtype
    if q.device.type == "cpu" and dtype in (torch.float16, torch.bfloat16):
        # the interpreter has no bfloat16 arithmetic: half precision is float32 on the CPU
        q, k, v = q.float(), k.float(), v.float()
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:  # the kernels need it
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if mask is not None:  # a view with 0 strides along broadcast axes
        mask = mask.expand(*batch, t_q, t_k).reshape(n_b, n_h, t_q, t_k)
    if bias is not None:  # autograd sums the gradient of a broadcast bias back to its shape
        bias = bias.to(q.dtype).expand(*batch, t_q, t_k).reshape(n_b, n_h, t_q, t_k)
    seed = (torch.randint(0, 2**62, (1,), dtype=torch.int64, device=q.device)
            if dropout_p > 0.0 else None)  # drawn from torch's generator, never read here
    tune = block_q is None and block_k is None
    if block_q is None or block_k is None:
        default_q, default_k = default_triton_blocks(max(q.shape[-1], v.shape[-1]), q.dtype)
        block_q, block_k = block_q or default_q, block_k or default_k
    config = (is_causal, float(scale), float(dropout_p), block_q, block_k, tune)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        out = _FlashAttention.apply(q, k, v, mask, bias, seed, *config,
                                    backward == "atomic")  # (B, H, T_q, d_v)
    else:  # no gradient wanted: the kernel alone, without autograd's bookkeeping
        out = (_forward_op if _traced(q) else _forward_run)(q, k, v, mask, bias, seed,
                                                           *config)[0]  # (B, H, T_q, d_v)
    if len(batch) != 2:
        out = out.reshape(*batch, t_q, v.shape[-1])  # (..., T_q, d_v)
    return (out if out.dtype == dtype else out.to(dtype)), None


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
    backward: str = "pair",
) -> Tensor:
    """The tiled attention of chapter 9 as Triton GPU programs, FlashAttention-2's algorithm.

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
            (``None``: tuned on a GPU in half precision from 256 positions on, else
            :func:`default_triton_blocks`).
        backward: ``"pair"`` (two kernels, no atomics: the same gradients to the bit on
            every run; 7 block products per tile) or ``"atomic"`` (FlashAttention-2's
            single pass, 5 block products per tile, dQ added up atomically in float32).

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
    check_choice(backward, "backward", TRITON_BACKWARDS)
    out, _ = attention_triton(q, k, v, mask, is_causal=is_causal, scale=scale,
                              dropout_p=dropout_p, bias=bias, block_q=block_q,
                              block_k=block_k, backward=backward)
    return out
