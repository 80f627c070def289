"""Chapter 5: boolean attention masks (``True`` = may attend) and converters.

The course uses one convention everywhere, the one of
``torch.nn.functional.scaled_dot_product_attention``: a boolean mask whose
``True`` entries are the (query, key) pairs that may interact. Converters
translate it for ``nn.MultiheadAttention`` (``True`` = blocked) and for
additive float masks (``0`` / ``-inf``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .._validation import (
    check_bool,
    check_bool_mask,
    check_choice,
    check_device,
    check_doc_ids,
    check_positive_int,
    check_tensor,
    explain_out_of_memory,
    moved_to,
    values_checkable,
)
from .attention import with_causal

__all__ = [
    "causal_mask",
    "combine_masks",
    "document_mask",
    "document_positions",
    "padding_mask",
    "positions_from_attention_mask",
    "scores_mask",
    "to_additive_mask",
    "to_torch_mha_mask",
]


def causal_mask(t_q: int, t_k: int | None = None, *, device: torch.device | str | None = None
                ) -> Tensor:
    """Causal mask ``(t_q, t_k)``: query ``i`` may attend key ``j <= t_k - t_q + i`` (Chapter 5).

    With ``t_k=None`` the mask is square and lower-triangular. When ``t_q < t_k``
    the queries are the *last* ``t_q`` positions of the sequence (bottom-right
    alignment): exactly what decoding with a KV cache needs, where new queries
    follow ``t_k - t_q`` cached keys. When ``t_q > t_k`` the first ``t_q - t_k``
    rows allow no key at all (attention then gives them zero output, Chapter 5),
    as PyTorch's ``causal_lower_right`` does. Note that PyTorch's ``is_causal=True``
    aligns top-left instead when the lengths differ (Chapter 5 shows the pitfall).
    """
    t_q = check_positive_int(t_q, "t_q")
    t_k = t_q if t_k is None else check_positive_int(t_k, "t_k")
    device = check_device(device, "device", exists=True)
    with explain_out_of_memory(f"causal_mask(t_q={t_q}, t_k={t_k})", t_q * t_k):
        return with_causal(None, t_q, t_k, device)  # (t_q, t_k)


def padding_mask(
    lengths: Tensor | Sequence[int],
    max_len: int | None = None,
    *,
    side: str = "right",
    device: torch.device | str | None = None,
) -> Tensor:
    """Boolean padding mask ``(B, max_len)``, ``True`` on real tokens (Chapter 5).

    Args:
        lengths: ``(B,)`` number of real tokens of each sequence, each in ``[0, max_len]``.
        max_len: padded length; defaults to ``max(lengths)``.
        side: ``"right"`` (real tokens first, pads after) or ``"left"`` (pads first,
            as batched generation uses).
        device: where the mask is made (default: the device of ``lengths``).
    """
    check_choice(side, "side", ("right", "left"))
    device = check_device(device, "device", exists=True)
    if not isinstance(lengths, Tensor | Sequence) or isinstance(lengths, str | bytes):
        raise TypeError(f"lengths must be a 1-D integer tensor or a sequence of ints (B,), "
                        f"got {type(lengths).__name__} {lengths!r}")
    if isinstance(lengths, Tensor):
        if lengths.dtype in (torch.bool,) or lengths.is_floating_point() or lengths.is_complex():
            raise TypeError(f"lengths must hold integers, got dtype {lengths.dtype}")
        lengths_t = lengths
    else:
        values = list(lengths)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in values):
            raise TypeError(f"lengths must be a sequence of ints, got {values!r}")
        lengths_t = torch.tensor(values, dtype=torch.long)  # checked on the CPU, then moved
    if lengths_t.dim() != 1 or lengths_t.numel() == 0:
        raise ValueError(f"lengths must be a non-empty 1-D sequence (B,), got shape "
                         f"{tuple(lengths_t.shape)}")
    if max_len is None and lengths_t.device.type == "meta":
        raise ValueError("lengths are on meta, which holds no values to take max_len from; "
                         "give max_len")
    if max_len is None:
        max_len = int(lengths_t.max())  # reads a value: give max_len to avoid it on a GPU
        if max_len < 1:
            raise ValueError(f"lengths must contain a positive length when max_len is not "
                             f"given, got {lengths_t.tolist()}")
    max_len = check_positive_int(max_len, "max_len")
    if values_checkable(lengths_t) and ((lengths_t < 0).any() or (lengths_t > max_len).any()):
        raise ValueError(f"lengths must each be in [0, max_len={max_len}], "
                         f"got {lengths_t.tolist()}")
    if device is not None:
        lengths_t = moved_to(lengths_t, "lengths", device, "the mask")
    positions = torch.arange(max_len, device=lengths_t.device).unsqueeze(0)  # (1, max_len)
    lengths_col = lengths_t.unsqueeze(1)  # (B, 1)
    if side == "right":
        return positions < lengths_col  # (B, max_len)
    return positions >= max_len - lengths_col  # (B, max_len)


def to_torch_mha_mask(mask: Tensor) -> Tensor:
    """A course mask inverted for ``nn.MultiheadAttention`` (``True`` = may NOT attend; Ch. 5).

    ``mask`` is what that module takes: an ``attn_mask (T_q, T_k)`` or
    ``(B * H, T_q, T_k)``, or a ``attention_mask (B, T_k)`` or ``(T_k,)``.
    """
    check_bool_mask(mask, "mask", mask.shape if isinstance(mask, Tensor) else ())
    if not 1 <= mask.dim() <= 3:
        raise ValueError(f"mask must have 1 to 3 dimensions, as nn.MultiheadAttention takes "
                         f"them ((T_k,), (B, T_k), (T_q, T_k) or (B*H, T_q, T_k)), got shape "
                         f"{tuple(mask.shape)}")
    return ~mask


def to_additive_mask(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Additive float mask: ``0.0`` where attention is allowed, ``-inf`` where blocked (Chapter 5).

    Adding it to the scores before softmax is equivalent to the boolean mask
    (except on fully blocked rows, where softmax of all ``-inf`` is NaN).
    """
    check_bool_mask(mask, "mask", mask.shape if isinstance(mask, Tensor) else ())
    if mask.dim() == 0:
        raise ValueError("mask must have at least one dimension (the keys), got a 0-d tensor")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return additive.masked_fill(~mask, float("-inf"))


