"""Chapter 10: masks as code. FlexAttention, the fifth attention path (``impl="flex"``).

Chapter 5 wrote each mask as a boolean tensor, chapter 10 ALiBi as a tensor added to the
scores, and chapter 9's kernel skipped the tiles a causal mask blocks. PyTorch's
FlexAttention (``torch.nn.attention.flex_attention``, PyTorch 2.5 and later) takes all
three as code: a ``mask_mod(b, h, q_idx, kv_idx)`` says whether query ``q_idx`` may attend
key ``kv_idx`` (``True`` = may attend, the course's convention), a ``score_mod(score, b, h,
q_idx, kv_idx)`` changes one score, and a ``BlockMask`` made from the mask_mod records
which tiles of 128 queries x 128 keys are empty (skipped), full (no mask_mod evaluated)
or partial. ``torch.compile`` turns the two functions into one fused kernel, on a GPU
(Triton) and on the CPU (C++).

Here:

* :func:`attention_flex`, the path behind ``attention(..., impl="flex")``: the course's
  arguments turned into mods (``is_causal`` as code, a boolean mask and a bias as look-ups
  into their tensors), a cached BlockMask, and the kernel;
* :func:`flex_attend`, the same kernel with mods written by hand (checked at its door);
* the building blocks :func:`causal_mask_mod`, :func:`tensor_mask_mod`,
  :func:`tensor_score_mod` and :func:`flex_kernel` (compiled where a compiler is found,
  else FlexAttention's uncompiled path, with one :class:`FlexFallbackWarning`).

What PyTorch 2.13's FlexAttention lacks, and what this path does instead:

* **no backward on the CPU** (compiled or not): on the CPU the backward recomputes the
  scores densely, as the manual path computes them, and differentiates them (``O(T^2)``
  memory in the backward only); on a GPU FlexAttention's own fused backward runs;
* **no dropout on the attention weights** (a score_mod changes a score before the
  softmax; dropout zeroes a weight after it): a call with ``dropout_p > 0`` is computed
  densely, with one warning;
* **no kernel for the ``meta`` device**: there the mods and the BlockMask are made as
  usual, and the kernel's output is only its shape (so the model tests on ``meta`` still
  find a tensor made on the wrong device);
* **no float64 in the compiled CPU kernel**: float64 (``gradcheck``) runs uncompiled there;
* **a new kernel for every new shape** (seconds to compile; the CPU kernel with symbolic
  lengths failed to build here, so shapes stay static): the path pads lengths and head
  sizes up to a power of two, at least 16, and masks the padding, so a KV cache's growing
  length compiles a kernel each time it doubles, not at every token; a mask tensor is
  given one layout, ``(B, 1 or H, T, T)``, whatever it broadcast over.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import shutil
import sys
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import (
    BlockMask,
    create_block_mask,
    create_mask,
    flex_attention,
)

from .._validation import check_positive_real, check_qkv, check_tensor

__all__ = [
    "FLEX_COMPILE",
    "FlexFallbackWarning",
    "MaskMod",
    "ScoreMod",
    "attention_flex",
    "causal_mask_mod",
    "flex_attend",
    "flex_compile_problem",
    "flex_kernel",
    "tensor_mask_mod",
    "tensor_score_mod",
]

#: ``mask_mod(b, h, q_idx, kv_idx) -> bool``: may query ``q_idx`` attend key ``kv_idx``?
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
#: ``score_mod(score, b, h, q_idx, kv_idx) -> score``: one score, changed.
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]

#: Compile FlexAttention where a compiler is found (``True``), or always run its uncompiled
#: path (``False``: the same results, scores materialised; the shared test matrix runs it so,
#: as compiling a kernel for each of its dozens of shapes would take minutes).
FLEX_COMPILE = True
#: The smallest padded length and head size: one shape, one kernel, for every tiny test.
MIN_FLEX_SIZE = 16
_BLOCK_MASK_CACHE_SIZE = 8
#: How many kernels (a shape with its mods) the compiled path keeps before torch.compile
#: gives up and runs FlexAttention uncompiled: dynamo's default, 8, is fewer than one
#: chapter's masks at a few lengths.
_RECOMPILE_LIMIT = 64


class FlexFallbackWarning(UserWarning):
    """FlexAttention ran without its compiled kernel (no compiler, or dropout; Chapter 10)."""


_WARNED: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _WARNED and not torch.compiler.is_compiling():  # a warning breaks a graph
        _WARNED.add(key)
        warnings.warn(message, FlexFallbackWarning, stacklevel=3)


# ----------------------------------------------------------------- the kernel, compiled
def _cpp_compiler() -> str:
    """The C++ compiler torch.compile's CPU backend looks for (``CXX``, else the platform's)."""
    default = {"darwin": "clang++", "win32": "cl"}.get(sys.platform, "g++")
    return os.environ.get("CXX") or default


def flex_compile_problem(device: torch.device | str, dtype: torch.dtype = torch.float32
                         ) -> str | None:
    """Why FlexAttention cannot be compiled for ``dtype`` tensors on ``device`` here, or
    ``None`` (Chapter 10)."""
    device = torch.device(device)
    if device.type == "meta":
        return None  # nothing runs on meta
    if device.type == "cpu":
        if dtype == torch.float64:  # PyTorch 2.13's CPU kernel refuses it while compiling
            return "its CPU kernel takes float32, float16 and bfloat16 tensors, not float64"
        compiler = _cpp_compiler()
        if shutil.which(compiler) is None:
            return (f"torch.compile builds the CPU kernel with a C++ compiler, and "
                    f"{compiler!r} was not found (install g++ or clang++, or set CXX)")
        return None
    if device.type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return "torch.compile builds the GPU kernel with Triton, which is not installed"
        return None
    return f"this course compiles FlexAttention for cpu and cuda tensors, not {device.type}"


_COMPILED: dict[str, Callable[..., Tensor]] = {}
#: Why compiling failed at run time, by (device type, dtype); dtype None: for every dtype.
_BROKEN: dict[tuple[str, torch.dtype | None], str] = {}


def _eager_flex(q: Tensor, k: Tensor, v: Tensor, *, score_mod: ScoreMod | None = None,
                block_mask: BlockMask | None = None, scale: float | None = None) -> Tensor:
    """FlexAttention's uncompiled path (scores materialised), without PyTorch's warning:
    :func:`flex_kernel` has said why it runs, once."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


