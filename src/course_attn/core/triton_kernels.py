"""Chapter 9: FlashAttention-2's three kernels in Triton, read top to bottom.

This module imports ``triton`` at its top, so the package loads it only when a
tensor is first sent down the ``"triton"`` path (``core/triton_attention.py`` holds
the path, its ``torch.autograd.Function`` and the checks). Nothing here checks its
arguments: the launchers below are handed prepared tensors.

Chapter 9's tiles, as Triton programs. A *program* is one instance of a kernel, run
on one GPU block of threads; it holds whole tiles as values (``tl.load`` reads one,
``tl.dot`` multiplies two) where chapter 9's torch code held slices of a tensor.

* forward: one program per (query block ``i``, batch x head ``bh``): the outer loop
  of ``attention_tiled`` became the grid, its inner loop over key blocks stays a
  loop, with the running max ``m``, sum ``l`` and weighted sum ``acc`` in float32
  registers. It stores the output and the log-sum-exp ``L = m + log l``.
* backward, dK and dV: one program per (key block ``j``, ``bh``), looping over the
  query blocks that may see it; it recomputes each tile's weights from Q, K and ``L``
  and accumulates its own rows of dK and dV.
* backward, dQ: one program per (query block, ``bh``), looping over key blocks like
  the forward, accumulating its rows of dQ.

Each program owns the rows it writes, so no two programs add into the same memory
(no atomics). ``D = rowsum(dO * O)``, the softmax backward's row term, is one torch line
in the launcher. The masks, in every kernel: rows and columns past ``T`` (the last tile
of a ragged ``T``), the bottom-right causal mask (key blocks wholly in a query block's
future are not visited at all), a boolean mask of any broadcast shape (read through
its strides, so a ``(B, 1, 1, T_k)`` key-padding mask costs ``T_k`` bytes per batch
row), an additive bias, and dropout by a counter-based random number of each weight's
position (``tl.rand``), drawn again in the backward instead of stored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["backward_dk_dv_kernel", "backward_dq_kernel", "dropout_keep", "flash_backward",
           "flash_forward", "forward_kernel", "load_rows", "store_rows", "tile_scores"]


# Two steps every kernel takes on every tile, written once.
@triton.jit
def tile_scores(q, k, rows, cols, row_ok, col_ok, b, h, offset, scale, acc_dtype: tl.constexpr,
                Mask, Bias, mask_sb, mask_sh, mask_sq, mask_sk, bias_sb, bias_sh, bias_sq,
                bias_sk, IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
                HAS_BIAS: tl.constexpr):
    # A tile's scores (BQ, BK) and which of them are allowed: bounds, causal, the mask.
    # (BQ, BDK) @ (BDK, BK) -> (BQ, BK)
    s = tl.dot(q, tl.trans(k), input_precision="ieee").to(acc_dtype) * scale
    allowed = row_ok[:, None] & col_ok[None, :]
    if HAS_BIAS:
        s += tl.load(Bias + b * bias_sb + h * bias_sh + rows[:, None] * bias_sq
                     + cols[None, :] * bias_sk, mask=allowed, other=0.0).to(acc_dtype)
    if IS_CAUSAL:  # bottom-right: query i sees key j <= i + offset
        allowed &= cols[None, :] <= rows[:, None] + offset
    if HAS_MASK:
        allowed &= tl.load(Mask + b * mask_sb + h * mask_sh + rows[:, None] * mask_sq
                           + cols[None, :] * mask_sk, mask=allowed, other=0) != 0
    return s, allowed


@triton.jit
def dropout_keep(Seed, bh, t_q, t_k, rows, cols, dropout_p):
    # Which weights of a tile dropout keeps: a counter-based random number of each
    # weight's position (tl.rand), so the backward draws the forward's mask again.
    seed = tl.load(Seed)
    where = (bh * t_q + rows[:, None]) * t_k + cols[None, :]  # int64 positions
    return tl.rand(seed, where) >= dropout_p


@triton.jit
def load_rows(Ptr, bh, t, D: tl.constexpr, rows, d):
    # Rows `rows` of the (T, D) matrix of head bh, as a (len(rows), len(d)) tile; the rows
    # past T and the columns past D (padding up to a power of two) read as 0.
    return tl.load(Ptr + bh * t * D + rows[:, None] * D + d[None, :],
                   mask=(rows < t)[:, None] & (d[None, :] < D), other=0.0)


@triton.jit
def store_rows(Ptr, tile, bh, t, D: tl.constexpr, rows, d):
    # A tile into rows `rows` of head bh's (T, D) matrix, in the matrix's dtype.
    tl.store(Ptr + bh * t * D + rows[:, None] * D + d[None, :],
             tile.to(Ptr.dtype.element_ty), mask=(rows < t)[:, None] & (d[None, :] < D))


# The forward: one program per (query block, batch x head), a loop over key blocks.
@triton.jit
def forward_kernel(
    Q, K, V, Out, LSE,  # (BH, T_q, d_k), (BH, T_k, d_k), (BH, T_k, d_v), (BH, T_q, d_v), (BH, T_q)
    Mask, Bias, Seed, Scale,  # (B, H, T_q, T_k) by strides (0 where broadcast); (1,) each
    n_heads, t_q, t_k, dropout_p,
    mask_sb, mask_sh, mask_sq, mask_sk, bias_sb, bias_sh, bias_sq, bias_sk,
    D_K: tl.constexpr, D_V: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, IS_CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr,
):
    block_q = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # int64: bh * T * d overflows int32 at long T
    b, h = bh // n_heads, bh % n_heads
    acc_dtype = tl.float64 if Q.dtype.element_ty == tl.float64 else tl.float32
    scale = tl.load(Scale)  # a tensor, not a float argument: those arrive as float32
    rows = block_q * BLOCK_Q + tl.arange(0, BLOCK_Q)  # (BQ,) query positions
    dk = tl.arange(0, BLOCK_DK)  # head dims, padded to a power of two >= 16 in registers
    dv = tl.arange(0, BLOCK_DV)
    row_ok = rows < t_q
    q = load_rows(Q, bh, t_q, D_K, rows, dk)  # (BQ, BDK)

    m = tl.full((BLOCK_Q,), float("-inf"), acc_dtype)  # running max of each row
    l = tl.zeros((BLOCK_Q,), acc_dtype)  # noqa: E741  running sum of exp(s - m)
    acc = tl.zeros((BLOCK_Q, BLOCK_DV), acc_dtype)  # running sum of exp(s - m) * v
    offset = t_k - t_q  # bottom-right causal: query i sees key j <= i + offset
    end = t_k
    if IS_CAUSAL:  # key blocks past the block's last query's last key: never visited
        end = tl.minimum(t_k, (block_q + 1) * BLOCK_Q + offset)
    for start in range(0, end, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)  # (BK,) key positions
        col_ok = cols < t_k
        k = load_rows(K, bh, t_k, D_K, cols, dk)  # (BK, BDK)
        v = load_rows(V, bh, t_k, D_V, cols, dv)  # (BK, BDV)
        s, allowed = tile_scores(  # (BQ, BK): this tile's scores
            q, k, rows, cols, row_ok, col_ok, b, h, offset, scale, acc_dtype,
            Mask, Bias, mask_sb, mask_sh, mask_sq, mask_sk,
            bias_sb, bias_sh, bias_sq, bias_sk, IS_CAUSAL, HAS_MASK, HAS_BIAS)
        s = tl.where(allowed, s, float("-inf"))

        m_new = tl.maximum(m, tl.max(s, 1))  # (BQ,)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet
        p = tl.exp(s - m_safe[:, None])  # (BQ, BK); 0 where masked
        alpha = tl.exp(m - m_safe)  # rescales what was summed under the old max
        l = l * alpha + tl.sum(p, 1)  # noqa: E741  dropped weights still count in l
        if DROPOUT:
            keep = dropout_keep(Seed, bh, t_q, t_k, rows, cols, dropout_p)
            p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
        # a key no query of the tile may see is zeroed: 0 * NaN in a pad would be NaN
        seen = tl.max(allowed.to(tl.int32), 0) > 0  # (BK,)
        v = tl.where(seen[:, None], v, 0.0)
        # (BQ, BK) @ (BK, BDV) -> (BQ, BDV)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m = m_new

    empty = l == 0  # a query with no allowed key: zeros, never NaN (chapter 5)
    out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l)[:, None])
    # L = m + log l; +inf for an empty row, so that the backward's exp(s - L) is 0 there
    lse = tl.where(empty, float("inf"), m + tl.log(tl.where(empty, 1.0, l)))
    store_rows(Out, out, bh, t_q, D_V, rows, dv)
    tl.store(LSE + bh * t_q + rows, lse, mask=row_ok)


# The backward's first kernel: one program per (key block, batch x head), a loop over
# the query blocks that may see it; it owns its rows of dK and dV (and of dBias).
@triton.jit
def backward_dk_dv_kernel(
    Q, K, V, dOut, LSE, Delta, dK, dV, dBias,  # dBias: (BH, T_q, T_k) float32, if asked
    Mask, Bias, Seed, Scale,
    n_heads, t_q, t_k, dropout_p,
    mask_sb, mask_sh, mask_sq, mask_sk, bias_sb, bias_sh, bias_sq, bias_sk,
    D_K: tl.constexpr, D_V: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, IS_CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr,
    BIAS_GRAD: tl.constexpr,
):
    block_k = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // n_heads, bh % n_heads
    acc_dtype = tl.float64 if Q.dtype.element_ty == tl.float64 else tl.float32
    scale = tl.load(Scale)  # a tensor, not a float argument: those arrive as float32
    cols = block_k * BLOCK_K + tl.arange(0, BLOCK_K)  # (BK,) this program's keys
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    col_ok = cols < t_k
    k = load_rows(K, bh, t_k, D_K, cols, dk)  # (BK, BDK)
    v = load_rows(V, bh, t_k, D_V, cols, dv)  # (BK, BDV)
    grad_k = tl.zeros((BLOCK_K, BLOCK_DK), acc_dtype)
    grad_v = tl.zeros((BLOCK_K, BLOCK_DV), acc_dtype)

    offset = t_k - t_q
    start_q = 0
    if IS_CAUSAL:  # the first query that may see this block's first key, block-aligned
        start_q = tl.maximum(block_k * BLOCK_K - offset, 0) // BLOCK_Q * BLOCK_Q
    for start in range(start_q, t_q, BLOCK_Q):
        rows = start + tl.arange(0, BLOCK_Q)  # (BQ,)
        row_ok = rows < t_q
        q = load_rows(Q, bh, t_q, D_K, rows, dk)  # (BQ, BDK)
        grad_out = load_rows(dOut, bh, t_q, D_V, rows, dv)  # (BQ, BDV)
        lse = tl.load(LSE + bh * t_q + rows, mask=row_ok, other=float("inf"))  # (BQ,)
        delta = tl.load(Delta + bh * t_q + rows, mask=row_ok, other=0.0)  # (BQ,)
        # the tile's weights, recomputed: P = exp(s - L), the forward's softmax exactly
        s, allowed = tile_scores(
            q, k, rows, cols, row_ok, col_ok, b, h, offset, scale, acc_dtype,
            Mask, Bias, mask_sb, mask_sh, mask_sq, mask_sk,
            bias_sb, bias_sh, bias_sq, bias_sk, IS_CAUSAL, HAS_MASK, HAS_BIAS)
        p = tl.where(allowed, tl.exp(s - lse[:, None]), 0.0)  # (BQ, BK)
        # (BQ, BDV) @ (BDV, BK) -> (BQ, BK): dP = dO V^T
        grad_p = tl.dot(grad_out, tl.trans(v), input_precision="ieee").to(acc_dtype)
        p_used = p
        if DROPOUT:  # the forward's dropout mask, drawn again from the same positions
            keep = dropout_keep(Seed, bh, t_q, t_k, rows, cols, dropout_p)
            p_used = tl.where(keep, p / (1.0 - dropout_p), 0.0)
            grad_p = tl.where(keep, grad_p / (1.0 - dropout_p), 0.0)
        # (BK, BQ) @ (BQ, BDV) -> (BK, BDV): dV += P^T dO
        grad_v += tl.dot(tl.trans(p_used.to(grad_out.dtype)), grad_out, input_precision="ieee")
        # the softmax backward: dS = P * (dP - D), 0 where masked (NaN in a pad stays out)
        grad_s = tl.where(allowed, p * (grad_p - delta[:, None]), 0.0)  # (BQ, BK)
        # (BK, BQ) @ (BQ, BDK) -> (BK, BDK): dK += dS^T Q * scale
        grad_k += tl.dot(tl.trans(grad_s.to(q.dtype)), q, input_precision="ieee") * scale
        if BIAS_GRAD:  # the bias's gradient is dS itself; this program owns these entries
            tl.store(dBias + bh * t_q * t_k + rows[:, None] * t_k + cols[None, :], grad_s,
                     mask=row_ok[:, None] & col_ok[None, :])

    store_rows(dK, grad_k, bh, t_k, D_K, cols, dk)
    store_rows(dV, grad_v, bh, t_k, D_V, cols, dv)


# The backward's second kernel: one program per (query block, batch x head), a loop over
# key blocks as in the forward; it owns its rows of dQ.
@triton.jit
def backward_dq_kernel(
    Q, K, V, dOut, LSE, Delta, dQ,
    Mask, Bias, Seed, Scale,
    n_heads, t_q, t_k, dropout_p,
    mask_sb, mask_sh, mask_sq, mask_sk, bias_sb, bias_sh, bias_sq, bias_sk,
    D_K: tl.constexpr, D_V: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, IS_CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr,
):
    block_q = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // n_heads, bh % n_heads
    acc_dtype = tl.float64 if Q.dtype.element_ty == tl.float64 else tl.float32
    scale = tl.load(Scale)  # a tensor, not a float argument: those arrive as float32
    rows = block_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    row_ok = rows < t_q
    q = load_rows(Q, bh, t_q, D_K, rows, dk)  # (BQ, BDK)
    grad_out = load_rows(dOut, bh, t_q, D_V, rows, dv)  # (BQ, BDV)
    lse = tl.load(LSE + bh * t_q + rows, mask=row_ok, other=float("inf"))
    delta = tl.load(Delta + bh * t_q + rows, mask=row_ok, other=0.0)
    grad_q = tl.zeros((BLOCK_Q, BLOCK_DK), acc_dtype)

    offset = t_k - t_q
    end = t_k
    if IS_CAUSAL:
        end = tl.minimum(t_k, (block_q + 1) * BLOCK_Q + offset)
    for start in range(0, end, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        col_ok = cols < t_k
        k = load_rows(K, bh, t_k, D_K, cols, dk)  # (BK, BDK)
        v = load_rows(V, bh, t_k, D_V, cols, dv)  # (BK, BDV)
        s, allowed = tile_scores(
            q, k, rows, cols, row_ok, col_ok, b, h, offset, scale, acc_dtype,
            Mask, Bias, mask_sb, mask_sh, mask_sq, mask_sk,
            bias_sb, bias_sh, bias_sq, bias_sk, IS_CAUSAL, HAS_MASK, HAS_BIAS)
        p = tl.where(allowed, tl.exp(s - lse[:, None]), 0.0)  # (BQ, BK)
        grad_p = tl.dot(grad_out, tl.trans(v), input_precision="ieee").to(acc_dtype)
        if DROPOUT:
            keep = dropout_keep(Seed, bh, t_q, t_k, rows, cols, dropout_p)
            grad_p = tl.where(keep, grad_p / (1.0 - dropout_p), 0.0)
        grad_s = tl.where(allowed, p * (grad_p - delta[:, None]), 0.0)  # (BQ, BK)
        seen = tl.max(allowed.to(tl.int32), 0) > 0  # keys no query here may see: zeroed
        k = tl.where(seen[:, None], k, 0.0)
        # (BQ, BK) @ (BK, BDK) -> (BQ, BDK): dQ += dS K * scale
        grad_q += tl.dot(grad_s.to(k.dtype), k, input_precision="ieee") * scale

    store_rows(dQ, grad_q, bh, t_q, D_K, rows, dk)


def _strides(t: Tensor | None) -> tuple[int, int, int, int]:
    """The four strides of a ``(B, H, T_q, T_k)`` view (0 along broadcast axes)."""
    return (0, 0, 0, 0) if t is None else tuple(t.stride())  # type: ignore[return-value]


def _launch_options(q: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
                    seed: Tensor | None, n_heads: int, is_causal: bool, scale: float,
                    dropout_p: float, block_q: int, block_k: int) -> tuple[list, dict]:
    """The arguments every kernel shares, after its own tensors."""
    t_q, t_k = q.shape[1], v.shape[1]
    d_k, d_v = q.shape[2], v.shape[2]
    mask_bytes = None if mask is None else mask.view(torch.uint8)  # bool -> 0/1 bytes
    scale_t = torch.full((1,), scale, dtype=torch.float64 if q.dtype == torch.float64
                         else torch.float32, device=q.device)
    shared = [mask_bytes if mask_bytes is not None else q, bias if bias is not None else q,
              seed if seed is not None else q, scale_t, n_heads, t_q, t_k, dropout_p,
              *_strides(mask), *_strides(bias)]
    constants = dict(D_K=d_k, D_V=d_v, BLOCK_DK=max(16, triton.next_power_of_2(d_k)),
                     BLOCK_DV=max(16, triton.next_power_of_2(d_v)), BLOCK_Q=block_q,
                     BLOCK_K=block_k, IS_CAUSAL=is_causal, HAS_MASK=mask is not None,
                     HAS_BIAS=bias is not None, DROPOUT=seed is not None)
    return shared, constants


def flash_forward(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
                  seed: Tensor | None, n_heads: int, is_causal: bool, scale: float,
                  dropout_p: float, block_q: int, block_k: int) -> tuple[Tensor, Tensor]:
    """Launch the forward kernel: ``(out (BH, T_q, d_v), lse (BH, T_q))`` (Chapter 9).

    ``q, k, v`` contiguous ``(BH, T, d)``; ``mask`` bool and ``bias`` float, each ``None``
    or a ``(B, H, T_q, T_k)`` view with ``B * H = BH``; ``seed`` an int64 ``(1,)`` tensor
    (dropout) or ``None``. No checks.
    """
    bh, t_q = q.shape[0], q.shape[1]
    out = torch.empty(bh, t_q, v.shape[2], dtype=q.dtype, device=q.device)  # (BH, T_q, d_v)
    lse = torch.empty(bh, t_q, dtype=torch.float64 if q.dtype == torch.float64
                      else torch.float32, device=q.device)  # (BH, T_q)
    shared, constants = _launch_options(q, v, mask, bias, seed, n_heads, is_causal, scale,
                                        dropout_p, block_q, block_k)
    grid = (triton.cdiv(t_q, block_q), bh)
    forward_kernel[grid](q, k, v, out, lse, *shared, **constants)
    return out, lse


def flash_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                   lse: Tensor, mask: Tensor | None, bias: Tensor | None,
                   seed: Tensor | None, n_heads: int, is_causal: bool, scale: float,
                   dropout_p: float, block_q: int, block_k: int, bias_grad: bool,
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Launch the two backward kernels: ``(dq, dk, dv, dbias or None)`` (Chapter 9).

    Shapes as in :func:`flash_forward`; ``dbias`` is ``(BH, T_q, T_k)`` float32 (float64
    for float64 inputs) when ``bias_grad``. No checks.
    """
    bh, t_q, t_k = q.shape[0], q.shape[1], k.shape[1]
    grad_out = grad_out.contiguous()
    # D_i = sum_d dO_i * O_i: the softmax backward's row term (O holds dropout already)
    delta = (grad_out.to(lse.dtype) * out.to(lse.dtype)).sum(-1)  # (BH, T_q)
    grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    grad_bias = (torch.zeros(bh, t_q, t_k, dtype=lse.dtype, device=q.device)
                 if bias_grad else None)  # (BH, T_q, T_k): skipped causal tiles stay 0
    shared, constants = _launch_options(q, v, mask, bias, seed, n_heads, is_causal, scale,
                                        dropout_p, block_q, block_k)
    backward_dk_dv_kernel[(triton.cdiv(t_k, block_k), bh)](
        q, k, v, grad_out, lse, delta, grad_k, grad_v,
        grad_bias if grad_bias is not None else q, *shared, BIAS_GRAD=bias_grad, **constants)
    backward_dq_kernel[(triton.cdiv(t_q, block_q), bh)](
        q, k, v, grad_out, lse, delta, grad_q, *shared, **constants)
    return grad_q, grad_k, grad_v, grad_bias
