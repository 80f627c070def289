"""Chapter 9's kernel against the other paths: time, peak memory and TFLOP/s against T.

For each length T, on the same random ``(B, H, T, head_dim)`` inputs, causal
self-attention through each path of ``course_attn.core.attention``: ``manual``
(stores the T x T weights), ``tiled`` (chapter 9's algorithm in torch, a Python loop
over tiles), ``triton`` (the same algorithm as Triton kernels, in FlashAttention-2's loop
order) and ``sdpa`` (PyTorch's fused kernel, whose backend is printed: FlashAttention-2, or
cuDNN's, which PyTorch picked on the H100 of benchmarks/records/h100-2026-11-26.md;
``benchmarks/gpu_check.sh`` forces each backend in turn).
The paths run one after the other for each T, so every ratio is between figures of
this run. For each it prints:

* the median time of ``--repeats`` calls after one warm-up (the GPU synchronised),
  forward (under ``torch.no_grad``) and forward + backward (the Triton path's first call of
  each shape also tunes its kernels on a GPU: the warm-up does that);
* the peak memory of one call beyond what was allocated before
  (:func:`course_attn.lab.measure.peak_memory_bytes`);
* the achieved TFLOP/s (GFLOP/s on the CPU), counting FlashAttention's FLOPs:
  ``4 B H T^2 d`` for the forward's two products, halved by the causal mask, and 2.5
  times that for the backward's five; and on a GPU its share of the card's dense half-precision peak
  (``course_attn.train.GPU_PEAK_FLOPS``).

Then the **host time per call** of the Triton path: the microseconds from the call to the
kernel launch (every launch replaced by a record of it, ``launches_recorded``), for a
model's typical call, causal self-attention on ``(4, 6, 256, 64)`` (chapter 11's gpu
preset): through ``attention(..., impl="triton")`` (its checks included) and through
``attention_triton``, which a model calls after checking its inputs once at its own door.
This is the work a GPU waits for when the kernel itself is short.

On a GPU (the default where there is one), T runs from 256 to 16k. The tiled path
launches a few torch calls per tile, so it stops at ``--tiled-max`` (2048); a path
that runs out of memory says so. On the CPU the Triton kernel runs under Triton's
interpreter (NumPy runs each program in Python): the script turns it on, keeps T
small, and its ``triton`` times measure the interpreter, not a kernel; the memory the
interpreter's NumPy arrays take is not seen either. A couple of minutes on 2 cores.

    python benchmarks/attention_triton.py                         # GPU if any, else CPU
    python benchmarks/attention_triton.py --host-only             # the host time alone
    python benchmarks/attention_triton.py --device cuda --dtype float16 \\
        --lengths 1024 4096 16384 --batch 4 --heads 16 --head-dim 64
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before anything imports triton (the package doesn't)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import time  # noqa: E402

# one path's peak memory and median times, as the scaling benchmark measures them (run as
# a script, this folder is on the import path)
from attention_scaling import measure  # noqa: E402

from course_attn.core.attention import attention  # noqa: E402
from course_attn.core.triton_attention import TRITON_FOUND, attention_triton  # noqa: E402
from course_attn.env import pick_device  # noqa: E402
from course_attn.lab.measure import sdpa_backend  # noqa: E402
from course_attn.train import gpu_peak_flops  # noqa: E402

IMPLS = ("manual", "tiled", "triton", "sdpa")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GPU_LENGTHS = [256, 512, 1024, 2048, 4096, 8192, 16384]
CPU_LENGTHS = [64, 128, 256]


def forward_flops(batch: int, heads: int, t: int, head_dim: int) -> float:
    """FLOPs of causal attention's forward: Q K^T and P V, half of the T x T tiles."""
    return 4 * batch * heads * t * t * head_dim / 2


def cell(value: float | None, unit: str) -> str:
    if value is None:
        return f"{'-':>9}"
    scale = {"ms": 1e3, "MiB": 2**-20, "TFLOP/s": 1e-12, "GFLOP/s": 1e-9, "%": 100}[unit]
    return f"{value * scale:9.2f}"


def best_microseconds(call, calls: int = 2000, rounds: int = 5) -> float:
    """The fastest of ``rounds`` averages over ``calls`` calls, in microseconds (the least
    disturbed by other processes)."""
    for _ in range(50):
        call()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def host_times(device: torch.device, dtype: torch.dtype,
               shape: tuple[int, int, int, int] = (4, 6, 256, 64)) -> dict[str, float]:
    """Host microseconds per Triton call before the launch, for a model's typical call."""
    from course_attn.core.triton_kernels import launches_recorded  # imports triton

    q, k, v = (torch.randn(*shape, device=device, dtype=dtype) for _ in range(3))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    grad_out = torch.randn_like(q)

    def forward_backward() -> None:
        out, _ = attention_triton(*leaves, is_causal=True)
        torch.autograd.grad(out, leaves, grad_out)

    times = {}
    with launches_recorded():
        with torch.no_grad():
            times["attention(impl='triton'), forward"] = best_microseconds(
                lambda: attention(q, k, v, is_causal=True, impl="triton"))
            times["attention_triton (a model's call), forward"] = best_microseconds(
                lambda: attention_triton(q, k, v, is_causal=True))
        times["attention_triton (a model's call), forward + backward"] = best_microseconds(
            forward_backward, calls=500)
    return times


