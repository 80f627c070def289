"""Chapter 9: the kernel's Triton programs and their launchers, read top to bottom.

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
* backward, dQ, two ways (``backward=`` of the path):

  - ``"pair"`` (the default): a second kernel, one program per (query block, ``bh``),
    looping over key blocks like the forward and accumulating its own rows of dQ. Each
    program owns the rows it writes, so no two programs add into the same memory: no
    atomics, and the same gradients to the bit on every run. The price: both kernels
    recompute the tile's scores S = QKᵀ and dP = dO·Vᵀ, so a tile costs 7 block
    products (dK/dV: S, dP, dV, dK; dQ: S, dP, dQ), where FlashAttention-2's backward
    takes 5;
  - ``"atomic"``: FlashAttention-2's single pass: the dK/dV program also adds its share
    dS·K of each query block's dQ into a float32 dQ with ``tl.atomic_add``. 5 block
    products per tile, but the order of the additions into dQ changes from run to run,
    so dQ may differ in its last bits between two runs.

``D = rowsum(dO * O)``, the softmax backward's row term, is a small kernel of its own.

The masks, in every kernel: rows and columns past ``T`` (the last tile of a ragged
``T``), the bottom-right causal mask, a boolean mask of any broadcast shape (read through
its strides, so a ``(B, 1, 1, T_k)`` key-padding mask costs ``T_k`` bytes per batch row),
an additive bias, and dropout by a counter-based random number of each weight's position
(``tl.rand``), drawn again in the backward instead of stored. Each loop over tiles is
split in two, as ``block_grid`` sorts the blocks: the tiles that every query of the block
sees whole run without any mask arithmetic, and only the rest (the causal diagonal, a
ragged last tile; every tile when a boolean mask is given) are masked. Key blocks wholly
in a query block's future are not visited at all.

Q, K, V, the output and the gradients are read and written through their strides (the
head dimension contiguous), so a model's ``(B, T, H, d)`` projections, viewed as
``(B, H, T, d)``, are never copied. float64 tiles multiply without ``tl.dot`` (see
:func:`mm`). On a GPU, half-precision calls of 256 positions or more without explicit tile
sizes pick their tiles, warps and pipeline stages with ``triton.autotune`` (timed once per
head size, length bucket and dtype); the interpreter, shorter calls and the other dtypes
use one fixed configuration.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["DK_DV_CONFIGS", "DQ_CONFIGS", "FORWARD_CONFIGS", "INTERPRETING", "TUNED_DTYPES",
           "TUNE_MIN_LENGTH",
           "Tuned", "Tuners", "backward_delta_kernel", "backward_dk_dv_kernel",
           "backward_dq_kernel", "build_tuners", "dropout_keep", "flash_backward",
           "flash_forward", "forward_kernel", "launches_recorded", "length_bucket", "load_tile",
           "mm", "store_tile", "tile_allowed", "tuners"]

#: Whether the kernels run under Triton's interpreter (NumPy on the CPU), as triton decided
#: when it was imported.
INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"


# ------------------------------------------------------------------ steps of every kernel
@triton.jit
def mm(a, b, USE_DOT: tl.constexpr):
    # (M, K) @ (K, N) -> (M, N), in float32 (float64 for float64 tiles). tl.dot runs on the
    # tensor cores; Triton has no float64 tl.dot at these tile sizes on a GPU ("fp64 don't
    # support largeK MMA"), so float64 tiles multiply, broadcast to (M, K, N), and sum.
    if USE_DOT:
        c = tl.dot(a, b, input_precision="ieee")  # float32 in full IEEE precision, not TF32
    else:
        c = tl.sum(a[:, :, None] * b[None, :, :], 1)
    return c


@triton.jit
def load_tile(Ptr, rows, t, row_stride, d, D: tl.constexpr, BLOCK_D: tl.constexpr):
    # Rows `rows` of one head's (T, D) matrix (row stride `row_stride`, columns contiguous) as
    # a (len(rows), BLOCK_D) tile; the rows past T and the columns past D (padding up to a
    # power of two) read as 0.
    ptrs = Ptr + rows[:, None] * row_stride + d[None, :]
    if D == BLOCK_D:  # no padded column: a mask constant along a row keeps the loads wide
        tile = tl.load(ptrs, mask=(rows < t)[:, None], other=0.0)
    else:
        tile = tl.load(ptrs, mask=(rows < t)[:, None] & (d[None, :] < D), other=0.0)
    return tile


@triton.jit
def store_tile(Ptr, tile, rows, t, row_stride, d, D: tl.constexpr):
    # A tile into rows `rows` of one head's (T, D) matrix, in the matrix's dtype.
    tl.store(Ptr + rows[:, None] * row_stride + d[None, :], tile.to(Ptr.dtype.element_ty),
             mask=(rows < t)[:, None] & (d[None, :] < D))


@triton.jit
def tile_allowed(rows, cols, t_q, t_k, b, h, offset, Mask, mask_sb, mask_sh, mask_sq, mask_sk,
                 IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr):
    # Which scores of a (BQ, BK) tile may be attended: in bounds, causal, the mask.
    allowed = (rows < t_q)[:, None] & (cols < t_k)[None, :]
    if IS_CAUSAL:  # bottom-right: query i sees key j <= i + offset
        allowed &= cols[None, :] <= rows[:, None] + offset
    if HAS_MASK:
        allowed &= tl.load(Mask + b * mask_sb + h * mask_sh + rows[:, None] * mask_sq
                           + cols[None, :] * mask_sk, mask=allowed, other=0) != 0
    return allowed


@triton.jit
def load_bias(Bias, rows, cols, t_q, t_k, b, h, bias_sb, bias_sh, bias_sq, bias_sk):
    # The (BQ, BK) tile of the additive bias, 0 out of bounds.
    return tl.load(Bias + b * bias_sb + h * bias_sh + rows[:, None] * bias_sq
                   + cols[None, :] * bias_sk,
                   mask=(rows < t_q)[:, None] & (cols < t_k)[None, :], other=0.0)


@triton.jit
def dropout_keep(Seed, bh, t_q, t_k, rows, cols, dropout_p):
    # Which weights of a tile dropout keeps: a counter-based random number of each
    # weight's position (tl.rand), so the backward draws the forward's mask again.
    seed = tl.load(Seed)
    where = (bh * t_q + rows[:, None]) * t_k + cols[None, :]  # int64 positions
    return tl.rand(seed, where) >= dropout_p


# ------------------------------------------------------------------------------ forward
# One program per (query block, batch x head); its loop over key blocks is forward_tiles.
@triton.jit(do_not_specialize=["n_heads"])  # one binary for any number of heads
def forward_kernel(
    Q, K, V, Out, LSE,  # (B, H, T_q, d_k), (B, H, T_k, d_k), (B, H, T_k, d_v) and
    # (B, H, T_q, d_v) by their strides below; LSE (B * H, T_q), contiguous
    Mask, Bias, Seed, Scale,  # (B, H, T_q, T_k) by strides (0 where broadcast); (1,) each
    q_sb, q_sh, q_st, k_sb, k_sh, k_st, v_sb, v_sh, v_st, o_sb, o_sh, o_st,
    mask_sb, mask_sh, mask_sq, mask_sk, bias_sb, bias_sh, bias_sq, bias_sk,
    n_heads, t_q, t_k, dropout_p, t_bucket,  # t_bucket: only the tuner's key
    D_K: tl.constexpr, D_V: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr,
    DROPOUT: tl.constexpr, USE_DOT: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
):
    block_q = tl.program_id(0)
    if IS_CAUSAL:  # the longest rows first, so that the last programs to start are short
        block_q = tl.num_programs(0) - 1 - block_q
    bh = tl.program_id(1).to(tl.int64)  # int64: b * stride overflows int32 at long T
    b, h = bh // n_heads, bh % n_heads
    acc_dtype = tl.float64 if Q.dtype.element_ty == tl.float64 else tl.float32
    scale = tl.load(Scale)  # a tensor, not a float argument: those arrive as float32
    rows = block_q * BLOCK_Q + tl.arange(0, BLOCK_Q)  # (BQ,) query positions
    dk = tl.arange(0, BLOCK_DK)  # head dims, padded to a power of two >= 16 in registers
    dv = tl.arange(0, BLOCK_DV)
    q = load_tile(Q + b * q_sb + h * q_sh, rows, t_q, q_st, dk, D_K, BLOCK_DK)  # (BQ, BDK)

    m = tl.full((BLOCK_Q,), float("-inf"), acc_dtype)  # running max of each row
    l = tl.zeros((BLOCK_Q,), acc_dtype)  # noqa: E741  running sum of exp(s - m)
    acc = tl.zeros((BLOCK_Q, BLOCK_DV), acc_dtype)  # running sum of exp(s - m) * v
    offset = t_k - t_q  # bottom-right causal: query i sees key j <= i + offset
    # keys [0, full): tiles every query of the block sees whole; [full, end): masked tiles
    full = t_k // BLOCK_K * BLOCK_K
    end = t_k
    if IS_CAUSAL:  # key blocks past the block's last query's last key: never visited
        full = tl.maximum(tl.minimum(t_k, block_q * BLOCK_Q + offset + 1), 0)
        full = full // BLOCK_K * BLOCK_K
        end = tl.minimum(t_k, (block_q + 1) * BLOCK_Q + offset)
    if HAS_MASK:
        full = 0
    K_head, V_head = K + b * k_sb + h * k_sh, V + b * v_sb + h * v_sh
    acc, l, m = forward_tiles(  # noqa: E741
        acc, l, m, q, K_head, V_head, k_st, v_st, 0, full, rows, b, h, bh, t_q, t_k, offset,
        scale, dropout_p, Mask, Bias, Seed, mask_sb, mask_sh, mask_sq, mask_sk,
        bias_sb, bias_sh, bias_sq, bias_sk, D_K, D_V, BLOCK_DK, BLOCK_DV, BLOCK_K,
        IS_CAUSAL, HAS_MASK, HAS_BIAS, DROPOUT, USE_DOT, False)
    acc, l, m = forward_tiles(  # noqa: E741
        acc, l, m, q, K_head, V_head, k_st, v_st, full, end, rows, b, h, bh, t_q, t_k, offset,
        scale, dropout_p, Mask, Bias, Seed, mask_sb, mask_sh, mask_sq, mask_sk,
        bias_sb, bias_sh, bias_sq, bias_sk, D_K, D_V, BLOCK_DK, BLOCK_DV, BLOCK_K,
        IS_CAUSAL, HAS_MASK, HAS_BIAS, DROPOUT, USE_DOT, True)

    empty = l == 0  # a query with no allowed key: zeros, never NaN (chapter 5)
    out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l)[:, None])
    # L = m + log l; +inf for an empty row, so that the backward's exp(s - L) is 0 there
    lse = tl.where(empty, float("inf"), m + tl.log(tl.where(empty, 1.0, l)))
    store_tile(Out + b * o_sb + h * o_sh, out, rows, t_q, o_st, dv, D_V)
    tl.store(LSE + bh * t_q + rows, lse, mask=rows < t_q)


@triton.jit
def forward_tiles(acc, l, m, q, K_head, V_head, k_st, v_st, lo, hi, rows, b, h, bh, t_q, t_k,
                  offset, scale, dropout_p, Mask, Bias, Seed, mask_sb, mask_sh, mask_sq,
                  mask_sk, bias_sb, bias_sh, bias_sq, bias_sk, D_K: tl.constexpr,
                  D_V: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
                  BLOCK_K: tl.constexpr, IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
                  HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr, USE_DOT: tl.constexpr,
                  MASKED: tl.constexpr):
    # The key tiles [lo, hi) of a query block: section 9.3's merge, once per tile.
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    for start in range(lo, hi, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)  # (BK,) key positions
        k = load_tile(K_head, cols, t_k, k_st, dk, D_K, BLOCK_DK)  # (BK, BDK)
        v = load_tile(V_head, cols, t_k, v_st, dv, D_V, BLOCK_DV)  # (BK, BDV)
        s = mm(q, tl.trans(k), USE_DOT) * scale  # (BQ, BDK) @ (BDK, BK) -> (BQ, BK)
        if HAS_BIAS:
            s += load_bias(Bias, rows, cols, t_q, t_k, b, h, bias_sb, bias_sh, bias_sq,
                           bias_sk).to(s.dtype)
        if MASKED:
            allowed = tile_allowed(rows, cols, t_q, t_k, b, h, offset, Mask, mask_sb, mask_sh,
                                   mask_sq, mask_sk, IS_CAUSAL, HAS_MASK)
            s = tl.where(allowed, s, float("-inf"))

        m_new = tl.maximum(m, tl.max(s, 1))  # (BQ,)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet
        p = tl.exp(s - m_safe[:, None])  # (BQ, BK); 0 where masked
        alpha = tl.exp(m - m_safe)  # rescales what was summed under the old max
        l = l * alpha + tl.sum(p, 1)  # noqa: E741  dropped weights still count in l
        if DROPOUT:
            keep = dropout_keep(Seed, bh, t_q, t_k, rows, cols, dropout_p)
            p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
        if MASKED:  # zero the keys no query here may see: 0 * NaN in a pad is NaN
            seen = tl.max(allowed.to(tl.int32), 0) > 0  # (BK,)
            v = tl.where(seen[:, None], v, 0.0)
        # (BQ, BK) @ (BK, BDV) -> (BQ, BDV)
        acc = acc * alpha[:, None] + mm(p.to(v.dtype), v, USE_DOT)
        m = m_new
    return acc, l, m


# ----------------------------------------------------------------------------- backward
# D_i = sum_d dO_i * O_i, the softmax backward's row term (O holds dropout already).
@triton.jit(do_not_specialize=["n_heads"])  # one binary for any number of heads
def backward_delta_kernel(Out, dOut, Delta, o_sb, o_sh, o_st, do_sb, do_sh, do_st, n_heads,
                          t_q, D_V: tl.constexpr, BLOCK_DV: tl.constexpr,
                          BLOCK_Q: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // n_heads, bh % n_heads
    rows = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    dv = tl.arange(0, BLOCK_DV)
    acc_dtype = Delta.dtype.element_ty
    out = load_tile(Out + b * o_sb + h * o_sh, rows, t_q, o_st, dv, D_V, BLOCK_DV)
    grad_out = load_tile(dOut + b * do_sb + h * do_sh, rows, t_q, do_st, dv, D_V, BLOCK_DV)
    delta = tl.sum(out.to(acc_dtype) * grad_out.to(acc_dtype), 1)  # (BQ,)
    tl.store(Delta + bh * t_q + rows, delta, mask=rows < t_q)


# One program per (key block, batch x head), a loop over the query blocks that may see it
# (key_block_tiles); it owns its rows of dK and dV (and its entries of dBias), and with
# ATOMIC_DQ it also adds into dQ: FlashAttention-2's single pass.
@triton.jit(do_not_specialize=["n_heads"])  # one binary for any number of heads
def backward_dk_dv_kernel(
    Q, K, V, dOut, LSE, Delta, dK, dV, dQ, dBias,  # dQ: float32 (float64), if ATOMIC_DQ;
    # dBias: (B * H, T_q, T_k) float32 (float64), if BIAS_GRAD
    Mask, Bias, Seed, Scale,
    q_sb, q_sh, q_st, k_sb, k_sh, k_st, v_sb, v_sh, v_st, do_sb, do_sh, do_st,
    dk_sb, dk_sh, dk_st, dv_sb, dv_sh, dv_st, dq_sb, dq_sh, dq_st,
    mask_sb, mask_sh, mask_sq, mask_sk, bias_sb, bias_sh, bias_sq, bias_sk,
    n_heads, t_q, t_k, dropout_p, t_bucket,
    D_K: tl.constexpr, D_V: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr,
    DROPOUT: tl.constexpr, USE_DOT: tl.constexpr, BIAS_GRAD: tl.constexpr,
    ATOMIC_DQ: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
):
    block_k = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // n_heads, bh % n_heads
    acc_dtype = tl.float64 if Q.dtype.element_ty == tl.float64 else tl.float32
    scale = tl.load(Scale)
    cols = block_k * BLOCK_K + tl.arange(0, BLOCK_K)  # (BK,) this program's keys
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    k = load_tile(K + b * k_sb + h * k_sh, cols, t_k, k_st, dk, D_K, BLOCK_DK)  # (BK, BDK)
    v = load_tile(V + b * v_sb + h * v_sh, cols, t_k, v_st, dv, D_V, BLOCK_DV)  # (BK, BDV)
    grad_k = tl.zeros((BLOCK_K, BLOCK_DK), acc_dtype)
    grad_v = tl.zeros((BLOCK_K, BLOCK_DV), acc_dtype)

    offset = t_k - t_q
    # queries [lo, mid): tiles to mask; [mid, t_q): tiles whose every query sees every key
    # of the block (a ragged key block, or a boolean mask, masks every tile)
    lo = 0
    mid = 0
    if IS_CAUSAL:  # the first query that may see this block's first key, block-aligned
        lo = tl.maximum(block_k * BLOCK_K - offset, 0) // BLOCK_Q * BLOCK_Q
        mid = tl.maximum((block_k + 1) * BLOCK_K - 1 - offset, 0)  # sees the block's last key
        mid = (mid + BLOCK_Q - 1) // BLOCK_Q * BLOCK_Q
    if HAS_MASK:
        mid = t_q
    mid = tl.where((block_k + 1) * BLOCK_K > t_k, t_q, mid)
    Q_head, dO_head = Q + b * q_sb + h * q_sh, dOut + b * do_sb + h * do_sh
    dQ_head = dQ + b * dq_sb + h * dq_sh
    grad_k, grad_v = key_block_tiles(
        grad_k, grad_v, k, v, Q_head, dO_head, dQ_head, q_st, do_st, dq_st, LSE, Delta, dBias,
        lo, tl.minimum(mid, t_q), cols, b, h, bh, t_q, t_k, offset, scale, dropout_p,
        Mask, Bias, Seed, mask_sb, mask_sh, mask_sq, mask_sk, bias_sb, bias_sh, bias_sq,
        bias_sk, D_K, D_V, BLOCK_DK, BLOCK_DV, BLOCK_Q, IS_CAUSAL, HAS_MASK, HAS_BIAS, DROPOUT,
        USE_DOT, BIAS_GRAD, ATOMIC_DQ, True)
    grad_k, grad_v = key_block_tiles(
        grad_k, grad_v, k, v, Q_head, dO_head, dQ_head, q_st, do_st, dq_st, LSE, Delta, dBias,
        mid, t_q, cols, b, h, bh, t_q, t_k, offset, scale, dropout_p,
        Mask, Bias, Seed, mask_sb, mask_sh, mask_sq, mask_sk, bias_sb, bias_sh, bias_sq,
        bias_sk, D_K, D_V, BLOCK_DK, BLOCK_DV, BLOCK_Q, IS_CAUSAL, HAS_MASK, HAS_BIAS, DROPOUT,
        USE_DOT, BIAS_GRAD, ATOMIC_DQ, False)

    store_tile(dK + b * dk_sb + h * dk_sh, grad_k * scale, cols, t_k, dk_st, dk, D_K)
    store_tile(dV + b * dv_sb + h * dv_sh, grad_v, cols, t_k, dv_st, dv, D_V)


@triton.jit
def key_block_tiles(grad_k, grad_v, k, v, Q_head, dO_head, dQ_head, q_st, do_st, dq_st, LSE,
                    Delta, dBias, lo, hi, cols, b, h, bh, t_q, t_k, offset, scale, dropout_p,
                    Mask, Bias, Seed, mask_sb, mask_sh, mask_sq, mask_sk, bias_sb, bias_sh,
                    bias_sq, bias_sk, D_K: tl.constexpr, D_V: tl.constexpr,
                    BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_Q: tl.constexpr,
                    IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr,
                    DROPOUT: tl.constexpr, USE_DOT: tl.constexpr, BIAS_GRAD: tl.constexpr,
                    ATOMIC_DQ: tl.constexpr, MASKED: tl.constexpr):
    # The query tiles [lo, hi) that see a key block: its dK and dV (and dQ's share).
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    for start in range(lo, hi, BLOCK_Q):
        rows = start + tl.arange(0, BLOCK_Q)  # (BQ,)
        q = load_tile(Q_head, rows, t_q, q_st, dk, D_K, BLOCK_DK)  # (BQ, BDK)
        grad_out = load_tile(dO_head, rows, t_q, do_st, dv, D_V, BLOCK_DV)  # (BQ, BDV)
        # rows past T_q: L = +inf, so their weights below are exp(s - inf) = 0
        lse = tl.load(LSE + bh * t_q + rows, mask=rows < t_q, other=float("inf"))  # (BQ,)
        delta = tl.load(Delta + bh * t_q + rows, mask=rows < t_q, other=0.0)  # (BQ,)
        # the tile's weights, recomputed: P = exp(s - L), the forward's softmax exactly
        s = mm(q, tl.trans(k), USE_DOT) * scale  # (BQ, BK)
        if HAS_BIAS:
            s += load_bias(Bias, rows, cols, t_q, t_k, b, h, bias_sb, bias_sh, bias_sq,
                           bias_sk).to(s.dtype)
        p = tl.exp(s - lse[:, None])  # (BQ, BK)
        if MASKED:
            allowed = tile_allowed(rows, cols, t_q, t_k, b, h, offset, Mask, mask_sb, mask_sh,
                                   mask_sq, mask_sk, IS_CAUSAL, HAS_MASK)
            p = tl.where(allowed, p, 0.0)
        # (BQ, BDV) @ (BDV, BK) -> (BQ, BK): dP = dO V^T
        grad_p = mm(grad_out, tl.trans(v), USE_DOT)
        p_used = p
        if DROPOUT:  # the forward's dropout mask, drawn again from the same positions
            keep = dropout_keep(Seed, bh, t_q, t_k, rows, cols, dropout_p)
            p_used = tl.where(keep, p / (1.0 - dropout_p), 0.0)
            grad_p = tl.where(keep, grad_p / (1.0 - dropout_p), 0.0)
        # (BK, BQ) @ (BQ, BDV) -> (BK, BDV): dV += P^T dO
        grad_v += mm(tl.trans(p_used.to(grad_out.dtype)), grad_out, USE_DOT)
        # the softmax backward: dS = P * (dP - D), 0 where masked (NaN in a pad stays out)
        grad_s = p * (grad_p - delta[:, None])  # (BQ, BK)
        if MASKED:
            grad_s = tl.where(allowed, grad_s, 0.0)
        # (BK, BQ) @ (BQ, BDK) -> (BK, BDK): dK += dS^T Q (times the scale, once, at the end)
        grad_k += mm(tl.trans(grad_s.to(q.dtype)), q, USE_DOT)
        if BIAS_GRAD:  # the bias's gradient is dS itself; this program owns these entries
            tl.store(dBias + bh * t_q * t_k + rows[:, None] * t_k + cols[None, :], grad_s,
                     mask=(rows < t_q)[:, None] & (cols < t_k)[None, :])
        if ATOMIC_DQ:  # FlashAttention-2: dQ += dS K * scale, added by every key block
            k_seen = k
            if MASKED:  # keys no query here may see are zeroed, as in the dQ kernel
                seen = tl.max(allowed.to(tl.int32), 0) > 0
                k_seen = tl.where(seen[:, None], k, 0.0)
            # (BQ, BK) @ (BK, BDK) -> (BQ, BDK)
            grad_q = mm(grad_s.to(k.dtype), k_seen, USE_DOT) * scale
            tl.atomic_add(dQ_head + rows[:, None] * dq_st + dk[None, :], grad_q,
                          mask=(rows < t_q)[:, None] & (dk[None, :] < D_K), sem="relaxed")
    return grad_k, grad_v


# The pair's second kernel: one program per (query block, batch x head), a loop over key
# blocks as in the forward (query_block_tiles); it owns its rows of dQ.
@triton.jit(do_not_specialize=["n_heads"])  # one binary for any number of heads
def backward_dq_kernel(
    Q, K, V, dOut, LSE, Delta, dQ,
    Mask, Bias, Seed, Scale,
    q_sb, q_sh, q_st, k_sb, k_sh, k_st, v_sb, v_sh, v_st, do_sb, do_sh, do_st,
    dq_sb, dq_sh, dq_st,
    mask_sb, mask_sh, mask_sq, mask_sk, bias_sb, bias_sh, bias_sq, bias_sk,
    n_heads, t_q, t_k, dropout_p, t_bucket,
    D_K: tl.constexpr, D_V: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr,
    DROPOUT: tl.constexpr, USE_DOT: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
):
    block_q = tl.program_id(0)
    if IS_CAUSAL:  # the longest rows first, as in the forward
        block_q = tl.num_programs(0) - 1 - block_q
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // n_heads, bh % n_heads
    acc_dtype = tl.float64 if Q.dtype.element_ty == tl.float64 else tl.float32
    scale = tl.load(Scale)
    rows = block_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    q = load_tile(Q + b * q_sb + h * q_sh, rows, t_q, q_st, dk, D_K, BLOCK_DK)  # (BQ, BDK)
    grad_out = load_tile(dOut + b * do_sb + h * do_sh, rows, t_q, do_st, dv, D_V, BLOCK_DV)
    lse = tl.load(LSE + bh * t_q + rows, mask=rows < t_q, other=float("inf"))
    delta = tl.load(Delta + bh * t_q + rows, mask=rows < t_q, other=0.0)
    grad_q = tl.zeros((BLOCK_Q, BLOCK_DK), acc_dtype)

    offset = t_k - t_q
    full = t_k // BLOCK_K * BLOCK_K  # as in the forward: [0, full) unmasked, [full, end) masked
    end = t_k
    if IS_CAUSAL:
        full = tl.maximum(tl.minimum(t_k, block_q * BLOCK_Q + offset + 1), 0)
        full = full // BLOCK_K * BLOCK_K
        end = tl.minimum(t_k, (block_q + 1) * BLOCK_Q + offset)
    if HAS_MASK:
        full = 0
    K_head, V_head = K + b * k_sb + h * k_sh, V + b * v_sb + h * v_sh
    grad_q = query_block_tiles(
        grad_q, q, grad_out, lse, delta, K_head, V_head, k_st, v_st, 0, full, rows, b, h, bh,
        t_q, t_k, offset, scale, dropout_p, Mask, Bias, Seed, mask_sb, mask_sh, mask_sq,
        mask_sk, bias_sb, bias_sh, bias_sq, bias_sk, D_K, D_V, BLOCK_DK, BLOCK_DV, BLOCK_K,
        IS_CAUSAL, HAS_MASK, HAS_BIAS, DROPOUT, USE_DOT, False)
    grad_q = query_block_tiles(
        grad_q, q, grad_out, lse, delta, K_head, V_head, k_st, v_st, full, end, rows, b, h, bh,
        t_q, t_k, offset, scale, dropout_p, Mask, Bias, Seed, mask_sb, mask_sh, mask_sq,
        mask_sk, bias_sb, bias_sh, bias_sq, bias_sk, D_K, D_V, BLOCK_DK, BLOCK_DV, BLOCK_K,
        IS_CAUSAL, HAS_MASK, HAS_BIAS, DROPOUT, USE_DOT, True)

    store_tile(dQ + b * dq_sb + h * dq_sh, grad_q * scale, rows, t_q, dq_st, dk, D_K)


@triton.jit
def query_block_tiles(grad_q, q, grad_out, lse, delta, K_head, V_head, k_st, v_st, lo, hi,
                      rows, b, h, bh, t_q, t_k, offset, scale, dropout_p, Mask, Bias, Seed,
                      mask_sb, mask_sh, mask_sq, mask_sk, bias_sb, bias_sh, bias_sq, bias_sk,
                      D_K: tl.constexpr, D_V: tl.constexpr, BLOCK_DK: tl.constexpr,
                      BLOCK_DV: tl.constexpr, BLOCK_K: tl.constexpr, IS_CAUSAL: tl.constexpr,
                      HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr,
                      USE_DOT: tl.constexpr, MASKED: tl.constexpr):
    # The key tiles [lo, hi) of a query block: its rows of dQ.
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    for start in range(lo, hi, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        k = load_tile(K_head, cols, t_k, k_st, dk, D_K, BLOCK_DK)  # (BK, BDK)
        v = load_tile(V_head, cols, t_k, v_st, dv, D_V, BLOCK_DV)  # (BK, BDV)
        s = mm(q, tl.trans(k), USE_DOT) * scale  # (BQ, BK)
        if HAS_BIAS:
            s += load_bias(Bias, rows, cols, t_q, t_k, b, h, bias_sb, bias_sh, bias_sq,
                           bias_sk).to(s.dtype)
        p = tl.exp(s - lse[:, None])  # (BQ, BK)
        if MASKED:
            allowed = tile_allowed(rows, cols, t_q, t_k, b, h, offset, Mask, mask_sb, mask_sh,
                                   mask_sq, mask_sk, IS_CAUSAL, HAS_MASK)
            p = tl.where(allowed, p, 0.0)
        grad_p = mm(grad_out, tl.trans(v), USE_DOT)  # (BQ, BK): dP = dO V^T
        if DROPOUT:
            keep = dropout_keep(Seed, bh, t_q, t_k, rows, cols, dropout_p)
            grad_p = tl.where(keep, grad_p / (1.0 - dropout_p), 0.0)
        grad_s = p * (grad_p - delta[:, None])  # (BQ, BK)
        if MASKED:
            grad_s = tl.where(allowed, grad_s, 0.0)
            seen = tl.max(allowed.to(tl.int32), 0) > 0  # keys no query here may see: zeroed
            k = tl.where(seen[:, None], k, 0.0)
        # (BQ, BK) @ (BK, BDK) -> (BQ, BDK): dQ += dS K (times the scale, once, at the end)
        grad_q += mm(grad_s.to(k.dtype), k, USE_DOT)
    return grad_q


# ------------------------------------------------------------------------------ tuning
def _configs(shapes: tuple[tuple[int, int, int, int], ...]) -> list[Any]:
    """``triton.Config`` s from ``(BLOCK_Q, BLOCK_K, num_warps, num_stages)``."""
    return [triton.Config({"BLOCK_Q": bq, "BLOCK_K": bk}, num_warps=warps, num_stages=stages)
            for bq, bk, warps, stages in shapes]


#: The forward's configurations, timed on a GPU for half precision: the Triton fused-attention
#: tutorial's Hopper set (tiles of 64 or 128 queries by 32 to 128 keys, 2 to 4 pipeline stages,
#: 8 warps only for 128 x 128 tiles, as its Hopper filter keeps them), cut to 7, with chapter
#: 9's 64 x 64 (the fastest of five shapes on the H100 record) among them.
FORWARD_CONFIGS = _configs(((128, 64, 4, 3), (128, 64, 4, 4), (128, 128, 8, 3), (128, 32, 4, 4),
                            (64, 64, 4, 3), (64, 128, 4, 3), (128, 128, 8, 2)))
#: The dK/dV kernel's: a program owns BLOCK_K keys and walks BLOCK_Q queries at a time
#: (the tutorial's backward owns 128 keys and steps 32 queries).
DK_DV_CONFIGS = _configs(((32, 128, 4, 3), (64, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 4),
                          (128, 64, 8, 2)))
#: The dQ kernel's: a program owns BLOCK_Q queries and walks BLOCK_K keys at a time.
DQ_CONFIGS = _configs(((128, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 4),
                       (64, 128, 8, 2)))
#: What the tuner's choice depends on: head sizes, a length bucket, the masks' kinds (the
#: tensors' dtypes are part of every autotune key).
TUNE_KEY = ["D_K", "D_V", "t_bucket", "IS_CAUSAL", "HAS_MASK", "HAS_BIAS", "DROPOUT"]
#: The dtypes whose calls are tuned on a GPU: float32 multiplies in full IEEE precision
#: (no tensor cores), float64 without tl.dot; both keep one fixed configuration.
TUNED_DTYPES = (torch.float16, torch.bfloat16)
#: Shorter calls (both lengths below it) keep the fixed configuration: their time is mostly
#: the launch, and a model that decodes token by token would otherwise tune at its first steps.
TUNE_MIN_LENGTH = 256


def length_bucket(t: int) -> int:
    """The tuner's length key: the power of 4 at or above ``t``, at least 256 (Chapter 9).

    A model that decodes token by token changes ``T_k`` at every call; the configuration
    is timed once per bucket, not once per length.
    """
    bucket = 256
    while bucket < t:
        bucket *= 4
    return bucket


class Tuned:
    """A kernel whose configuration ``triton.autotune`` times once per key, then launched
    directly with the one it chose (the autotuner's own per-call bookkeeping skipped).

    ``reset_to_zero`` names an output the kernel adds into (it is zeroed before each timed
    run, since the tuner runs the kernel once per configuration on the real tensors).
    """

    def __init__(self, kernel: Any, configs: list[Any], *, reset_to_zero: list[str] | None = None,
                 do_bench: Callable[..., Any] | None = None) -> None:
        options: dict[str, Any] = {"reset_to_zero": reset_to_zero}
        if do_bench is not None and "do_bench" in inspect.signature(triton.autotune).parameters:
            options["do_bench"] = do_bench
        self.kernel = kernel
        self.tuner = triton.autotune(configs, key=TUNE_KEY, **options)(kernel)
        self.chosen: dict[tuple[Any, ...], dict[str, Any]] = {}

    def launch(self, grid: Callable[[dict[str, Any]], tuple[int, int]], key: tuple[Any, ...],
               *args: Any, **constants: Any) -> None:
        """Run ``kernel[grid](*args, **constants)`` with the configuration chosen for ``key``."""
        chosen = self.chosen.get(key)
        if chosen is None:  # time every configuration once (each run rewrites the outputs)
            self.tuner[grid](*args, **constants)
            self.chosen[key] = self.tuner.best_config.all_kwargs()
        else:
            self.kernel[grid](*args, **constants, **chosen)


class Tuners:
    """The tuned forward, dK/dV (alone and with the atomic dQ) and dQ kernels."""

    def __init__(self, forward: list[Any], dk_dv: list[Any], dq: list[Any],
                 do_bench: Callable[..., Any] | None = None) -> None:
        self.forward = Tuned(forward_kernel, forward, do_bench=do_bench)
        self.dk_dv = Tuned(backward_dk_dv_kernel, dk_dv, do_bench=do_bench)
        self.dk_dv_dq = Tuned(backward_dk_dv_kernel, dk_dv, reset_to_zero=["dQ"],
                              do_bench=do_bench)
        self.dq = Tuned(backward_dq_kernel, dq, do_bench=do_bench)


def build_tuners(forward: list[Any] = FORWARD_CONFIGS, dk_dv: list[Any] = DK_DV_CONFIGS,
                 dq: list[Any] = DQ_CONFIGS,
                 do_bench: Callable[..., Any] | None = None) -> Tuners:
    """Tuned kernels over these configurations (Chapter 9). ``do_bench(kernel_call,
    quantiles)`` times one configuration (default: ``triton.testing.do_bench`` with 5 ms of
    warm-up and 25 of runs; a configuration that fails to compile counts as infinitely
    slow)."""
    return Tuners(forward, dk_dv, dq, do_bench or _time_or_skip)


def _time_or_skip(kernel_call: Callable[[], None], quantiles: Any) -> Any:
    """``triton.testing.do_bench`` (5 ms warm-up, 25 ms of runs), or an infinite time for a
    configuration that fails to compile with this Triton on this GPU, so the tuner skips it
    instead of failing the call (the autotuner itself skips only resource errors)."""
    try:
        return triton.testing.do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)
    except Exception as error:  # a compiler error of one configuration, say
        warnings.warn(f"a Triton configuration was skipped: {type(error).__name__}: "
                      f"{str(error)[:200]}", RuntimeWarning, stacklevel=2)
        return [float("inf")] * len(quantiles)


#: The kernels the launchers tune with; ``None`` under the interpreter, which keeps one fixed
#: configuration (a test may set its own, see :func:`build_tuners`).
tuners: Tuners | None = None if INTERPRETING else build_tuners()


# ----------------------------------------------------------------------------- launchers
# Host arithmetic in plain Python: triton.cdiv and triton.next_power_of_2 are constexpr
# functions in recent Triton, and calling one from the host costs tens of microseconds.
def _cdiv(n: int, d: int) -> int:
    return -(-n // d)


def _padded(d: int) -> int:
    """A head size padded to a power of two >= 16 (tl.arange and tl.dot need it)."""
    return max(16, 1 << (d - 1).bit_length())


_SCALES: dict[tuple[float, torch.dtype, torch.device], Tensor] = {}


def _scale_tensor(scale: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``scale`` as a ``(1,)`` tensor on ``device``, made once per value (Triton passes a
    Python float as float32, which would round a float64 run's scale)."""
    key = (scale, dtype, device)
    tensor = _SCALES.get(key)
    if tensor is None:
        tensor = _SCALES[key] = torch.full((1,), scale, dtype=dtype, device=device)
    return tensor


@functools.lru_cache(maxsize=256)
def _constants(d_k: int, d_v: int, is_causal: bool, has_mask: bool, has_bias: bool,
               dropout: bool, use_dot: bool) -> dict[str, Any]:
    """The compile-time arguments every kernel shares (one dict per combination, never
    changed)."""
    return dict(D_K=d_k, D_V=d_v, BLOCK_DK=_padded(d_k),
                BLOCK_DV=_padded(d_v), IS_CAUSAL=is_causal,
                HAS_MASK=has_mask, HAS_BIAS=has_bias, DROPOUT=dropout, USE_DOT=use_dot)


def _strides4(t: Tensor | None) -> tuple[int, ...]:
    """The four strides of a ``(B, H, T_q, T_k)`` view (0 along broadcast axes)."""
    return (0, 0, 0, 0) if t is None else t.stride()


def _shared(q: Tensor, mask: Tensor | None, bias: Tensor | None, seed: Tensor | None,
            scale: float) -> list[Any]:
    """The tensor arguments every kernel takes after its own: Mask, Bias, Seed, Scale."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    return [q if mask is None else mask.view(torch.uint8),  # bool -> 0/1 bytes
            q if bias is None else bias, q if seed is None else seed,
            _scale_tensor(scale, acc, q.device)]


def _tail(q: Tensor, k: Tensor, mask: Tensor | None, bias: Tensor | None, dropout_p: float,
          ) -> list[Any]:
    """The strides of the mask and the bias, then ``n_heads, t_q, t_k, dropout_p, t_bucket``."""
    t_q, t_k = q.shape[2], k.shape[2]
    return [*_strides4(mask), *_strides4(bias), q.shape[1], t_q, t_k, dropout_p,
            length_bucket(max(t_q, t_k))]


def flash_forward(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bias: Tensor | None,
                  seed: Tensor | None, is_causal: bool, scale: float, dropout_p: float,
                  block_q: int, block_k: int, tune: bool) -> tuple[Tensor, Tensor]:
    """Launch the forward kernel: ``(out (B, H, T_q, d_v), lse (B * H, T_q))`` (Chapter 9).

    ``q, k, v`` ``(B, H, T, d)`` with any strides but a contiguous last axis (``B`` or ``H``
    strides may be 0); ``mask`` bool and ``bias`` float, each ``None`` or a ``(B, H, T_q,
    T_k)`` view; ``seed`` an int64 ``(1,)`` tensor (dropout) or ``None``. With ``tune`` (and
    half precision on a GPU) the tile sizes come from the tuner, else from ``block_q`` and
    ``block_k``. ``out`` is laid out like ``q`` when ``q`` is a ``(B, T, H, d)`` tensor seen
    as ``(B, H, T, d)``, so that merging the heads afterwards copies nothing. No checks.
    """
    n_b, n_h, t_q, d_k = q.shape
    d_v = v.shape[3]
    if q.stride(1) < q.stride(2):  # heads inside time: (B, T, H, d) memory, as a model's
        out = torch.empty(n_b, t_q, n_h, d_v, dtype=q.dtype, device=q.device).transpose(1, 2)
    else:
        out = torch.empty(n_b, n_h, t_q, d_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(n_b * n_h, t_q, dtype=torch.float64 if q.dtype == torch.float64
                      else torch.float32, device=q.device)  # (B * H, T_q)
    constants = _constants(d_k, d_v, is_causal, mask is not None, bias is not None,
                           seed is not None, q.dtype != torch.float64)
    args = (q, k, v, out, lse, *_shared(q, mask, bias, seed, scale), *q.stride()[:3],
            *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
            *_tail(q, k, mask, bias, dropout_p))
    if (tune and tuners is not None and q.dtype in TUNED_DTYPES
            and max(t_q, k.shape[2]) >= TUNE_MIN_LENGTH):
        tuners.forward.launch(lambda meta: (_cdiv(t_q, meta["BLOCK_Q"]), n_b * n_h),
                              (q.dtype, args[-1], *constants.values()), *args, **constants)
    else:
        forward_kernel[(_cdiv(t_q, block_q), n_b * n_h)](
            *args, **constants, BLOCK_Q=block_q, BLOCK_K=block_k)
    return out, lse


def flash_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                   lse: Tensor, mask: Tensor | None, bias: Tensor | None,
                   seed: Tensor | None, is_causal: bool, scale: float, dropout_p: float,
                   block_q: int, block_k: int, tune: bool, bias_grad: bool, atomic_dq: bool,
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Launch the backward kernels: ``(dq, dk, dv, dbias or None)`` (Chapter 9).

    Shapes as in :func:`flash_forward`; each gradient has its input's layout (a contiguous
    one for a broadcast input); ``dbias`` is ``(B * H, T_q, T_k)`` float32 (float64 for
    float64 inputs) when ``bias_grad``. ``atomic_dq``: FlashAttention-2's single pass, dQ
    added up atomically in float32 by the dK/dV kernel; else the pair of kernels. No checks.
    """
    n_b, n_h, t_q, d_k = q.shape
    t_k, d_v, bh = k.shape[2], v.shape[3], n_b * n_h
    if grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()
    acc = lse.dtype
    delta = torch.empty_like(lse)  # (B * H, T_q)
    backward_delta_kernel[(_cdiv(t_q, 64), bh)](
        out, grad_out, delta, *out.stride()[:3], *grad_out.stride()[:3], n_h, t_q,
        D_V=d_v, BLOCK_DV=_padded(d_v), BLOCK_Q=64)
    grad_k, grad_v = torch.empty_like(k), torch.empty_like(v)  # contiguous if broadcast
    # float32 for the atomic adds: the sum of many small terms in half precision loses them
    grad_q = torch.zeros_like(q, dtype=acc) if atomic_dq else torch.empty_like(q)
    grad_bias = (torch.zeros(bh, t_q, t_k, dtype=acc, device=q.device) if bias_grad
                 else None)  # (B * H, T_q, T_k): skipped causal tiles stay 0
    constants = _constants(d_k, d_v, is_causal, mask is not None, bias is not None,
                           seed is not None, q.dtype != torch.float64)
    shared = _shared(q, mask, bias, seed, scale)
    tail = _tail(q, k, mask, bias, dropout_p)
    common = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *grad_out.stride()[:3])
    dk_dv_args = (q, k, v, grad_out, lse, delta, grad_k, grad_v, grad_q,
                  lse if grad_bias is None else grad_bias, *shared, *common,
                  *grad_k.stride()[:3], *grad_v.stride()[:3],
                  *(grad_q.stride()[:3] if atomic_dq else (0, 0, 0)), *tail)
    dq_args = (q, k, v, grad_out, lse, delta, grad_q, *shared, *common, *grad_q.stride()[:3],
               *tail)
    tuned = (tune and tuners is not None and q.dtype in TUNED_DTYPES
             and max(t_q, t_k) >= TUNE_MIN_LENGTH)
    key = (q.dtype, tail[-1], *constants.values(), bias_grad)
    if tuned:
        assert tuners is not None  # for mypy: `tuned` says so
        (tuners.dk_dv_dq if atomic_dq else tuners.dk_dv).launch(
            lambda meta: (_cdiv(t_k, meta["BLOCK_K"]), bh), key, *dk_dv_args,
            **constants, BIAS_GRAD=bias_grad, ATOMIC_DQ=atomic_dq)
        if not atomic_dq:
            tuners.dq.launch(lambda meta: (_cdiv(t_q, meta["BLOCK_Q"]), bh), key,
                             *dq_args, **constants)
    else:
        backward_dk_dv_kernel[(_cdiv(t_k, block_k), bh)](
            *dk_dv_args, **constants, BIAS_GRAD=bias_grad, ATOMIC_DQ=atomic_dq,
            BLOCK_Q=block_q, BLOCK_K=block_k)
        if not atomic_dq:
            backward_dq_kernel[(_cdiv(t_q, block_q), bh)](
                *dq_args, **constants, BLOCK_Q=block_q, BLOCK_K=block_k)
    if atomic_dq and grad_q.dtype != q.dtype:
        grad_q = grad_q.to(q.dtype)
    return grad_q, grad_k, grad_v, grad_bias


