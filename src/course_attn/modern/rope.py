"""Modern attention: rotary position embedding (RoPE, Su et al. 2021).

Chapter 7 *adds* a sinusoidal table to the token embeddings. RoPE uses the
same angles, ``angle[p, i] = p / 10000^(2i / head_dim)``, but *rotates* each
pair of features ``(x[2i], x[2i+1])`` of a query or key by ``angle[p, i]``
instead. A rotation by ``p * theta`` of the query and by ``j * theta`` of the
key leaves their dot product depending only on ``p - j``: the score sees
relative positions, while the keys can still be cached (a key is rotated
once, by its own position, when it is made).

Pairs are *interleaved* ``(x0, x1), (x2, x3), ...`` as in the RoFormer paper
and as ``torch.view_as_complex`` reads them (the tests use that as the
reference). Llama-style code pairs ``x[i]`` with ``x[i + head_dim/2]``
instead ("rotate half"): a fixed permutation of the head dimensions, so the
two layouts learn the same models.

:func:`sinusoid_angles` is the one home of the angle formula; the tests pin
``layers.sinusoidal_table`` to it bit for bit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from .._validation import (
    check_positive_int,
    check_positive_real,
    check_tensor,
    moved_to,
)

__all__ = ["apply_rope", "apply_rotary", "rope_cos_sin", "rope_rotation", "sinusoid_angles"]

ROPE_BASE = 10000.0


def _check_positions(positions: object, name: str = "positions") -> Tensor:
    if not isinstance(positions, Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor, got "
                        f"{type(positions).__name__} {positions!r}")
    if positions.dtype == torch.bool or positions.is_floating_point() or positions.is_complex():
        raise TypeError(f"{name} must hold integers (e.g. torch.long), got dtype "
                        f"{positions.dtype}")
    return positions


def sinusoid_angles(positions: Tensor, dim: int, *, base: float = ROPE_BASE,
                    dtype: torch.dtype = torch.float64) -> Tensor:
    """The angles of Chapter 7's sinusoidal table: ``positions[..., None] / base^(2i / dim)``.

    Args:
        positions: integer tensor of any shape ``(...)``.
        dim: the width the angles are for (``d_model`` for the sinusoidal table,
            ``head_dim`` for RoPE).
        base: 10000 in both papers.
        dtype: floating dtype of the result (made on ``positions``' device).

    Returns:
        ``(..., ceil(dim / 2))``: column ``i`` turns ``1 / base^(2i / dim)``
        radians per position, from one turn in ``2 pi`` positions (``i = 0``)
        down to about one in ``2 pi * base`` positions.
    """
    positions = _check_positions(positions)
    dim = check_positive_int(dim, "dim")
    base = check_positive_real(base, "base")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    return _angles(positions, dim, base, dtype)


def _angles(positions: Tensor, dim: int, base: float, dtype: torch.dtype) -> Tensor:
    even = torch.arange(0, dim, 2, dtype=dtype, device=positions.device)  # (ceil(dim / 2),)
    # The same expression as layers.sinusoidal_table, so the two agree to the last bit.
    return positions.to(dtype).unsqueeze(-1) / (base ** (even / dim))  # (..., ceil(dim / 2))


def rope_cos_sin(positions: Tensor, head_dim: int, *, base: float = ROPE_BASE,
                 dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` of the rotation angles, each ``(..., head_dim / 2)`` (Chapter 10).

    A building block without checks: a model computes them once per forward and
    hands them to :func:`apply_rotary` in every layer; :func:`apply_rope` is the
    checked way to rotate, which does both. ``head_dim`` is even (features turn in
    pairs); ``dtype`` is that of the angles (float32 at least: half precision cannot
    even hold position 2049 exactly).
    """
    angles = _angles(positions, head_dim, base, dtype)  # (..., head_dim / 2)
    return torch.cos(angles), torch.sin(angles)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Turn each feature pair ``(x[2i], x[2i+1])`` of ``x`` by its angle's cos/sin (Chapter 10).

    A building block without checks (see :func:`rope_cos_sin`). ``x (..., T, head_dim)``
    are queries or keys; ``cos, sin (..., T, head_dim / 2)`` broadcast to its leading
    dimensions. Returns ``(..., T, head_dim)`` in ``x``'s dtype and on its device
    (half precision is rotated in ``cos``'s dtype, float32 or float64).
    """
    work = cos.dtype
    pairs = x.to(work).unflatten(-1, (-1, 2))  # (..., T, head_dim) -> (..., T, head_dim / 2, 2)
    first, second = pairs[..., 0], pairs[..., 1]  # each (..., T, head_dim / 2)
    # A table made on the CPU follows x to its device (a no-op when it is already there).
    cos, sin = cos.to(x.device), sin.to(x.device)
    # (a + ib) * (cos + i sin) = (a cos - b sin) + i (a sin + b cos)
    rotated = torch.stack((first * cos - second * sin, first * sin + second * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)  # (..., T, head_dim / 2, 2) -> (..., T, head_dim)


def rope_rotation(positions: Tensor, head_dim: int, *, like: Tensor,
                  base: float = ROPE_BASE) -> Callable[[Tensor], Tensor]:
    """The rotation a model hands its blocks, RoPE at ``positions`` (Chapter 10), without checks.

    ``positions (T,)`` or ``(B, T)``, one row per sequence (then broadcast over the
    heads). The angles are float64 for a float64 model (``like``, its weights), else
    float32: half precision cannot even hold position 2049 exactly. The result maps
    queries or keys ``(B, H, T, head_dim)`` to their rotated selves.
    """
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    cos, sin = rope_cos_sin(positions, head_dim, base=base, dtype=dtype)  # ((B,) T, hd / 2)
    if positions.dim() == 2:  # one row of positions per sequence
        cos, sin = cos[:, None], sin[:, None]  # (B, T, hd/2) -> (B, 1, T, hd/2): every head
    return functools.partial(apply_rotary, cos=cos, sin=sin)


def apply_rope(x: Tensor, positions: Tensor, *, base: float = ROPE_BASE) -> Tensor:
    """Rotary position embedding of ``x (..., T, head_dim)`` at integer ``positions`` (Chapter 10).

    Args:
        x: queries or keys, e.g. ``(B, H, T, head_dim)``; ``head_dim`` must be even.
        positions: integer positions, either ``(T,)`` (shared by every row) or
            with ``x.dim() - 1`` dimensions broadcastable to ``x.shape[:-1]``,
            e.g. ``(B, 1, T)`` for one row of positions per sequence (left
            padding: ``positions_from_attention_mask(mask)[:, None, :]``). With a
            KV cache, the new tokens' positions continue after the cached ones.
            A ``(B, T)`` tensor against a 4-D ``x`` is refused: its rows would
            line up with the heads, not with the batch. Made on the CPU, they follow
            ``x`` to its device (from ``meta``, which has no values, a ``ValueError``).
        base: 10000, as in RoFormer and Llama 2 (Llama 3 uses 500000).

    Returns:
        ``(..., T, head_dim)``, same dtype and device as ``x``. Rotations keep
        every vector's norm, and ``apply_rope(q, i) . apply_rope(k, j)`` depends
        on ``i - j`` only.
    """
    check_tensor(x, "x", min_ndim=2)
    positions = _check_positions(positions)
    if x.shape[-1] % 2:
        raise ValueError(f"x must have an even head_dim for RoPE (features are rotated in "
                         f"pairs), got shape {tuple(x.shape)} with head_dim={x.shape[-1]}")
    leading = x.shape[:-1]  # (..., T)
    if positions.dim() not in (1, len(leading)):
        raise ValueError(f"positions must be (T,)=({leading[-1]},) or have {len(leading)} "
                         f"dimensions broadcastable to {tuple(leading)} (e.g. (B, 1, T) for "
                         f"x (B, H, T, head_dim)), got shape {tuple(positions.shape)}")
    try:
        fits = torch.broadcast_shapes(positions.shape, leading) == leading
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"positions of shape {tuple(positions.shape)} do not broadcast to x's "
                         f"positions {tuple(leading)} (x has shape {tuple(x.shape)})")
    base = check_positive_real(base, "base")
    positions = moved_to(positions, "positions", x.device, "x")  # made on the CPU: follow x
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32  # angle precision
    cos, sin = rope_cos_sin(positions, x.shape[-1], base=base, dtype=dtype)  # (..., T, hd / 2)
    return apply_rotary(x, cos, sin)
