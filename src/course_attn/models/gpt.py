"""Chapter 11: MiniGPT, a decoder-only Transformer small enough to read in one sitting.

Token ids -> token embedding (+ positions) -> ``n_layers`` pre-norm causal
Transformer blocks (chapter 7) -> final LayerNorm -> a linear head that scores
every vocabulary entry. The layout follows nanoGPT's ``model.py``; the blocks
are the course's own ``TransformerBlock``, so the attention inside is the code of
chapters 4 to 8, with its manual/fused/tiled switch (``GPTConfig.impl``) and its KV
cache. The causal structure is built once, at construction; ``forward`` checks
its arguments at the door (``course_attn.models.checks``) and prepares the mask,
the positions and RoPE's rotation once for every block.

``GPTConfig`` switches on the modern variants of chapter 10, each off by default:
rotary, sinusoidal or ALiBi positions (``pos_encoding``), grouped-query attention
(``n_kv_heads``) and sliding-window attention (``window``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .._validation import (
    check_bool,
    check_choice,
    check_head_split,
    check_impl_head_dim,
    check_kv_heads,
    check_positive_int,
    check_positive_real,
    check_probability,
    check_token_ids,
    trust_children,
    trusting,
    values_checkable,
)
from ..core.attention import ATTENTION_IMPLS, AttentionFunction
from ..core.kv_cache import KVCache, new_caches
from ..core.layers import (
    ACTIVATIONS,
    NORMS,
    TransformerBlock,
    TransformerBlocks,
    make_norm,
    sinusoidal_table,
)
from ..core.masks import causal_mask, document_positions
from ..core.triton_attention import MAX_TRITON_HEAD_SIZE
from ..modern.alibi import alibi_bias, alibi_slopes
from ..modern.rope import rope_rotation
from ..modern.sliding_window import sliding_window_mask
from .checks import check_generate_call, check_gpt_call, check_packed_call, embed_token_ids
from .decoding import decode, pick_next

__all__ = ["POS_ENCODINGS", "GPTConfig", "MiniGPT", "next_token_loss"]

#: How ``MiniGPT`` tells positions apart (``GPTConfig.pos_encoding``): a learned
#: table added to the embeddings (GPT-2), chapter 7's fixed sinusoidal table
#: added the same way, rotary embeddings of the queries and keys (RoPE), or
#: ALiBi's per-head bias ``-slope * (i - j)`` added to the attention scores.
POS_ENCODINGS = ("learned", "sinusoidal", "rope", "alibi")


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a :class:`MiniGPT` (Chapter 11).

    ``vocab_size`` token ids, contexts of at most ``context_length`` tokens,
    ``n_layers`` blocks of ``n_heads`` heads over a width ``d_model``
    (``head_dim = d_model / n_heads``). ``tie_weights`` shares the token
    embedding with the output head (GPT-2 and nanoGPT do); ``impl`` picks the
    attention path (one of ``ATTENTION_IMPLS``). ``init_std``
    is the standard deviation of the initial weights: GPT-2's 0.02 suits
    widths of hundreds; a narrow model (width 64) learns some two-layer
    circuits far sooner from a larger start such as 0.1 (chapter 11).

    Modern variants (chapter 10), each off by default: ``pos_encoding`` is one of
    ``POS_ENCODINGS`` (``"rope"`` needs an even ``head_dim``; ``"alibi"`` adds no
    parameter, only a fixed bias per head); ``n_kv_heads`` key/value heads (``None``:
    ``n_heads``; it must divide ``n_heads``) make grouped-query attention, ``1``
    multi-query; ``window`` (``None``: the whole causal context) lets each token
    attend only to the last ``window`` positions, itself included. ``norm="rms"`` and
    ``activation="swiglu"`` make the blocks (and the final norm) those of a 2026 decoder
    (chapter 7): RMSNorm and a SwiGLU feed-forward network.
    """

    vocab_size: int
    context_length: int
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
    norm: str = "layer"
    activation: str = "gelu"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "n_layers"):
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
        check_impl_head_dim(self.impl, head_dim, MAX_TRITON_HEAD_SIZE)
        check_positive_real(self.init_std, "init_std")
        check_choice(self.norm, "norm", NORMS)
        check_choice(self.activation, "activation", ACTIVATIONS)


