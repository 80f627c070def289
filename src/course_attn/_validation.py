"""Argument checks shared by the public API.

Every public function validates its inputs here, at the boundary, so that a
learner sees one clear message naming the argument, what was expected and
what came, instead of a NaN or a shape error from deep inside torch: a
``TypeError`` for a wrong type, a ``ValueError`` for a wrong value.

**NaN and inf: one policy.** Checks on *shapes, dtypes and devices* are free
and run everywhere. Checks on *values* cost a pass over the data and, on a GPU,
a host-device synchronisation (under ``torch.compile``, a graph break), so:

* The Chapter 1-2 teaching functions that take a learner's raw numbers,
  ``softmax``, ``attention_pool`` and ``simple_self_attention``, check their
  values and refuse NaN or inf with a ``ValueError`` that names the argument
  (and say so when the input is finite but the *scores* overflowed). These
  checks run only where :func:`values_checkable` allows (CPU, eager).
* ``attention()`` / ``scaled_dot_product_attention`` and every ``nn.Module``
  forward (``SelfAttention``, ``MultiHeadAttention``, ``FeedForward``,
  ``TransformerBlock``, ``MiniGPT``, the encoder-decoder) never scan values:
  they sit inside a model, once per layer and step. A NaN or inf there
  propagates by IEEE rules: a non-finite query spoils its own output row; a
  non-finite key or value spoils every row that attends to it, and can spoil
  rows that mask it out too (``0 * NaN = NaN`` in ``weights @ values``, and
  PyTorch's fused kernels make no promise there). One case is contained on
  purpose: keys and values that *no* query may attend to (padding) are zeroed
  before use, so garbage in padded slots never reaches a real token. Token
  ids, which index tables, are range-checked where values are checkable (an
  out-of-range id is not a NaN, it is a crash).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from numbers import Real
from typing import Literal, overload

import torch
from torch import Tensor, nn

__all__ = [
    "check_bool",
    "check_bool_mask",
    "check_nonnegative_real",
    "check_sequence",
    "check_token_id_tensor",
    "check_token_ids",
    "check_token_mask",
    "trust_children",
    "trusting",
    "check_attention_args",
    "check_device",
    "check_device_exists",
    "check_doc_ids",
    "check_kv_heads",
    "check_qkv",
    "explain_out_of_memory",
    "check_head_split",
    "check_head_sizes_at_most",
    "check_impl_head_dim",
    "check_power_of_two_block",
    "check_left_padding",
    "check_nonnegative_int",
    "check_on_device",
    "moved_to",
    "check_choice",
    "check_cpu_generator",
    "check_split",
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


def check_on_device(tensor: Tensor, name: str, device: torch.device, owner: str) -> Tensor:
    """``tensor`` must be on ``device``, where ``owner`` (``"the layer"``, ``"query"``) is.

    The doors of the layers and models (Chapters 6-11) ask this of every tensor they take:
    inputs, masks, biases, positions, caches. Otherwise the first operation that mixes
    two devices fails deep inside torch ("Tensor on device cpu is not on the expected
    device meta"), and a mask copied over at every call of a model would cost a transfer
    each step (on a GPU, a host-device sync). The message names both devices and the fix.
    """
    if tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device} but {owner} is on {device}; move one "
                         f"of them, e.g. {name}.to({str(device)!r})")
    return tensor


def moved_to(tensor: Tensor, name: str, device: torch.device, owner: str) -> Tensor:
    """``tensor`` on ``device`` (where ``owner`` is): copied there when it is elsewhere.

    The functions of the chapters (``attention``, ``alibi_attention``, ``apply_rope``,
    ``combine_masks``, ...) take a mask, bias or positions made on the CPU for inputs on
    a GPU, as a convenience for hand-made tensors. A tensor on ``meta`` holds no values
    to copy ("Cannot copy out of meta tensor"): a ``ValueError`` that names both devices.
    """
    if tensor.device != device and tensor.device.type == "meta":
        raise ValueError(f"{name} is on meta (shapes only, no values to copy) but {owner} is on "
                         f"{device}; make {name} on {device}, e.g. with device={str(device)!r}")
    return tensor.to(device)


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


def check_nonnegative_real(value: object, name: str) -> float:
    """Check that ``value`` is a finite real number >= 0; return it as float."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a finite number >= 0, got {_describe(value)}")
    if not math.isfinite(float(value)) or float(value) < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return float(value)