def flex_kernel(device: torch.device | str, dtype: torch.dtype = torch.float32
                ) -> Callable[..., Tensor]:
    """``flex_attention`` compiled for ``dtype`` tensors on ``device``, or its uncompiled
    path (Chapter 10).

    Compiled when :data:`FLEX_COMPILE` is on and :func:`flex_compile_problem` finds nothing
    missing (nor did an earlier compilation fail); otherwise the uncompiled path, with one
    :class:`FlexFallbackWarning` per reason that says why (when :data:`FLEX_COMPILE` is
    on). Shapes are static (``dynamic=False``): each new one compiles a kernel.
    """
    device = torch.device(device)
    if not FLEX_COMPILE:
        return _eager_flex
    problem = (_BROKEN.get((device.type, None)) or _BROKEN.get((device.type, dtype))
               or flex_compile_problem(device, dtype))
    if problem is not None:
        _warn_once(f"compile-{device.type}-{problem}", f"impl='flex' runs FlexAttention "
                   f"uncompiled on {device.type}: {problem}. The results are the same; the "
                   "uncompiled path materialises the scores (slower, O(T^2) memory).")
        return _eager_flex
    if device.type not in _COMPILED:
        _COMPILED[device.type] = _kept(torch.compile(flex_attention, dynamic=False))
    return _COMPILED[device.type]