def combine_masks(
    t_q: int,
    t_k: int,
    *,
    mask: Tensor | None = None,
    attention_mask: Tensor | None = None,
    is_causal: bool = False,
    device: torch.device | str | None = None,
) -> Tensor | None:
    """AND together the masks one attention call may get; ``None`` if nothing is masked (Chapter 5).

    Args:
        t_q, t_k: query and key lengths.
        mask: bool ``(T_q, T_k)`` or ``(B, T_q, T_k)``, ``True`` = may attend.
        attention_mask: bool ``(B, T_k)``, ``True`` on real keys (``False`` on padding).
        is_causal: add ``causal_mask(t_q, t_k)`` (bottom-right aligned).
            ``mask`` and ``attention_mask`` must agree on ``B`` when both have it.
        device: where the returned mask lives (the other masks are moved there, except
            from ``meta``, which holds no values to move: a ``ValueError``);
            ``None`` means the device of the other masks, else the default device.
            Attention layers pass their queries' device, so no mask stays behind
            on the CPU while the model runs on a GPU.

    Returns:
        bool mask broadcastable to ``(B, H, T_q, T_k)``: ``(T_q, T_k)``, or
        ``(B, 1, T_q, T_k)`` when a batch-dependent mask is involved.
    """
    t_q = check_positive_int(t_q, "t_q")
    t_k = check_positive_int(t_k, "t_k")
    check_bool(is_causal, "is_causal")
    for name, value in (("mask", mask), ("attention_mask", attention_mask)):
        if value is not None and not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a boolean torch.Tensor or None, got "
                            f"{type(value).__name__}")
    device = check_device(device, "device", exists=True)
    if (mask is not None and attention_mask is not None and mask.dim() == 3
            and attention_mask.dim() == 2
            and 1 not in (mask.shape[0], attention_mask.shape[0])
            and mask.shape[0] != attention_mask.shape[0]):
        raise ValueError(f"mask and attention_mask disagree on the batch size B: "
                         f"mask {tuple(mask.shape)} has B={mask.shape[0]}, "
                         f"attention_mask {tuple(attention_mask.shape)} has "
                         f"B={attention_mask.shape[0]}")
    if device is None:
        device = next((m.device for m in (mask, attention_mask) if m is not None), None)
    if mask is not None:
        mask = _on(device, _check_pair_mask(mask, t_q, t_k), "mask")
    if attention_mask is not None:
        attention_mask = _on(device, _check_key_mask(attention_mask, t_k), "attention_mask")
    combined = scores_mask(mask, attention_mask)
    if is_causal:
        causal = causal_mask(t_q, t_k, device=device)  # (T_q, T_k)
        combined = causal if combined is None else causal & combined
    return combined


def _on(device: torch.device | None, mask: Tensor, name: str) -> Tensor:
    """``mask`` moved to ``device`` (``None``: where it is)."""
    return mask if device is None else moved_to(mask, name, device, "the combined mask")


