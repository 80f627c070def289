"""Efficient attention: the online softmax and a tiled, FlashAttention-style kernel in torch.

Standard attention builds the whole ``(T_q, T_k)`` score matrix, so its memory
grows as ``T^2``. The tiled kernel never does: it walks over blocks of keys and
keeps, for every query, only a running maximum ``m``, a running sum ``l`` of
``exp(score - m)`` and a running weighted sum of values, rescaling the old
partial results whenever a larger score arrives (Milakov and Gimelshein's online
softmax; Dao et al.'s FlashAttention). The backward pass recomputes the weights
block by block from the saved log-sum-exp ``m + log l`` instead of storing them.

Written in plain torch, this is a *model* of the GPU kernel, not a fast kernel:
each block is a separate small matrix product launched from Python. Its point
is that it is exact (it equals the manual path to round-off) and that its memory
is ``O(T * block)``. Chapter "efficient attention" derives and measures it.

Dropout on the attention weights works as in FlashAttention: the kernel never
stores a dropout mask. Whether weight ``(b, i, j)`` is kept is a hash of a random
seed and the weight's position (counter-based random numbers, in the spirit of the
Philox generator the GPU kernels use), so the backward pass regenerates exactly
the mask of the forward pass, block by block, and the result does not depend on
the block sizes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_attention_args, check_positive_int, check_tensor

__all__ = [
    "SoftmaxState",
    "attention_tiled",
    "block_grid",
    "merge_softmax_states",
    "online_softmax",
    "tiled_attention",
]


class SoftmaxState:
    """A partial softmax over some of a row's scores: running max ``m``, sum ``l`` (Chapter 9).

    ``m (..., 1)`` is the largest score seen so far and ``l (..., 1)`` the sum of
    ``exp(score - m)`` over those scores; ``acc (..., d)`` (optional) is the sum of
    ``exp(score - m) * value``. A row that has seen no allowed score has
    ``m = -inf`` and ``l = 0``.
    """

    def __init__(self, m: Tensor, l: Tensor, acc: Tensor | None = None) -> None:  # noqa: E741
        check_tensor(m, "m", min_ndim=1)
        check_tensor(l, "l")
        if m.shape[-1] != 1 or l.shape != m.shape:
            raise ValueError(f"m and l must both have shape (..., 1), one entry per row, got "
                             f"m {tuple(m.shape)} and l {tuple(l.shape)}")
        if acc is not None:
            check_tensor(acc, "acc", min_ndim=1)
            if acc.shape[:-1] != m.shape[:-1]:
                raise ValueError(f"acc must have shape (..., d) with the rows of m "
                                 f"{tuple(m.shape)}, got {tuple(acc.shape)}")
        self.m, self.l, self.acc = m, l, acc

    def result(self) -> Tensor:
        """``acc / l``: the attention output, zero for a row that saw no allowed score."""
        if self.acc is None:
            raise ValueError("this state carries no weighted sum of values (acc is None)")
        # l == 0 only for a row without any allowed score; a NaN score stays NaN (never
        # read as "no key"), as on the other paths.
        empty = self.l == 0
        safe = torch.where(empty, torch.ones_like(self.l), self.l)
        return torch.where(empty, torch.zeros_like(self.acc), self.acc / safe)

    def logsumexp(self) -> Tensor:
        """``m + log l``, the log of the softmax's denominator (``-inf`` for an empty row)."""
        return self.m + torch.log(self.l)


def _finite(m: Tensor) -> Tensor:
    """``m`` with ``-inf`` replaced by 0, so that ``exp(s - m)`` and ``exp(m_old - m)`` stay
    defined for a row that has seen no allowed score yet (its terms are all 0 anyway)."""
    return torch.where(torch.isinf(m), torch.zeros_like(m), m)