def _kept(compiled: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``compiled`` run with dynamo's recompile limit raised to :data:`_RECOMPILE_LIMIT`
    (each new mask_mod or shape is a recompilation of the one compiled function)."""
    @functools.wraps(compiled)  # keeps what torch.compile records (the original function)
    def kernel(*args: object, **kwargs: object) -> Tensor:
        with torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT):
            return compiled(*args, **kwargs)
    return kernel


@functools.cache
def _compile_errors() -> tuple[type[BaseException], ...]:
    """The exceptions of a compilation that failed (a compiler that crashed, say)."""
    from torch._dynamo.exc import BackendCompilerFailed

    inductor = importlib.import_module("torch._inductor.exc")
    return (BackendCompilerFailed, *(getattr(inductor, name) for name in
                                     ("InductorError", "InvalidCxxCompiler", "CppCompileError")
                                     if hasattr(inductor, name)))


def _run_kernel(q: Tensor, k: Tensor, v: Tensor, score_mod: ScoreMod | None,
                block_mask: BlockMask | None, scale: float) -> Tensor:
    """The kernel on ``(B, H, T, d)`` tensors; a failed compilation falls back, once said.

    Inside a model that ``torch.compile`` traces, FlexAttention itself: the model's compiler
    fuses it."""
    if torch.compiler.is_compiling():
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    kernel = flex_kernel(q.device, q.dtype)
    try:
        return kernel(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    except _compile_errors() as error:
        if kernel is _eager_flex:
            raise
        first_line = (str(error).strip().splitlines() or [""])[0][:200]
        # no compiler at all: every dtype; anything else: this dtype (float64, say)
        scope = None if type(error).__name__ == "InvalidCxxCompiler" else q.dtype
        _BROKEN[(q.device.type, scope)] = (f"compiling it failed ({type(error).__name__}: "
                                          f"{first_line})")
        return flex_kernel(q.device, q.dtype)(q, k, v, score_mod=score_mod,
                                              block_mask=block_mask, scale=scale)


# ----------------------------------------------------------------------- the mods
def causal_mask_mod(offset: int | Tensor = 0) -> MaskMod:
    """Chapter 5's causal mask as code: query ``i`` may attend key ``j <= i + offset`` (Ch. 10).

    ``offset = T_k - T_q`` aligns it bottom-right, as a KV cache needs (the queries are the
    last positions). A 0-d integer tensor ``offset`` is read by the kernel, so a new value
    does not compile a new kernel; an int is baked into it.
    """
    if isinstance(offset, Tensor):
        if offset.dim() != 0 or offset.is_floating_point() or offset.dtype == torch.bool:
            raise TypeError(f"offset must be an int or a 0-d integer tensor, got a "
                            f"{offset.dtype} tensor of shape {tuple(offset.shape)}")
    elif isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"offset must be an int or a 0-d integer tensor, got "
                        f"{type(offset).__name__} {offset!r}")

    def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return kv_idx <= q_idx + offset

    return causal


def _clamped(table: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
    """``table[b, h, q_idx, kv_idx]``, each index clamped to the table: an axis of size 1
    broadcasts, and a kernel's padded tile never reads past the end."""
    n_b, n_h, t_q, t_k = table.shape
    return table[b.clamp(max=n_b - 1), h.clamp(max=n_h - 1), q_idx.clamp(max=t_q - 1),
                 kv_idx.clamp(max=t_k - 1)]


def tensor_mask_mod(mask: Tensor) -> MaskMod:
    """A boolean mask ``(B or 1, H or 1, T_q, T_k)`` as a mask_mod: a look-up (Chapter 10).

    What ``attention(mask=...)`` becomes on the flex path; a mask written as code
    (:func:`causal_mask_mod`, ``course_attn.modern.mask_mods``) needs no tensor at all.
    """
    check_tensor(mask, "mask", ndim=4, floating=False)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must have dtype torch.bool (True = may attend), got {mask.dtype}")

    def allowed(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return _clamped(mask, b, h, q_idx, kv_idx)

    return allowed


def tensor_score_mod(bias: Tensor) -> ScoreMod:
    """A bias ``(B or 1, H or 1, T_q, T_k)`` added to each score, as a score_mod (Chapter 10).

    What ``attention(bias=...)`` becomes on the flex path (ALiBi's ``-slope * distance`` as a
    tensor; ``course_attn.modern.mask_mods.alibi_score_mod`` computes it instead).
    """
    check_tensor(bias, "bias", ndim=4)

    def add_bias(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + _clamped(bias, b, h, q_idx, kv_idx).to(score.dtype)

    return add_bias


# ------------------------------------------------------------ the dense reference
def _dense_scores(score_mod: ScoreMod, scores: Tensor) -> Tensor:
    """A score_mod applied to every score of ``(B, H, T_q, T_k)`` at once, by broadcasting
    its index arguments (what the kernel does one score at a time)."""
    n_b, n_h, t_q, t_k = scores.shape
    index = [torch.arange(n, device=scores.device).view(shape) for n, shape in
             ((n_b, (-1, 1, 1, 1)), (n_h, (1, -1, 1, 1)), (t_q, (1, 1, -1, 1)),
              (t_k, (1, 1, 1, -1)))]
    return score_mod(scores, *index).expand(scores.shape)


def _dense_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None,
                     bias: Tensor | None, scale: float, score_mod: ScoreMod | None = None,
                     dropout_p: float = 0.0) -> Tensor:
    """What the kernel computes, with every score in memory, as chapter 4's manual path:
    the backward's recomputation, and the calls with dropout. ``(B, H, T_q, d_v)``."""
    attn_scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, T_q, d_k) @ (B, H, d_k, T_k)
    if score_mod is not None:
        attn_scores = _dense_scores(score_mod, attn_scores)
    if bias is not None:
        attn_scores = attn_scores + bias  # (B, H, T_q, T_k)
    if allowed is not None:
        attn_scores = attn_scores.masked_fill(~allowed, float("-inf"))
        # a row with no allowed key: finite scores here, zero weights below (no NaN)
        attn_scores = attn_scores.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
    attn_weights = torch.softmax(attn_scores, dim=-1)  # (B, H, T_q, T_k)
    if allowed is not None:
        attn_weights = attn_weights.masked_fill(~allowed, 0.0)
    if dropout_p > 0.0:
        attn_weights = F.dropout(attn_weights, p=dropout_p, training=True)
    return attn_weights @ v  # (B, H, T_q, T_k) @ (B, H, T_k, d_v) -> (B, H, T_q, d_v)


# ----------------------------------------------------------- one call of the kernel
@dataclass(frozen=True, eq=False)
class _Run:
    """What one call needs besides q, k, v and the bias: the padded sizes the kernel sees,
    its mods and BlockMask, and the dense mask the CPU's backward recomputes with."""

    t_q: int  # padded lengths and head size (the path pads; flex_attend does not)
    t_k: int
    d: int
    block_mask: BlockMask | None
    score_mod: ScoreMod | None  # the hand-written one (flex_attend), not the bias's
    allowed: Tensor | Callable[[], Tensor] | None  # dense, unpadded (or how to make it)
    scale: float

    def dense_mask(self) -> Tensor | None:
        return self.allowed() if callable(self.allowed) else self.allowed

    def kernel(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
        """The kernel on padded copies of ``q, k, v`` (and the bias); ``(B, H, T_q, d_v)``."""
        t_q, t_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
        if q.device.type == "meta":  # no kernel: the output's shape is what meta checks
            return q.new_empty(*q.shape[:-1], d_v)
        q, k, v = (_pad(x, t, self.d) for x, t in ((q, self.t_q), (k, self.t_k), (v, self.t_k)))
        score_mod = self.score_mod
        if bias is not None:
            padded = F.pad(bias, (0, self.t_k - t_k, 0, self.t_q - t_q))  # (B, H, t_q, t_k)
            score_mod = tensor_score_mod(padded.contiguous())  # one layout: one kernel
        out = _run_kernel(q, k, v, score_mod, self.block_mask, self.scale)
        return out[..., :t_q, :d_v]  # (B, H, T_q, d_v)

    def dense(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
        return _dense_attention(q, k, v, self.dense_mask(), bias, self.scale, self.score_mod)


def _pad(x: Tensor, t: int, d: int) -> Tensor:
    """``(B, H, T, D)`` padded with zeros to ``(B, H, t, d)``."""
    if x.shape[-2:] == (t, d):
        return x
    return F.pad(x, (0, d - x.shape[-1], 0, t - x.shape[-2]))


class _FlexFunction(torch.autograd.Function):
    """The kernel forward; the backward by dense recomputation (PyTorch has no CPU backward)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, run: _Run) -> Tensor:
        ctx.save_for_backward(q, k, v, bias)
        ctx.run = run
        # detached: FlexAttention refuses CPU tensors that require a gradient
        return run.kernel(q.detach(), k.detach(), v.detach(),
                          None if bias is None else bias.detach())

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        saved = ctx.saved_tensors
        inputs = [None if t is None else t.detach().requires_grad_(need)
                  for t, need in zip(saved, ctx.needs_input_grad[:4], strict=True)]
        wanted = [t for t in inputs if t is not None and t.requires_grad]
        with torch.enable_grad():
            out = ctx.run.dense(*inputs)
        grads = iter(torch.autograd.grad(out, wanted, grad_out, allow_unused=True))
        return (*(next(grads) if t is not None and t.requires_grad else None
                  for t in inputs), None)


def _attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, run: _Run) -> Tensor:
    """One call: through :class:`_FlexFunction` where PyTorch has no backward (CPU, meta,
    MPS), else straight into the kernel, whose fused backward autograd then runs."""
    if q.device.type in ("cpu", "meta", "mps"):
        return _FlexFunction.apply(q, k, v, bias, run)
    return run.kernel(q, k, v, bias)


# ------------------------------------------------------------------- the path
def _bucket(n: int) -> int:
    """The padded size of a length or head size: a power of two, at least 16."""
    return max(MIN_FLEX_SIZE, 1 << (n - 1).bit_length())


_BLOCK_MASKS: OrderedDict[tuple, tuple[Callable[[], object], BlockMask]] = OrderedDict()


def _cached(key: Callable[[], tuple], owner: Tensor | None,
            make: Callable[[], BlockMask]) -> BlockMask:
    """A BlockMask made once per ``key()`` (and per mask tensor ``owner``, while it lives and
    is not changed in place): a model's layers share the one their forward needs. Not
    cached inside a traced model (the trace makes it once per graph)."""
    if torch.compiler.is_compiling():
        return make()
    key_now = key()
    entry = _BLOCK_MASKS.get(key_now)
    if entry is not None and (owner is None or entry[0]() is owner):
        _BLOCK_MASKS.move_to_end(key_now)
        return entry[1]
    block_mask = make()
    alive = weakref.ref(owner) if owner is not None else (lambda: None)
    _BLOCK_MASKS[key_now] = alive, block_mask
    while len(_BLOCK_MASKS) > _BLOCK_MASK_CACHE_SIZE:
        _BLOCK_MASKS.popitem(last=False)
    return block_mask


def _mask_block_mask(mask: Tensor, n_b: int, t_q: int, t_k: int, owner: Tensor,
                     is_causal: bool) -> BlockMask:
    """The BlockMask of a boolean mask ``(B or 1, H or 1, T_q, T_k)``: a look-up mod into it,
    padded to ``(t_q, t_k)`` with ``False`` and given its ``n_b`` rows (one shape for the
    kernel, whatever the mask broadcast over). ``mask`` is made from ``owner``, the caller's
    mask (and the causal mask when ``is_causal``), and cached while ``owner`` is unchanged."""
    def make() -> BlockMask:
        padded = F.pad(mask, (0, t_k - mask.shape[-1], 0, t_q - mask.shape[-2]))  # False
        padded = padded.expand(n_b, *padded.shape[1:]).contiguous()  # (B, 1 or H, t_q, t_k)
        return create_block_mask(tensor_mask_mod(padded), n_b, padded.shape[1], t_q, t_k,
                                 device=mask.device)

    def key() -> tuple:
        return ("mask", id(owner), owner._version, tuple(owner.shape), owner.stride(),
                is_causal, tuple(mask.shape), n_b, t_q, t_k)

    return _cached(key, owner, make)


def _causal_block_mask(offset: int | None, t_k_real: int, t_q: int, t_k: int,
                       device: torch.device) -> BlockMask:
    """The BlockMask of the causal mask (``offset``) or of none, as code over the padded
    ``(t_q, t_k)``: the padded keys past ``t_k_real`` are masked. The two numbers are 0-d
    tensors, read by the kernel: a cache that grows within a power of two keeps its kernel."""
    def make() -> BlockMask:
        length = torch.tensor(t_k_real, device=device)
        shift = torch.tensor(0 if offset is None else offset, device=device)
        causal = causal_mask_mod(shift)

        def keys(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return kv_idx < length

        def causal_keys(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return causal(b, h, q_idx, kv_idx) & (kv_idx < length)

        mod = keys if offset is None else causal_keys
        return create_block_mask(mod, 1, 1, t_q, t_k, device=device)

    return _cached(lambda: ("causal", offset, t_k_real, t_q, t_k, str(device)), None, make)


def _heads(x: Tensor, batch: torch.Size, n_b: int, n_h: int) -> Tensor:
    """``(..., T, d)`` broadcast to ``batch`` and seen as ``(B, H, T, d)`` (a view unless
    several broadcast batch axes merge)."""
    return x.expand(*batch, *x.shape[-2:]).reshape(n_b, n_h, *x.shape[-2:])


def _shrunk(x: Tensor) -> Tensor:
    """``(B, H, ...)`` with a broadcast (stride-0) batch or head axis cut to size 1."""
    for axis in (0, 1):
        if x.shape[axis] > 1 and x.stride(axis) == 0:
            x = x.narrow(axis, 0, 1)
    return x


def attention_flex(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *,
                   is_causal: bool = False, scale: float | None = None, dropout_p: float = 0.0,
                   bias: Tensor | None = None) -> tuple[Tensor, None]:
    """The ``"flex"`` path of ``attention()``: FlexAttention with the course's arguments
    (Chapter 10; no checks, ``attention()`` checks them).

    Same signature as the other paths (``course_attn.core.attention``); returns ``(out
    (..., T_q, d_v), None)``. ``is_causal`` alone becomes :func:`causal_mask_mod`
    (bottom-right aligned; no mask tensor); a ``mask`` (with the causal part ANDed in)
    becomes :func:`tensor_mask_mod`, a ``bias`` :func:`tensor_score_mod`. The BlockMask is
    cached per mask tensor. A query with no allowed key gets zeros. Half precision is
    computed in float32 on the CPU. ``dropout_p > 0`` computes densely (see the module).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    t_q, t_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    given = mask  # the caller's mask: its BlockMask is cached while it lives
    if is_causal and mask is not None:
        mask = mask & torch.ones(t_q, t_k, dtype=torch.bool, device=q.device).tril(t_k - t_q)
    if mask is not None:  # a padded key may hold NaN: 0 * NaN would reach the outputs
        reachable = mask.any(dim=-2).unsqueeze(-1)  # (..., T_k, 1)
        k, v = k.masked_fill(~reachable, 0.0), v.masked_fill(~reachable, 0.0)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    n_b, n_h = (int(torch.Size(batch[:-1]).numel()), batch[-1]) if batch else (1, 1)
    q4, k4, v4 = (_heads(x, batch, n_b, n_h) for x in (q, k, v))  # (B, H, T, d)
    scores = (*batch, t_q, t_k)  # a mask or bias broadcasts to it: seen as (B, H, T_q, T_k)
    mask4 = None if mask is None else _shrunk(mask.expand(scores).reshape(n_b, n_h, t_q, t_k))
    bias4 = None if bias is None else bias.expand(scores).reshape(n_b, n_h, t_q, t_k)
    dtype = q.dtype
    if q.device.type == "cpu" and dtype in (torch.float16, torch.bfloat16):
        q4, k4, v4 = q4.float(), k4.float(), v4.float()  # the CPU kernel's safe precision
        bias4 = None if bias4 is None else bias4.float()
    if dropout_p > 0.0:
        _warn_once("dropout", f"impl='flex' with dropout_p={dropout_p}: FlexAttention has no "
                   "dropout on the attention weights (a score_mod changes a score before the "
                   "softmax, dropout zeroes a weight after it), so such calls are computed "
                   "densely, as impl='manual' computes them. Use dropout=0 for the kernel.")
        allowed = _causal_dense(t_q, t_k, q.device) if is_causal and mask4 is None else mask4
        out = _dense_attention(q4, k4, v4, allowed, bias4, scale, dropout_p=dropout_p)
    else:
        run = _path_run(mask4, given, is_causal, q4, k4, v4, scale)
        out = _attend(q4, k4, v4, bias4, run)  # (B, H, T_q, d_v)
    out = out.reshape(*batch, t_q, d_v) if len(batch) != 2 else out  # (..., T_q, d_v)
    return out.to(dtype), None


def _causal_dense(t_q: int, t_k: int, device: torch.device) -> Tensor:
    """The bottom-right causal mask ``(t_q, t_k)`` as a tensor (the dense computations)."""
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(t_k - t_q)


def _path_run(mask4: Tensor | None, given: Tensor | None, is_causal: bool, q: Tensor,
              k: Tensor, v: Tensor, scale: float) -> _Run:
    """The padded sizes, BlockMask and dense mask of one call of :func:`attention_flex`."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    t_qp, t_kp, d = _bucket(t_q), _bucket(t_k), _bucket(max(q.shape[-1], v.shape[-1]))
    if mask4 is not None and given is not None:
        block_mask = _mask_block_mask(mask4, q.shape[0], t_qp, t_kp, given, is_causal)
        return _Run(t_qp, t_kp, d, block_mask, None, mask4, scale)
    offset = t_k - t_q if is_causal else None
    block_mask = _causal_block_mask(offset, t_k, t_qp, t_kp, q.device)
    allowed = (lambda: _causal_dense(t_q, t_k, q.device)) if is_causal else None
    return _Run(t_qp, t_kp, d, block_mask, None, allowed, scale)


def flex_attend(q: Tensor, k: Tensor, v: Tensor, *, mask_mod: MaskMod | None = None,
                score_mod: ScoreMod | None = None, block_mask: BlockMask | None = None,
                scale: float | None = None) -> Tensor:
    """FlexAttention with mods written by hand, compiled where possible (Chapter 10).

    Args:
        q, k, v: ``(B, H, T_q, d_k)``, ``(B, H, T_k, d_k)``, ``(B, H, T_k, d_v)``.
        mask_mod: ``(b, h, q_idx, kv_idx) -> bool``, ``True`` = may attend (``None``: every
            key); its BlockMask is made here (``(1, 1, T_q, T_k)`` unless ``block_mask``).
        score_mod: ``(score, b, h, q_idx, kv_idx) -> score``, applied to each scaled score.
        block_mask: a ``BlockMask`` made by ``create_block_mask`` for these lengths (then
            its mask_mod is used; give either it or ``mask_mod``).
        scale: multiplies the scores; ``None`` means ``1 / sqrt(d_k)``.

    Returns:
        ``(B, H, T_q, d_v)``; zeros for a query with no allowed key. Differentiable: on the
        CPU the backward recomputes the scores densely (the mods applied to every index at
        once by broadcasting, so they must be elementwise torch code).
    """
    q, k, v = check_qkv(q, k, v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(x, name, ndim=4)
    if not q.shape[:2] == k.shape[:2] == v.shape[:2]:
        raise ValueError(f"q, k and v must share (B, H), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    for name, mod in (("mask_mod", mask_mod), ("score_mod", score_mod)):
        if mod is not None and not callable(mod):
            raise TypeError(f"{name} must be a function or None, got {type(mod).__name__}")
    if block_mask is not None and not isinstance(block_mask, BlockMask):
        raise TypeError(f"block_mask must be a BlockMask (create_block_mask) or None, got "
                        f"{type(block_mask).__name__}")
    if block_mask is not None and mask_mod is not None:
        raise ValueError("give mask_mod or block_mask (which holds its mask_mod), not both")
    scale = q.shape[-1] ** -0.5 if scale is None else check_positive_real(scale, "scale")
    (n_b, n_h, t_q, _), t_k = q.shape, k.shape[-2]
    if block_mask is None and mask_mod is not None:
        block_mask = create_block_mask(mask_mod, 1, 1, t_q, t_k, device=q.device)
    mod = None if block_mask is None else block_mask.mask_mod
    allowed = None if mod is None else (lambda: create_mask(mod, n_b, n_h, t_q, t_k, q.device))
    run = _Run(t_q, t_k, max(q.shape[-1], v.shape[-1]), block_mask, score_mod, allowed, scale)
    return _attend(q, k, v, None, run)