def print_host_times(device: torch.device, dtype: torch.dtype) -> None:
    if not TRITON_FOUND:
        return
    print("\nhost time per call of the triton path before its kernel launch (us), causal, "
          f"q, k, v of shape (4, 6, 256, 64), {dtype}:")
    for what, micro in host_times(device, dtype).items():
        print(f"  {what:55s} {micro:8.1f}")


def table(title: str, unit: str, lengths: list[int], rows: dict[int, dict[str, dict]],
          key: str) -> None:
    print(f"\n{title} ({unit}; '-': not run, see above)")
    print(f"{'T':>6} " + " ".join(f"{impl:>9}" for impl in IMPLS))
    for t in lengths:
        print(f"{t:6d} " + " ".join(cell(rows[t][impl].get(key), unit) for impl in IMPLS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if any)")
    parser.add_argument("--lengths", type=int, nargs="+", default=None,
                        help=f"default {GPU_LENGTHS} on a GPU, {CPU_LENGTHS} on the CPU")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=None, help="default 16 (GPU), 2 (CPU)")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="default bfloat16 on a GPU, float32 on the CPU")
    parser.add_argument("--repeats", type=int, default=None, help="default 10 (GPU), 3 (CPU)")
    parser.add_argument("--tiled-max", type=int, default=2048,
                        help="longest T for the tiled path (its time grows with T^2 launches)")
    parser.add_argument("--host-only", action="store_true",
                        help="print only the host time per call of the triton path")
    args = parser.parse_args()
    device = pick_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = device.type == "cuda"
    lengths = sorted(args.lengths or (GPU_LENGTHS if gpu else CPU_LENGTHS))
    heads = args.heads or (16 if gpu else 2)
    dtype = DTYPES[args.dtype or ("bfloat16" if gpu else "float32")]
    repeats = args.repeats or (10 if gpu else 3)
    name = torch.cuda.get_device_name(device) if gpu else "CPU"
    peak = gpu_peak_flops(name) if gpu else None
    print(f"{name}, {dtype}, q, k, v of shape ({args.batch}, {heads}, T, {args.head_dim}), "
          f"causal, median of {repeats}")
    if not gpu:
        print("No GPU: the triton path runs under Triton's interpreter (TRITON_INTERPRET=1), "
              "at small T only;\nits figures measure NumPy running each program in Python, "
              "not a kernel. Run this on a GPU for the kernel's speed.")
    if not TRITON_FOUND:
        print("triton is not installed: the triton column stays empty.")
    if args.host_only:
        print_host_times(device, dtype)
        return
    probe = torch.randn(args.batch, heads, lengths[0], args.head_dim, device=device, dtype=dtype)
    print(f"SDPA backend for these inputs: {sdpa_backend(probe, probe, probe, is_causal=True)}")

    rows: dict[int, dict[str, dict]] = {}
    for t in lengths:
        g = torch.Generator(device=device).manual_seed(t)
        q, k, v = (torch.randn(args.batch, heads, t, args.head_dim, generator=g, device=device,
                               dtype=dtype) for _ in range(3))
        rows[t] = {}
        for impl in IMPLS:
            if (impl == "tiled" and t > args.tiled_max) or (impl == "triton" and not TRITON_FOUND):
                rows[t][impl] = {}
                continue
            try:
                if impl == "triton":  # the first call of a shape compiles (and tunes)
                    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
                    attention(*leaves, is_causal=True, impl=impl)[0].sum().backward()
                rows[t][impl] = measure(impl, q, k, v, repeats, device)
            except torch.OutOfMemoryError:
                print(f"  T = {t}: {impl} ran out of GPU memory")
                rows[t][impl] = {}
                torch.cuda.empty_cache()
        flops = forward_flops(args.batch, heads, t, args.head_dim)
        for result in rows[t].values():
            if result:
                result["tflops_fwd"] = flops / result["time_fwd"]
                result["tflops_fb"] = 3.5 * flops / result["time_fb"]  # backward: 2.5 x fwd
                if peak:
                    result["peak_fwd"] = result["tflops_fwd"] / peak
                    result["peak_fb"] = result["tflops_fb"] / peak
        print(f"  T = {t:6d} measured")

    table("time, forward", "ms", lengths, rows, "time_fwd")
    table("time, forward + backward", "ms", lengths, rows, "time_fb")
    table("peak memory, forward", "MiB", lengths, rows, "mem_fwd")
    table("peak memory, forward + backward", "MiB", lengths, rows, "mem_fb")
    rate = "TFLOP/s" if gpu else "GFLOP/s"
    table("achieved, forward", rate, lengths, rows, "tflops_fwd")
    table("achieved, forward + backward", rate, lengths, rows, "tflops_fb")
    if peak:
        print(f"\n{name}'s dense half-precision peak: {peak / 1e12:.0f} TFLOP/s")
        table("share of the peak, forward", "%", lengths, rows, "peak_fwd")
        table("share of the peak, forward + backward", "%", lengths, rows, "peak_fb")
    elif gpu:
        print(f"\n{name} is not in course_attn.train.GPU_PEAK_FLOPS: no share of the peak")

    print_host_times(device, dtype)

    print("\nratios at each T (triton / sdpa time, manual / triton time, forward | f+b)")
    for t in lengths:
        r = rows[t]
        if r["triton"] and r["sdpa"]:
            line = " | ".join(f"{r['triton'][key] / r['sdpa'][key]:6.2f}, "
                              + (f"{r['manual'][key] / r['triton'][key]:6.2f}" if r["manual"]
                                 else "     -")
                              for key in ("time_fwd", "time_fb"))
            print(f"  T = {t:6d}: {line}")


if __name__ == "__main__":
    main()
