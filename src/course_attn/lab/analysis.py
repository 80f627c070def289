"""Chapters 8 and 11: the attention weights of a model, and scores that say what a head does.

:func:`attention_maps` (a decoder-only model) and :func:`cross_attention_maps` (an
encoder-decoder's cross-attention) read every layer's weights with forward hooks.
Given a head's weights, :func:`offset_attention_score` measures how much a
query looks a fixed number of positions back (a previous-token head, or the
copying pattern on :class:`~course_attn.data.tasks.CopyTask`), and
:func:`induction_attention_score` how much it looks at the token after an
earlier copy of its own token (an induction head). :class:`HeadScoreTracker` records both
scores for every head at each evaluation of a training run, so that a chapter can plot when
a head forms against the loss.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..models.encoder_decoder import EncoderDecoder

__all__ = ["HeadScoreTracker", "attention_maps", "cross_attention_maps", "cross_document_attention",
           "induction_attention_score", "offset_attention_score"]


@torch.no_grad()
def attention_maps(model: nn.Module, idx: Tensor, *,
                   attention_mask: Tensor | None = None,
                   doc_ids: Tensor | None = None) -> Tensor:
    """Attention weights of every head of every block of a model, ``(L, B, H, T, T)`` (Ch. 11).

    Read as from any PyTorch model: a forward hook on each block's self-attention
    (``model.blocks[i].self_attn``) catches the weights it returns, during one
    forward of ``idx (B, T)`` in eval mode with ``need_weights=True``; the model's
    door checks ``idx``, ``attention_mask`` and ``doc_ids`` (packed documents).
    """
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList) or not all(hasattr(b, "self_attn") for b in blocks):
        raise TypeError(f"model must have blocks with a self_attn (a MiniGPT), got "
                        f"{type(model).__name__}")
    maps: list[Tensor] = []
    layers = [block.get_submodule("self_attn") for block in blocks]
    hooks = [layer.register_forward_hook(lambda _, args, out: maps.append(out[1]))
             for layer in layers]
    was_training = model.training
    try:
        extra = {} if doc_ids is None else {"doc_ids": doc_ids}  # a MiniGPT's packed rows
        model.eval()(idx, attention_mask=attention_mask, need_weights=True, **extra)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    return torch.stack(maps)  # (L, B, H, T, T)


@torch.no_grad()
def cross_attention_maps(model: EncoderDecoder, src: Tensor, tgt: Tensor, *,
                         src_attention_mask: Tensor | None = None,
                         tgt_attention_mask: Tensor | None = None,
                         memory_attention_mask: Tensor | None = None) -> Tensor:
    """Cross-attention weights of every decoder layer, ``(L, B, H, T_t, T_s)`` (Chapter 8).

    A forward hook on each decoder block's ``cross_attn`` catches the weights it
    returns during one forward (eval mode, ``need_weights=True``) of ``src (B, T_s)``
    and the decoder input ``tgt (B, T_t)``. Hooking the attention layer itself makes
    this right whatever the block feeds it: a pre-norm block hands it ``norm3(x)``, a
    post-norm block ``norm1``'s output (``norm3`` then normalises what comes *out*).
    ``memory_attention_mask (B, T_s)`` is the mask the cross-attention uses, by default
    ``src_attention_mask`` (the encoder's); section 8.6 passes another one to see what
    a wrong mask does while the encoder keeps the right one. The encoder's and the
    decoder's doors check the arguments.
    """
    if not isinstance(model, EncoderDecoder):
        raise TypeError(f"model must be an EncoderDecoder, got {type(model).__name__}")
    if memory_attention_mask is None:
        memory_attention_mask = src_attention_mask
    maps: list[Tensor] = []
    layers = [block.get_submodule("cross_attn") for block in model.decoder.blocks]
    hooks = [layer.register_forward_hook(lambda _, args, out: maps.append(out[1]))
             for layer in layers]
    was_training = model.training
    try:
        memory = model.eval().encoder(src, src_attention_mask)  # (B, T_s, D)
        model.decoder(tgt, memory, tgt_attention_mask=tgt_attention_mask,
                      memory_attention_mask=memory_attention_mask, need_weights=True)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    return torch.stack(maps)  # (L, B, H, T_t, T_s)


def _check_weights(attn_weights: object, min_ndim: int, shape: str) -> None:
    if not isinstance(attn_weights, Tensor):
        raise TypeError(f"attn_weights must be a tensor {shape}, got "
                        f"{type(attn_weights).__name__}")
    if not attn_weights.is_floating_point():
        raise TypeError(f"attn_weights must be a floating-point tensor (attention weights), "
                        f"got dtype {attn_weights.dtype}")
    if attn_weights.dim() < min_ndim:
        raise ValueError(f"attn_weights must be a tensor {shape}, got shape "
                         f"{tuple(attn_weights.shape)}")


def offset_attention_score(
    attn_weights: Tensor, offset: int, *, first_query: int | None = None
) -> Tensor:
    """Mean attention weight a query puts on the key ``offset`` positions back (Chapter 11).

    ``attn_weights (..., T, T)`` -> ``(...)``: the mean over queries
    ``t >= first_query`` (default ``offset``) of ``attn_weights[..., t, t - offset]``.
    ``offset=1`` scores a *previous-token head*. On the copy task, the token
    after the earlier copy of query ``t``'s token sits ``n - 1`` positions back
    (:attr:`CopyTask.copy_offset`), so that offset scores the head that does
    the copying (the pattern of an *induction head*). A score near 1 means the
    head looks almost only there.
    """
    _check_weights(attn_weights, 2, "(..., T, T)")
    time = attn_weights.shape[-1]
    if attn_weights.shape[-2] != time:
        raise ValueError(f"attn_weights must be square (..., T, T), got "
                         f"{tuple(attn_weights.shape)}")
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset must be an int in [0, T={time}), got {offset!r}")
    if not 0 <= offset < time:
        raise ValueError(f"offset must be an int in [0, T={time}), got {offset!r}")
    first = offset if first_query is None else first_query
    if isinstance(first, bool) or not isinstance(first, int):
        raise TypeError(f"first_query must be an int or None, got {first_query!r}")
    if not offset <= first < time:
        raise ValueError(f"first_query must be an int in [offset={offset}, T={time}), "
                         f"got {first_query!r}")
    queries = torch.arange(first, time, device=attn_weights.device)  # (Q,)
    picked = attn_weights[..., queries, queries - offset]  # (..., Q)
    return picked.mean(dim=-1)


def cross_document_attention(attn_weights: Tensor, doc_ids: Tensor) -> Tensor:
    """The share of attention a query puts on keys of other documents (Chapter 11).

    ``attn_weights (..., B, H, T, T)`` (``attention_maps``: ``(L, B, H, T, T)``) of packed
    rows whose tokens belong to the documents ``doc_ids (B, T)`` -> ``(..., H)``: the mean,
    over the queries that have an earlier document in their row, of the weight on its keys.
    With the document mask it is 0 by construction; without it, it is what leaks.
    """
    _check_weights(attn_weights, 4, "(..., B, H, T, T)")
    batch, time = attn_weights.shape[-4], attn_weights.shape[-1]
    if not isinstance(doc_ids, Tensor) or doc_ids.is_floating_point():
        raise TypeError(f"doc_ids must be an integer tensor (B, T), got "
                        f"{type(doc_ids).__name__}")
    if tuple(doc_ids.shape) != (batch, time):
        raise ValueError(f"doc_ids must have shape (B, T) = ({batch}, {time}), got "
                         f"{tuple(doc_ids.shape)}")
    doc_ids = doc_ids.to(attn_weights.device)
    other = doc_ids[:, None, :, None] != doc_ids[:, None, None, :]  # (B, 1, T, T)
    leaked = (attn_weights * other).sum(-1)  # (..., B, H, T): weight on other documents
    has_other = (doc_ids != doc_ids[:, :1]).unsqueeze(1)  # (B, 1, T): not the first one
    counted = has_other.expand(leaked.shape[-3:])  # (B, H, T)
    total = (leaked * counted).sum(dim=(-3, -1))  # (..., H)
    return total / counted[:, 0].sum().clamp(min=1)  # (..., H)


def _query_mask(queries: object, batch: int, time: int, device: torch.device) -> Tensor:
    """``queries`` (None, positions ``(Q,)`` or a boolean ``(T,)`` / ``(B, T)``) -> ``(B, T)``."""
    if queries is None:
        return torch.ones(batch, time, dtype=torch.bool, device=device)
    if not isinstance(queries, Tensor):
        raise TypeError(f"queries must be None, a tensor of query positions (Q,) or a boolean "
                        f"mask (T,) or (B, T), got {type(queries).__name__}")
    if queries.dtype == torch.bool:
        if tuple(queries.shape) not in ((time,), (batch, time)):
            raise ValueError(f"queries as a boolean mask must have shape (T={time},) or "
                             f"(B={batch}, T={time}), got {tuple(queries.shape)}")
        return queries.to(device).expand(batch, time)
    if queries.is_floating_point() or queries.is_complex() or queries.dim() != 1:
        raise TypeError(f"queries must be a 1-D tensor of integer positions (Q,) or a boolean "
                        f"mask, got dtype {queries.dtype} and shape {tuple(queries.shape)}")
    if queries.numel() and not (0 <= int(queries.min()) and int(queries.max()) < time):
        raise ValueError(f"queries must hold positions in [0, T={time}), got "
                         f"{queries.min().item()} .. {queries.max().item()}")
    mask = torch.zeros(time, dtype=torch.bool, device=device)
    mask[queries.to(device)] = True
    return mask.expand(batch, time)


def induction_attention_score(
    attn_weights: Tensor, tokens: Tensor, *, queries: Tensor | None = None
) -> Tensor:
    """Mean weight a query puts on the tokens that followed earlier copies of its own token.

    ``attn_weights (..., B, H, T, T)`` (or ``(B, T, T)``) and ``tokens (B, T)``
    -> ``(..., H)`` (or a scalar). For every scored query ``t`` whose token
    occurred before, at some ``j`` with ``j + 1 < t``, the weight on the keys
    ``j + 1`` is summed; the score is the mean over those queries and the
    batch. Queries with no earlier copy are left out.

    ``queries`` limits the scoring to the queries where "the token after the
    earlier copy" is the right thing to look at: positions ``(Q,)`` such as
    :attr:`RecallTask.key_positions`, or a boolean mask ``(T,)`` or ``(B, T)``
    (``True`` = scored). Default: every query. A head that always attends to
    the token after the earlier copy scores 1, but only if that is the right
    rule for every scored query: in :class:`RecallTask` a repeated *value*
    (two keys that drew the same value) has an earlier copy too, yet the next
    token is the next key, not what followed that copy. Scored over all
    queries, a perfect recall head scores only about 0.5 there; pass
    ``queries=task.key_positions`` (Chapter 11).
    """
    if not isinstance(tokens, Tensor):
        raise TypeError(f"tokens must be a tensor (B, T) of token ids, got "
                        f"{type(tokens).__name__}")
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must hold integer token ids, got dtype {tokens.dtype}")
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be a tensor (B, T), got shape {tuple(tokens.shape)}")
    batch, time = tokens.shape
    _check_weights(attn_weights, 3, "(..., B, H, T, T) or (B, T, T)")
    squeeze = attn_weights.dim() == 3
    weights = attn_weights.unsqueeze(-3) if squeeze else attn_weights  # (..., B, H, T, T)
    if tuple(weights.shape[-2:]) != (time, time) or weights.shape[-4] != batch:
        raise ValueError(f"attn_weights must end in (B={batch}, H, T={time}, T={time}) to "
                         f"match tokens, got {tuple(attn_weights.shape)}")
    scored = _query_mask(queries, batch, time, tokens.device)  # (B, T)
    same = tokens[:, :, None] == tokens[:, None, :]  # (B, T, T): query t, earlier j
    earlier = torch.ones(time, time, dtype=torch.bool, device=tokens.device).tril(-2)
    target = torch.zeros(batch, time, time, device=weights.device)  # (B, T, T): keys j + 1
    target[:, :, 1:] = (same & earlier)[:, :, :-1].to(weights.device, torch.float32)
    has_copy = (target.sum(dim=-1) > 0) & scored.to(weights.device)  # (B, T)
    if not has_copy.any():
        raise ValueError("tokens has no scored query whose token occurred earlier: nothing "
                         "to score")
    picked = (weights.float() * target[:, None]).sum(dim=-1)  # (..., B, H, T)
    score = (picked * has_copy[:, None]).sum(dim=(-3, -1)) / has_copy.sum()  # (..., H)
    return score.squeeze(-1) if squeeze else score




def _check_positions(positions: object, name: str, time: int) -> Tensor | None:
    if positions is None:
        return None
    if not isinstance(positions, Tensor) or positions.dim() != 1 or positions.dtype in (
            torch.bool, torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"{name} must be None or a 1-D tensor of integer query positions "
                        f"(Q,), got {positions!r}")
    if positions.numel() == 0 or int(positions.min()) < 1 or int(positions.max()) >= time:
        raise ValueError(f"{name} must hold positions in [1, T={time}) (a query with a "
                         f"token before it), got {positions.tolist()}")
    return positions


class HeadScoreTracker:
    """Every head's previous-token and induction scores, recorded during training (Ch. 11).

    An ``on_eval`` callback for :func:`course_attn.train.train`: called as
    ``tracker(iteration, model, result)`` after every evaluation (call it once with
    ``iteration=0`` before training for the untrained model), it reads every head's
    attention weights on the fixed sequences ``tokens (B, T)`` with :func:`attention_maps`
    and records

    * ``previous_token[i]`` ``(L, H)``: the mean weight a query puts on the key just before
      it, over ``previous_queries`` (positions ``(Q,)``; default every query from 1, as
      :func:`offset_attention_score` with ``offset=1`` scores);
    * ``induction[i]`` ``(L, H)``: :func:`induction_attention_score` over
      ``induction_queries`` (default every query);

    with the iteration in ``iterations[i]``. It only reads the model (in eval mode, without
    gradients; :func:`attention_maps` puts the training mode back), so the run's losses are
    those of a run without it. :meth:`history` stacks what it recorded.
    """

    def __init__(self, tokens: Tensor, *, previous_queries: Tensor | None = None,
                 induction_queries: Tensor | None = None) -> None:
        if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.is_floating_point():
            raise TypeError(f"tokens must be a tensor (B, T) of token ids, got {tokens!r}")
        time = tokens.shape[1]
        self.tokens = tokens
        self.previous_queries = _check_positions(previous_queries, "previous_queries", time)
        self.induction_queries = induction_queries
        # fails now, not after the first evaluation, if no scored query has an earlier copy
        probe = torch.zeros(tokens.shape[0], 1, time, time)
        induction_attention_score(probe, tokens, queries=induction_queries)
        self.iterations: list[int] = []
        self.previous_token: list[Tensor] = []
        self.induction: list[Tensor] = []

    def __call__(self, iteration: int, model: nn.Module, result: object = None) -> None:
        """Score every head of ``model`` now and record it under ``iteration``."""
        if isinstance(iteration, bool) or not isinstance(iteration, int):
            raise TypeError(f"iteration must be an int >= 0, got {iteration!r}")
        if iteration < 0:
            raise ValueError(f"iteration must be an int >= 0, got {iteration}")
        device = next(model.parameters()).device
        maps = attention_maps(model, self.tokens.to(device)).float().cpu()  # (L, B, H, T, T)
        if self.previous_queries is None:
            previous = offset_attention_score(maps.mean(dim=1), 1)  # (L, H)
        else:
            q = self.previous_queries.cpu()
            previous = maps[..., q, q - 1].mean(dim=(1, 3))  # (L, B, H, Q) -> (L, H)
        self.iterations.append(iteration)
        self.previous_token.append(previous)
        self.induction.append(induction_attention_score(maps, self.tokens.cpu(),
                                                        queries=self.induction_queries))

    def history(self) -> tuple[list[int], Tensor, Tensor]:
        """``(iterations, previous_token (N, L, H), induction (N, L, H))`` for N records."""
        if not self.iterations:
            raise ValueError("the tracker has recorded nothing yet: pass it to "
                             "train(..., on_eval=tracker), or call tracker(0, model)")
        return (list(self.iterations), torch.stack(self.previous_token),
                torch.stack(self.induction))
