"""Chapters 8 and 11: decoding one token at a time, with a KV cache per layer.

One home for what every autoregressive model here shares: the loop that appends
tokens (:func:`decode`) and the choice of the next token (:func:`pick_next`).
``MiniGPT.generate`` and ``EncoderDecoder.greedy_decode`` are both this loop
around their own forward pass. Both functions are building blocks that check
nothing: their callers have checked every argument once, at their own door,
and nothing is checked inside the loop.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..core.kv_cache import KVCache

__all__ = ["decode", "pick_next"]

#: ``step(tokens (B, T_in), attention_mask (B, T_cache + T_in) or None, caches or None)``
#: returns the logits ``(B, T_in, N_vocab)`` of the newest tokens.
Step = Callable[[Tensor, "Tensor | None", "list[KVCache] | None"], Tensor]


def decode(step: Step, tokens: Tensor, attention_mask: Tensor | None, max_new_tokens: int,
           pick: Callable[[Tensor], Tensor], *, n_layers: int | None,
           context_length: int | None = None) -> Tensor:
    """Append ``max_new_tokens`` tokens to ``tokens (B, T)``, one step per token (Chapter 8).

    With a cache (``n_layers`` given) the first step runs the whole prompt and
    fills one cache per layer (prefill); every later step feeds only the newest
    token, whose keys and values join the cache. Without one, each step runs
    the whole sequence again. ``context_length`` (the model's) crops the input to
    the last ``context_length`` tokens once the sequence outgrows it; cached keys
    would then carry stale positions, so from there on no cache is used.
    ``attention_mask (B, T)`` marks real tokens (left padding; ``None``: no
    padding); ``pick`` turns the last position's logits ``(B, N_vocab)`` into the next
    ids ``(B, 1)``. A model whose last logits are not finite (a diverged run) is
    reported once, after the loop.
    """
    caches: list[KVCache] | None = None
    logits = None
    for _ in range(max_new_tokens):
        fits = context_length is None or tokens.shape[1] <= context_length
        if n_layers is not None and fits and caches is not None:
            logits = step(tokens[:, -1:], attention_mask, caches)  # (B, 1, N_vocab)
        elif n_layers is not None and fits:
            caches = [KVCache() for _ in range(n_layers)]  # prefill: the whole prompt, once
            logits = step(tokens, attention_mask, caches)  # (B, T, N_vocab)
        else:
            caches = None  # cropped context: positions shift, recompute it all
            crop = slice(None) if context_length is None else slice(-context_length, None)
            logits = step(tokens[:, crop], None if attention_mask is None
                          else attention_mask[:, crop], None)  # (B, T, N_vocab)
        next_id = pick(logits[:, -1, :])  # (B, N_vocab) -> (B, 1)
        tokens = torch.cat([tokens, next_id], dim=1)  # (B, T + 1)
        if attention_mask is not None:
            attention_mask = torch.cat(
                [attention_mask, torch.ones_like(next_id, dtype=torch.bool)], dim=1)  # (B, T + 1)
    if logits is not None and logits.device.type == "cpu" and bool(
            (logits.isnan() | logits.isposinf()).any()):
        raise ValueError("the model produced NaN or +inf logits, so the tokens it picked mean "
                         "nothing: its weights or inputs are not finite (a diverged training "
                         "run?)")
    return tokens


def pick_next(logits: Tensor, temperature: float = 0.0, top_k: int | None = None,
              generator: torch.Generator | None = None, top_p: float | None = None) -> Tensor:
    """The next token from ``logits (B, N_vocab)``: argmax, or a tempered sample (Chapter 11).

    ``temperature=0`` is greedy decoding. A sample may be restricted to the ``top_k``
    likeliest tokens, and to the smallest set of them whose probabilities add up to at
    least ``top_p`` (nucleus sampling; the likeliest token always stays). Callers
    validate the arguments.
    """
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    logits = logits.float()  # (B, N_vocab)
    scaled = logits / temperature  # (B, N_vocab)
    # A tiny temperature overflows the division (1.0 / 1e-45 = inf, and softmax
    # of inf is NaN). Such rows take softmax()'s route: shift by the row maximum
    # first (every entry <= 0, the best ones 0), then divide by a temperature
    # clamped to float32's smallest normal number. Other rows keep the plain
    # division, bit for bit. torch.where decides per row without a host sync.
    info = torch.finfo(torch.float32)
    shifted = (logits - logits.amax(dim=-1, keepdim=True)) / max(temperature, info.tiny)
    overflowed = ~scaled.amax(dim=-1, keepdim=True).isfinite()  # (B, 1)
    logits = torch.where(overflowed, shifted, scaled)  # (B, N_vocab)
    if top_k is not None:
        kth_best = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # (B, N_vocab)
    if top_p is not None:  # keep a token when the likelier ones add up to less than top_p
        sorted_probs, order = probs.sort(dim=-1, descending=True)  # (B, N_vocab) each
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the likelier tokens
        dropped_sorted = before >= top_p  # (B, N_vocab), in order of probability
        dropped = torch.zeros_like(dropped_sorted).scatter(-1, order, dropped_sorted)
        probs = probs.masked_fill(dropped, 0.0)  # (B, N_vocab); multinomial renormalises
    device = logits.device if generator is None else generator.device
    try:
        next_id = torch.multinomial(probs.to(device), 1, generator=generator)  # (B, 1)
    except RuntimeError as error:  # NaN, inf or negative probabilities
        raise ValueError("the model produced NaN or +inf logits, so there is nothing to "
                         "sample from: its weights or inputs are not finite (a diverged "
                         "training run?)") from error
    return next_id.to(logits.device)
