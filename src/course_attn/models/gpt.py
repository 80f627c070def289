"""Chapter 11: MiniGPT, a decoder-only Transformer small enough to read in one sitting.

Token ids -> token embedding + learned position embedding -> ``n_layers``
pre-norm causal Transformer blocks (chapter 7) -> final LayerNorm -> a linear
head that scores every vocabulary entry. The layout follows nanoGPT's
``model.py``; the blocks are the course's own ``TransformerBlock``, so the
attention inside is the code of chapters 4 to 7, with its manual/fused switch
(``GPTConfig.impl``) and its KV cache. ``forward`` checks its arguments once
and prepares the mask (and RoPE's rotations) once; the blocks then run unchecked.

``GPTConfig`` switches on the modern variants of the chapters before it, each
off by default: rotary, sinusoidal or ALiBi positions (``pos_encoding``),
grouped-query attention (``n_kv_heads``) and sliding-window attention (``window``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .._validation import (
    check_bool,
    check_choice,
    check_head_split,
    check_left_padding,
    check_nonnegative_int,
    check_nonnegative_real,
    check_positive_int,
    check_positive_real,
    check_probability,
    check_token_ids,
    check_token_mask,
)
from ..core.attention import ATTENTION_IMPLS
from ..core.layers import TransformerBlock, TransformerBlocks, sinusoidal_table
from ..core.masks import causal_mask, positions_from_attention_mask
from ..modern.alibi import _alibi_bias, alibi_slopes
from ..modern.gqa import check_kv_heads
from ..modern.rope import _angle_dtype, rope_cos_sin
from ..modern.sliding_window import sliding_window_mask
from .decoding import KVCache, check_caches, decode, new_caches, pick_next

__all__ = ["POS_ENCODINGS", "GPTConfig", "MiniGPT", "next_token_loss"]

#: How ``MiniGPT`` tells positions apart (``GPTConfig.pos_encoding``): a learned
#: table added to the embeddings (GPT-2), chapter 7's fixed sinusoidal table
#: added the same way, rotary embeddings of the queries and keys (RoPE), or
#: ALiBi's per-head bias ``-slope * (i - j)`` added to the attention scores.
POS_ENCODINGS = ("learned", "sinusoidal", "rope", "alibi")


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a :class:`MiniGPT` (chapter 11).

    ``vocab_size`` V token ids, contexts of at most ``block_size`` tokens,
    ``n_layers`` blocks of ``n_heads`` heads over a width ``d_model``
    (``head_dim = d_model / n_heads``). ``tie_weights`` shares the token
    embedding with the output head (GPT-2 and nanoGPT do); ``impl`` picks the
    attention path (one of ``ATTENTION_IMPLS``). ``init_std``
    is the standard deviation of the initial weights: GPT-2's 0.02 suits
    widths of hundreds; a narrow model (width 64) learns some two-layer
    circuits far sooner from a larger start such as 0.1 (chapter 11).

    Modern variants, each off by default: ``pos_encoding`` is one of
    ``POS_ENCODINGS`` (``"rope"`` needs an even ``head_dim``; ``"alibi"`` adds no
    parameter and no table, only a fixed bias per head); ``n_kv_heads``
    key/value heads (``None``: ``n_heads``; it must divide ``n_heads``) make
    grouped-query attention, ``1`` multi-query; ``window`` (``None``: the whole
    causal context) lets each token attend only to the last ``window`` positions,
    itself included (sliding-window attention).
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
    pos_encoding: str = "learned"
    n_kv_heads: int | None = None
    window: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layers"):
            check_positive_int(getattr(self, name), name)
        head_dim = check_head_split(self.d_model, self.n_heads)
        check_choice(self.pos_encoding, "pos_encoding", POS_ENCODINGS)
        if self.pos_encoding == "rope" and head_dim % 2:
            raise ValueError(f"pos_encoding='rope' needs an even head_dim = d_model / n_heads "
                             f"(RoPE rotates features in pairs), got d_model={self.d_model} / "
                             f"n_heads={self.n_heads} = {head_dim}")
        if self.n_kv_heads is not None:
            check_kv_heads(self.n_heads, self.n_kv_heads)
        if self.window is not None:
            check_positive_int(self.window, "window")
        check_probability(self.dropout, "dropout")
        for name in ("bias", "tie_weights"):
            check_bool(getattr(self, name), name)
        check_choice(self.impl, "impl", ATTENTION_IMPLS)
        check_positive_real(self.init_std, "init_std")


def next_token_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of ``logits (B, T, V)`` against ``targets (B, T)``; ``-1`` is left out.

    Computed as (sum of the per-token losses) / max(number of counted targets, 1):
    exactly ``F.cross_entropy(..., ignore_index=-1)`` when a target counts, and
    ``0`` instead of 0/0 = NaN when none does, without reading a tensor value.
    """
    # Half-precision logits are upcast: log-softmax over V entries needs the range.
    flat = logits.reshape(-1, logits.shape[-1])  # (B, T, V) -> (B*T, V)
    if flat.dtype in (torch.float16, torch.bfloat16):
        flat = flat.float()
    flat_targets = targets.reshape(-1)  # (B*T,)
    loss_sum = F.cross_entropy(flat, flat_targets, ignore_index=-1, reduction="sum")
    return loss_sum / (flat_targets != -1).sum().clamp(min=1)


