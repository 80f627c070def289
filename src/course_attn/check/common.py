"""What several check tables share: seeded inputs and the properties a failure is told about.

A property names what is wrong with a failing output without guessing how it came about:
weights whose rows do not sum to 1, weight on a key the mask blocks, a gradient that does
not arrive, a result that is not a boolean mask (Chapters 1-11).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .report import section
from .runner import Inputs, Property

__all__ = [
    "F64",
    "gen",
    "item",
    "no_gradient",
    "not_normalised",
    "randn",
    "shared_projections",
    "weight_where_blocked",
]

F64 = torch.float64


def gen(seed: int) -> torch.Generator:
    """A CPU generator with ``seed``: random inputs that are the same on every machine."""
    return torch.Generator().manual_seed(seed)


def randn(generator: torch.Generator, *shape: int, scale: float = 1.0) -> Tensor:
    """Seeded float64 normal numbers."""
    return scale * torch.randn(*shape, generator=generator, dtype=F64)


def item(value: object, index: int) -> object:
    """Entry ``index`` of a returned tuple, or the value itself when it is not one."""
    if isinstance(value, tuple | list):
        return value[index]
    return value


def _rows_off(weights: object) -> bool:
    return isinstance(weights, Tensor) and weights.is_floating_point() and not bool(
        torch.allclose(weights.detach().double().sum(-1), torch.ones((), dtype=F64),
                       atol=1e-6))


def not_normalised(index: int | None, hint: str) -> Property:
    """Weights (the output, or its entry ``index``) whose rows do not all sum to 1."""
    def fails(got: object, expected: object, inputs: Inputs) -> bool:
        weights = got if index is None else item(got, index)
        return _rows_off(weights) and not _rows_off(
            expected if index is None else item(expected, index))
    return Property(fails, hint)


def weight_where_blocked(mask_at: int, weights_at: int, number: str) -> Property:
    """Weights (entry ``weights_at`` of the output) on a key the mask (argument
    ``mask_at``, ``True`` = may attend) blocks."""
    def fails(got: object, expected: object, inputs: Inputs) -> bool:
        weights, mask = item(got, weights_at), inputs[0][mask_at]
        return isinstance(weights, Tensor) and bool(
            (weights.detach().abs() * ~mask.broadcast_to(weights.shape)).amax() > 1e-12)
    return Property(fails, f"your weights give a key the mask blocks (False) some weight: "
                           f"a blocked score must become -inf before the softmax, so that "
                           f"its weight is exactly 0 ({section(number)})")


def no_gradient(index: int, name: str, number: str) -> Property:
    """The gradient of argument ``name`` (entry ``index`` of a gradient case) all zero where
    the reference's is not: something on its path was detached."""
    def fails(got: object, expected: object, inputs: Inputs) -> bool:
        mine, ref = item(got, index), item(expected, index)
        return isinstance(mine, Tensor) and isinstance(ref, Tensor) and \
            not bool(mine.any()) and bool(ref.any())
    return Property(fails, f"no gradient reaches {name}: something on its path leaves "
                           f"autograd (.detach(), .item(), .data, .numpy(), torch.tensor(...) "
                           f"of computed values, a no_grad block); keep every step a torch "
                           f"operation on the tensors ({section(number)})")


def shared_projections(number: str) -> Property:
    """A layer's projections that are one module under several names (its structure)."""
    def fails(got: object, expected: object, inputs: Inputs) -> bool:
        return isinstance(got, tuple) and any("the same module as" in str(s) for s in got)
    return Property(fails, f"each projection is a layer of its own, with its own weights: "
                           f"self.q_proj = self.k_proj = self.v_proj = nn.Linear(...) makes one "
                           f"layer under three names; build one nn.Linear per projection "
                           f"({section(number)})")


def gradient_properties(names: tuple[str, ...], number: str) -> tuple[Property, ...]:
    """One :func:`no_gradient` property per differentiated argument."""
    return tuple(no_gradient(i, name, number) for i, name in enumerate(names))


Predicate = Callable[[object, object, Inputs], bool]
