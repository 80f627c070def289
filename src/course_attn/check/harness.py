"""How a case runs code: plainly, for its gradients, or as a layer built from a class (Ch. 1-11).

A harness is called as ``harness(fn, args, kwargs)`` and returns what the case compares; the
runner calls the same harness on the reference, on the learner's code and on each known
mistake, so that all three are held to the same thing. A layer is checked as the learner
uses it: built, given the case's weights (in float64), switched to ``eval()`` (dropout off)
and called.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .runner import Harness, call

__all__ = ["first", "gradients", "layer_forward", "layer_structure", "pseudo_random"]


def _first(result: object) -> object:
    if isinstance(result, tuple | list) and result and isinstance(result[0], Tensor):
        return result[0]
    return result


def first(inner: Harness = call) -> Harness:
    """``inner``'s result, or its first entry when it is a tuple of tensors: where an
    exercise lets ``out`` or ``(out, weights)`` be returned."""
    def harness(fn: Any, positional: tuple[Any, ...], keyword: dict[str, Any]) -> object:
        return _first(inner(fn, positional, keyword))
    return harness


def pseudo_random(like: Tensor) -> Tensor:
    """Fixed numbers in [-1, 1] shaped like ``like``: weights for a gradient's output.

    Not drawn from torch's generator: ``make nbval-perturbed`` nudges every random draw,
    and the reference and the learner's code must be weighted by the very same numbers.
    """
    n = torch.arange(like.numel(), dtype=torch.float64, device=like.device)
    return torch.sin(0.7 * n + 0.3).reshape(like.shape).to(like.dtype)


def gradients(leaves: Sequence[int], inner: Harness = call,
              output: Callable[[object], object] = _first) -> Harness:
    """The gradients of ``sum(output * w)`` with respect to the arguments at ``leaves``,
    ``w`` fixed numbers (:func:`pseudo_random`); zeros where no gradient arrives."""
    def harness(fn: Any, positional: tuple[Any, ...], keyword: dict[str, Any]) -> object:
        given = list(positional)
        for i in leaves:
            given[i] = given[i].detach().clone().requires_grad_(True)
        wanted = [given[i] for i in leaves]
        with torch.enable_grad():
            result = output(inner(fn, tuple(given), keyword))
            if not isinstance(result, Tensor) or not result.requires_grad:
                return tuple(torch.zeros_like(t) for t in wanted)  # nothing flows back
            total = (result * pseudo_random(result).to(result.dtype)).sum()
            grads = torch.autograd.grad(total, wanted, allow_unused=True)
        return tuple(torch.zeros_like(t) if g is None else g.detach()
                     for g, t in zip(grads, wanted, strict=True))
    return harness


def _linear(layer: object, name: str, before: Sequence[str]) -> str:
    linear = getattr(layer, name, None)
    if linear is None:
        return f"{name}: missing"
    same = [other for other in before if getattr(layer, other, None) is linear]
    if same:
        return f"{name}: the same module as {same[0]}"
    if not isinstance(linear, nn.Linear):
        return f"{name}: a {type(linear).__name__}"
    bias = linear.bias is not None
    return f"{name}: nn.Linear({linear.in_features}, {linear.out_features}, bias={bias})"


def layer_structure(names: Sequence[str]) -> Harness:
    """What the class builds: each projection named in ``names``, as ``nn.Linear(...)``.

    Called with ``(init_args, ...)``: the class is built with ``init_args``.
    """
    def harness(cls: Any, positional: tuple[Any, ...], keyword: dict[str, Any]) -> object:
        layer = cls(*positional[0])
        if not isinstance(layer, nn.Module):
            return (f"an nn.Module, got a {type(layer).__name__}",)
        return tuple(_linear(layer, name, names[:i]) for i, name in enumerate(names))
    return harness


def _build(cls: Any, init: tuple[Any, ...], weights: dict[str, tuple[Tensor, Tensor | None]]
           ) -> nn.Module:
    layer = cls(*init)
    if not isinstance(layer, nn.Module):
        raise TypeError(f"the class must build an nn.Module, got a {type(layer).__name__}")
    layer = layer.double()  # before the weights: float64 weights stay float64
    with torch.no_grad():
        for name, (weight, bias) in weights.items():
            linear = getattr(layer, name)
            linear.weight.copy_(weight)
            if bias is not None:
                linear.bias.copy_(bias)
    layer.eval()  # as the learner uses it for values: dropout off
    torch.manual_seed(0)  # whatever the forward draws, the same numbers at every call
    return layer


def layer_forward(*, output: Callable[[object], object] = _first) -> Harness:
    """The layer built from ``cls(*init)``, given ``weights`` and called on ``x``.

    Called with ``(init_args, weights, x)`` and the forward's keyword arguments;
    ``weights`` maps each projection's name to its ``(weight, bias or None)``.
    """
    def harness(cls: Any, positional: tuple[Any, ...], keyword: dict[str, Any]) -> object:
        init, weights, x = positional
        return output(_build(cls, init, weights)(x, **keyword))
    return harness


def seeded_linears(names: Sequence[str], d_in: int, d_out: int, seed: int, *,
                   bias: bool) -> dict[str, tuple[Tensor, Tensor | None]]:
    """Distinct seeded float64 weights ``(d_out, d_in)`` (and biases) for each projection,
    so that a mistake cannot hide in symmetry."""
    gen = torch.Generator().manual_seed(seed)
    found: dict[str, tuple[Tensor, Tensor | None]] = {}
    for name in names:
        weight = torch.randn(d_out, d_in, generator=gen, dtype=torch.float64) / math.sqrt(d_in)
        found[name] = (weight, 0.1 * torch.randn(d_out, generator=gen, dtype=torch.float64)
                       if bias else None)
    return found
