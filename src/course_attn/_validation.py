"""Argument checks shared by the public API.

Every public function validates its inputs here, at the boundary, so that a
learner sees one clear message naming the argument, what was expected and
what came, instead of a NaN or a shape error from deep inside torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from numbers import Real

import torch
from torch import Tensor

__all__ = [
    "check_bool_mask",
    "check_choice",
    "check_positive_int",
    "check_positive_real",
    "check_probability",
    "check_tensor",
    "values_checkable",
]


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r}"


def check_tensor(
    value: object,
    name: str,
    *,
    ndim: int | None = None,
    min_ndim: int | None = None,
    floating: bool = True,
) -> Tensor:
    """Check that ``value`` is a tensor of the expected rank and kind; return it.

    ``floating=True`` asks for a floating-point dtype (attention needs real
    numbers); ``ndim`` asks for an exact rank, ``min_ndim`` for a least one.
    """
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {_describe(value)}")
    if floating and not value.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor (e.g. torch.float32), got dtype {value.dtype}"
        )
    if ndim is not None and value.dim() != ndim:
        raise ValueError(
            f"{name} must have {ndim} dimensions, got shape {tuple(value.shape)} "
            f"({value.dim()} dimensions)"
        )
    if min_ndim is not None and value.dim() < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimensions, got shape {tuple(value.shape)}"
        )
    return value


def check_positive_int(value: object, name: str) -> int:
    """Check that ``value`` is an int >= 1 (bools are refused); return it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {_describe(value)}")
    if value < 1:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return value


def check_positive_real(value: object, name: str) -> float:
    """Check that ``value`` is a finite real number > 0; return it as float."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a positive finite number, got {_describe(value)}")
    if not math.isfinite(float(value)) or float(value) <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value}")
    return float(value)


def check_probability(value: object, name: str) -> float:
    """Check that ``value`` is a real number in [0, 1); return it as float."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number in [0, 1), got {_describe(value)}")
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return float(value)


def check_choice(value: object, name: str, choices: Iterable[str]) -> str:
    """Check that ``value`` is one of ``choices``; return it."""
    options = tuple(choices)
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return value  # type: ignore[return-value]


def check_bool_mask(value: object, name: str, target_shape: Sequence[int]) -> Tensor:
    """Check a boolean mask (``True`` = may attend) that broadcasts to ``target_shape``."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a boolean torch.Tensor, got {_describe(value)}")
    if value.dtype != torch.bool:
        raise TypeError(
            f"{name} must have dtype torch.bool (True = may attend), got {value.dtype}; "
            "convert additive float masks or inverted masks first (see course_attn.masks)"
        )
    try:
        shape = torch.broadcast_shapes(value.shape, torch.Size(target_shape))
    except RuntimeError:
        shape = None
    if shape != torch.Size(target_shape):
        raise ValueError(
            f"{name} of shape {tuple(value.shape)} does not broadcast to the attention "
            f"scores' shape {tuple(target_shape)}"
        )
    return value


def values_checkable(tensor: Tensor) -> bool:
    """Whether a check may read ``tensor``'s values (token ids in range, say).

    Only on the CPU, in eager mode. On a GPU each read is a host-device
    synchronisation that stalls the pipeline at every forward; under
    ``torch.compile`` it is a graph break; on the ``meta`` device there are no
    values. There the checks that need values are skipped: an out-of-range id
    then fails inside the embedding (on CUDA, a device-side assert). Run the
    same input on the CPU to get the clear message.
    """
    return tensor.device.type == "cpu" and not torch.compiler.is_compiling()