def merge_softmax_states(a: SoftmaxState, b: SoftmaxState) -> SoftmaxState:
    """Two partial softmaxes over disjoint parts of the same rows, merged exactly (Chapter 9).

    With ``m = max(m_a, m_b)``: ``l = e^(m_a - m) l_a + e^(m_b - m) l_b`` and the same
    rescaling for ``acc``. This is the step that lets a kernel (or several GPU
    blocks, as in flash-decoding's split-K) work on key blocks independently.
    """
    for name, state in (("a", a), ("b", b)):
        if not isinstance(state, SoftmaxState):
            raise TypeError(f"{name} must be a SoftmaxState, got {type(state).__name__}")
    if a.m.shape != b.m.shape:
        raise ValueError(f"a and b must be partial results for the same rows, got m of shapes "
                         f"{tuple(a.m.shape)} and {tuple(b.m.shape)}")
    if (a.acc is None) != (b.acc is None):
        raise ValueError("a and b must both carry a weighted sum of values (acc) or neither")
    m = torch.maximum(a.m, b.m)  # (..., 1)
    safe = _finite(m)
    scale_a, scale_b = torch.exp(a.m - safe), torch.exp(b.m - safe)  # (..., 1) each
    l = scale_a * a.l + scale_b * b.l  # noqa: E741
    acc = None  # the states were checked to carry both or neither
    if a.acc is not None and b.acc is not None:
        acc = scale_a * a.acc + scale_b * b.acc  # (..., d)
    return SoftmaxState(m, l, acc)


def online_softmax(scores: Tensor, block: int) -> Tensor:
    """Softmax over the last dimension in one pass over blocks of ``block`` columns.

    Equal to ``torch.softmax(scores, -1)`` up to round-off; ``-inf`` entries are
    masked entries, and a row that is entirely ``-inf`` gives zeros (chapter 5).
    """
    if not isinstance(scores, Tensor) or not scores.is_floating_point():
        raise TypeError(f"scores must be a floating-point tensor, got {type(scores).__name__}")
    block = check_positive_int(block, "block")
    m = torch.full((*scores.shape[:-1], 1), float("-inf"), dtype=scores.dtype,
                   device=scores.device)
    state = SoftmaxState(m, torch.zeros_like(m))
    for start in range(0, scores.shape[-1], block):
        chunk = scores[..., start:start + block]  # (..., block)
        m_chunk = chunk.amax(dim=-1, keepdim=True)  # (..., 1)
        l_chunk = torch.exp(chunk - _finite(m_chunk)).sum(dim=-1, keepdim=True)
        state = merge_softmax_states(state, SoftmaxState(m_chunk, l_chunk))
    # Second, cheap pass: now that m and l are final, each weight is exp(s - m) / l.
    empty = state.l == 0  # rows with no allowed score
    safe_l = torch.where(empty, torch.ones_like(state.l), state.l)
    weights = torch.exp(scores - _finite(state.m)) / safe_l
    return torch.where(empty, torch.zeros_like(weights), weights)


_LOW32 = 0xFFFFFFFF


def _mul32(x: Tensor, c: int) -> Tensor:
    """``(x * c) mod 2**32`` for int64 ``x`` in ``[0, 2**32)``, with no int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16  # c = hi * 2**16 + lo; every product below is < 2**49
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _LOW32


def _mix32(x: Tensor) -> Tensor:
    """MurmurHash3's finaliser: a bijection of 32-bit integers that scrambles every bit."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def _dropout_seed(device: torch.device) -> Tensor:
    """Two random 32-bit words from torch's generator on ``device`` (no value is read)."""
    return torch.randint(0, 2**32, (2,), dtype=torch.int64, device=device)


def _dropout_keep(seed: Tensor, batch: tuple[int, ...], t_q: int, t_k: int, rows: slice,
                  cols: slice, dropout_p: float) -> Tensor:
    """Which weights of the ``(*batch, rows, cols)`` block dropout keeps, as a bool tensor.

    Weight ``(b, i, j)`` (``b`` the flattened batch index) is kept when a hash of
    the seed and its position ``(b * T_q + i) * T_k + j`` is at least
    ``dropout_p * 2**32``: with probability ``1 - dropout_p``, independently of
    every other weight, and the same answer whichever block asks.
    """
    device = seed.device
    base = torch.arange(math.prod(batch), device=device).reshape(*batch, 1, 1)  # (*batch, 1, 1)
    query = torch.arange(rows.start, rows.stop, device=device)[:, None]  # (bq, 1)
    key = torch.arange(cols.start, cols.stop, device=device)[None, :]  # (1, bk)
    position = (base * t_q + query) * t_k + key  # (*batch, bq, bk), int64
    x = _mix32((position & _LOW32) ^ seed[0])
    x = _mix32(x ^ (position >> 32) ^ seed[1])
    return x >= int(dropout_p * 2**32)