def next_token_loss(logits: Tensor, targets: Tensor, *, may_read: bool = False) -> Tensor:
    """Mean cross-entropy of ``logits (B, T, N_vocab)`` against ``targets (B, T)``, ``-1`` left out.

    Computed as (sum of the per-token losses) / max(number of counted targets, 1):
    exactly ``F.cross_entropy(..., ignore_index=-1)`` when a target counts, and
    ``0`` instead of 0/0 = NaN when none does, without reading a tensor value
    (Chapter 11). ``may_read``: the caller lets it read one value (the CPU, where a read
    is no host-device synchronisation; ``MiniGPT``'s door says when): then the plain mean,
    read once, and the formula above only when that read is NaN (no target counts, or NaN
    or infinite logits, which then give NaN again). The plain mean gives the same bits on
    the CPU without the four operators that count the targets, forward and backward.
    Where a read would synchronise or break a graph (``values_checkable``), it counts.
    """
    # Half-precision logits are upcast: log-softmax over N_vocab entries needs the range.
    flat = logits.reshape(-1, logits.shape[-1])  # (B, T, N_vocab) -> (B*T, N_vocab)
    if flat.dtype in (torch.float16, torch.bfloat16):
        flat = flat.float()
    flat_targets = targets.reshape(-1)  # (B*T,)
    if may_read and values_checkable(flat):
        loss = F.cross_entropy(flat, flat_targets, ignore_index=-1)
        if not math.isnan(loss.item()):  # NaN: no target counts (0/0), or NaN logits
            return loss
    loss_sum = F.cross_entropy(flat, flat_targets, ignore_index=-1, reduction="sum")
    return loss_sum / (flat_targets != -1).sum().clamp(min=1)


def _loss_checking_targets(logits: Tensor, targets: Tensor, *, may_read: bool) -> Tensor:
    """:func:`next_token_loss`, doing the door's range check of ``targets (B, T)`` where the
    door left it to the loss (``may_read``, see ``check_gpt_call``).

    On the CPU ``cross_entropy`` checks every target anyway and raises ``IndexError`` for
    one outside ``[0, N_vocab)`` that is not ``-1``; that becomes the door's ``ValueError``,
    as for ``idx`` (``embed_token_ids``). So a training step reads no target value, where
    the door read both ends (a reduction and two reads, issue 42). The price: such an error
    comes after the forward, whose forward hooks have run and whose dropout has drawn
    (nothing else changes: the door checks the targets itself where a cache would grow).
    """
    try:
        return next_token_loss(logits, targets, may_read=may_read)
    except IndexError as error:
        lookup = error
    check_token_ids(targets, "targets", logits.shape[-1], ignore_index=-1)  # not chained
    raise lookup