def _check_pair_mask(mask: Tensor, t_q: int, t_k: int) -> Tensor:
    if mask.dim() not in (2, 3):
        raise ValueError(f"mask must have shape (T_q, T_k)=({t_q}, {t_k}) or "
                         f"(B, T_q, T_k), got {tuple(mask.shape)}")
    check_bool_mask(mask, "mask", (*mask.shape[:-2], t_q, t_k))
    if mask.shape[-2:] != (t_q, t_k):
        raise ValueError(f"mask must have shape (T_q, T_k)=({t_q}, {t_k}) or "
                         f"(B, {t_q}, {t_k}), got {tuple(mask.shape)}")
    return mask


def _check_key_mask(attention_mask: Tensor, t_k: int) -> Tensor:
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must have shape (B, T_k) with T_k={t_k}, "
                         f"got {tuple(attention_mask.shape)}")
    check_bool_mask(attention_mask, "attention_mask", (attention_mask.shape[0], t_k))
    if attention_mask.shape[1] != t_k:
        raise ValueError(f"attention_mask must have shape (B, T_k) with T_k={t_k}, "
                         f"got {tuple(attention_mask.shape)}")
    return attention_mask


def scores_mask(mask: Tensor | None, attention_mask: Tensor | None) -> Tensor | None:
    """One boolean mask for the scores ``(B, H, T_q, T_k)`` of every head (Chapter 6); no checks.

    ``mask`` is ``(T_q, T_k)``, ``(B, T_q, T_k)`` (given its head axis here) or already
    broadcastable to the scores; ``attention_mask (B, T_k)`` is ``True`` on real keys.
    The building block of :func:`combine_masks`, which checks; an attention layer calls
    it in every forward, where inside a model it only hands the prepared mask on.
    """
    if mask is not None and mask.dim() == 3:
        mask = mask.unsqueeze(1)  # (B, T_q, T_k) -> (B, 1, T_q, T_k): the same for every head
    if attention_mask is None:
        return mask
    keys = attention_mask[:, None, None, :]  # (B, T_k) -> (B, 1, 1, T_k): no query sees a pad
    return keys if mask is None else mask & keys


def positions_from_attention_mask(attention_mask: Tensor) -> Tensor:
    """Position of every token counted over the real tokens of its row (Chapter 7).

    ``attention_mask (B, T)`` bool, ``True`` on real tokens -> ``(B, T)`` long:
    the first real token of each row is at position 0, the next real one at 1,
    and so on, wherever the padding sits. Padding slots get the position of the
    last real token before them (0 before the first one); they are masked anyway.
    With left padding this is what makes a padded row see the same positional
    encodings as the unpadded sequence would.
    """
    check_bool_mask(attention_mask, "attention_mask",
                    attention_mask.shape if isinstance(attention_mask, Tensor) else ())
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must have shape (B, T), got "
                         f"{tuple(attention_mask.shape)}")
    positions = attention_mask.long().cumsum(dim=-1) - 1  # (B, T): index among real tokens
    return positions.clamp(min=0)  # (B, T)


def document_mask(doc_ids: Tensor) -> Tensor:
    """Packed documents (Chapter 11): query ``i`` may attend key ``j`` of its own document only.

    ``doc_ids (B, T)`` (or ``(T,)``) holds the document of each token of a packed row,
    documents numbered in order (``[0, 0, 0, 1, 1, 2, ...]``). Returns a boolean ``(B, T, T)``
    (or ``(T, T)``) mask, ``True`` = may attend: block-diagonal. AND it with
    :func:`causal_mask` for a decoder. With :func:`document_positions` (positions that
    restart at each document), each document of the row gives what it gives alone.
    """
    doc_ids = check_doc_ids(doc_ids)
    return doc_ids.unsqueeze(-1) == doc_ids.unsqueeze(-2)  # (..., T, 1) == (..., 1, T)


def document_positions(doc_ids: Tensor) -> Tensor:
    """The position of each token within its document, ``0`` at its first token (Chapter 11).

    ``doc_ids (B, T)`` or ``(T,)`` as in :func:`document_mask`; returns long, same shape.
    A row cut from the middle of a document starts that document at position 0. Reads no
    value (a model's forward calls it; its door checks the ids with :func:`check_doc_ids`).
    """
    doc_ids = check_tensor(doc_ids, "doc_ids", floating=False)
    if doc_ids.dim() not in (1, 2) or doc_ids.is_floating_point():
        raise ValueError(f"doc_ids must be integer ids of shape (T,) or (B, T), got "
                         f"{doc_ids.dtype} of shape {tuple(doc_ids.shape)}")
    index = torch.arange(doc_ids.shape[-1], device=doc_ids.device).expand(doc_ids.shape)
    starts = torch.ones_like(doc_ids, dtype=torch.bool)  # (..., T): a document starts here
    starts[..., 1:] = doc_ids[..., 1:] != doc_ids[..., :-1]
    last_start = (index * starts).cummax(dim=-1).values  # (..., T): where my document began
    return index - last_start  # (..., T)
