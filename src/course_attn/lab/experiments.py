"""Experiments: gradients through deep stacks (chapter 7), the cost of decoding (chapter 8),
a mask as code against a mask as a tensor (chapter 10).

:func:`block_gradient_norms` compares pre-norm and post-norm stacks at
initialisation (with or without a final norm), :func:`residual_stream_rms` follows
the size of a stack's residual stream and :func:`stream_gradient_norm` the gradient that
enters the stack at its top; :func:`decode_step_seconds` times one decoding
step with and without the KV cache, and :func:`cross_cache_step_ms` times a cached step against
the source length, with and without the static cross-attention cache;
:func:`masked_attention_seconds` times FlexAttention (the mask as code, tiles skipped)
against PyTorch's fused attention and the manual path given the mask as a tensor. They
measure the models; they are not part of them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import and_masks, create_block_mask, create_mask

from .._validation import check_bool, check_choice, check_nonnegative_int, check_positive_int
from ..core.attention import attention_manual
from ..core.flex_attention import causal_mask_mod, flex_attend
from ..core.layers import TransformerBlock
from ..models.encoder_decoder import EncoderDecoder
from ..modern.mask_mods import document_mask_mod, sliding_window_mask_mod
from .measure import median_seconds

__all__ = ["TIMED_MASKS", "block_gradient_norms", "cross_cache_step_ms", "decode_step_seconds",
           "masked_attention_seconds", "residual_stream_rms", "stream_gradient_norm"]

#: The masks :func:`masked_attention_seconds` times (chapter 10): causal, a causal sliding
#: window, and causal attention inside packed documents.
TIMED_MASKS = ("causal", "sliding window", "documents")


def block_gradient_norms(n_layers: int, *, norm_first: bool, d_model: int = 64, n_heads: int = 4,
                         batch_size: int = 8, seq_len: int = 16, seed: int = 0,
                         final_norm: bool | None = None) -> Tensor:
    """Gradient norm of each block's weights in a fresh stack, at initialisation (Chapter 7).

    Builds ``n_layers`` encoder :class:`TransformerBlock` s (PyTorch's default
    initialisation; a final LayerNorm after a pre-norm stack), feeds random
    inputs ``(batch_size, seq_len, d_model)``, takes the mean squared error to a
    random target, back-propagates once and returns ``(n_layers,)``: the L2 norm of
    the gradients of block ``l``'s attention and feed-forward parameters (block 0
    is the one next to the input). LayerNorm gains and biases are left out: in a
    post-norm stack the last block's norm is the output norm, whose gradient
    comes straight from the loss and would make that one block look special.
    The same ``seed`` gives the same weights and data for both norm placements.

    ``final_norm`` puts a final LayerNorm after the stack (``True``) or none
    (``False``); the default, ``None``, means one after a pre-norm stack only.
    Chapter 7 takes it away from a pre-norm stack to show what it does to the
    gradient.
    """
    blocks, x, target = _stack_and_data(n_layers, norm_first, d_model, n_heads, batch_size,
                                        seq_len, seed)
    if final_norm is None:
        final_norm = norm_first
    check_bool(final_norm, "final_norm")
    output_norm = nn.LayerNorm(d_model) if final_norm else nn.Identity()
    for block in blocks:
        x = block(x)  # (B, T, D)
    loss = (output_norm(x) - target).pow(2).mean()
    loss.backward()
    return torch.stack([_grad_norm(block) for block in blocks]).detach()  # (n_layers,)


def residual_stream_rms(n_layers: int, *, norm_first: bool = True, d_model: int = 64,
                        n_heads: int = 4, batch_size: int = 8, seq_len: int = 16,
                        seed: int = 0) -> Tensor:
    """Root mean square of the residual stream after each block of a fresh stack (Chapter 7).

    The stack, the inputs and the ``seed`` are those of :func:`block_gradient_norms`
    (no final norm is applied). Returns ``(n_layers + 1,)``: entry 0 is the input's
    RMS, entry ``l`` the RMS of the stream after block ``l``, over every position and
    feature. In a pre-norm stack every block adds its output to the stream, which the
    final LayerNorm then divides by its size.
    """
    blocks, x, _ = _stack_and_data(n_layers, norm_first, d_model, n_heads, batch_size,
                                   seq_len, seed)
    sizes = [x.pow(2).mean().sqrt()]
    with torch.no_grad():
        for block in blocks:
            x = block(x)  # (B, T, D)
            sizes.append(x.pow(2).mean().sqrt())
    return torch.stack(sizes)  # (n_layers + 1,)


def stream_gradient_norm(n_layers: int, *, norm_first: bool = True, d_model: int = 64,
                         n_heads: int = 4, batch_size: int = 8, seq_len: int = 16,
                         seed: int = 0, final_norm: bool | None = None) -> Tensor:
    """Norm of the loss's gradient with respect to the stream after the last block (Chapter 7).

    The stack, the inputs, the loss and ``final_norm`` are those of
    :func:`block_gradient_norms`. Returns a 0-dim tensor: the L2 norm of
    ``dL/dx`` for the ``(batch_size, seq_len, d_model)`` stream ``x`` that the last block
    writes, the gradient every block's weights receive through the residual path. A
    final LayerNorm divides it by the size of each position's vector; without one, the
    mean squared error is taken on the raw stream.
    """
    blocks, x, target = _stack_and_data(n_layers, norm_first, d_model, n_heads, batch_size,
                                        seq_len, seed)
    if final_norm is None:
        final_norm = norm_first
    check_bool(final_norm, "final_norm")
    output_norm = nn.LayerNorm(d_model) if final_norm else nn.Identity()
    with torch.no_grad():
        for block in blocks:
            x = block(x)  # (B, T, D)
    top = x.requires_grad_(True)  # (B, T, D), a leaf: the stream after the last block
    (output_norm(top) - target).pow(2).mean().backward()
    assert top.grad is not None
    return top.grad.norm().detach()


def _stack_and_data(n_layers: int, norm_first: bool, d_model: int, n_heads: int,
                    batch_size: int, seq_len: int, seed: int
                    ) -> tuple[nn.ModuleList, Tensor, Tensor]:
    """Checked arguments -> a fresh stack of blocks, random inputs and targets (B, T, D)."""
    n_layers = check_positive_int(n_layers, "n_layers")
    check_bool(norm_first, "norm_first")
    for name, value in (("d_model", d_model), ("n_heads", n_heads), ("batch_size", batch_size),
                        ("seq_len", seq_len)):
        check_positive_int(value, name)
    check_nonnegative_int(seed, "seed", upper=2**64 - 1)
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):  # do not disturb the caller's global RNG
        torch.manual_seed(seed)
        blocks = nn.ModuleList(TransformerBlock(d_model, n_heads, norm_first=norm_first)
                               for _ in range(n_layers))
    x = torch.randn(batch_size, seq_len, d_model, generator=generator)  # (B, T, D)
    target = torch.randn(batch_size, seq_len, d_model, generator=generator)  # (B, T, D)
    return blocks, x, target


def _grad_norm(block: nn.Module) -> Tensor:
    """L2 norm of the gradients of a block's weights, its LayerNorms left out (summed in order)."""
    total = torch.zeros(())
    for name, p in block.named_parameters():
        if p.grad is not None and not name.startswith("norm"):
            total = total + p.grad.pow(2).sum()
    return total.sqrt()


