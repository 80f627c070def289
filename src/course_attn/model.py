"""Chapter 8: MiniGPT, a decoder-only Transformer small enough to read in one sitting.

Token ids -> token embedding + learned position embedding -> ``n_layers``
pre-norm causal Transformer blocks (chapter 7) -> final LayerNorm -> a linear
head that scores every vocabulary entry. The layout follows nanoGPT's
``model.py``; the blocks are the course's own ``TransformerBlock``, so the
attention inside is the code of chapters 4 to 7, with its manual/fused switch
(``GPTConfig.impl``) and its KV cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ._validation import (
    check_bool,
    check_choice,
    check_left_padding,
    check_positive_int,
    check_positive_real,
    check_probability,
    values_checkable,
)
from .attention import ATTENTION_IMPLS
from .layers import KVCache, TransformerBlock, check_caches
from .masks import causal_mask

__all__ = ["GPTConfig", "MiniGPT"]


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a :class:`MiniGPT` (chapter 8).

    ``vocab_size`` V token ids, contexts of at most ``block_size`` tokens,
    ``n_layers`` blocks of ``n_heads`` heads over a width ``d_model``
    (``head_dim = d_model / n_heads``). ``tie_weights`` shares the token
    embedding with the output head (GPT-2 and nanoGPT do); ``impl`` picks the
    attention path (``"manual"`` or PyTorch's fused ``"sdpa"``). ``init_std``
    is the standard deviation of the initial weights: GPT-2's 0.02 suits
    widths of hundreds; a narrow model (width 64) learns some two-layer
    circuits far sooner from a larger start such as 0.1 (chapter 8).
    """

    vocab_size: int
    block_size: int
    n_layers: int = 4
    n_heads: int = 4
    d_model: int = 128
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = True
    impl: str = "manual"
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layers", "n_heads", "d_model"):
            check_positive_int(getattr(self, name), name)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads} "
                             "(each head gets d_model / n_heads dimensions)")
        check_probability(self.dropout, "dropout")
        for name in ("bias", "tie_weights"):
            check_bool(getattr(self, name), name)
        check_choice(self.impl, "impl", ATTENTION_IMPLS)
        check_positive_real(self.init_std, "init_std")


