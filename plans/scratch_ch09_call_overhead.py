"""Chapter 9: what makes the Python tiled kernel slow on a CPU -- measured.

The cell proposed in plans/issue24_edits.md, section 9.3, preceded by the chapter's own
definitions it uses (`B`, `H`, `head_dim`, `qkv`, one thread). Timings, so the notebook cell is
tagged nbval-ignore-output; its assert holds on any machine (counts, and block 32 slower than
block 256). Run: PYTHONPATH=src .venv/bin/python plans/scratch_ch09_call_overhead.py
"""
from functools import partial

import torch

from course_attn import measure, tiled_attention

# --- the chapter's definitions (c4, c6)
B, H, head_dim = 1, 4, 64


def qkv(T, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, head_dim, generator=g, dtype=dtype) for _ in range(3)]


torch.set_num_threads(1)

# --- the proposed cell
q, k, v = qkv(1024)
one = torch.zeros(1)
tiny_us = 1e6 * measure.median_seconds(lambda: one + 1, repeats=2001)
print(f"the smallest call, adding 1 to a one-number tensor: {tiny_us:.1f} us")
calls, ms = [], []
for b in (32, 64, 128, 256):
    run = partial(tiled_attention, q, k, v, is_causal=True, block_q=b, block_k=b)
    with torch.no_grad():
        calls.append(measure.count_ops(run))
        ms.append(1e3 * measure.median_seconds(run, repeats=5))
    print(f"blocks of {b:3d}: {calls[-1]:6,d} calls, {ms[-1]:6.1f} ms, "
          f"{1e3 * ms[-1] / calls[-1]:5.1f} us per call")
fit = torch.linalg.lstsq(torch.tensor([[c, 1.0] for c in calls], dtype=torch.float64),
                         torch.tensor(ms, dtype=torch.float64)[:, None]).solution[:, 0]
per_call_us, rest_ms = 1e3 * fit[0].item(), fit[1].item()  # time = a * calls + b
print(f"fit: {per_call_us:.1f} us per call + {rest_ms:.1f} ms; with blocks of 32 the calls "
      f"explain {per_call_us * calls[0] / 1e3 / ms[0]:.0%} of the time")
assert calls[0] > 10 * calls[-1] and ms[0] > ms[-1]

# --- for comparison (not in the proposed cell; c44 measures the manual path itself)
mask = ~torch.ones(1024, 1024, dtype=torch.bool).tril()
with torch.no_grad():
    manual_ms = 1e3 * measure.median_seconds(
        lambda: torch.softmax((q @ k.mT / 8).masked_fill(mask, float("-inf")), -1) @ v,
        repeats=5)
print(f"the manual path, for comparison: {manual_ms:.1f} ms")