def check_nonnegative_int(value: object, name: str, *, upper: int | None = None) -> int:
    """Check that ``value`` is an int >= 0 (and <= ``upper`` if given; bools refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= 0, got {_describe(value)}")
    if value < 0 or (upper is not None and value > upper):
        bound = f"in [0, {upper}]" if upper is not None else ">= 0"
        raise ValueError(f"{name} must be an int {bound}, got {value}")
    return value


def check_bool(value: object, name: str) -> bool:
    """Check that ``value`` is exactly ``True`` or ``False`` (not ``"no"``, ``0`` or ``None``).

    A truthy string such as ``"no"`` would otherwise silently mean ``True``.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False), got {_describe(value)}")
    return value


@overload
def check_device(value: object, name: str = ..., *, allow_none: Literal[False],
                 exists: bool = ...) -> torch.device: ...
@overload
def check_device(value: object, name: str = ..., *, allow_none: bool = ...,
                 exists: bool = ...) -> torch.device | None: ...
def check_device(value: object, name: str = "device", *, allow_none: bool = True,
                 exists: bool = False) -> torch.device | None:
    """Check a device argument: a ``torch.device``, a string such as ``"cuda:0"``, or ``None``.

    Returns the parsed ``torch.device`` (or ``None``, where ``allow_none``). With
    ``exists`` (functions that make tensors there) a CUDA or MPS device must exist on
    this machine: torch would otherwise fail inside with an ``AssertionError`` or an
    allocator message. ``"meta"``, which holds shapes without values, is accepted.
    """
    if value is None and not allow_none:
        raise TypeError(f"{name} must be a torch.device or a string such as 'cpu' or "
                        "'cuda:0', got None")
    if value is None:
        return None
    if isinstance(value, torch.device):
        device = value
    elif isinstance(value, str):
        try:
            device = torch.device(value)
        except RuntimeError:
            raise ValueError(f"{name} must name a torch device such as 'cpu', 'cuda', 'cuda:0' "
                             f"or 'mps', got {value!r}") from None
    else:
        raise TypeError(f"{name} must be a torch.device, a string such as 'cpu' or 'cuda:0', "
                        f"or None, got {_describe(value)}")
    return check_device_exists(device, name) if exists else device