class MiniGPT(nn.Module):
    """A GPT-style language model built from the course's blocks (chapter 8).

    ``forward(idx (B, T), targets=None (B, T), *, attention_mask=None (B, T))``
    returns ``(logits (B, T, V), loss or None)``; ``generate`` continues prompts.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Embedding(config.block_size, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(config.d_model, config.n_heads, dropout=config.dropout,
                             norm_first=True, cross_attention=False, activation="gelu",
                             bias=config.bias, impl=config.impl)
            for _ in range(config.n_layers)
        )
        self.norm = nn.LayerNorm(config.d_model, bias=config.bias)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_weights:
            # One matrix both reads tokens in and scores them out (GPT-2, nanoGPT).
            self.lm_head.weight = self.embed.weight
        self.apply(self._init_weights)
        # GPT-2: scale the projections that write into the residual stream by
        # 1/sqrt(2 * n_layers), so the stream's variance does not grow with depth.
        residual_std = config.init_std / math.sqrt(2 * config.n_layers)
        for block in self.blocks:
            for layer in (block.self_attn.out_proj, block.ff.linear2):
                nn.init.normal_(layer.weight, mean=0.0, std=residual_std)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)

    def num_parameters(self, *, non_embedding: bool = False) -> int:
        """Number of parameters (a tied matrix counts once); optionally without the position table ``pos``."""
        check_bool(non_embedding, "non_embedding")
        total = sum(p.numel() for p in self.parameters())
        return total - self.pos.weight.numel() if non_embedding else total

    def flops_per_token(self) -> int:
        """Floating-point operations to train on one token: forward and backward (chapter 8).

        The estimate of the PaLM paper that nanoGPT uses: ``6 N`` for the weights
        (2 per weight forward, 4 backward) plus ``12 L T D`` for the attention
        scores and the weighted sum over a full context of ``T = block_size``
        (``N`` without the position table, ``L`` layers, width ``D``).
        """
        c = self.config
        attention = 12 * c.n_layers * c.block_size * c.d_model
        return 6 * self.num_parameters(non_embedding=True) + attention

    def new_caches(self) -> list[KVCache]:
        """One empty :class:`KVCache` per block, for incremental decoding (chapter 7)."""
        return [KVCache() for _ in self.blocks]

    # ----------------------------------------------------------------- checks
    def _check_idx(self, idx: object, name: str = "idx") -> Tensor:
        if not isinstance(idx, Tensor):
            raise TypeError(f"{name} must be a torch.long tensor (B, T), got {type(idx).__name__}")
        if idx.dtype != torch.long:
            raise TypeError(f"{name} must have dtype torch.long (token ids), got {idx.dtype}")
        if idx.dim() != 2 or idx.shape[0] == 0 or idx.shape[1] == 0:
            raise ValueError(f"{name} must have shape (B, T) with B >= 1 and T >= 1, "
                             f"got {tuple(idx.shape)}")
        if values_checkable(idx) and idx.numel() and (
                idx.min() < 0 or idx.max() >= self.config.vocab_size):
            raise ValueError(f"{name} must hold token ids in [0, vocab_size="
                             f"{self.config.vocab_size}), got values in [{int(idx.min())}, "
                             f"{int(idx.max())}]")
        return idx

    @staticmethod
    def _check_attention_mask(mask: object, shape: tuple[int, int]) -> Tensor:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            got = f"dtype {mask.dtype}" if isinstance(mask, Tensor) else type(mask).__name__
            raise TypeError(f"attention_mask must be a torch.bool tensor (B, T), True on real "
                            f"tokens, got {got}")
        if tuple(mask.shape) != shape:
            raise ValueError(f"attention_mask must have shape (B, T)={shape}, "
                             f"got {tuple(mask.shape)}")
        if values_checkable(mask) and not mask.any(dim=1).all():
            raise ValueError("attention_mask has a row without any real token (all False)")
        return mask

    # ---------------------------------------------------------------- forward
    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        *,
        attention_mask: Tensor | None = None,
        caches: list[KVCache] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Next-token logits for every position, and the loss when ``targets`` are given.

        Args:
            idx: ``(B, T)`` long token ids in ``[0, V)``, ``T <= block_size``.
            targets: ``(B, T)`` long, the id each position should predict;
                ``-1`` (and, with ``attention_mask``, padding) is left out of the loss.
            attention_mask: ``(B, T)`` bool, ``True`` on real tokens (left-padded
                batches). Padding keys are never attended to and each row's
                positions count from its first real token, so a padded row gives
                the same logits as the row alone.
            caches: one :class:`KVCache` per block (from :meth:`new_caches`) for
                incremental decoding: ``idx`` then holds only the new tokens and
                ``attention_mask`` covers every cached and new token ``(B, T_cache + T)``.

        Returns:
            ``(logits (B, T, V), loss)``: ``loss`` is the mean cross-entropy in
            nats over the targets that count, or ``None`` without targets. It is
            computed as (sum of the per-token losses) / max(number of counted
            targets, 1): exactly ``F.cross_entropy(..., ignore_index=-1)`` when
            at least one target counts, and ``0`` (with zero gradients) when none
            does (all ``-1`` or all padding), where the plain mean would be 0/0 = NaN.
            No tensor value is read to decide this. Token ids are range-checked
            on the CPU; activations are never scanned for NaN (see
            ``course_attn._validation``).
        """
        idx = self._check_idx(idx)
        batch, time = idx.shape
        past = 0
        if caches is not None:
            past = check_caches(caches, len(self.blocks))
        if past + time > self.config.block_size:
            raise ValueError(f"the sequence has {past + time} tokens (T={time}"
                             + (f" after {past} cached" if past else "")
                             + f"), more than block_size={self.config.block_size}")
        if attention_mask is not None:
            self._check_attention_mask(attention_mask, (batch, past + time))
            attention_mask = attention_mask.to(idx.device)
            # Position of each token = number of real tokens before it in its row.
            positions = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, past+T)
            positions = positions[:, past:]  # (B, T)
        else:
            positions = torch.arange(past, past + time, device=idx.device)  # (T,)
        # The mask every block uses, prepared once. Plain causal self-attention needs
        # none: the blocks get is_causal=True, which the fused path hands to PyTorch's
        # FlashAttention-eligible kernel. Padding or a cache make it explicit.
        mask = None
        if attention_mask is not None or past:
            mask = causal_mask(time, past + time, device=idx.device)  # (T, past+T)
            if attention_mask is not None:
                mask = mask & attention_mask[:, None, :]  # (B, T, past+T): no padded key

        x = self.drop(self.embed(idx) + self.pos(positions))  # (B, T, D)
        for i, block in enumerate(self.blocks):
            x = block(x, attn_mask=mask, is_causal=mask is None,
                      cache=None if caches is None else caches[i])  # (B, T, D)
        logits = self.lm_head(self.norm(x))  # (B, T, D) @ (D, V) -> (B, T, V)

        if targets is None:
            return logits, None
        if not isinstance(targets, Tensor) or targets.dtype != torch.long:
            raise TypeError("targets must be a torch.long tensor (B, T) of token ids")
        if targets.shape != idx.shape:
            raise ValueError(f"targets must have the shape of idx {tuple(idx.shape)}, "
                             f"got {tuple(targets.shape)}")
        if values_checkable(targets) and targets.numel() and (
                targets.min() < -1 or targets.max() >= self.config.vocab_size):
            raise ValueError(f"targets must hold ids in [0, {self.config.vocab_size}) or -1 "
                             f"(ignored), got values in [{int(targets.min())}, "
                             f"{int(targets.max())}]")
        if attention_mask is not None:
            targets = targets.masked_fill(~attention_mask[:, past:], -1)
        # Half-precision logits are upcast: log-softmax over V entries needs the range.
        flat = logits.reshape(-1, logits.shape[-1])  # (B, T, V) -> (B*T, V)
        if flat.dtype in (torch.float16, torch.bfloat16):
            flat = flat.float()
        flat_targets = targets.reshape(-1)  # (B*T,)
        # sum / count instead of reduction="mean": the same number whenever a target
        # counts, and 0 instead of 0/0 = NaN when none does, without reading a value.
        loss_sum = F.cross_entropy(flat, flat_targets, ignore_index=-1, reduction="sum")
        n_counted = (flat_targets != -1).sum().clamp(min=1)
        loss = loss_sum / n_counted
        return logits, loss

    @torch.no_grad()
    def attention_maps(self, idx: Tensor, *, attention_mask: Tensor | None = None) -> Tensor:
        """Attention weights of every head of every block: ``(L, B, H, T, T)`` (chapter 8).

        Runs the model once (in eval mode) with the manual attention path and
        records what each block's self-attention computed.
        """
        idx = self._check_idx(idx)
        recorded: list[Tensor] = []

        def ask_for_weights(module, args, kwargs):
            return args, {**kwargs, "need_weights": True}

        def keep_weights(module, args, kwargs, output):
            out, attn_weights = output
            recorded.append(attn_weights.detach())  # (B, H, T, T)
            return out

        handles = []
        for block in self.blocks:
            handles.append(block.self_attn.register_forward_pre_hook(ask_for_weights,
                                                                     with_kwargs=True))
            handles.append(block.self_attn.register_forward_hook(keep_weights, with_kwargs=True))
        was_training = self.training
        self.eval()
        try:
            self(idx, attention_mask=attention_mask)
        finally:
            for handle in handles:
                handle.remove()
            self.train(was_training)
        return torch.stack(recorded)  # (L, B, H, T, T)

    # --------------------------------------------------------------- generate
    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        use_cache: bool = True,
        attention_mask: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Continue each prompt of ``idx (B, T)`` by ``max_new_tokens`` sampled tokens.

        Args:
            idx: ``(B, T)`` long prompts; with ``attention_mask``, left-padded.
            max_new_tokens: how many tokens to append (>= 0).
            temperature: divides the logits; ``0`` means greedy (argmax). A tiny
                temperature behaves as in :func:`~course_attn.softmax.softmax`:
                where ``logits / temperature`` would overflow (say ``1e-45``), the
                logits are shifted by their maximum first and the temperature is
                clamped to the smallest normal float32, so the best token(s) get
                all the probability (ties share it), never NaN or inf.
            top_k: sample only among the ``top_k`` most likely tokens.
            use_cache: keep each block's keys and values in a :class:`KVCache`
                and feed only the newest token at each step. Once the sequence
                is longer than ``block_size`` the context is cropped to the last
                ``block_size`` tokens (as nanoGPT does); the cached keys would
                then carry stale positions, so from there on every step
                recomputes the cropped window from scratch (no cache).
            attention_mask: ``(B, T)`` bool, ``True`` on real tokens, ``False`` on
                left padding; each row then gets the continuation it would get alone.
            generator: a seeded ``torch.Generator`` makes sampling reproducible
                (sampling happens on the generator's device).

        Returns:
            ``(B, T + max_new_tokens)`` long: the prompts followed by the new tokens.
        """
        idx = self._check_idx(idx)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise TypeError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if isinstance(temperature, bool) or not isinstance(temperature, int | float):
            raise TypeError(f"temperature must be a number >= 0, got {temperature!r}")
        if not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
        if top_k is not None:
            check_positive_int(top_k, "top_k")
            if top_k > self.config.vocab_size:
                raise ValueError(f"top_k must be at most vocab_size={self.config.vocab_size}, "
                                 f"got {top_k}")
        check_bool(use_cache, "use_cache")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        if attention_mask is None:
            mask = torch.ones_like(idx, dtype=torch.bool)
        else:
            mask = self._check_attention_mask(attention_mask, tuple(idx.shape)).to(idx.device)
            check_left_padding(mask, "attention_mask")

        was_training = self.training
        self.eval()
        block_size = self.config.block_size
        caches: list[KVCache] | None = None
        try:
            for _ in range(max_new_tokens):
                fits = idx.shape[1] <= block_size
                if use_cache and fits and caches is not None:
                    # Only the newest token goes through the blocks; the rest is cached.
                    logits, _ = self(idx[:, -1:], attention_mask=mask, caches=caches)
                elif use_cache and fits:
                    caches = self.new_caches()  # prefill: the whole prompt, once
                    logits, _ = self(idx, attention_mask=mask, caches=caches)
                else:
                    caches = None  # cropped context: positions shift, recompute it all
                    logits, _ = self(idx[:, -block_size:], attention_mask=mask[:, -block_size:])
                next_id = self._pick(logits[:, -1, :], temperature, top_k, generator)  # (B, 1)
                idx = torch.cat([idx, next_id], dim=1)  # (B, T + 1)
                mask = torch.cat([mask, torch.ones_like(next_id, dtype=torch.bool)], dim=1)
        finally:
            self.train(was_training)
        return idx

    @staticmethod
    def _pick(logits: Tensor, temperature: float, top_k: int | None,
              generator: torch.Generator | None) -> Tensor:
        """Choose the next token from ``logits (B, V)``: argmax, or a tempered top-k sample."""
        if values_checkable(logits) and (logits.isnan() | logits.isposinf()).any():
            raise ValueError("the model produced NaN or +inf logits, so there is nothing to "
                             "sample from: its weights or inputs are not finite (a diverged "
                             "training run?)")
        if temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        logits = logits.float()  # (B, V)
        scaled = logits / temperature  # (B, V)
        # A tiny temperature overflows the division (1.0 / 1e-45 = inf, and softmax
        # of inf is NaN). Such rows take softmax()'s route: shift by the row maximum
        # first (every entry <= 0, the best ones 0), then divide by a temperature
        # clamped to float32's smallest normal number. Other rows keep the plain
        # division, bit for bit. torch.where decides per row without a host sync.
        info = torch.finfo(torch.float32)
        shifted = (logits - logits.amax(dim=-1, keepdim=True)) / max(temperature, info.tiny)
        overflowed = ~scaled.amax(dim=-1, keepdim=True).isfinite()  # (B, 1)
        logits = torch.where(overflowed, shifted, scaled)  # (B, V)
        if top_k is not None:
            kth_best = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
            logits = logits.masked_fill(logits < kth_best, float("-inf"))
        probs = torch.softmax(logits, dim=-1)  # (B, V)
        device = logits.device if generator is None else generator.device
        next_id = torch.multinomial(probs.to(device), 1, generator=generator)  # (B, 1)
        return next_id.to(logits.device)
