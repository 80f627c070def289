"""Chapter 4: scaled dot-product attention, and the one switch between its three paths.

Three functions compute the same thing with the same signature, Hugging Face's
``eager_attention_forward`` style: ``(q, k, v, mask, *, is_causal, scale,
dropout_p, bias) -> (out, weights or None)``.

* :func:`attention_manual`, the readable reference: every step is a line you can print;
* :func:`attention_sdpa`, PyTorch's fused ``scaled_dot_product_attention``, with the
  course's mask conventions;
* :func:`~course_attn.core.tiled.attention_tiled`, the FlashAttention algorithm written
  in torch (chapter 9);
* :func:`~course_attn.core.triton_attention.attention_triton`, the same algorithm as a
  FlashAttention-2 kernel in Triton (chapter 9): compiled on a CUDA GPU, or run by
  Triton's interpreter on the CPU (``TRITON_INTERPRET=1``);
* :func:`~course_attn.core.flex_attention.attention_flex`, PyTorch's FlexAttention with
  the masks and the bias as code (chapter 10), compiled where a compiler is found.

They check nothing: :func:`attention` (and :func:`scaled_dot_product_attention`, the
manual path alone) checks the arguments once and picks a path by name from
``ATTENTION_FUNCTIONS``. A model checks its inputs at its own door and calls a path
directly, once per layer. The tests prove the paths agree (outputs, gradients, masks).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validation import check_attention_args, check_choice, check_head_sizes_at_most
from .flex_attention import attention_flex
from .tiled import attention_tiled
from .triton_attention import MAX_TRITON_HEAD_SIZE, attention_triton

__all__ = [
    "ATTENTION_FUNCTIONS",
    "ATTENTION_IMPLS",
    "AttentionFunction",
    "attention",
    "attention_manual",
    "attention_sdpa",
    "scaled_dot_product_attention",
    "with_causal",
    "zero_unreachable_keys",
]

#: ``f(q, k, v, mask, *, is_causal, scale, dropout_p, bias) -> (out, weights or None)``:
#: what a layer calls to attend (``MultiHeadAttention(attention_fn=...)``).
AttentionFunction = Callable[..., tuple[Tensor, Tensor | None]]


def with_causal(mask: Tensor | None, t_q: int, t_k: int,
                device: torch.device | None) -> Tensor:
    """``mask`` AND the bottom-right causal mask ``(t_q, t_k)`` made on ``device`` (Chapter 5).

    No checks: a building block of the attention paths (``causal_mask`` is the checked one).
    Query ``i`` may attend key ``j <= i + t_k - t_q``: the queries are the last positions.
    """
    causal = torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(t_k - t_q)  # (t_q, t_k)
    return causal if mask is None else mask & causal


def zero_unreachable_keys(k: Tensor, v: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Zero the keys and values that no query may attend to (padding); no checks (Chapter 5).

    A padded slot may hold anything, NaN included. Its weight is 0, but 0 * NaN = NaN:
    without this a NaN in a pad's value would reach every real token's output.
    """
    reachable = mask.any(dim=-2).unsqueeze(-1)  # (..., T_q, T_k) -> (..., T_k, 1)
    return k.masked_fill(~reachable, 0.0), v.masked_fill(~reachable, 0.0)