class MiniGPT(nn.Module):
    """A GPT-style language model built from the course's blocks (Chapter 11).

    ``forward(idx (B, T), targets=None, doc_ids=None, *, attention_mask=None, caches=None)``
    gives ``(logits (B, T, N_vocab), loss or None)``; ``targets``: the next ids (``-1`` is left
    out). ``doc_ids (B, T)``: the document of each token of packed rows (chapter 11):
    attention stays inside a document and positions restart at each one, so each document
    gives what it gives alone (a batch ``(x, y, doc_ids)`` unpacks into the call).
    ``attention_mask (B, T_cache + T)``: ``True`` on real tokens of left-padded rows
    (positions count from the first real one). ``caches``: one :class:`KVCache` per block.
    ``attention_fn`` replaces every block's attention path (chapters 10 and 11).
    """

    check_inputs = True  # the door of forward; generate checks once and shuts it
    pos: nn.Embedding | None  # the learned position table (pos_encoding="learned")
    pos_table: Tensor | None  # the fixed sinusoidal table (pos_encoding="sinusoidal")
    alibi: Tensor | None  # ALiBi's bias (H, T_max, T_max) (pos_encoding="alibi")
    allowed: Tensor  # (T_max, T_max): the keys each query may see (causal, and the window)

    def __init__(self, config: GPTConfig, *,
                 attention_fn: AttentionFunction | None = None) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        self.config = c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = (nn.Embedding(c.context_length, c.d_model) if c.pos_encoding == "learned"
                    else None)
        # Fixed tables are buffers, built once here, not saved (persistent=False); they
        # follow the model to its device. ``allowed`` is nanoGPT's causal "bias" buffer.
        self.register_buffer("pos_table", sinusoidal_table(c.context_length, c.d_model)
                             if c.pos_encoding == "sinusoidal" else None, persistent=False)
        self.register_buffer("alibi", alibi_bias(c.context_length, c.context_length,
                                                 alibi_slopes(c.n_heads))
                             if c.pos_encoding == "alibi" else None, persistent=False)
        self.register_buffer("allowed", causal_mask(c.context_length) if c.window is None
                             else sliding_window_mask(c.context_length, window=c.window),
                             persistent=False)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = TransformerBlocks(
            TransformerBlock(c.d_model, c.n_heads, dropout=c.dropout, norm_first=True,
                             bias=c.bias, impl=c.impl, n_kv_heads=c.n_kv_heads,
                             attention_fn=attention_fn, norm=c.norm, activation=c.activation,
                             fused_qkv=True, ff_dropout=0.0)  # GPT-2's layer, nanoGPT's c_attn
            for _ in range(c.n_layers))
        self.norm = make_norm(c.norm, c.d_model, bias=c.bias)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_weights:  # one matrix reads tokens in and scores them out (GPT-2, nanoGPT)
            self.lm_head.weight = self.embed.weight
        self.apply(self._init_weights)
        # GPT-2: the projections that write into the residual stream start smaller, by
        # 1/sqrt(2 * n_layers), so the stream's variance does not grow with depth.
        for block in self.blocks:
            for layer in (block.self_attn.out_proj, block.ff.linear2):
                nn.init.normal_(layer.weight, std=c.init_std / math.sqrt(2 * c.n_layers))
        trust_children(self)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: Tensor, targets: Tensor | None = None,
                doc_ids: Tensor | None = None, *,
                attention_mask: Tensor | None = None, caches: list[KVCache] | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """``(logits (B, T, N_vocab), loss or None)`` for token ids ``idx (B, T)`` (see the class).

        ``loss`` is :func:`next_token_loss`. ``need_weights``: every block's attention runs
        the manual path and returns its weights, for a forward hook on ``block.self_attn``.
        """
        may_read = False  # the loss may read its value and checks the targets (CPU)
        if self.check_inputs:
            attention_mask, may_read = check_gpt_call(self, idx, targets, attention_mask,
                                                      caches, need_weights)
            if doc_ids is not None:
                doc_ids = check_packed_call(idx, doc_ids, attention_mask, caches)
        c, time = self.config, idx.shape[1]
        past = 0 if caches is None else caches[0].length  # cached positions before idx
        positions: Tensor | None = None  # None: past .. past + T - 1 (see _add_positions)
        windowed = c.window is not None and c.window < past + time
        mask = None  # plain causal self-attention: is_causal=True, FlashAttention-eligible
        if doc_ids is not None:  # packed documents: attention and positions stay in each one
            same = doc_ids[:, None, :, None] == doc_ids[:, None, None, :]  # (B, 1, T, T)
            mask = self.allowed[:time, :time] & same  # (B, 1, T, T)
            positions = document_positions(doc_ids)  # (B, T)
        elif attention_mask is not None or past or windowed:
            mask = self.allowed[past:past + time, :past + time]  # (T, T_cache + T)
            if attention_mask is not None:  # no pad key; positions count real tokens only
                mask = mask & attention_mask[:, None, None, :]  # (B, 1, T, T_cache + T)
                positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, past:]  # (B, T)
        x = embed_token_ids(self.embed, idx) if self.check_inputs else self.embed(idx)  # (B, T, D)
        x = self.drop(self._add_positions(x, positions, past))  # (B, T, D)
        rotate = None  # RoPE: one rotation at these positions, made once for every block
        if c.pos_encoding == "rope":
            if positions is None:
                positions = torch.arange(past, past + time, device=idx.device)  # (T,)
            rotate = rope_rotation(positions, c.d_model // c.n_heads, like=self.embed.weight)
        bias = None if self.alibi is None else self.alibi[:, past:past + time, :past + time]
        # Only the arguments this call has: each keyword costs every block's call host time
        # (issue 42), and a plain causal call needs just is_causal.
        given: dict[str, Any] = {name: value for name, value in (
            ("mask", mask), ("rotate", rotate), ("bias", bias)) if value is not None}
        if need_weights:
            given["need_weights"] = True
        for i, block in enumerate(self.blocks):
            if caches is not None:
                given["cache"] = caches[i]
            x = block(x, is_causal=mask is None, **given)  # (B, T, D)
        logits = self.lm_head(self.norm(x))  # (B, T, D) @ (D, N_vocab) -> (B, T, N_vocab)
        if targets is None:
            return logits, None
        if attention_mask is not None:  # padding predicts nothing
            targets = targets.masked_fill(~attention_mask[:, past:], -1)
        return logits, _loss_checking_targets(logits, targets, may_read=may_read)

    def _add_positions(self, x: Tensor, positions: Tensor | None, past: int) -> Tensor:
        """``x (B, T, D)`` plus the learned or fixed table's rows at ``positions ((B,) T)``.

        ``None`` stands for past .. past + T - 1: the rows are then taken as a view
        (``narrow``, which fails past the table's end, as a lookup would), with no ``arange``,
        and the backward runs ``slice_backward`` in place of ``embedding_dense_backward``,
        with the same bits (issue 42). RoPE and ALiBi add nothing here.
        """
        time = x.shape[1]
        if self.pos is not None:
            x = x + (self.pos.weight.narrow(0, past, time) if positions is None
                     else self.pos(positions))  # (B, T, D) + ((B,) T, D)
        if self.pos_table is not None:
            x = x + (self.pos_table.narrow(0, past, time) if positions is None
                     else self.pos_table[positions]).to(x.dtype)  # (B, T, D) + ((B,) T, D)
        return x

    def num_parameters(self, *, non_embedding: bool = False) -> int:
        """Parameters (a tied matrix counts once), optionally without ``pos`` (Chapter 11)."""
        check_bool(non_embedding, "non_embedding")
        table = self.pos.weight.numel() if non_embedding and self.pos is not None else 0
        return sum(p.numel() for p in self.parameters()) - table

    def flops_per_token(self) -> int:
        """Training FLOPs per token (Chapter 11), PaLM's estimate as in nanoGPT: ``6 N`` for
        ``N`` weights (2 forward, 4 backward; no position table), ``12 L T D`` for attention."""
        c = self.config
        attention = 12 * c.n_layers * c.context_length * c.d_model
        return 6 * self.num_parameters(non_embedding=True) + attention

    def new_caches(self) -> list[KVCache]:
        """One empty :class:`KVCache` per block, for incremental decoding (Chapter 8)."""
        return new_caches(len(self.blocks))

    @torch.no_grad()
    def generate(self, idx: Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None,
                 use_cache: bool = True, attention_mask: Tensor | None = None,
                 generator: torch.Generator | None = None) -> Tensor:
        """Continue each prompt of ``idx (B, T)`` by ``max_new_tokens``: ``(B, T + new)``.

        ``temperature`` divides the logits (``0``: greedy); ``top_k`` and ``top_p``
        (nucleus) narrow the draw; ``generator`` makes it reproducible. ``use_cache``
        feeds only the newest token to a :class:`KVCache`; past ``context_length`` the
        context is cropped and recomputed (nanoGPT). ``attention_mask (B, T)``: the real
        tokens of left-padded prompts. Checked once; every step runs :meth:`forward`
        with its door shut, so hooks on the blocks fire at every step (Chapter 11).
        """
        attention_mask = check_generate_call(self, idx, max_new_tokens, temperature, top_k,
                                             top_p, use_cache, attention_mask, generator)

        def step(tokens: Tensor, mask: Tensor | None, caches: list[KVCache] | None) -> Tensor:
            return self(tokens, attention_mask=mask, caches=caches)[0]  # (B, T_in, N_vocab)

        def pick(logits: Tensor) -> Tensor:
            return pick_next(logits, temperature, top_k, generator, top_p)  # (B, 1)

        was_training = self.training
        try:
            with trusting(self.eval()):
                return decode(step, idx, attention_mask, max_new_tokens, pick,
                              n_layers=len(self.blocks) if use_cache else None,
                              context_length=self.config.context_length)
        finally:
            self.train(was_training)