class _Recorder:
    """Stands in for a kernel: ``kernel[grid](*args, **kwargs)`` records the call, runs nothing."""

    def __init__(self, name: str, calls: deque[tuple[str, tuple[Any, ...], dict[str, Any]]]):
        self.name, self.calls = name, calls

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.calls.append((self.name, args, kwargs))

        return launch


_KERNELS = ("forward_kernel", "backward_delta_kernel", "backward_dk_dv_kernel",
            "backward_dq_kernel")


@contextlib.contextmanager
def launches_recorded() -> Iterator[deque[tuple[str, tuple[Any, ...], dict[str, Any]]]]:
    """Inside, no kernel of this module runs: each launch is recorded instead (Chapter 9).

    Yields the last 16 launches as ``(kernel name, args, keyword args)``; the outputs stay
    uninitialised and tuning is off. For measuring the host's work per call, which is
    everything but the launch (``benchmarks/attention_triton.py``), and for tests of what
    reaches a kernel (no copy, no mask).
    """
    global tuners
    calls: deque[tuple[str, tuple[Any, ...], dict[str, Any]]] = deque(maxlen=16)
    saved = {name: globals()[name] for name in (*_KERNELS, "tuners")}
    try:
        globals().update({name: _Recorder(name, calls) for name in _KERNELS})
        tuners = None
        yield calls
    finally:
        globals().update(saved)