def attention_manual(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *,
                     is_causal: bool = False, scale: float | None = None, dropout_p: float = 0.0,
                     bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """softmax(q k^T * scale + bias, masked) v, step by step (Chapter 4; no checks).

    The manual path of :func:`attention`, which checks the arguments. ``mask`` is on
    ``q``'s device; ``scale=None`` means ``1 / sqrt(d_k)``. Returns ``(out (..., T_q,
    d_v), attn_weights (..., T_q, T_k))``, the weights that multiplied ``v`` (after
    dropout).
    """
    # Plain causal attention (no other mask, T_q <= T_k) has no empty row and no key that no
    # query sees: the empty-row and pad machinery below is skipped, nothing else changes.
    guarded = mask is not None or (is_causal and q.shape[-2] > k.shape[-2])
    if is_causal:
        mask = with_causal(mask, q.shape[-2], k.shape[-2], q.device)  # (..., T_q, T_k)
    if guarded and mask is not None:
        k, v = zero_unreachable_keys(k, v, mask)  # garbage in a pad never reaches a token

    # (..., T_q, d_k) @ (..., d_k, T_k) -> (..., T_q, T_k)
    attn_scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if bias is not None:
        attn_scores = attn_scores + bias.to(attn_scores.dtype)  # ALiBi, say (chapter 10)
    if mask is not None:
        attn_scores = attn_scores.masked_fill(~mask, float("-inf"))
    if guarded and mask is not None:
        # A row with no allowed key would be softmax(all -inf) = NaN. Give it finite
        # scores here and zero its weights below, so forward and backward stay finite.
        has_key = mask.any(dim=-1, keepdim=True)  # (..., T_q, 1)
        attn_scores = attn_scores.masked_fill(~has_key, 0.0)
    # Half-precision scores are upcast: softmax's exp and sum lose too much in 16 bits.
    attn_weights = torch.softmax(attn_scores, dim=-1, dtype=torch.float32
                                 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype)
    attn_weights = attn_weights.to(q.dtype)  # (..., T_q, T_k)
    if guarded and mask is not None:
        attn_weights = attn_weights.masked_fill(~mask, 0.0)
    if dropout_p > 0.0:
        attn_weights = F.dropout(attn_weights, p=dropout_p, training=True)
    out = attn_weights @ v  # (..., T_q, T_k) @ (..., T_k, d_v) -> (..., T_q, d_v)
    return out, attn_weights


def attention_sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *,
                   is_causal: bool = False, scale: float | None = None, dropout_p: float = 0.0,
                   bias: Tensor | None = None) -> tuple[Tensor, None]:
    """PyTorch's fused kernel with the course's conventions (no checks; see :func:`attention`).

    Plain causal self-attention (``is_causal``, no mask, no bias, ``T_q == T_k``) goes to
    PyTorch as ``is_causal=True`` with no mask tensor: that is what lets it pick the
    FlashAttention kernel. Everything else gets one explicit mask, the causal part
    aligned bottom-right (PyTorch's ``is_causal`` aligns top-left when the lengths
    differ): boolean, or float when a ``bias`` comes along (the bias, ``-inf`` where
    blocked; PyTorch adds a float mask to the scores).

    A row with no allowed key never reaches PyTorch's kernel as one: the kernel is told that
    such a row may attend every key (all finite: the unreachable ones are zeroed first), and
    the row's output is set to zero afterwards, which also stops every gradient from it.
    PyTorch's CPU kernels would give zeros by themselves (since PyTorch 2.5), but its cuDNN
    kernel on a GPU, in float16 and bfloat16 with a boolean mask, gives such a row a nonzero
    output and NaN gradients (``benchmarks/records/h200-2026-11-28-empty-rows.md``).
    """
    if is_causal and mask is None and bias is None and q.shape[-2] == k.shape[-2]:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True,
                                             scale=scale)  # (..., T_q, d_v)
        return out, None
    if is_causal:
        mask = with_causal(mask, q.shape[-2], k.shape[-2], q.device)  # (..., T_q, T_k)
    has_key: Tensor | None = None
    if mask is not None:
        k, v = zero_unreachable_keys(k, v, mask)  # padded keys: contained, as on every path
        has_key = mask.any(dim=-1, keepdim=True)  # (..., T_q, 1): False on an empty row
        mask = mask | ~has_key  # (..., T_q, T_k): an empty row may attend every key
    attn_mask: Tensor | None = mask
    if bias is not None:
        bias = bias.to(q.dtype)  # PyTorch wants a float mask in q's dtype
        attn_mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                         scale=scale)  # (..., T_q, d_v)
    if has_key is None:
        return out, None
    return out.masked_fill(~has_key, 0.0), None  # rows with no key give zeros


