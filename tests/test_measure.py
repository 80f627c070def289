"""course_attn.lab.measure: peak memory, time, saved tensors, operator counts, the SDPA kernel."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F

from course_attn.core.attention import attention
from course_attn.core.tiled import tiled_attention
from course_attn.lab.measure import (
    SDPA_BACKENDS,
    SDPA_MISSING,
    count_ops,
    median_seconds,
    peak_memory_bytes,
    saved_tensor_bytes,
    sdpa_backend,
)

MB = 1_000_000


def test_peak_memory_counts_what_is_held_at_the_worst_moment():
    def allocate():
        a = torch.empty(MB, dtype=torch.uint8)
        b = torch.empty(2 * MB, dtype=torch.uint8)
        del a  # held: 1 + 2, then 2
        c = torch.empty(5 * MB, dtype=torch.uint8)  # held: 2 + 5 = 7 MB, the peak
        del b
        return c

    peak, result = peak_memory_bytes(allocate)
    assert result.numel() == 5 * MB
    assert 7 * MB <= peak < 7 * MB + 100_000  # a few small allocations of the profiler's own
    nothing, _ = peak_memory_bytes(lambda: None)
    assert nothing < 100_000


def test_peak_memory_of_attention_grows_as_t_squared_on_the_manual_path_only():
    """The claim of the chapter, at a size where the T x T matrices dominate."""
    def peaks(t):
        q = torch.randn(1, 2, t, 32)
        return {impl: peak_memory_bytes(lambda impl=impl: attention(q, q, q, impl=impl))[0]
                for impl in ("manual", "tiled", "sdpa")}

    small, large = peaks(256), peaks(512)
    assert small["manual"] >= 2 * 256 * 256 * 4  # the scores and the weights, float32
    assert 3.5 < large["manual"] / small["manual"] < 4.5
    assert large["tiled"] / small["tiled"] < 2.5 and large["sdpa"] / small["sdpa"] < 2.5


def test_peak_memory_leaves_python_stderr_alone(capfd):
    peak_memory_bytes(lambda: print("kept", file=sys.stderr))
    sys.stderr.flush()
    captured = capfd.readouterr()
    assert "kept" in captured.err and "profiler_start" not in captured.err
    os.write(2, b"fd 2 restored\n")
    assert "fd 2 restored" in capfd.readouterr().err


def test_saved_tensor_bytes_of_the_three_paths():
    t, d = 64, 8
    q, k, v = (torch.randn(1, 2, t, d, requires_grad=True) for _ in range(3))
    vector = 2 * t * d * 4  # one (1, 2, T, d) float32 tensor
    lse = 2 * t * 4  # one number per query
    assert saved_tensor_bytes(lambda: tiled_attention(q, k, v, block_q=16, block_k=16)) == (
        4 * vector + lse)  # q, k, v, out and the log-sum-exp
    assert saved_tensor_bytes(lambda: attention(q, k, v, impl="sdpa")) == 4 * vector + lse
    manual = saved_tensor_bytes(lambda: attention(q, k, v, impl="manual"))
    assert manual >= 2 * t * t * 4  # the weights, (1, 2, T, T)
    with torch.no_grad():
        assert saved_tensor_bytes(lambda: attention(q, k, v, impl="manual")) == 0


def test_count_ops_tells_a_fused_call_from_a_python_loop():
    q = torch.randn(1, 1, 64, 8)
    assert count_ops(lambda: F.scaled_dot_product_attention(q, q, q)) == 1
    one_block = count_ops(lambda: tiled_attention(q, q, q, block_q=64, block_k=64))
    four_blocks = count_ops(lambda: tiled_attention(q, q, q, block_q=32, block_k=32))
    assert 1 < one_block < four_blocks


def test_sdpa_backend_on_the_cpu():
    q = torch.randn(1, 2, 8, 16)
    assert sdpa_backend(q, q, q) == "flash"  # PyTorch's CPU flash kernel
    assert sdpa_backend(q, q, q, is_causal=True) == "flash"
    assert sdpa_backend(q, q, q, dropout_p=0.5) == "math"  # the CPU flash kernel has no dropout
    assert sdpa_backend(q[0], q[0], q[0]) == "math"  # 3-D inputs
    assert sdpa_backend(q, q, q) in SDPA_BACKENDS
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        sdpa_backend(q, None, q)
    with pytest.raises(ValueError, match=r"refused q \(1, 2, 8, 16\).*k \(1, 2, 8, 7\)"):
        sdpa_backend(q, q[..., :7], q)  # a shape error stays an error


def test_sdpa_backend_names_a_kernel_missing_on_this_cpu(monkeypatch):
    """PyTorch's portable build on an Intel AMX CPU has no bfloat16 CPU kernel: say so."""
    import torch.nn.functional as F

    def missing(*args, **kwargs):
        raise RuntimeError("pack_vnni2 is only supported when avx512 is supported")

    monkeypatch.setattr(F, "scaled_dot_product_attention", missing)
    q = torch.randn(1, 2, 8, 16).bfloat16()
    assert sdpa_backend(q, q, q) == SDPA_MISSING


def test_median_seconds_and_bad_arguments():
    calls = []
    seconds = median_seconds(lambda: calls.append(1), repeats=3, warmup=2)
    assert len(calls) == 5 and 0 <= seconds < 1
    with pytest.raises(ValueError, match="repeats"):
        median_seconds(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        median_seconds(lambda: None, warmup=-1)
    for measure in (median_seconds, peak_memory_bytes, saved_tensor_bytes, count_ops):
        with pytest.raises(TypeError, match="fn must be callable"):
            measure("not a function")
    with pytest.raises(ValueError, match="device"):
        peak_memory_bytes(lambda: None, device="meta")


def test_operator_counts_name_each_operator_of_a_training_step_on_meta():
    """By name, and on the meta device (nothing computed): a linear layer's step."""
    from course_attn.lab.measure import operator_counts

    with torch.device("meta"):
        layer = torch.nn.Linear(4, 3, bias=False)
        x = torch.randn(2, 4)

    def step() -> None:
        layer(x).sum().backward()

    counts = operator_counts(step)
    assert counts["mm"] == 2  # forward x W^T, and the weight's gradient
    assert sum(counts.values()) == count_ops(step)


def test_module_calls_counts_each_module_call_by_class_and_removes_its_hook():
    """Chapter 11: every ``nn.Module`` call, nested ones included, and nothing after."""
    from course_attn.lab.measure import module_calls

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(3, 4)
    assert module_calls(lambda: net(x)) == {"Sequential": 1, "Linear": 2, "ReLU": 1}
    assert module_calls(lambda: (net(x), net[0](x))) == {"Sequential": 1, "Linear": 3,
                                                           "ReLU": 1}
    assert module_calls(lambda: F.relu(x)) == {}  # a function is no module call

    def fails() -> None:
        net(x)
        raise RuntimeError("inside")

    with pytest.raises(RuntimeError, match="inside"):
        module_calls(fails)
    from torch.nn.modules.module import _global_forward_pre_hooks
    assert not _global_forward_pre_hooks  # removed, even after a failure
    with pytest.raises(TypeError, match="fn must be callable"):
        module_calls("not a function")  # type: ignore[arg-type]