class MiniGPT(nn.Module):
    """A GPT-style language model built from the course's blocks (chapter 11).

    ``forward(idx (B, T), targets=None (B, T), *, attention_mask=None (B, T))``
    returns ``(logits (B, T, V), loss or None)``; ``generate`` continues prompts.
    """

    pos: nn.Embedding | None  # the learned position table (pos_encoding="learned")
    pos_table: Tensor | None  # the fixed sinusoidal table (pos_encoding="sinusoidal")
    alibi_slopes: Tensor | None  # ALiBi's slope per head (pos_encoding="alibi")

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = (nn.Embedding(c.block_size, c.d_model) if c.pos_encoding == "learned"
                    else None)
        # Fixed, so not saved: a non-persistent buffer (it still follows .to(device)).
        self.register_buffer("pos_table", sinusoidal_table(c.block_size, c.d_model)
                             if c.pos_encoding == "sinusoidal" else None, persistent=False)
        # Fixed and made from n_heads alone: not saved either. A buffer follows the
        # model to its device and dtype (meta included), so the bias is made there.
        self.register_buffer("alibi_slopes", alibi_slopes(c.n_heads)
                             if c.pos_encoding == "alibi" else None, persistent=False)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = TransformerBlocks(
            TransformerBlock(c.d_model, c.n_heads, dropout=c.dropout, norm_first=True,
                             bias=c.bias, impl=c.impl, n_kv_heads=c.n_kv_heads)
            for _ in range(c.n_layers))
        self.norm = nn.LayerNorm(c.d_model, bias=c.bias)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_weights:
            # One matrix both reads tokens in and scores them out (GPT-2, nanoGPT).
            self.lm_head.weight = self.embed.weight
        self.apply(self._init_weights)
        # GPT-2: scale the projections that write into the residual stream by
        # 1/sqrt(2 * n_layers), so the stream's variance does not grow with depth.
        for block in self.blocks:
            for layer in (block.self_attn.out_proj, block.ff.linear2):
                nn.init.normal_(layer.weight, std=c.init_std / math.sqrt(2 * c.n_layers))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_parameters(self, *, non_embedding: bool = False) -> int:
        """Number of parameters (a tied matrix counts once); optionally without ``pos``."""
        check_bool(non_embedding, "non_embedding")
        total = sum(p.numel() for p in self.parameters())
        if non_embedding and self.pos is not None:
            return total - self.pos.weight.numel()
        return total

    def flops_per_token(self) -> int:
        """Floating-point operations to train on one token: forward and backward (chapter 11).

        The estimate of the PaLM paper that nanoGPT uses: ``6 N`` for the weights
        (2 per weight forward, 4 backward) plus ``12 L T D`` for the attention
        scores and the weighted sum over a full context of ``T = block_size``
        (``N`` without the position table, ``L`` layers, width ``D``).
        """
        c = self.config
        attention = 12 * c.n_layers * c.block_size * c.d_model
        return 6 * self.num_parameters(non_embedding=True) + attention

    def new_caches(self) -> list[KVCache]:
        """One empty :class:`KVCache` per block, for incremental decoding (chapter 8)."""
        return new_caches(len(self.blocks))

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
        past = self._check_forward(idx, targets, attention_mask, caches)
        x, _ = self._run(idx, attention_mask, caches, past)  # (B, T, D)
        logits = self.lm_head(self.norm(x))  # (B, T, D) @ (D, V) -> (B, T, V)
        if targets is None:
            return logits, None
        if attention_mask is not None:  # padding predicts nothing
            targets = targets.masked_fill(~attention_mask[:, past:].to(targets.device), -1)
        return logits, next_token_loss(logits, targets)

    def _run(self, idx: Tensor, attention_mask: Tensor | None, caches: list[KVCache] | None,
             past: int, *, need_weights: bool = False) -> tuple[Tensor, list[Tensor | None]]:
        """Embed ``idx (B, T)`` and run every block; return ``x (B, T, D)`` and the weights."""
        mask, positions = self._mask_and_positions(idx, attention_mask, past)
        rope = self._rope(positions)  # (cos, sin), made once for every block, or None
        bias = self._alibi(idx.shape[1], past)  # (H, T, T_cache + T), once, or None
        x = self.drop(self._embed(idx, positions))  # (B, T, D)
        weights = []
        for i, block in enumerate(self.blocks):
            x, w = block._forward(x, mask, is_causal=mask is None, need_weights=need_weights,
                                  cache=None if caches is None else caches[i],
                                  rope=rope, bias=bias)  # (B, T, D)
            weights.append(w)
        return x, weights

    def _mask_and_positions(self, idx: Tensor, attention_mask: Tensor | None,
                            past: int) -> tuple[Tensor | None, Tensor]:
        """The mask every block uses, prepared once, and the new tokens' positions.

        Plain causal self-attention needs no mask: the blocks get ``is_causal=True``,
        which the fused path hands to PyTorch's FlashAttention-eligible kernel.
        Padding, a cache or a window shorter than the context make it explicit:
        ``(T, T_cache + T)``, or ``(B, 1, T, T_cache + T)`` with padding. Positions are
        ``(T,)``, or ``(B, T)`` counted from each row's first real token.
        """
        time, device, window = idx.shape[1], idx.device, self.config.window
        mask: Tensor | None = None
        positions = torch.arange(past, past + time, device=device)  # (T,)
        if window is not None and window < past + time:
            mask = sliding_window_mask(time, past + time, window=window,
                                       device=device)  # (T, past+T)
        elif attention_mask is not None or past:
            mask = causal_mask(time, past + time, device=device)  # (T, past+T)
        if attention_mask is not None:
            attention_mask = attention_mask.to(device)
            # Each row's positions count from its first real token (left padding).
            positions = positions_from_attention_mask(attention_mask)[:, past:]  # (B, T)
            assert mask is not None  # made above: padding always needs a mask
            mask = mask & attention_mask[:, None, None, :]  # (B, 1, T, past+T): no pad key
        return mask, positions

    def _embed(self, idx: Tensor, positions: Tensor) -> Tensor:
        """Token embeddings ``(B, T, D)`` plus the position table's rows, if the model has one."""
        x = self.embed(idx)  # (B, T, D)
        if self.pos is not None:
            return x + self.pos(positions)  # (B, T, D) + ((B,) T, D)
        if self.pos_table is not None:
            return x + self.pos_table[positions].to(x.dtype)  # (B, T, D) + ((B,) T, D)
        return x  # RoPE, ALiBi: positions enter inside attention

    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor] | None:
        """RoPE's ``(cos, sin)`` at ``positions``, shaped to broadcast over the heads."""
        if self.config.pos_encoding != "rope":
            return None
        c = self.config
        cos, sin = rope_cos_sin(positions, c.d_model // c.n_heads,
                                dtype=_angle_dtype(self.embed.weight.dtype))  # (.., T, hd/2)
        if positions.dim() == 2:  # one row of positions per sequence
            cos, sin = cos[:, None], sin[:, None]  # (B, T, hd/2) -> (B, 1, T, hd/2)
        return cos, sin

    def _alibi(self, time: int, past: int) -> Tensor | None:
        """ALiBi's score bias ``(H, T, T_cache + T)`` for ``T`` new tokens after ``past``.

        Aligned bottom-right: the new queries are the last ``T`` positions, so a
        cached step gets exactly the rows the full forward pass would. Only the
        distance ``i - j`` enters, so left padding (which shifts a row's queries
        and keys alike) changes nothing once its pad keys are masked: no positions
        from the ``attention_mask`` are needed, unlike RoPE.
        """
        if self.alibi_slopes is None:
            return None
        return _alibi_bias(time, past + time, self.alibi_slopes)  # (H, T, past + T)

    def _check_forward(self, idx: object, targets: object, attention_mask: object,
                       caches: object) -> int:
        """Check ``forward``'s arguments once, at the boundary; return ``T_cache``."""
        c = self.config
        idx = check_token_ids(idx, "idx", c.vocab_size)
        past = 0 if caches is None else check_caches(caches, len(self.blocks))
        if past + idx.shape[1] > c.block_size:
            raise ValueError(f"the sequence has {past + idx.shape[1]} tokens (T={idx.shape[1]}"
                             + (f" after {past} cached" if past else "")
                             + f"), more than block_size={c.block_size}")
        if attention_mask is not None:
            check_token_mask(attention_mask, "attention_mask", (idx.shape[0], past + idx.shape[1]),
                             rows_nonempty=True)
        if targets is not None:
            check_token_ids(targets, "targets", c.vocab_size, shape=idx.shape, ignore_index=-1)
        return past

    @torch.no_grad()
    def attention_maps(self, idx: Tensor, *, attention_mask: Tensor | None = None) -> Tensor:
        """Attention weights of every head of every block: ``(L, B, H, T, T)`` (chapter 11).

        Runs the model once (in eval mode) with the manual attention path.
        """
        self._check_forward(idx, None, attention_mask, None)
        was_training = self.training
        self.eval()
        try:
            _, weights = self._run(idx, attention_mask, None, 0, need_weights=True)
        finally:
            self.train(was_training)
        return torch.stack(weights)  # type: ignore[arg-type]  # (L, B, H, T, T)

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
        mask = self._check_generate(idx, max_new_tokens, temperature, top_k, use_cache,
                                    attention_mask, generator)

        def step(tokens: Tensor, mask: Tensor, caches: list[KVCache] | None) -> Tensor:
            past = 0 if caches is None else caches[0].length
            x, _ = self._run(tokens, mask, caches, past)  # (B, T_in, D)
            return self.lm_head(self.norm(x))  # (B, T_in, V)

        def pick(logits: Tensor) -> Tensor:
            return pick_next(logits, temperature, top_k, generator)  # (B, 1)

        was_training = self.training
        self.eval()
        try:
            return decode(step, idx, mask, max_new_tokens, pick,
                          n_layers=len(self.blocks) if use_cache else None,
                          context=self.config.block_size)
        finally:
            self.train(was_training)

    def _check_generate(self, idx: object, max_new_tokens: object, temperature: object,
                        top_k: object, use_cache: object, attention_mask: object,
                        generator: object) -> Tensor:
        """Check ``generate``'s arguments; return the mask of real tokens ``(B, T)``."""
        idx = check_token_ids(idx, "idx", self.config.vocab_size)
        check_nonnegative_int(max_new_tokens, "max_new_tokens")
        check_nonnegative_real(temperature, "temperature")
        if top_k is not None:
            if check_positive_int(top_k, "top_k") > self.config.vocab_size:
                raise ValueError(f"top_k must be at most vocab_size={self.config.vocab_size}, "
                                 f"got {top_k}")
        check_bool(use_cache, "use_cache")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        if attention_mask is None:
            return torch.ones_like(idx, dtype=torch.bool)
        mask = check_token_mask(attention_mask, "attention_mask", idx.shape, rows_nonempty=True)
        return check_left_padding(mask.to(idx.device), "attention_mask")
