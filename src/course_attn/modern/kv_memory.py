"""Modern attention: how many bytes the decoding cache of each attention kind holds.

The memory table of the modern-attention chapter. Per layer and per token a
cache stores:

========== ============================================ ==============================
kind       per token and layer                          reference
========== ============================================ ==============================
``mha``    keys and values of every head:               Vaswani et al. 2017
           ``2 * n_heads * head_dim``
``gqa``    ``2 * n_kv_heads * head_dim``                Ainslie et al. 2023
``mqa``    one shared head: ``2 * head_dim``            Shazeer 2019
``mla``    the latent (and the decoupled RoPE key):     DeepSeek-AI 2024 (DeepSeek-V2)
           ``d_latent + d_rope``
``linear`` nothing per token: a fixed state of          Katharopoulos et al. 2020
           ``n_heads * (head_dim * head_dim + head_dim)``
           per layer, whatever the length
========== ============================================ ==============================

With a sliding ``window`` only the last ``window`` tokens are kept. An
encoder-decoder's decoder also keeps the memory's keys and values in its static
cross-attention cache (Chapter 8): ``memory_length`` (the source length ``T_s``) more
positions per layer, in the same layout and never windowed, since every step reads
the whole source. The tests check each formula against the bytes of the package's
real caches.
"""

from __future__ import annotations

import torch

from .._validation import check_choice, check_kv_heads, check_nonnegative_int, check_positive_int

__all__ = ["KV_CACHE_KINDS", "kv_cache_bytes"]

KV_CACHE_KINDS = ("mha", "gqa", "mqa", "mla", "linear")


def _check_kind_options(kind: str, n_kv_heads: object, d_latent: object, d_rope: int,
                        window: object) -> int | None:
    """The options that belong to one kind of cache only; return the window."""
    if (n_kv_heads is not None) != (kind == "gqa"):
        raise ValueError(f"n_kv_heads must be given for kind='gqa' and only then, got "
                         f"kind={kind!r} with n_kv_heads={n_kv_heads!r}")
    if (d_latent is not None) != (kind == "mla"):
        raise ValueError(f"d_latent must be given for kind='mla' and only then, got "
                         f"kind={kind!r} with d_latent={d_latent!r}")
    if d_rope and kind != "mla":
        raise ValueError(f"d_rope is MLA's decoupled RoPE key width; it must be 0 for "
                         f"kind={kind!r}, got {d_rope}")
    if window is None:
        return None
    if kind == "linear":
        raise ValueError("window must be None for kind='linear': its state has a fixed "
                         "size whatever the length")
    return check_positive_int(window, "window")


def kv_cache_bytes(
    kind: str,
    *,
    n_layers: int,
    context_length: int,
    n_heads: int,
    head_dim: int,
    n_kv_heads: int | None = None,
    d_latent: int | None = None,
    d_rope: int = 0,
    window: int | None = None,
    memory_length: int = 0,
    batch_size: int = 1,
    dtype: torch.dtype = torch.float32,
) -> int:
    """Bytes a decoding cache keeps for ``context_length`` tokens of a batch (Chapter 10).

    Args:
        kind: one of ``KV_CACHE_KINDS`` (see the module's table).
        n_layers, context_length, n_heads, head_dim, batch_size: the model and the run.
        n_kv_heads: required for ``"gqa"`` (must divide ``n_heads``), refused otherwise.
        d_latent: required for ``"mla"``, refused otherwise; ``d_rope`` is MLA's
            decoupled RoPE key width (0 without it).
        window: a sliding window: only ``min(context_length, window)`` tokens are cached
            (not for ``"linear"``, whose state does not grow with ``context_length``).
        memory_length: the source length ``T_s`` of an encoder-decoder, whose
            cross-attention caches the memory's keys and values (``"mha"``, ``"gqa"``,
            ``"mqa"``): with ``"mha"`` the total is ``2 L B (T + T_s) D`` numbers.
        dtype: the cache's dtype (4 bytes for float32, 2 for bfloat16).
    """
    check_choice(kind, "kind", KV_CACHE_KINDS)
    n_layers, n_heads, head_dim, batch_size = (check_positive_int(value, name) for value, name in (
        (n_layers, "n_layers"), (n_heads, "n_heads"), (head_dim, "head_dim"),
        (batch_size, "batch_size")))
    context_length = check_nonnegative_int(context_length, "context_length")
    d_rope = check_nonnegative_int(d_rope, "d_rope")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__} {dtype!r}")
    window = _check_kind_options(kind, n_kv_heads, d_latent, d_rope, window)
    memory_length = check_nonnegative_int(memory_length, "memory_length")
    if memory_length and kind in ("mla", "linear"):
        raise ValueError(f"memory_length is the source length of an encoder-decoder's "
                         f"cross-attention cache, of kind 'mha', 'gqa' or 'mqa'; it must be 0 "
                         f"for kind={kind!r}, got {memory_length}")
    if kind == "linear":
        # S = sum phi(k) v^T (head_dim x head_dim) and z = sum phi(k) (head_dim), per head
        state = n_heads * (head_dim * head_dim + head_dim)
        return batch_size * n_layers * state * dtype.itemsize
    tokens = context_length if window is None else min(context_length, window)
    if kind == "mha":
        per_token = 2 * n_heads * head_dim
    elif kind == "gqa":
        _, n_kv_heads = check_kv_heads(n_heads, n_kv_heads)
        per_token = 2 * n_kv_heads * head_dim
    elif kind == "mqa":
        per_token = 2 * head_dim
    else:  # mla
        per_token = check_positive_int(d_latent, "d_latent") + d_rope
    tokens += memory_length  # the static cross-attention cache: the whole source, per layer
    return batch_size * n_layers * tokens * per_token * dtype.itemsize
