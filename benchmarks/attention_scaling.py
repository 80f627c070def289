"""Peak memory and time of attention against the length T: manual, tiled and SDPA (chapter 8).

For each length T and each path of ``course_attn.core.attention`` (``impl="manual"``,
``"tiled"``, ``"sdpa"``) it measures, on the same random ``(B, H, T, head_dim)``
inputs, causal self-attention:

* **peak memory** of one forward call (under ``torch.no_grad``, as in inference),
  and of one forward + backward call
  (gradients of q, k and v included), in bytes held beyond what was allocated
  before the call, with :func:`course_attn.lab.measure.peak_memory_bytes`.
  On the CPU that function replays the allocation and free records of
  ``torch.profiler`` (``profile_memory=True``): every tensor the call creates,
  every tensor autograd saves and every scratch buffer PyTorch's kernels take
  from its CPU allocator, in time order; the running sum's maximum is the peak.
  (Memory a math library takes from the system by itself is not seen.) On CUDA
  it is ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``.
* **time**: the median of ``--repeats`` calls after one warm-up
  (:func:`course_attn.lab.measure.median_seconds`, which synchronises a GPU).

The three paths are measured one after the other for each T, so they see the
same machine load; every ratio printed is between figures of this run. The
table also gives, per path, the growth factor of each figure when T doubles
(about 4 for a path that stores T x T matrices, about 2 for one that does not),
and the crossover points: the smallest measured T from which the tiled path
uses less memory than the manual one, and from which it is faster.

    python benchmarks/attention_scaling.py                        # CPU, T = 256 .. 4096
    python benchmarks/attention_scaling.py --lengths 512 1024 2048 --repeats 9
    python benchmarks/attention_scaling.py --device cuda --dtype bfloat16 \\
        --lengths 1024 2048 4096 8192 16384

The tiled path is the course's kernel in plain torch: exact and O(T) in memory,
but every block is several small operator calls launched from Python. Its time
measures that overhead, not what a fused FlashAttention kernel achieves.
"""

from __future__ import annotations

import argparse
import math

import torch

from course_attn.core.attention import attention
from course_attn.env import pick_device
from course_attn.lab.measure import median_seconds, peak_memory_bytes, sdpa_backend

IMPLS = ("manual", "tiled", "sdpa")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


def measure(impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, repeats: int,
            device: torch.device) -> dict[str, float]:
    """Peak bytes and median seconds of one path, forward and forward + backward."""
    def forward():
        with torch.no_grad():
            return attention(q, k, v, is_causal=True, impl=impl)[0]

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]

    def forward_backward():
        for leaf in leaves:
            leaf.grad = None
        out, _ = attention(*leaves, is_causal=True, impl=impl)
        out.sum().backward()

    forward()  # a first call may compile kernels (Triton's): not part of any figure
    peak_fwd, out = peak_memory_bytes(forward, device=device)
    del out
    peak_fb, _ = peak_memory_bytes(forward_backward, device=device)
    return {
        "mem_fwd": peak_fwd,
        "mem_fb": peak_fb,
        "time_fwd": median_seconds(forward, repeats=repeats, device=device),
        "time_fb": median_seconds(forward_backward, repeats=repeats, device=device),
    }


def mib(n: float) -> str:
    return f"{n / 2**20:11.2f}"


def ms(s: float) -> str:
    return f"{s * 1e3:11.2f}"


def crossover(lengths: list[int], better: list[bool]) -> str:
    """The smallest T from which ``better`` holds for every larger measured T too."""
    for i, t in enumerate(lengths):
        if all(better[i:]):
            return f"T = {t}" + (" (the smallest measured)" if i == 0 else "")
    return f"not reached up to T = {lengths[-1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: torch's choice)")
    args = parser.parse_args()
    device = pick_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    lengths = sorted(args.lengths)
    shape = (args.batch, args.heads, "T", args.head_dim)
    print(f"device {device}, dtype {args.dtype}, q, k, v of shape {shape}, causal, "
          f"{torch.get_num_threads()} CPU thread(s), median of {args.repeats}")
    probe = torch.randn(args.batch, args.heads, lengths[0], args.head_dim, device=device,
                        dtype=dtype)
    print(f"SDPA backend for these inputs: {sdpa_backend(probe, probe, probe, is_causal=True)}")
    results: dict[str, list[dict[str, float]]] = {impl: [] for impl in IMPLS}
    for t in lengths:
        g = torch.Generator(device=device).manual_seed(t)
        q, k, v = (torch.randn(args.batch, args.heads, t, args.head_dim, generator=g,
                               device=device, dtype=dtype) for _ in range(3))
        for impl in IMPLS:
            results[impl].append(measure(impl, q, k, v, args.repeats, device))
        one_matrix = args.batch * args.heads * t * t * probe.element_size()
        print(f"  T = {t:6d} measured (one T x T matrix of scores: {one_matrix / 2**20:.2f} MiB)")

    print("\npeak memory in MiB (forward | forward + backward)")
    print(f"{'T':>6} " + " ".join(f"{impl + ' fwd':>11} {impl + ' f+b':>11}" for impl in IMPLS))
    for i, t in enumerate(lengths):
        print(f"{t:6d} " + " ".join(f"{mib(results[impl][i]['mem_fwd'])} "
                                    f"{mib(results[impl][i]['mem_fb'])}" for impl in IMPLS))
    print("\ntime in ms (forward | forward + backward)")
    print(f"{'T':>6} " + " ".join(f"{impl + ' fwd':>11} {impl + ' f+b':>11}" for impl in IMPLS))
    for i, t in enumerate(lengths):
        print(f"{t:6d} " + " ".join(f"{ms(results[impl][i]['time_fwd'])} "
                                    f"{ms(results[impl][i]['time_fb'])}" for impl in IMPLS))

    print("\ngrowth when T doubles (geometric mean over the measured doublings)")
    for key, label in (("mem_fwd", "memory, forward"), ("mem_fb", "memory, fwd + bwd"),
                       ("time_fwd", "time, forward"), ("time_fb", "time, fwd + bwd")):
        factors = []
        for impl in IMPLS:
            ratios = [results[impl][i + 1][key] / results[impl][i][key]
                      for i in range(len(lengths) - 1)
                      if lengths[i + 1] == 2 * lengths[i] and results[impl][i][key] > 0]
            mean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else math.nan
            factors.append(f"{impl} x{mean:.2f}")
        print(f"  {label:18s} " + ", ".join(factors))

    print("\nratios at each T (manual / tiled, manual / sdpa)")
    for i, t in enumerate(lengths):
        parts = []
        for key in ("mem_fwd", "time_fwd", "time_fb"):
            m = results["manual"][i][key]
            parts.append(f"{key} {m / results['tiled'][i][key]:6.2f}, "
                         f"{m / results['sdpa'][i][key]:6.2f}")
        print(f"  T = {t:6d}: " + " | ".join(parts))

    print("\ncrossover points")
    for key, label in (("mem_fwd", "uses less memory (forward)"),
                       ("mem_fb", "uses less memory (fwd + bwd)"),
                       ("time_fwd", "is faster (forward)"), ("time_fb", "is faster (fwd + bwd)")):
        for other in ("manual", "sdpa"):
            better = [results["tiled"][i][key] < results[other][i][key]
                      for i in range(len(lengths))]
            print(f"  tiled {label} than {other}: {crossover(lengths, better)}")
        better = [results["sdpa"][i][key] < results["manual"][i][key]
                  for i in range(len(lengths))]
        print(f"  sdpa {label} than manual: {crossover(lengths, better)}")


if __name__ == "__main__":
    main()