def _allowed(mask: Tensor | None, causal_offset: int | None, rows: slice, cols: slice,
             device: torch.device) -> Tensor | None:
    """The ``(..., rows, cols)`` block of ``mask`` AND the causal mask (None: all allowed)."""
    block = None if mask is None else mask[..., rows, cols]
    if causal_offset is not None:
        query = torch.arange(rows.start, rows.stop, device=device)[:, None]  # (bq, 1)
        key = torch.arange(cols.start, cols.stop, device=device)[None, :]  # (1, bk)
        causal = key <= query + causal_offset  # (bq, bk), bottom-right aligned
        block = causal if block is None else block & causal
    return block


def _key_blocks(rows: slice, t_k: int, block_k: int, causal_offset: int | None):
    """The key column blocks a block of query rows must visit.

    Under the causal mask, key blocks that start after the last key the block's
    last query may see are skipped outright: they are entirely in the future.
    """
    for j in range(0, t_k, block_k):
        if causal_offset is not None and j > rows.stop - 1 + causal_offset:
            return
        yield slice(j, min(j + block_k, t_k))


def _blocks(t_q: int, t_k: int, block_q: int, block_k: int, causal_offset: int | None):
    """Every (query rows, key columns) pair of blocks that holds an allowed score."""
    for i in range(0, t_q, block_q):
        rows = slice(i, min(i + block_q, t_q))
        for cols in _key_blocks(rows, t_k, block_k, causal_offset):
            yield rows, cols


def _contain(block: Tensor, allowed: Tensor | None) -> Tensor:
    """Zero the rows of a key or value block ``(..., bk, d)`` that no query of the block may
    see: their weights are 0, but ``0 * NaN = NaN`` would carry a padded slot's garbage
    into the product (the manual path zeroes unreachable keys the same way)."""
    if allowed is None:
        return block
    seen = allowed.any(dim=-2).unsqueeze(-1)  # (..., bq, bk) -> (..., bk, 1)
    return block.masked_fill(~seen, 0.0)


