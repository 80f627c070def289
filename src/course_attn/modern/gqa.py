"""Modern attention: grouped-query and multi-query attention (GQA, MQA).

Multi-head attention gives every one of the ``n_heads`` query heads its own
key and value head, and the KV cache stores all of them. GQA (Ainslie et al.
2023) keeps ``n_heads`` query heads but only ``n_kv_heads`` key/value heads:
each group of ``n_heads / n_kv_heads`` consecutive query heads shares one.
``n_kv_heads = n_heads`` is multi-head attention, ``n_kv_heads = 1`` is
multi-query attention (Shazeer 2019). The cache shrinks by the same factor.
"""

from __future__ import annotations

from torch import Tensor

from .._validation import check_choice, check_kv_heads, check_positive_int, check_tensor
from ..core.attention import ATTENTION_IMPLS, attention

__all__ = ["check_kv_heads", "grouped_query_attention", "repeat_kv"]


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """``(B, n_kv_heads, T, head_dim)`` -> ``(B, n_kv_heads * n_rep, T, head_dim)`` (Chapter 10).

    Each key/value head is repeated ``n_rep`` times *in place* (head ``h`` of
    the result is head ``h // n_rep`` of ``x``), the layout of
    ``torch.repeat_interleave(x, n_rep, dim=1)`` and of SDPA's ``enable_gqa``.
    """
    check_tensor(x, "x", ndim=4)
    n_rep = check_positive_int(n_rep, "n_rep")
    if n_rep == 1:
        return x
    batch, n_kv_heads, time, head_dim = x.shape
    x = x[:, :, None].expand(batch, n_kv_heads, n_rep, time, head_dim)  # (B, H_kv, n_rep, T, hd)
    return x.reshape(batch, n_kv_heads * n_rep, time, head_dim)  # (B, H_kv * n_rep, T, hd)


def grouped_query_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    impl: str = "manual",
) -> tuple[Tensor, Tensor | None]:
    """Attention of ``n_heads`` query heads over ``n_kv_heads`` shared key/value heads (Chapter 10).

    Args:
        q: ``(B, n_heads, T_q, head_dim)``.
        k: ``(B, n_kv_heads, T_k, head_dim)``, ``n_kv_heads`` dividing ``n_heads``.
        v: ``(B, n_kv_heads, T_k, d_v)``.
        mask, is_causal, scale, dropout_p, impl: as in ``attention`` (boolean
            mask broadcastable to ``(B, n_heads, T_q, T_k)``, ``True`` = may
            attend; causal bottom-right aligned; fully masked rows give zeros).

    Returns:
        ``(out (B, n_heads, T_q, d_v), attn_weights (B, n_heads, T_q, T_k) or None)``.

    The key/value heads are repeated to ``n_heads`` just before attending,
    so the cache keeps only ``n_kv_heads``. (PyTorch's fused kernels can skip
    the copy, ``enable_gqa=True``; the tests use that as the reference.)
    """
    check_tensor(q, "q", ndim=4)
    check_tensor(k, "k", ndim=4)
    check_tensor(v, "v", ndim=4)
    check_choice(impl, "impl", ATTENTION_IMPLS)
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same number of heads n_kv_heads, got k "
                         f"{tuple(k.shape)} and v {tuple(v.shape)}")
    if k.shape[1] == 0 or q.shape[1] == 0:
        raise ValueError(f"q and k must each have at least one head, got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}")
    n_heads, n_kv_heads = q.shape[1], k.shape[1]
    if n_heads % n_kv_heads:
        raise ValueError(f"the n_kv_heads={n_kv_heads} heads of k {tuple(k.shape)} must divide "
                         f"the n_heads={n_heads} heads of q {tuple(q.shape)}")
    n_rep = n_heads // n_kv_heads
    k = repeat_kv(k, n_rep)  # (B, H_kv, T_k, hd) -> (B, H, T_k, hd)
    v = repeat_kv(v, n_rep)  # (B, H_kv, T_k, d_v) -> (B, H, T_k, d_v)
    return attention(q, k, v, mask, is_causal=is_causal, scale=scale, dropout_p=dropout_p,
                     impl=impl)