def decode_step_seconds(model: EncoderDecoder, prefix_len: int, *, use_cache: bool,
                        batch_size: int = 1, src_len: int = 16, repeats: int = 5,
                        seed: int = 0, cross_cache: bool = True) -> float:
    """Wall-clock seconds to get the next token's logits after ``prefix_len`` tokens (Chapter 8).

    With ``use_cache`` the prefix is run once (not timed) to fill the caches,
    and each timed step feeds one token ``(B, 1)`` against ``prefix_len`` cached
    keys; with ``cross_cache`` too (the default, as ``greedy_decode`` decodes) the
    memory's keys and values come from the static cross-attention cache filled then,
    while ``cross_cache=False`` projects the whole memory again in every layer at
    every step (the decoder before it had that cache). Without ``use_cache`` each
    timed step re-runs the decoder on all ``prefix_len + 1`` tokens, which is what
    decoding costs without a cache. The encoder output is computed once, outside the
    timing, in every case. Returns the fastest of ``repeats`` timed runs (after one
    warm-up run): the minimum is the run least disturbed by other work on the machine.
    """
    if not isinstance(model, EncoderDecoder):
        raise TypeError(f"model must be an EncoderDecoder, got {type(model).__name__}")
    prefix_len = check_positive_int(prefix_len, "prefix_len")
    check_bool(use_cache, "use_cache")
    check_bool(cross_cache, "cross_cache")
    for name, value in (("batch_size", batch_size), ("src_len", src_len), ("repeats", repeats)):
        check_positive_int(value, name)
    check_nonnegative_int(seed, "seed", upper=2**64 - 1)
    c = model.config
    if prefix_len + 1 > c.context_length or src_len > c.context_length:
        raise ValueError(f"prefix_len + 1={prefix_len + 1} and src_len={src_len} must not "
                         f"exceed context_length={c.context_length}")
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(c.src_vocab_size, (batch_size, src_len), generator=g).to(device)
    tgt = torch.randint(c.tgt_vocab_size, (batch_size, prefix_len + 1), generator=g).to(device)
    timings = []
    with torch.no_grad():
        memory = model.encoder(src)  # (B, T_s, D)
        cross_caches = model.new_cross_caches() if use_cache and cross_cache else None
        if use_cache:
            filled = model.new_caches()
            model.decoder(tgt[:, :-1], memory, caches=filled,
                          cross_caches=cross_caches)  # fill: (B, prefix_len), and the memory's
        for _ in range(repeats + 1):  # the first run warms up and is dropped
            if use_cache:
                caches = [cache.fork() for cache in filled]  # each step from the same prefix
                _sync(device)
                start = time.perf_counter()
                model.decoder(tgt[:, -1:], memory, caches=caches,
                              cross_caches=cross_caches)  # (B, 1, N_vocab_tgt)
            else:
                _sync(device)
                start = time.perf_counter()
                model.decoder(tgt, memory)[:, -1]  # (B, N_vocab_tgt)
            _sync(device)
            timings.append(time.perf_counter() - start)
    return min(timings[1:])


