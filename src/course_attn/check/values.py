"""How a check compares a learner's value with the expected one, and shows both (Ch. 1-11).

The tolerance policy, stated in every passing report: masks, integers and rearranged
values (a head split) are compared exactly; a float64 case of plain linear algebra (a
projection, the scores) at :data:`TIGHT`, the round-off of another order of the same
float64 operations; a case whose usual code may take a step in float32 (a softmax or a
log-softmax in float32, as the package does for half precision; RoPE's angles, as Llama's
code does; the sinusoidal table) at :data:`FLOAT32`, far below any mistake's effect. A
failure names the largest difference and where it occurs, and shows ``expected`` and
``got`` with as many digits as it takes for them to differ where they differ (three at
least).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, TypedDict

import torch
from torch import Tensor

__all__ = [
    "EXACT",
    "FLOAT32",
    "TIGHT",
    "Difference",
    "Tolerance",
    "describe_difference",
    "describe_tolerance",
    "matches",
    "shape_of",
    "show",
]


class Tolerance(TypedDict):
    """How close a learner's number must come to the expected one: ``|got - expected| <=
    atol + rtol * |expected|``."""

    atol: float
    rtol: float


#: float64 throughout: another order of the same operations differs by round-off only.
TIGHT: Tolerance = {"atol": 1e-9, "rtol": 1e-7}
#: A step in float32 (a softmax, RoPE's angles in the usual Llama code, a float32 table):
#: float32 rounding (6e-8 relative) of angles up to 15 radians or of exponentials,
#: carried to the result, stays below it; every known mistake differs by far more.
FLOAT32: Tolerance = {"atol": 1e-5, "rtol": 1e-5}
#: Masks, integers, shapes: nothing but equality.
EXACT: Tolerance = {"atol": 0.0, "rtol": 0.0}

#: A tolerance for a whole value, or one per entry of a tuple.
Tol = Tolerance | tuple[Tolerance, ...]


def describe_tolerance(tol: Tolerance) -> str:
    """``"1e-09 + 1e-07 |expected|"``: a tolerance as a report states it."""
    if tol["atol"] == 0 and tol["rtol"] == 0:
        return "exactly"
    return f"{tol['atol']:.0e} + {tol['rtol']:.0e} |expected|"


# ---------------------------------------------------------------------- showing values


def _number(value: float | int | bool, digits: int = 3) -> str:
    if isinstance(value, bool | int):
        return str(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"  # never "-0"
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))  # 1000, not 1e+03
    return f"{value:.{digits}g}"


def _nested(values: Any, digits: int) -> str:
    if isinstance(values, list):
        return "[" + ", ".join(_nested(v, digits) for v in values) + "]"
    return _number(values, digits)


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def show(value: object, *, limit: int = 12, digits: int = 3) -> str:
    """A value as a learner reads it: small tensors in full, large ones by shape."""
    if isinstance(value, Tensor):
        if value.numel() <= limit and value.dim() <= 3:
            return _nested(value.detach().cpu().tolist(), digits)
        return shape_of(value)
    if isinstance(value, tuple | list):
        inner = ", ".join(show(v, limit=limit, digits=digits) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    if isinstance(value, float | int | bool):
        return _number(value, digits)
    if isinstance(value, str):
        return value
    return "None" if value is None else _a(type(value).__name__)


def _a(word: str) -> str:
    """``"an int"``, ``"a float"``: the article a word takes (u as in uint8 takes "a")."""
    return f"an {word}" if word[:1] in "aeioAEIO" else f"a {word}"


def shape_of(value: object) -> str:
    """``"a float64 tensor of shape (2, 3)"``, ``"a tuple of 2"``, ``"a float"``."""
    if isinstance(value, Tensor):
        return f"{_a(_dtype(value.dtype))} tensor of shape {tuple(value.shape)}"
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    return "None" if value is None else _a(type(value).__name__)


def _digits(expected: float, got: float) -> int:
    """The fewest significant digits (three at least) at which two floats print apart."""
    for digits in range(3, 18):
        if _number(expected, digits) != _number(got, digits):
            return digits
    return 3


# ------------------------------------------------------------------------ differences


@dataclasses.dataclass(frozen=True)
class Difference:
    """Why ``got`` is not ``expected``, in words and in kind.

    ``kind`` is the property that fails: ``"type"`` (not a tensor, a tuple of another
    length), ``"shape"``, ``"dtype"``, ``"nan"`` (NaN or inf where a number is expected) or
    ``"value"``. ``largest`` says the largest difference, where, and the tolerance (values
    only). ``expected_part`` and ``got_part`` are the entries that differ (of a tuple, the
    first that does), for the hints that read them.
    """

    expected: str
    got: str
    kind: str
    largest: str = ""
    expected_part: object = None
    got_part: object = None


def _tensor_difference(expected: Tensor, got: Tensor, tol: Tolerance,
                       equal_nan: bool) -> Difference | None:
    if tuple(got.shape) != tuple(expected.shape):
        return Difference(shape_of(expected), shape_of(got), "shape", "", expected, got)
    if got.dtype != expected.dtype:
        return Difference(shape_of(expected), shape_of(got), "dtype", "", expected, got)
    e, g = expected.detach().cpu(), got.detach().cpu()
    if not e.is_floating_point() and not e.is_complex():
        bad = e != g
        gap = bad.to(torch.float64)
    else:
        e64, g64 = e.to(torch.float64), g.to(torch.float64)
        gap = (g64 - e64).abs()
        near = torch.isfinite(e64) & (gap <= tol["atol"] + tol["rtol"] * e64.abs())
        same = (e64 == g64) | near  # inf matches inf only
        if equal_nan:
            same |= torch.isnan(e64) & torch.isnan(g64)
        bad = ~same
        gap = torch.where(torch.isnan(gap), torch.full_like(gap, math.inf), gap)
    if not bool(bad.any()):
        return None
    flat = int(torch.where(bad.reshape(-1), gap.reshape(-1), -1.0).argmax())
    return _value_difference(e, g, flat, tol)


def _index(flat: int, shape: Sequence[int]) -> list[int]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return list(reversed(index))


def _value_difference(e: Tensor, g: Tensor, flat: int, tol: Tolerance) -> Difference:
    """The difference at ``flat`` (the largest), with its row around it."""
    index = _index(flat, e.shape) if e.dim() else []
    e_val, g_val = e.reshape(-1)[flat].item(), g.reshape(-1)[flat].item()
    floating = e.is_floating_point()
    kind = "nan" if floating and not math.isfinite(g_val) and math.isfinite(e_val) else "value"
    digits = _digits(e_val, g_val) if floating else 3
    if e.numel() <= 12 and e.dim() <= 3:
        shown = (show(e, digits=digits), show(g, digits=digits))
    elif index and e[tuple(index[:-1])].numel() <= 8:  # the whole last-axis row
        row = tuple(index[:-1])
        at = f"row {list(row)}: " if row else ""
        shown = (at + show(e[row], digits=digits), at + show(g[row], digits=digits))
    else:
        shown = (f"at {index}: {_number(e_val, digits)}", f"at {index}: {_number(g_val, digits)}")
    largest = ""
    if floating:
        size = abs(g_val - e_val)
        size_text = _number(size, 2) if math.isfinite(size) else _number(g_val)
        largest = (f"|got - expected| = {size_text} at {index}, allowed "
                   f"{describe_tolerance(tol)}")
    return Difference(shown[0], shown[1], kind, largest, e, g)


def _tuple_difference(expected: tuple[Any, ...], got: object, tol: Tol,
                      equal_nan: bool) -> Difference | None:
    if not isinstance(got, tuple | list) or len(got) != len(expected):
        return Difference(f"a tuple of {len(expected)}: " + ", ".join(map(shape_of, expected)),
                          shape_of(got), "type", "", expected, got)
    tols = tol if isinstance(tol, tuple) else (tol,) * len(expected)
    for i, (e, g, t) in enumerate(zip(expected, got, tols, strict=True)):
        part = describe_difference(e, g, tol=t, equal_nan=equal_nan)
        if part is not None:
            return dataclasses.replace(part, expected=f"item {i}: {part.expected}",
                                       got=f"item {i}: {part.got}")
    return None


def _number_difference(expected: float | int, got: object, tol: Tolerance,
                       equal_nan: bool) -> Difference | None:
    if isinstance(got, Tensor) and got.numel() == 1:
        got = got.item()
    if not isinstance(got, float | int) or isinstance(got, bool):
        return Difference(_number(expected), shape_of(got), "type", "", expected, got)
    if equal_nan and math.isnan(got) and math.isnan(expected):
        return None
    if got == expected or (math.isfinite(expected) and
                           abs(got - expected) <= tol["atol"] + tol["rtol"] * abs(expected)):
        return None
    digits = _digits(float(expected), float(got))
    kind = "nan" if not math.isfinite(got) else "value"
    largest = (f"|got - expected| = {_number(abs(got - expected), 2)}, allowed "
               f"{describe_tolerance(tol)}") if math.isfinite(got) else ""
    return Difference(_number(expected, digits), _number(got, digits), kind, largest,
                      expected, got)


def describe_difference(expected: object, got: object, *, tol: Tol = TIGHT,
                        equal_nan: bool = False) -> Difference | None:
    """``None`` when ``got`` matches ``expected``, else what differs (a :class:`Difference`).

    Tensors must agree in shape and dtype and be close entry by entry (``inf`` where ``inf``
    is expected counts as equal; NaN only with ``equal_nan``); tuples (a list will do) entry
    by entry, ``tol`` being one tolerance or one per entry; Python numbers (a one-element
    tensor will do) against the tolerance; strings exactly.
    """
    if isinstance(expected, tuple):
        return _tuple_difference(expected, got, tol, equal_nan)
    single = tol[0] if isinstance(tol, tuple) else tol
    if isinstance(expected, Tensor):
        if isinstance(got, tuple | list) and got and isinstance(got[0], Tensor):
            return Difference(shape_of(expected), f"{shape_of(got)} (return the tensor "
                              "itself)", "type", "", expected, got)
        if not isinstance(got, Tensor):
            return Difference(shape_of(expected), shape_of(got), "type", "", expected, got)
        return _tensor_difference(expected, got, single, equal_nan)
    if isinstance(expected, float | int) and not isinstance(expected, bool):
        return _number_difference(expected, got, single, equal_nan)
    if isinstance(expected, str):
        return None if got == expected else Difference(expected, show(got), "value", "",
                                                       expected, got)
    raise TypeError(f"expected must be a tensor, a tuple, a number or a string, got "
                    f"{shape_of(expected)}")


def matches(got: object, wrong: object, *, tol: Tol = TIGHT) -> bool:
    """Whether ``got`` equals ``wrong``, the output of a known mistake (NaN equals NaN)."""
    try:
        return describe_difference(wrong, got, tol=tol, equal_nan=True) is None
    except (TypeError, RuntimeError, ValueError, IndexError):
        return False
