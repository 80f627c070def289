"""Measuring a call: memory, time, saved tensors, operators, SDPA kernel (Chapter 9).

:func:`peak_memory_bytes` answers "how many bytes did this call hold at its
worst, beyond what was already allocated when it started?"

* On CUDA it asks the caching allocator: ``torch.cuda.max_memory_allocated``
  after ``reset_peak_memory_stats``, minus the bytes allocated at the start.
* On the CPU there is no such counter, so it records the call under
  ``torch.profiler`` with ``profile_memory=True``: every allocation and every
  free that goes through PyTorch's CPU allocator becomes an event with its size
  (positive or negative). Sorted by time, their running sum is the memory the
  call holds at each moment, and its maximum is the peak. This sees the tensors
  the call creates, the ones autograd saves and the scratch buffers that
  PyTorch's own kernels allocate (the fused attention kernel's included); it
  does not see memory a math library (MKL, oneDNN) takes from the system by
  itself, nor Python objects.

:func:`median_seconds` times a call: the median of several runs after a warm-up,
synchronising a GPU around each run. Timings depend on the machine and its load;
compare only figures measured in the same run.

Four counts depend on the code and the shapes only, so they are the same on
every machine: :func:`saved_tensor_bytes` (what autograd keeps for the backward
pass), :func:`count_ops` (how many PyTorch operators a call runs),
:func:`module_calls` (how many ``nn.Module`` calls, Chapter 11) and
:func:`sdpa_backend` (which of ``scaled_dot_product_attention``'s kernels a call
uses, read from the profiler's operator names).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch

from .._validation import check_device, check_nonnegative_int, check_positive_int

__all__ = [
    "SDPA_BACKENDS",
    "SDPA_MISSING",
    "count_ops",
    "median_seconds",
    "module_calls",
    "operator_counts",
    "peak_memory_bytes",
    "saved_tensor_bytes",
    "sdpa_backend",
]

# The operator each SDPA backend runs, as the profiler names it (longest names first).
_SDPA_OPS = (
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "flash"),
    ("aten::_scaled_dot_product_flash_attention", "flash"),
    ("aten::_scaled_dot_product_efficient_attention", "efficient"),
    ("aten::_scaled_dot_product_cudnn_attention", "cudnn"),
    ("aten::_scaled_dot_product_fused_attention_overrideable", "overrideable"),
    ("aten::_scaled_dot_product_attention_math", "math"),
)
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math", "overrideable")
#: What :func:`sdpa_backend` answers where the kernel chosen has no code for these inputs on
#: this machine (PyTorch's portable build on an Intel AMX CPU has no bfloat16 CPU kernel).
SDPA_MISSING = "none on this CPU"
# How PyTorch words a kernel it was built without or cannot run on this CPU.
_MISSING_KERNEL = ("only supported when", "not implemented for", "not supported")


@contextmanager
def _native_stderr_silenced():
    """Send the C++ side's stderr (file descriptor 2) to /dev/null for a moment.

    Starting and stopping the profiler makes its C++ library log two lines with a
    time stamp and a process id to stderr; in Jupyter they would land in the
    cell's output. Python's own ``sys.stderr`` (warnings, errors) is untouched
    in Jupyter, and this is used only around the profiler's start and stop.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no real descriptor 2: nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _profiled(fn: Callable[[], object], *, profile_memory: bool):
    """Run ``fn()`` under ``torch.profiler`` (CPU activity); return ``(profiler, result)``."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    prof = torch.profiler.profile(activities=activities, profile_memory=profile_memory)
    with _native_stderr_silenced():
        prof.__enter__()
    try:
        result = fn()
    finally:
        with _native_stderr_silenced():
            prof.__exit__(None, None, None)
    return prof, result


def _cpu_peak_bytes(fn: Callable[[], object]) -> tuple[int, object]:
    prof, result = _profiled(fn, profile_memory=True)
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    held = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        held += event.nbytes()  # + for an allocation, - for a free
        peak = max(peak, held)
    return peak, result


def peak_memory_bytes(fn: Callable[[], object], *,
                      device: str | torch.device = "cpu") -> tuple[int, object]:
    """Run ``fn()`` once; return ``(peak bytes held beyond the start, fn's result)``.

    ``device`` says whose memory to count: ``"cpu"`` (through the profiler, see
    the module docstring) or a CUDA device (through the caching allocator's
    counters). Tensors that ``fn`` returns or leaves behind (``.grad``) count,
    since they were allocated during the call.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    device = check_device(device, allow_none=False)
    if device.type == "cpu":
        return _cpu_peak_bytes(fn)
    if device.type != "cuda":
        raise ValueError(f"device must be 'cpu' or a CUDA device, got {str(device)!r}")
    torch.cuda.synchronize(device)
    start = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - start, result


def median_seconds(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1,
                   device: str | torch.device = "cpu") -> float:
    """The median wall-clock time of ``repeats`` calls of ``fn()``, after ``warmup`` calls.

    On a CUDA ``device`` the GPU is synchronised before and after each call, so
    the time covers the work, not only its launch.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    repeats = check_positive_int(repeats, "repeats")
    warmup = check_nonnegative_int(warmup, "warmup")
    device = check_device(device, allow_none=False)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def saved_tensor_bytes(fn: Callable[[], object]) -> int:
    """Bytes of the tensors that autograd saves for the backward pass while ``fn()`` runs.

    Every tensor saved for backward (by PyTorch's operators and by
    ``ctx.save_for_backward`` in a custom ``autograd.Function``) is counted once
    per distinct storage, with its storage's full size. The inputs themselves
    count when they are saved. This depends only on the code and the shapes.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    storages: dict[tuple[object, int], int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[(tensor.device, storage.data_ptr())] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        result = fn()
    del result
    return sum(storages.values())


def operator_counts(fn: Callable[[], object]) -> Counter[str]:
    """How many times ``fn()`` runs each PyTorch operator (ATen calls, below autograd), by
    name (``"mm"``, ``"masked_fill"``, ...): forward, backward and optimizer alike when ``fn``
    runs them. On the ``meta`` device nothing is computed and the counts are the same
    (Chapters 9 and 11)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: Counter[str] = Counter()

    class _Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            counts[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    with _Counter():
        fn()
    return counts


def module_calls(fn: Callable[[], object]) -> Counter[str]:
    """How many times ``fn()`` calls an ``nn.Module``, by class name (``"Linear"``, ...).

    In eager mode each call runs ``nn.Module.__call__`` in Python (it looks for hooks before
    ``forward``), host work that no operator count shows (Chapter 11). Counted with a global
    forward pre-hook, removed afterwards even if ``fn`` fails. While it is installed every
    module call of the process is counted, and takes ``__call__``'s slower path with hooks:
    do not time under it. Classes of the same name count together; a ``forward`` called
    directly, or code compiled by ``torch.compile``, is not counted.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    counts: Counter[str] = Counter()

    def count(module: torch.nn.Module, args: object) -> None:
        counts[type(module).__name__] += 1

    hook = torch.nn.modules.module.register_module_forward_pre_hook(count)
    try:
        fn()
    finally:
        hook.remove()
    return counts


def count_ops(fn: Callable[[], object]) -> int:
    """How many PyTorch operators (ATen calls, below autograd) ``fn()`` runs.

    A fused kernel is one call; a Python loop over blocks makes several calls
    per block. On a GPU each is a kernel launch with its own pass over memory; on a
    CPU each costs microseconds of Python and dispatcher overhead (Chapter 9).
    """
    return sum(operator_counts(fn).values())


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> str:
    """Which backend ``F.scaled_dot_product_attention(q, k, v, **kwargs)`` runs here.

    One of :data:`SDPA_BACKENDS`: ``"flash"``, ``"efficient"`` (memory-efficient),
    ``"cudnn"``, ``"math"`` (the unfused reference) or ``"overrideable"``. The
    call is made once under the profiler and the answer read from the name of
    the operator it dispatched to, so it holds for these inputs on this device
    with the backends enabled at the time (see ``torch.nn.attention.sdpa_kernel``).

    Where that kernel has no code for these inputs here (a dtype the CPU build cannot run
    on this processor: PyTorch raises ``RuntimeError``), the answer is
    :data:`SDPA_MISSING` instead of the error; any other error becomes a ``ValueError``
    that names the inputs.
    """
    import torch.nn.functional as F

    for value, name in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    try:
        prof, _ = _profiled(lambda: F.scaled_dot_product_attention(q, k, v, **kwargs),
                            profile_memory=False)
    except RuntimeError as err:
        if any(words in str(err) for words in _MISSING_KERNEL):
            return SDPA_MISSING
        shapes = ", ".join(f"{n} {tuple(t.shape)} {t.dtype}"
                           for n, t in zip("qkv", (q, k, v), strict=True))
        raise ValueError(f"scaled_dot_product_attention refused {shapes} with {kwargs}: "
                         f"{str(err).splitlines()[0]}") from err
    names = [event.name for event in prof.events()]
    for name in names:
        for op, backend in _SDPA_OPS:
            if name.startswith(op):
                return backend
    raise RuntimeError(f"no SDPA backend operator found among the profiled calls {names}")