#: The attention paths by name: what ``impl`` picks in :func:`attention`, the layers and
#: ``GPTConfig``. ``"tiled"`` is chapter 9's FlashAttention model in torch, ``"triton"``
#: the same algorithm as a Triton kernel (it needs the triton package), ``"flex"``
#: PyTorch's FlexAttention (chapter 10).
ATTENTION_FUNCTIONS: dict[str, AttentionFunction] = {
    "manual": attention_manual,
    "sdpa": attention_sdpa,
    "tiled": attention_tiled,
    "triton": attention_triton,
    "flex": attention_flex,
}
ATTENTION_IMPLS = tuple(ATTENTION_FUNCTIONS)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T * scale + bias, masked) v, written out step by step (Chapter 4).

    Args:
        q: queries ``(..., T_q, d_k)``.
        k: keys ``(..., T_k, d_k)``.
        v: values ``(..., T_k, d_v)``.
        mask: boolean, broadcastable to ``(..., T_q, T_k)``, ``True`` = may attend.
        is_causal: also apply ``causal_mask(T_q, T_k)`` (bottom-right aligned).
        scale: multiplies the scores; ``None`` means ``1 / sqrt(d_k)``.
        dropout_p: dropout on the attention weights (0 = none; only when asked).
        bias: optional float tensor broadcastable to ``(..., T_q, T_k)``, added to
            the scaled scores before the mask (ALiBi's ``-slope * distance``, say).
            It is converted to ``q``'s dtype and device.

    Returns:
        ``(out, attn_weights)``: ``out (..., T_q, d_v)``; ``attn_weights (..., T_q, T_k)``
        (after dropout, i.e. the weights that multiplied ``v``). A query with no
        allowed key gets zero weights and a zero output (finite gradients), as in
        PyTorch's fused attention. Softmax runs in float32 for half-precision inputs.

    Values are never scanned (see ``course_attn._validation``): a NaN or inf in
    ``q`` spoils its own row, one in ``k`` or ``v`` every row that attends to it
    (and possibly rows that mask it: ``0 * NaN = NaN``), except in keys no
    query may attend to (padding), which are zeroed first.
    """
    q, k, v, mask, scale, bias = check_attention_args(
        q, k, v, mask, is_causal=is_causal, scale=scale, dropout_p=dropout_p, bias=bias)
    return attention_manual(q, k, v, mask, is_causal=is_causal, scale=scale,
                            dropout_p=dropout_p, bias=bias)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    bias: Tensor | None = None,
    impl: str = "manual",
) -> tuple[Tensor, Tensor | None]:
    """The one switch between the attention paths: manual, sdpa, tiled, triton, flex (Ch. 4-10).

    Same arguments and semantics as :func:`scaled_dot_product_attention`; ``impl``
    is ``"manual"`` (returns the weights), ``"sdpa"`` (PyTorch's fused kernel,
    faster and lighter on memory, returns ``None`` for the weights, which it
    never materialises) or ``"tiled"`` (the FlashAttention algorithm written in
    torch, exact and ``O(T)`` in memory but slow, a model of the kernel; also
    ``None`` for the weights; dropout by a position hash, so its random mask
    differs from the other paths' for the same seed) or ``"triton"`` (the same
    algorithm as a FlashAttention-2 kernel in Triton, ``None`` for the weights, dropout
    by a position hash too; head sizes up to 128; on CPU tensors it needs Triton's
    interpreter, ``TRITON_INTERPRET=1``, and it needs the triton package: see
    ``course_attn.core.triton_attention``) or ``"flex"`` (PyTorch's FlexAttention, the
    masks and the bias as code, compiled where a compiler is found; ``None`` for the
    weights; no dropout in its kernel: see ``course_attn.core.flex_attention``). Checks its
    arguments once, then calls ``ATTENTION_FUNCTIONS[impl]``.

    Like the manual path it never reads tensor values (no host-device sync):
    NaN or inf inputs propagate (padded keys excepted, which are contained).
    """
    check_choice(impl, "impl", ATTENTION_IMPLS)
    q, k, v, mask, scale, bias = check_attention_args(
        q, k, v, mask, is_causal=is_causal, scale=scale, dropout_p=dropout_p, bias=bias)
    if impl == "triton":
        check_head_sizes_at_most(q, v, MAX_TRITON_HEAD_SIZE, "impl='triton'")
    return ATTENTION_FUNCTIONS[impl](q, k, v, mask, is_causal=is_causal, scale=scale,
                                     dropout_p=dropout_p, bias=bias)
