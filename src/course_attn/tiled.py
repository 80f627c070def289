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
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._validation import check_positive_int

__all__ = ["SoftmaxState", "merge_softmax_states", "online_softmax", "tiled_attention"]


class SoftmaxState:
    """A partial softmax over some of a row's scores: running max ``m`` and sum ``l``.

    ``m (..., 1)`` is the largest score seen so far and ``l (..., 1)`` the sum of
    ``exp(score - m)`` over those scores; ``acc (..., d)`` (optional) is the sum of
    ``exp(score - m) * value``. A row that has seen no allowed score has
    ``m = -inf`` and ``l = 0``.
    """

    def __init__(self, m: Tensor, l: Tensor, acc: Tensor | None = None) -> None:  # noqa: E741
        self.m, self.l, self.acc = m, l, acc

    def result(self) -> Tensor:
        """``acc / l``: the attention output, zero for a row that saw no allowed score."""
        if self.acc is None:
            raise ValueError("this state carries no weighted sum of values (acc is None)")
        safe = torch.where(self.l > 0, self.l, torch.ones_like(self.l))
        return torch.where(self.l > 0, self.acc / safe, torch.zeros_like(self.acc))

    def logsumexp(self) -> Tensor:
        """``m + log l``, the log of the softmax's denominator (``-inf`` for an empty row)."""
        return self.m + torch.log(self.l)


def _finite(m: Tensor) -> Tensor:
    """``m`` with ``-inf`` replaced by 0, so that ``exp(s - m)`` and ``exp(m_old - m)`` stay
    defined for a row that has seen no allowed score yet (its terms are all 0 anyway)."""
    return torch.where(torch.isinf(m), torch.zeros_like(m), m)


def merge_softmax_states(a: SoftmaxState, b: SoftmaxState) -> SoftmaxState:
    """Combine two partial softmaxes over disjoint parts of the same rows, exactly.

    With ``m = max(m_a, m_b)``: ``l = e^(m_a - m) l_a + e^(m_b - m) l_b`` and the same
    rescaling for ``acc``. This is the step that lets a kernel (or several GPU
    blocks, as in flash-decoding's split-K) work on key blocks independently.
    """
    m = torch.maximum(a.m, b.m)  # (..., 1)
    safe = _finite(m)
    scale_a, scale_b = torch.exp(a.m - safe), torch.exp(b.m - safe)  # (..., 1) each
    l = scale_a * a.l + scale_b * b.l  # noqa: E741
    acc = None
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
    safe_l = torch.where(state.l > 0, state.l, torch.ones_like(state.l))
    weights = torch.exp(scores - _finite(state.m)) / safe_l
    return torch.where(state.l > 0, weights, torch.zeros_like(weights))


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


class _TiledAttention(torch.autograd.Function):
    """Forward by online softmax over key blocks; backward by recomputation from the lse."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                causal_offset: int | None, scale: float, block_q: int, block_k: int) -> Tensor:
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
                allowed = _allowed(mask, causal_offset, rows, cols, q.device)
                if allowed is not None:
                    scores = scores.masked_fill(~allowed, float("-inf"))
                m_blk = scores.amax(dim=-1, keepdim=True)  # (..., bq, 1)
                p = torch.exp(scores - _finite(m_blk))  # (..., bq, bk); masked -> 0
                partial = SoftmaxState(m_blk, p.sum(dim=-1, keepdim=True), p @ v[..., cols, :])
                state = merge_softmax_states(state, partial)
            out[..., rows, :] = state.result()
            lse[..., rows, :] = state.logsumexp()
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.config = (causal_offset, scale, block_q, block_k)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse, mask = ctx.saved_tensors
        causal_offset, scale, block_q, block_k = ctx.config
        grad_q, grad_k, grad_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        # D_i = sum_d dO_i * O_i: the softmax backward's row term, once per query.
        delta = (grad_out * out).sum(dim=-1, keepdim=True)  # (..., T_q, 1)
        safe_lse = _finite(lse)
        for rows, cols in _blocks(q.shape[-2], k.shape[-2], block_q, block_k, causal_offset):
            scores = q[..., rows, :] @ k[..., cols, :].transpose(-2, -1) * scale  # (bq, bk)
            p = torch.exp(scores - safe_lse[..., rows, :])  # the weights, recomputed
            allowed = _allowed(mask, causal_offset, rows, cols, q.device)
            if allowed is not None:
                p = p.masked_fill(~allowed, 0.0)
            p = p.masked_fill(torch.isinf(lse[..., rows, :]), 0.0)  # rows with no key
            grad_v[..., cols, :] += p.transpose(-2, -1) @ grad_out[..., rows, :]
            grad_p = grad_out[..., rows, :] @ v[..., cols, :].transpose(-2, -1)  # (bq, bk)
            grad_s = p * (grad_p - delta[..., rows, :])  # softmax backward, per block
            grad_q[..., rows, :] += grad_s @ k[..., cols, :] * scale
            grad_k[..., cols, :] += grad_s.transpose(-2, -1) @ q[..., rows, :] * scale
        return grad_q, grad_k, grad_v, None, None, None, None, None


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
) -> Tensor:
    """Scaled dot-product attention computed block by block, never storing ``(T_q, T_k)``.

    Args:
        q, k, v: ``(..., T_q, d_k)``, ``(..., T_k, d_k)``, ``(..., T_k, d_v)``; batch
            dimensions broadcast.
        mask: boolean, broadcastable to ``(..., T_q, T_k)``, ``True`` = may attend.
        is_causal: also apply the bottom-right causal mask; key blocks that lie
            entirely in the future of a query block are skipped, not computed.
        scale: multiplies the scores; ``None`` means ``1 / sqrt(d_k)``.
        block_q, block_k: rows of queries and keys per block (any positive size;
            the last block may be smaller).

    Returns:
        ``(..., T_q, d_v)``, equal to :func:`~course_attn.attention.scaled_dot_product_attention`
        up to round-off, zero for a query with no allowed key. Half-precision inputs
        are computed in float32. Differentiable (backward by recomputation).
    """
    from .attention import _check_options, _check_qkv  # one set of checks for every path

    q, k, v = _check_qkv(q, k, v)
    mask, scale = _check_options(mask, q, k, is_causal, scale, 0.0)
    block_q = check_positive_int(block_q, "block_q")
    block_k = check_positive_int(block_k, "block_k")
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    t_q, t_k = q.shape[-2], k.shape[-2]
    q = q.expand(*batch, t_q, q.shape[-1])  # views: autograd sums the broadcast gradients
    k = k.expand(*batch, t_k, k.shape[-1])
    v = v.expand(*batch, t_k, v.shape[-1])
    if mask is not None:
        mask = mask.expand(*batch, t_q, t_k)
    dtype = q.dtype
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    causal_offset = t_k - t_q if is_causal else None
    out = _TiledAttention.apply(q.to(work), k.to(work), v.to(work), mask, causal_offset,
                                float(scale), block_q, block_k)
    return out.to(dtype)
