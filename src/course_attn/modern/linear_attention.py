"""Modern attention: linear attention and its RNN view (Katharopoulos et al. 2020).

Softmax attention weighs value ``j`` by ``exp(q_i . k_j)``. Replace that
similarity by ``phi(q_i) . phi(k_j)`` for a positive feature map ``phi``
(here ``elu(x) + 1``) and the causal output becomes

    out_i = phi(q_i)^T S_i / (phi(q_i) . z_i),
    S_i = sum_{j <= i} phi(k_j) v_j^T   (d_k x d_v),   z_i = sum_{j <= i} phi(k_j)   (d_k).

``S`` and ``z`` are running sums: causal linear attention *is* a recurrent
network whose state ``(S, z)`` has a fixed size, however long the sequence.
Decoding then costs the same at every step, with no growing KV cache; the
price is that everything the model remembers must fit in ``d_k x d_v``
numbers per head, which is what the recall task shows.

:func:`linear_attention` is the parallel form (a ``T x T`` matrix, like
softmax attention, for training); :func:`linear_attention_recurrent` is the
RNN form, one token at a time, carrying a :class:`LinearAttentionState`.
The tests prove they agree. There is no ``1/sqrt(d_k)`` scale: the
normalisation by ``phi(q_i) . z_i`` cancels any scale of the scores.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validation import (
    check_bool_mask,
    check_positive_real,
    check_qkv,
    check_tensor,
    moved_to,
)
from ..core.attention import with_causal, zero_unreachable_keys

__all__ = [
    "LinearAttentionState",
    "elu_feature_map",
    "linear_attention",
    "linear_attention_recurrent",
]

FeatureMap = Callable[[Tensor], Tensor]


def elu_feature_map(x: Tensor) -> Tensor:
    """``elu(x) + 1``: positive everywhere, so the normaliser never vanishes (Chapter 10)."""
    check_tensor(x, "x")
    return F.elu(x) + 1.0


def _check_feature_map(feature_map: object) -> FeatureMap:
    if not callable(feature_map):
        raise TypeError(f"feature_map must be a function of a tensor (such as "
                        f"elu_feature_map), got {type(feature_map).__name__} {feature_map!r}")
    return feature_map


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    feature_map: FeatureMap = elu_feature_map,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """Linear attention, parallel form: ``phi(q) phi(k)^T`` for ``softmax(q k^T)`` (Chapter 10).

    Args:
        q: ``(..., T_q, d_k)``; k: ``(..., T_k, d_k)``; v: ``(..., T_k, d_v)``.
        mask: boolean, broadcastable to ``(..., T_q, T_k)``, ``True`` = may attend.
        is_causal: also apply ``causal_mask(T_q, T_k)`` (bottom-right aligned).
        feature_map: ``phi``, positive-valued; ``elu(x) + 1`` by default.
        eps: the normaliser is clamped to at least ``eps``.

    Returns:
        ``(out (..., T_q, d_v), attn_weights (..., T_q, T_k))`` with
        ``attn_weights[i, j] = phi(q_i) . phi(k_j) / sum_j' phi(q_i) . phi(k_j')``
        over the allowed keys. A query with no allowed key gets zero weights
        and a zero output. Costs ``T_q x T_k`` like softmax attention: it is the
        training form; :func:`linear_attention_recurrent` is the decoding form.
    """
    q, k, v = check_qkv(q, k, v)
    feature_map = _check_feature_map(feature_map)
    eps = check_positive_real(eps, "eps")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {is_causal!r}")
    if mask is not None:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        check_bool_mask(mask, "mask", (*batch, q.shape[-2], k.shape[-2]))
        mask = moved_to(mask, "mask", q.device, "q")
    if is_causal:
        mask = with_causal(mask, q.shape[-2], k.shape[-2], q.device)  # (..., T_q, T_k)
    if mask is not None:
        k, v = zero_unreachable_keys(k, v, mask)  # NaN in a pad must not reach 0 * NaN
    # (..., T_q, d_k) @ (..., d_k, T_k) -> (..., T_q, T_k): non-negative similarities
    attn_scores = feature_map(q) @ feature_map(k).transpose(-2, -1)
    if mask is not None:
        attn_scores = attn_scores.masked_fill(~mask, 0.0)
    normaliser = attn_scores.sum(dim=-1, keepdim=True).clamp_min(eps)  # (..., T_q, 1)
    attn_weights = attn_scores / normaliser  # (..., T_q, T_k)
    out = attn_weights @ v  # (..., T_q, T_k) @ (..., T_k, d_v) -> (..., T_q, d_v)
    return out, attn_weights


class LinearAttentionState:
    """The recurrent state of causal linear attention: what replaces the KV cache (Chapter 10).

    ``S (B, H, d_k, d_v)`` is ``sum_j phi(k_j) v_j^T`` and ``z (B, H, d_k)`` is
    ``sum_j phi(k_j)`` over the (real) tokens seen so far; ``length`` counts the
    positions seen. Its size does not grow with the sequence.
    """

    def __init__(self) -> None:
        self.S: Tensor | None = None
        self.z: Tensor | None = None
        self.length = 0

    def reset(self) -> None:
        """Back to the empty state."""
        self.S = self.z = None
        self.length = 0


def _check_recurrent(q: object, k: object, v: object,
                     state: object) -> tuple[Tensor, Tensor, Tensor]:
    """Queries, keys and values ``(B, H, T, d)`` with one key and value per query; a state."""
    for name, value in (("q", q), ("k", k), ("v", v)):
        check_tensor(value, name, ndim=4)
    q, k, v = check_qkv(q, k, v)
    if not q.shape[:3] == k.shape[:3] == v.shape[:3]:
        raise ValueError(f"q, k and v must share (B, H, T) (one key and value per query), got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)}")
    if state is not None and not isinstance(state, LinearAttentionState):
        raise TypeError(f"state must be a LinearAttentionState or None, got "
                        f"{type(state).__name__}")
    return q, k, v


def _check_state(state: LinearAttentionState, shape: tuple[int, ...], q: Tensor) -> None:
    """The carried ``S`` must match these inputs (one state per layer and batch)."""
    if state.S is not None and (state.S.shape != shape or state.S.dtype != q.dtype
                                or state.S.device != q.device):
        raise ValueError(f"state holds S of shape {tuple(state.S.shape)} ({state.S.dtype}, "
                         f"{state.S.device}) but these inputs need (B, H, d_k, d_v)="
                         f"{shape} ({q.dtype}, {q.device}); use one state "
                         "per layer and per batch (reset() it between batches)")


def _check_pad_mask(attention_mask: Tensor, shape: tuple[int, int]) -> None:
    """``attention_mask`` is a ``(B, T)`` bool tensor."""
    check_bool_mask(attention_mask, "attention_mask", shape)
    if attention_mask.shape != shape:
        raise ValueError(f"attention_mask must have shape (B, T)={shape}, got "
                         f"{tuple(attention_mask.shape)}")


def linear_attention_recurrent(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: LinearAttentionState | None = None,
    *,
    attention_mask: Tensor | None = None,
    feature_map: FeatureMap = elu_feature_map,
    eps: float = 1e-6,
) -> Tensor:
    """Causal linear attention as an RNN, one token at a time through ``(S, z)`` (Chapter 10).

    Args:
        q: ``(B, H, T, d_k)``; k: ``(B, H, T, d_k)``; v: ``(B, H, T, d_v)``: the
            next ``T`` positions (``T = 1`` when decoding).
        state: carried from the previous call and updated in place; ``None``
            starts from the empty state (and the caller does not see it).
        attention_mask: ``(B, T)`` bool, ``True`` on real tokens: a pad adds
            nothing to the state (and gets a zero output if no real token came
            before it).
        feature_map, eps: as in :func:`linear_attention`.

    Returns:
        ``out (B, H, T, d_v)``, equal to ``linear_attention(q, k, v,
        is_causal=True)`` over the whole sequence seen so far.
    """
    q, k, v = _check_recurrent(q, k, v, state)
    feature_map = _check_feature_map(feature_map)
    eps = check_positive_real(eps, "eps")
    phi_k = feature_map(k)  # (B, H, T, d_phi): d_phi = d_k for elu + 1
    batch, n_heads, time, d_phi = phi_k.shape
    d_v = v.shape[-1]
    if state is None:
        state = LinearAttentionState()
    _check_state(state, (batch, n_heads, d_phi, d_v), q)
    if attention_mask is not None:
        _check_pad_mask(attention_mask, (batch, time))
        real = moved_to(attention_mask, "attention_mask", q.device, "q")[:, None, :, None]
        # (B, T) -> (B, 1, T, 1)
        phi_k = phi_k.masked_fill(~real, 0.0)  # a pad adds nothing to S or z ...
        v = v.masked_fill(~real, 0.0)  # ... even if it holds NaN
    phi_q = feature_map(q)  # (B, H, T, d_phi)
    S = state.S if state.S is not None else q.new_zeros(batch, n_heads, d_phi, d_v)
    z = state.z if state.z is not None else q.new_zeros(batch, n_heads, d_phi)
    outs = []
    for t in range(time):
        # S += phi(k_t) v_t^T: (B, H, d_phi, 1) * (B, H, 1, d_v) -> (B, H, d_phi, d_v)
        S = S + phi_k[:, :, t, :, None] * v[:, :, t, None, :]
        z = z + phi_k[:, :, t]  # (B, H, d_phi)
        # (B, H, 1, d_phi) @ (B, H, d_phi, d_v) -> (B, H, 1, d_v) -> (B, H, d_v)
        numerator = (phi_q[:, :, t, None, :] @ S).squeeze(-2)
        normaliser = (phi_q[:, :, t] * z).sum(-1, keepdim=True)  # (B, H, 1)
        outs.append(numerator / normaliser.clamp_min(eps))  # (B, H, d_v)
    state.S, state.z = S, z
    state.length += time
    return torch.stack(outs, dim=2)  # T x (B, H, d_v) -> (B, H, T, d_v)