def check_device_exists(device: torch.device, name: str = "device") -> torch.device:
    """Refuse a CUDA or MPS device this machine does not have (an index too, for CUDA)."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}={str(device)!r} but no CUDA device is available")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"{name}={str(device)!r} asks for CUDA device index {device.index}, "
                             f"but this machine has {count} CUDA device"
                             f"{'' if count == 1 else 's'} (indices 0 to {count - 1})")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{name}={str(device)!r} but no Apple MPS device is available")
    return device


@contextmanager
def explain_out_of_memory(what: str, n_bytes: int) -> Iterator[None]:
    """Turn an allocator failure while making ``what`` into a ``ValueError`` that says so.

    ``what`` names the call and its sizes, ``n_bytes`` the memory it asked for. Torch's own
    message ("DefaultCPUAllocator: can't allocate memory", "CUDA out of memory") does not
    say which argument was too large.
    """
    try:
        yield
    except (MemoryError, RuntimeError) as error:  # torch.OutOfMemoryError is a RuntimeError
        text = str(error).lower()
        if not isinstance(error, MemoryError) and "memory" not in text and "alloc" not in text:
            raise
        raise ValueError(f"{what} needs {n_bytes:.3g} bytes, more than this machine can "
                         f"allocate ({type(error).__name__})") from None


def check_choice(value: object, name: str, choices: Iterable[str]) -> str:
    """Check that ``value`` is one of the strings ``choices``; return it."""
    options = tuple(choices)
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {options}, got {_describe(value)}")
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return value


def check_bool_mask(value: object, name: str, target_shape: Sequence[int]) -> Tensor:
    """Check a boolean mask (``True`` = may attend) that broadcasts to ``target_shape``."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a boolean torch.Tensor, got {_describe(value)}")
    if value.dtype != torch.bool:
        raise TypeError(
            f"{name} must have dtype torch.bool (True = may attend), got {value.dtype}; "
            "convert additive float masks or inverted masks first (see course_attn.core.masks)"
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


def check_left_padding(mask: Tensor, name: str) -> Tensor:
    """Check that a ``(B, T)`` boolean mask (``True`` on real tokens) is left padding.

    Every row must be ``False ... False True ... True`` with at least one
    ``True``: generation appends on the right, so a pad after a real token
    would sit between the prompt and its continuation. Reads values, so it
    runs only where :func:`values_checkable` allows.
    """
    if values_checkable(mask):
        if not mask.any(dim=1).all():
            raise ValueError(f"{name} has a row without any real token (all False)")
        if (mask[:, 1:].long() < mask[:, :-1].long()).any():
            raise ValueError(f"{name} must describe left padding (False... then True... in "
                             "every row): generation appends on the right")
    return mask


def values_checkable(tensor: Tensor) -> bool:
    """Whether a check may read ``tensor``'s values (token ids in range, say).

    Only on the CPU, in eager mode. On a GPU each read is a host-device
    synchronisation that stalls the pipeline at every forward; under
    ``torch.compile`` it is a graph break; on the ``meta`` device there are no
    values. There the checks that need values are skipped: an out-of-range id
    then fails inside the embedding (on CUDA, a device-side assert). Run the
    same input on the CPU to get the clear message.
    """
    # is_cpu, not device.type == "cpu": no device object and no string made, at every call
    return tensor.is_cpu and not torch.compiler.is_compiling()


def check_sequence(value: object, name: str, *, width: int, batch: int | None = None,
                   dtype: torch.dtype | None = None) -> Tensor:
    """Check a batch of vectors ``(B, T, width)`` with ``T >= 1``, as a layer takes it.

    ``batch`` asks for that ``B``; ``dtype`` for the layer's weight dtype (a
    mismatch would fail deep inside ``nn.Linear`` with "mat1 and mat2 must have
    the same dtype"), except under autocast, which casts by itself.
    """
    x = check_tensor(value, name, ndim=3)
    if x.shape[1] == 0:
        raise ValueError(f"{name} must hold at least one position (B, T, D) with T >= 1, "
                         f"got shape {tuple(x.shape)}")
    if x.shape[-1] != width:
        raise ValueError(f"{name} must have width d_model={width}, got shape {tuple(x.shape)}")
    if batch is not None and x.shape[0] != batch:
        raise ValueError(f"{name} must have batch size B={batch}, got shape {tuple(x.shape)}")
    if dtype is not None and x.dtype != dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(f"{name} has dtype {x.dtype} but the layer's weights are {dtype}; "
                        "convert one with .to(dtype)")
    return x


def check_token_ids(value: object, name: str, vocab_size: int, *,
                    shape: Sequence[int] | None = None, ignore_index: int | None = None
                    ) -> Tensor:
    """Check token ids: a ``torch.long`` tensor ``(B, T)``, ``B, T >= 1``, ids in ``[0, N_vocab)``.

    ``shape`` asks for exactly that shape (targets match their inputs);
    ``ignore_index`` is one more allowed value (``-1``: left out of a loss). The
    range is checked only where :func:`values_checkable` allows.
    """
    value = check_token_id_tensor(value, name, shape=shape)
    if not values_checkable(value):
        return value
    allowed = "" if ignore_index is None else f" or {ignore_index} (ignored)"
    if ignore_index in (None, -1):  # one reduction for both ends, and a read of each
        low, high = (int(end) for end in torch.aminmax(value))
        if not (low >= (0 if ignore_index is None else -1) and high < vocab_size):
            raise ValueError(f"{name} must hold token ids in [0, vocab_size={vocab_size})"
                             f"{allowed}, got values in [{low}, {high}]")
        return value
    bad = (value < 0) | (value >= vocab_size)
    bad &= value != ignore_index
    if bad.any():
        raise ValueError(f"{name} must hold token ids in [0, vocab_size={vocab_size})"
                         f"{allowed}, got values in [{int(value.min())}, "
                         f"{int(value.max())}]")
    return value


def check_token_id_tensor(value: object, name: str, *,
                          shape: Sequence[int] | None = None) -> Tensor:
    """What :func:`check_token_ids` checks without reading a value: a ``torch.long`` tensor
    ``(B, T)`` with ``B, T >= 1`` (exactly ``shape`` if given)."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.long tensor (B, T) of token ids, got "
                        f"{_describe(value)}")
    if value.dtype != torch.long:
        raise TypeError(f"{name} must have dtype torch.long (token ids), got {value.dtype}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(value.shape)}")
    if value.dim() != 2 or value.shape[0] == 0 or value.shape[1] == 0:
        raise ValueError(f"{name} must have shape (B, T) with B >= 1 and T >= 1, "
                         f"got {tuple(value.shape)}")
    return value


def check_token_mask(value: object, name: str, shape: Sequence[int], *,
                     rows_nonempty: bool = False) -> Tensor:
    """Check a mask of real tokens: ``torch.bool`` of exactly ``shape`` ``(B, T)``.

    ``True`` marks a real token, ``False`` padding (the meaning of Hugging Face's
    ``attention_mask``; PyTorch's ``key_padding_mask`` is the opposite).
    ``rows_nonempty`` also refuses a row without any real token, where values
    are checkable.
    """
    if not isinstance(value, Tensor) or value.dtype != torch.bool:
        got = f"dtype {value.dtype}" if isinstance(value, Tensor) else _describe(value)
        raise TypeError(f"{name} must be a torch.bool tensor (B, T), True on real tokens, "
                        f"got {got}")
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape (B, T)={tuple(shape)}, "
                         f"got {tuple(value.shape)}")
    if rows_nonempty and values_checkable(value) and not value.any(dim=1).all():
        raise ValueError(f"{name} has a row without any real token (all False)")
    return value


def check_doc_ids(doc_ids: object, name: str = "doc_ids") -> Tensor:
    """Check document ids ``(T,)`` or ``(B, T)``: integers, never decreasing along a row
    (a document is one run of tokens), read only where values are cheap (Chapter 11)."""
    doc_ids = check_tensor(doc_ids, name, floating=False)
    if doc_ids.is_floating_point() or doc_ids.is_complex() or doc_ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer document ids (e.g. torch.long), got dtype "
                        f"{doc_ids.dtype}")
    if doc_ids.dim() not in (1, 2) or doc_ids.shape[-1] == 0:
        raise ValueError(f"{name} must have shape (T,) or (B, T) with T >= 1, got "
                         f"{tuple(doc_ids.shape)}")
    if values_checkable(doc_ids) and (doc_ids[..., 1:] < doc_ids[..., :-1]).any():
        raise ValueError(f"{name} must never decrease along a row (each document is one run "
                         f"of tokens; number them in order), got {doc_ids.tolist()}")
    return doc_ids


def check_head_split(d_model: object, n_heads: object) -> int:
    """Check that ``d_model`` splits into ``n_heads`` equal heads; return ``head_dim``."""
    d_model = check_positive_int(d_model, "d_model")
    n_heads = check_positive_int(n_heads, "n_heads")
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads} "
                         "(each head gets d_model / n_heads dimensions)")
    return d_model // n_heads


def check_kv_heads(n_heads: object, n_kv_heads: object) -> tuple[int, int]:
    """Check that ``n_kv_heads`` divides ``n_heads`` (GQA, Chapter 10); return both."""
    n_heads = check_positive_int(n_heads, "n_heads")
    n_kv_heads = check_positive_int(n_kv_heads, "n_kv_heads")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads} (each key/value "
                         f"head serves a whole group of query heads)")
    return n_heads, n_kv_heads


def check_qkv(q: object, k: object, v: object) -> tuple[Tensor, Tensor, Tensor]:
    """Check queries ``(..., T_q, d_k)``, keys ``(..., T_k, d_k)``, values ``(..., T_k, d_v)``.

    One dtype and one device for the three, ``d_k >= 1``, batch dimensions that broadcast.
    """
    q = check_tensor(q, "q", min_ndim=2)
    k = check_tensor(k, "k", min_ndim=2)
    v = check_tensor(v, "v", min_ndim=2)
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, "
                         f"{v.device}; move them with .to(device)")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share their last dimension d_k (queries are compared "
                         f"with keys), got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if q.shape[-1] == 0:
        raise ValueError(f"q and k must have a head size d_k >= 1 (the scores are scaled by "
                         f"1/sqrt(d_k)), got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of positions T_k (one value per "
                         f"key), got k {tuple(k.shape)} and v {tuple(v.shape)}")
    try:
        torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(f"the batch dimensions of q {tuple(q.shape)}, k {tuple(k.shape)} and "
                         f"v {tuple(v.shape)} do not broadcast") from None
    return q, k, v


def check_attention_args(q: object, k: object, v: object, mask: object = None, *,
                         is_causal: object = False, scale: object = None,
                         dropout_p: object = 0.0, bias: object = None,
                         ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, float, Tensor | None]:
    """The door of every attention function: check its arguments once, and prepare them.

    Returns ``(q, k, v, mask, scale, bias)``: the mask on ``q``'s device with at least its
    ``(T_q, T_k)`` axes, the scale as a float (``1 / sqrt(d_k)`` for ``None``), the bias on
    ``q``'s device in ``q``'s dtype (:func:`moved_to`). The attention paths behind the door
    check nothing.
    """
    q, k, v = check_qkv(q, k, v)
    scores_shape = (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])
    if mask is not None:
        mask = moved_to(check_bool_mask(mask, "mask", scores_shape), "mask", q.device, "q")
        if mask.dim() < 2:  # (T_k,) or a scalar: give it its (T_q, T_k) axes, as 1s
            mask = mask.reshape((1,) * (2 - mask.dim()) + tuple(mask.shape))
    check_bool(is_causal, "is_causal")
    check_probability(dropout_p, "dropout_p")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else check_positive_real(scale, "scale")
    if bias is not None:
        if not isinstance(bias, Tensor) or not bias.is_floating_point():
            got = bias.dtype if isinstance(bias, Tensor) else type(bias).__name__
            raise TypeError(f"bias must be a floating-point torch.Tensor added to the scores "
                            f"(a boolean mask goes in mask=), got {got}")
        try:
            fits = torch.broadcast_shapes(bias.shape, scores_shape) == scores_shape
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"bias of shape {tuple(bias.shape)} does not broadcast to the "
                             f"attention scores' shape {tuple(scores_shape)}")
        bias = moved_to(bias, "bias", q.device, "q").to(q.dtype)  # no-ops where it is so
    return q, k, v, mask, scale, bias


def check_head_sizes_at_most(q: Tensor, v: Tensor, limit: int, path: str) -> None:
    """A path that holds a row of a head in registers takes ``d_k, d_v <= limit``."""
    for tensor, name, size in ((q, "q", "d_k"), (v, "v", "d_v")):
        if tensor.shape[-1] > limit:
            raise ValueError(f"{path} takes head sizes up to {limit}: {name} has {size} = "
                             f"{tensor.shape[-1]} (shape {tuple(tensor.shape)}); use "
                             f"impl='sdpa' or impl='manual' for wider heads")


def check_impl_head_dim(impl: str, head_dim: int, limit: int) -> None:
    """A layer or config built for ``impl="triton"`` needs ``head_dim <= limit``."""
    if impl == "triton" and head_dim > limit:
        raise ValueError(f"impl='triton' takes head sizes up to {limit}, got head_dim = "
                         f"d_model / n_heads = {head_dim}; use more heads, or impl='sdpa'")


def check_power_of_two_block(value: object, name: str) -> int:
    """A kernel's tile size: a power of two >= 16 (``tl.dot`` needs 16 rows at least)."""
    value = check_positive_int(value, name)
    if value < 16 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= 16, got {value}")
    return value


def trust_children(parent: nn.Module) -> None:
    """Shut the doors of the layers inside ``parent``: it checks its own inputs, once.

    Every layer of the course has ``check_inputs = True``: built by a reader, it
    checks the arguments of each call. Built into a block or a model, it is handed
    arguments its parent has already checked and prepared, so re-checking them in
    every layer of every step would cost time and say nothing new.
    """
    for module in parent.modules():
        if module is not parent and hasattr(module, "check_inputs"):
            setattr(module, "check_inputs", False)  # noqa: B010  (nn.Module's typing)


@contextmanager
def trusting(module: nn.Module) -> Iterator[None]:
    """Shut ``module``'s own door for a while: its caller has checked the arguments once.

    ``MiniGPT.generate`` checks its arguments, then runs the model's forward at every
    step inside ``with trusting(model):``, so nothing is checked inside the loop.
    """
    was = getattr(module, "check_inputs")  # noqa: B009  (nn.Module's typing)
    setattr(module, "check_inputs", False)  # noqa: B010
    try:
        yield
    finally:
        setattr(module, "check_inputs", was)  # noqa: B010


def check_cpu_generator(generator: object) -> None:
    """``None`` or a CPU ``torch.Generator`` (batch positions are drawn on the host)."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got "
                        f"{type(generator).__name__}")
    if generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU torch.Generator (batches are drawn on the "
                         f"host, then copied), got one on {generator.device}")


def check_split(split: object) -> str:
    """``"train"`` or ``"val"``: which part of a data set a batch is drawn from."""
    if not isinstance(split, str):
        raise TypeError(f"split must be 'train' or 'val', got {type(split).__name__} {split!r}")
    return check_choice(split, "split", ("train", "val"))