def cross_cache_step_ms(model: EncoderDecoder, src_lengths: Sequence[int], *,
                        prefix_len: int = 16, repeats: int = 9,
                        seed: int = 0) -> dict[str, list[float]]:
    """Milliseconds of one cached decoding step against the source length ``T_s`` (Chapter 8).

    For each ``T_s`` in ``src_lengths`` one step after ``prefix_len`` cached target
    tokens is timed twice with :func:`decode_step_seconds`: with the static
    cross-attention cache (the memory's keys and values read from the cache) and
    without it (``k_proj`` and ``v_proj`` run over all ``T_s`` memory positions in
    every decoder layer). The two are timed one after the other at each length, so
    that a change in the machine's load affects both alike. Returns
    ``{"static cross-attention cache": [ms per length], "memory projected at every
    step": [ms per length]}``, ready for ``viz.plot_curves(src_lengths, ...)``. Timings
    vary from machine to machine and run to run: compare the two curves of one run.
    """
    if not isinstance(model, EncoderDecoder):
        raise TypeError(f"model must be an EncoderDecoder, got {type(model).__name__}")
    if not isinstance(src_lengths, Sequence) or isinstance(src_lengths, str) or \
            not src_lengths:
        raise TypeError(f"src_lengths must be a non-empty sequence of source lengths, got "
                        f"{src_lengths!r}")
    lengths = [check_positive_int(n, "src_lengths") for n in src_lengths]
    if max(lengths) > model.config.context_length:
        raise ValueError(f"src_lengths must not exceed context_length="
                         f"{model.config.context_length}, got {max(lengths)}")
    labels = {"static cross-attention cache": True, "memory projected at every step": False}
    curves: dict[str, list[float]] = {label: [] for label in labels}
    for src_len in lengths:
        for label, cross_cache in labels.items():
            seconds = decode_step_seconds(model, prefix_len, use_cache=True, src_len=src_len,
                                          repeats=repeats, seed=seed, cross_cache=cross_cache)
            curves[label].append(1e3 * seconds)
    return curves


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def masked_attention_seconds(t: int, mask: str = "causal", *, heads: int = 4,
                             head_dim: int = 64, window: int = 256, document: int = 256,
                             repeats: int = 3, seed: int = 0) -> dict[str, float]:
    """Forward seconds of one attention call at length ``t`` on three paths (Chapter 10).

    ``mask`` is one of :data:`TIMED_MASKS` (``window`` positions; documents of
    ``document`` tokens). ``"flex"``: FlexAttention with the mask as code and its
    BlockMask (made once, outside the timing), compiled where a compiler is found;
    ``"sdpa"``: ``F.scaled_dot_product_attention`` given the mask as a boolean
    ``(T, T)`` tensor; ``"manual"``: chapter 4's path given the same tensor. Each is the
    median of ``repeats`` calls after one, whose time is ``"flex first call"`` for flex
    (the compilation, for a new shape). Inputs ``(1, heads, t, head_dim)``, float32, on
    the CPU, without gradients. Timings vary with the machine and its load: compare the
    paths of one call.
    """
    t = check_positive_int(t, "t")
    check_choice(mask, "mask", TIMED_MASKS)
    for name, value in (("heads", heads), ("head_dim", head_dim), ("window", window),
                        ("document", document), ("repeats", repeats)):
        check_positive_int(value, name)
    check_nonnegative_int(seed, "seed")
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, t, head_dim, generator=g) for _ in range(3))
    mod = {"causal": causal_mask_mod(),
           "sliding window": sliding_window_mask_mod(window),
           "documents": and_masks(causal_mask_mod(),
                                  document_mask_mod(torch.arange(t)[None] // document))}[mask]
    allowed = create_mask(mod, 1, 1, t, t, "cpu")  # (1, 1, T, T): the same mask, as a tensor
    block_mask = create_block_mask(mod, 1, 1, t, t, device="cpu")
    runs = {"flex": lambda: flex_attend(q, k, v, block_mask=block_mask),
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=allowed),
            "manual": lambda: attention_manual(q, k, v, allowed)}
    seconds: dict[str, float] = {}
    with torch.no_grad():
        start = time.perf_counter()
        runs["flex"]()  # compiles the kernel for this shape (once per process)
        seconds["flex first call"] = time.perf_counter() - start
        for name, run in runs.items():
            seconds[name] = median_seconds(run, repeats=repeats, warmup=0 if name == "flex"
                                           else 1)
    return seconds