def block_grid(t_q: int, t_k: int, block_q: int, block_k: int, *,
               is_causal: bool = False) -> Tensor:
    """What the tiled kernel does with each (query block, key block) pair (Chapter 9).

    Returns an int64 tensor of shape ``(ceil(T_q / block_q), ceil(T_k / block_k))``:
    ``0`` = skipped (under the bottom-right causal mask every score of the block
    lies in the future, so it is never computed), ``1`` = computed, with some
    scores masked by the causal mask (the blocks on the diagonal), ``2`` =
    computed in full. Only the causal mask is known from the shapes alone; an
    explicit mask is applied inside computed blocks.
    """
    for value, name in ((t_q, "t_q"), (t_k, "t_k"), (block_q, "block_q"), (block_k, "block_k")):
        check_positive_int(value, name)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {is_causal!r}")
    offset = t_k - t_q if is_causal else None
    grid = torch.zeros(-(-t_q // block_q), -(-t_k // block_k), dtype=torch.int64)
    for rows, cols in _blocks(t_q, t_k, block_q, block_k, offset):
        # the block's top-right score (first query, last key) is the one most in the future
        partly_masked = offset is not None and cols.stop - 1 > rows.start + offset
        grid[rows.start // block_q, cols.start // block_k] = 1 if partly_masked else 2
    return grid


class _TiledAttention(torch.autograd.Function):
    """Forward by online softmax over key blocks; backward by recomputation from the lse."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, seed: Tensor | None,
                causal_offset: int | None, scale: float, block_q: int, block_k: int,
                dropout_p: float, bias: Tensor | None) -> Tensor:
        t_q, t_k = q.shape[-2], k.shape[-2]
        out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
        lse = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype, device=q.device)
        for i in range(0, t_q, block_q):
            rows = slice(i, min(i + block_q, t_q))
            m = torch.full((*q.shape[:-2], rows.stop - rows.start, 1), float("-inf"),
                           dtype=q.dtype, device=q.device)  # (..., bq, 1)
            state = SoftmaxState(m, torch.zeros_like(m),
                                 torch.zeros(*m.shape[:-1], v.shape[-1], dtype=q.dtype,
                                             device=q.device))
            for cols in _key_blocks(rows, t_k, block_k, causal_offset):
                scores = q[..., rows, :] @ k[..., cols, :].transpose(-2, -1) * scale  # (bq, bk)
                if bias is not None:
                    scores = scores + bias[..., rows, cols]  # this block of the bias only
                allowed = _allowed(mask, causal_offset, rows, cols, q.device)
                if allowed is not None:
                    scores = scores.masked_fill(~allowed, float("-inf"))
                m_blk = scores.amax(dim=-1, keepdim=True)  # (..., bq, 1)
                p = torch.exp(scores - _finite(m_blk))  # (..., bq, bk); masked -> 0
                p_used = p  # the weights that multiply v: after dropout, if any
                if seed is not None:
                    keep = _dropout_keep(seed, q.shape[:-2], t_q, t_k, rows, cols, dropout_p)
                    p_used = torch.where(keep, p / (1.0 - dropout_p), 0.0)
                values = _contain(v[..., cols, :], None if mask is None else allowed)
                partial = SoftmaxState(m_blk, p.sum(dim=-1, keepdim=True), p_used @ values)
                state = merge_softmax_states(state, partial)
            out[..., rows, :] = state.result()
            lse[..., rows, :] = state.logsumexp()
        ctx.save_for_backward(q, k, v, out, lse, mask, seed, bias)
        ctx.config = (causal_offset, scale, block_q, block_k, dropout_p)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse, mask, seed, bias = ctx.saved_tensors
        causal_offset, scale, block_q, block_k, dropout_p = ctx.config
        t_q, t_k = q.shape[-2], k.shape[-2]
        grad_q, grad_k, grad_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        # The bias's gradient is the scores' gradient, (T_q, T_k) in full: only when asked.
        grad_bias = torch.zeros_like(bias) if ctx.needs_input_grad[10] else None
        # D_i = sum_d dO_i * O_i: the softmax backward's row term, once per query
        # (with dropout too: O already holds the dropped, rescaled weights).
        delta = (grad_out * out).sum(dim=-1, keepdim=True)  # (..., T_q, 1)
        safe_lse = _finite(lse)
        for rows, cols in _blocks(t_q, t_k, block_q, block_k, causal_offset):
            allowed = _allowed(mask, causal_offset, rows, cols, q.device)
            contained = None if mask is None else allowed
            keys = _contain(k[..., cols, :], contained)  # (..., bk, d_k)
            values = _contain(v[..., cols, :], contained)  # (..., bk, d_v)
            scores = q[..., rows, :] @ keys.transpose(-2, -1) * scale  # (..., bq, bk)
            if bias is not None:
                scores = scores + bias[..., rows, cols]
            p = torch.exp(scores - safe_lse[..., rows, :])  # the weights, recomputed
            if allowed is not None:
                p = p.masked_fill(~allowed, 0.0)
            p = p.masked_fill(torch.isinf(lse[..., rows, :]), 0.0)  # rows with no key
            grad_p = grad_out[..., rows, :] @ values.transpose(-2, -1)  # (..., bq, bk)
            p_used = p
            if seed is not None:  # the forward's dropout mask, regenerated
                keep = _dropout_keep(seed, q.shape[:-2], t_q, t_k, rows, cols, dropout_p)
                p_used = torch.where(keep, p / (1.0 - dropout_p), 0.0)
                grad_p = torch.where(keep, grad_p / (1.0 - dropout_p), 0.0)
            grad_v[..., cols, :] += p_used.transpose(-2, -1) @ grad_out[..., rows, :]
            grad_s = p * (grad_p - delta[..., rows, :])  # softmax backward, per block
            grad_q[..., rows, :] += grad_s @ keys * scale
            grad_k[..., cols, :] += grad_s.transpose(-2, -1) @ q[..., rows, :] * scale
            if grad_bias is not None:
                grad_bias[..., rows, cols] = grad_s  # each score lies in exactly one block
        return grad_q, grad_k, grad_v, None, None, None, None, None, None, None, grad_bias


def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    block_q: int = 32,
    block_k: int = 32,
    dropout_p: float = 0.0,
    bias: Tensor | None = None,
) -> Tensor:
    """Attention computed block by block, never storing ``(T_q, T_k)`` (Chapter 9).

    Args:
        q, k, v: ``(..., T_q, d_k)``, ``(..., T_k, d_k)``, ``(..., T_k, d_v)``; batch
            dimensions broadcast.
        mask: boolean, broadcastable to ``(..., T_q, T_k)``, ``True`` = may attend.
        is_causal: also apply the bottom-right causal mask; key blocks that lie
            entirely in the future of a query block are skipped, not computed.
        scale: multiplies the scores; ``None`` means ``1 / sqrt(d_k)``.
        block_q, block_k: rows of queries and keys per block (any positive size;
            the last block may be smaller).
        dropout_p: dropout on the attention weights (0 = none). The mask is a hash
            of a seed drawn from torch's generator on q's device and of each
            weight's position, regenerated in the backward pass, never stored.
        bias: optional float tensor broadcastable to ``(..., T_q, T_k)``, added to the
            scaled scores before the mask (ALiBi, say); each block adds its slice. A
            broadcast bias is a view: only its gradient, when it requires one, is
            stored in full.

    Returns:
        ``(..., T_q, d_v)``, equal to chapter 4's ``scaled_dot_product_attention``
        up to round-off, zero for a query with no allowed key. Half-precision inputs
        are computed in float32. Differentiable (backward by recomputation).
    """
    q, k, v, mask, scale, bias = check_attention_args(
        q, k, v, mask, is_causal=is_causal, scale=scale, dropout_p=dropout_p, bias=bias)
    block_q = check_positive_int(block_q, "block_q")
    block_k = check_positive_int(block_k, "block_k")
    out, _ = attention_tiled(q, k, v, mask, is_causal=is_causal, scale=scale,
                             dropout_p=dropout_p, bias=bias, block_q=block_q, block_k=block_k)
    return out


def attention_tiled(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *,
                    is_causal: bool = False, scale: float | None = None, dropout_p: float = 0.0,
                    bias: Tensor | None = None, block_q: int = 32, block_k: int = 32,
                    ) -> tuple[Tensor, None]:
    """:func:`tiled_attention` without its checks: the ``"tiled"`` path of ``attention()``.

    Same signature as the other paths (``course_attn.core.attention``), so a layer can
    call it; returns ``(out, None)``: the weights are never formed.
    """
    if scale is None:
        scale = q.shape[-1] ** -0.5
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    t_q, t_k = q.shape[-2], k.shape[-2]
    q = q.expand(*batch, t_q, q.shape[-1])  # views: autograd sums the broadcast gradients
    k = k.expand(*batch, t_k, k.shape[-1])
    v = v.expand(*batch, t_k, v.shape[-1])
    if mask is not None:
        mask = mask.expand(*batch, t_q, t_k)
    if bias is not None:
        bias = bias.expand(*batch, t_q, t_k)  # a view; autograd sums a broadcast gradient
    dtype = q.dtype
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    causal_offset = t_k - t_q if is_causal else None
    seed = _dropout_seed(q.device) if dropout_p > 0.0 else None
    out = _TiledAttention.apply(q.to(work), k.to(work), v.to(work), mask, seed, causal_offset,
                                float(scale), block_q, block_k, float(dropout_p),
                                None if bias is None else bias.to(work))
    return out.to(dtype), None
