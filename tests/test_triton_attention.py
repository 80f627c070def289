"""Chapter 9's kernel: FlashAttention-2 in Triton against the manual path and SDPA (issue 27).

Without a GPU the kernels run under Triton's interpreter, which must be on before triton
is first imported (``tests/conftest.py`` switches it on for the whole run; this module does
too when run alone). With a GPU the same tests run the compiled kernels on it. Where
triton is not installed, the tests that need it skip, and the error the path raises then
is tested. Shapes stay small: the interpreter runs every program in Python.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch

if not torch.cuda.is_available():  # before anything imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.testing import assert_close  # noqa: E402

from course_attn import triton_attention  # noqa: E402
from course_attn.core import triton_attention as module  # noqa: E402
from course_attn.core.attention import ATTENTION_IMPLS, attention  # noqa: E402
from course_attn.core.layers import MultiHeadAttention  # noqa: E402
from course_attn.models.gpt import GPTConfig, MiniGPT  # noqa: E402
from course_attn.train.cli import build_parser  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_triton = pytest.mark.skipif(not module.TRITON_FOUND,
                                  reason="triton is not installed (Linux only)")
#: The issue's bar: float32 forward and gradients equal the manual path to 1e-5.
EXACT = dict(rtol=1e-5, atol=1e-5)


def _qkv(b_h: tuple[int, ...], t_q: int, t_k: int, d_k: int, d_v: int, seed: int,
         dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    shapes = ((*b_h, t_q, d_k), (*b_h, t_k, d_k), (*b_h, t_k, d_v), (*b_h, t_q, d_v))
    q, k, v, grad_out = (torch.randn(s, generator=g, dtype=dtype).to(DEVICE) for s in shapes)
    return q, k, v, grad_out


def _run(impl: str, q, k, v, grad_out, mask=None, **options):
    """``(out, dq, dk, dv)`` of one path, for the same upstream gradient."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    if impl == "triton-blocks":  # the checked function, with explicit tile sizes
        out = triton_attention(q, k, v, mask, **options)
    else:
        out, _ = attention(q, k, v, mask, impl=impl, **options)
    out.backward(grad_out)
    return (out, q.grad, k.grad, v.grad)


def _key_padding(batch: int, t_k: int, lengths: list[int]) -> torch.Tensor:
    """``(B, 1, 1, T_k)``: ``True`` on each row's first ``lengths[b]`` keys (chapter 5)."""
    mask = torch.arange(t_k)[None, :] < torch.tensor(lengths)[:, None]  # (B, T_k)
    return mask[:, None, None, :].to(DEVICE)


CASES = {
    # name: (batch x heads, T_q, T_k, d_k, d_v, causal, key lengths or None)
    "square": ((2, 2), 32, 32, 16, 16, False, None),
    "causal": ((2, 2), 32, 32, 16, 16, True, None),
    "ragged-T": ((1, 3), 37, 37, 32, 32, True, None),
    "T_q<T_k causal (a cache)": ((2, 1), 9, 45, 16, 24, True, None),
    "T_q>T_k causal (rows with no key)": ((1, 2), 40, 23, 24, 16, True, None),
    "key padding": ((3, 2), 20, 20, 16, 16, False, [20, 13, 1]),
    "key padding, causal": ((3, 2), 33, 33, 16, 8, True, [33, 17, 5]),
    "a row with no key": ((2, 1), 12, 19, 16, 16, False, [19, 0]),
    "head size 64": ((1, 2), 24, 40, 64, 64, False, None),
    "head size 128": ((1, 1), 17, 17, 128, 128, True, None),
    "tiny head size": ((2,), 6, 7, 4, 3, False, None),
}


@needs_triton
@pytest.mark.parametrize("name", list(CASES))
def test_forward_and_every_gradient_equal_the_manual_path_and_sdpa(name):
    b_h, t_q, t_k, d_k, d_v, causal, lengths = CASES[name]
    q, k, v, grad_out = _qkv(b_h, t_q, t_k, d_k, d_v, seed=len(name))
    mask = None if lengths is None else _key_padding(b_h[0], t_k, lengths)
    if mask is not None and len(b_h) == 1:
        mask = mask[:, 0]  # (B, 1, T_k): no head axis
    manual = _run("manual", q, k, v, grad_out, mask, is_causal=causal)
    sdpa = _run("sdpa", q, k, v, grad_out, mask, is_causal=causal)
    kernel = _run("triton", q, k, v, grad_out, mask, is_causal=causal)
    for what, want, fused, got in zip(("out", "dq", "dk", "dv"), manual, sdpa, kernel,
                                      strict=True):
        assert torch.isfinite(got).all(), what
        assert_close(got, want, **EXACT, msg=lambda m, w=what: f"{w}: {m}")
        assert_close(got, fused, **EXACT, msg=lambda m, w=what: f"{w} vs sdpa: {m}")


@needs_triton
@pytest.mark.parametrize(("block_q", "block_k"), [(16, 16), (16, 32), (32, 16), (64, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_any_tile_size_gives_the_same_answer(block_q, block_k, causal):
    q, k, v, grad_out = _qkv((1, 2), 45, 50, 16, 16, seed=3)
    mask = _key_padding(1, 50, [41])
    manual = _run("manual", q, k, v, grad_out, mask, is_causal=causal)
    kernel = _run("triton-blocks", q, k, v, grad_out, mask, is_causal=causal,
                  block_q=block_q, block_k=block_k)
    for want, got in zip(manual, kernel, strict=True):
        assert_close(got, want, **EXACT)


TILE_CASES = [  # (T_q, T_k, block_q, block_k, causal, backward, key padding, bias)
    (45, 45, 16, 32, True, "pair", False, False),
    (45, 45, 32, 16, True, "atomic", False, True),
    (20, 50, 16, 16, True, "pair", False, True),
    (20, 50, 32, 16, True, "atomic", False, False),
    (50, 20, 16, 32, True, "pair", False, False),
    (50, 20, 16, 16, True, "atomic", False, False),
    (64, 64, 32, 16, False, "pair", False, False),
    (45, 50, 16, 32, False, "atomic", False, True),
    (45, 45, 16, 16, True, "atomic", True, False),
]


@needs_triton
@pytest.mark.parametrize(("t_q", "t_k", "block_q", "block_k", "causal", "backward", "padded",
                          "biased"), TILE_CASES)
def test_unmasked_and_masked_tiles_of_every_kernel_equal_the_manual_path(
        t_q, t_k, block_q, block_k, causal, backward, padded, biased):
    """Several tiles each way, so that every kernel runs both its loops: the tiles every
    query sees whole (no mask arithmetic) and the masked ones (the causal diagonal, a ragged
    last tile, T_q != T_k); both kinds of backward."""
    q, k, v, grad_out = _qkv((2, 2), t_q, t_k, 16, 8, seed=t_q + t_k)
    mask = _key_padding(2, t_k, [t_k, t_k - 7]) if padded else None
    g = torch.Generator().manual_seed(16)
    bias = torch.randn(2, 1, t_q, t_k, generator=g).to(DEVICE) if biased else None
    manual = _run("manual", q, k, v, grad_out, mask, is_causal=causal, bias=bias)
    kernel = _run("triton-blocks", q, k, v, grad_out, mask, is_causal=causal, bias=bias,
                  block_q=block_q, block_k=block_k, backward=backward)
    for what, want, got in zip(("out", "dq", "dk", "dv"), manual, kernel, strict=True):
        assert torch.isfinite(got).all(), what
        assert_close(got, want, **EXACT, msg=lambda m, w=what: f"{w}: {m}")


@needs_triton
def test_the_tuners_length_key_is_a_power_of_four_bucket():
    from course_attn.core.triton_kernels import length_bucket

    assert [length_bucket(t) for t in (1, 256, 257, 1024, 4096, 4097, 16384)] == \
        [256, 256, 1024, 1024, 4096, 16384, 16384]


@needs_triton
@pytest.mark.parametrize("backward", module.TRITON_BACKWARDS)
def test_tuning_times_each_configuration_on_the_real_outputs_and_keeps_them_right(
        monkeypatch, backward):
    """The tuned launch path, under the interpreter with two configurations a kernel and a
    stand-in timer: the tuner runs every kernel once per configuration on the real outputs
    (the atomic dQ is zeroed before each run), then launches its choice directly."""
    if DEVICE.type == "cuda":
        pytest.skip("the GPU tunes for real: benchmarks/gpu_check.sh checks its results")
    import triton

    from course_attn.core import triton_kernels as kernels

    runs = []

    def once(kernel_call, quantiles):  # a timer that runs the kernel and says 1 ms
        kernel_call()
        runs.append(1)
        return [1.0, 1.0, 1.0]

    two = [triton.Config({"BLOCK_Q": bq, "BLOCK_K": bk}, num_warps=4, num_stages=2)
           for bq, bk in ((16, 32), (32, 16))]
    tuners = kernels.build_tuners(two, two, two, do_bench=once)
    monkeypatch.setattr(kernels, "tuners", tuners)
    monkeypatch.setattr(kernels, "TUNED_DTYPES", (torch.float32,))
    monkeypatch.setattr(kernels, "TUNE_MIN_LENGTH", 0)
    q, k, v, grad_out = _qkv((1, 2), 40, 40, 16, 16, seed=17)
    manual = _run("manual", q, k, v, grad_out, is_causal=True)
    for _ in range(2):  # the first call tunes, the second launches the chosen configuration
        tuned = _run("triton-blocks", q, k, v, grad_out, is_causal=True, backward=backward)
        for want, got in zip(manual, tuned, strict=True):
            assert_close(got, want, **EXACT)
    kinds = ("forward", "dk_dv_dq") if backward == "atomic" else ("forward", "dk_dv", "dq")
    assert len(runs) == 2 * len(kinds)  # timed once, on the first call only
    for kind in kinds:
        chosen = getattr(tuners, kind).chosen
        assert len(chosen) == 1
        config = next(iter(chosen.values()))
        assert (config["BLOCK_Q"], config["BLOCK_K"]) in {(16, 32), (32, 16)}


@needs_triton
def test_a_configuration_that_fails_to_compile_is_skipped_by_the_tuner():
    """The autotuner skips only resource errors; a compiler error of one configuration on
    some Triton and GPU must cost that configuration, not the call."""
    from course_attn.core import triton_kernels as kernels

    def broken():
        raise RuntimeError("PassManager::run failed")

    timer = kernels.build_tuners().forward.tuner.do_bench
    with pytest.warns(RuntimeWarning, match=r"a Triton configuration was skipped"):
        assert timer(broken, quantiles=(0.5, 0.2, 0.8)) == [float("inf")] * 3


@pytest.mark.skipif(DEVICE.type != "cuda", reason="tuning runs on a GPU only")
@pytest.mark.parametrize("backward", module.TRITON_BACKWARDS)
def test_the_tuned_kernel_in_bfloat16_matches_float32_on_a_gpu(backward):
    """bf16 from 256 positions on: the tuner's configurations, forward and both backwards
    (the shape's specialisations are the GPU check's T = 1024, so it compiles them once)."""
    from course_attn.core import triton_kernels as kernels

    q, k, v, grad_out = _qkv((1, 16), 512, 512, 64, 64, seed=19)
    full = _run("manual", q, k, v, grad_out, is_causal=True)
    half = _run("triton-blocks", *(t.bfloat16() for t in (q, k, v, grad_out)), is_causal=True,
                backward=backward)
    assert kernels.tuners is not None and kernels.tuners.forward.chosen  # it was tuned
    for what, want, got in zip(("out", "dq", "dk", "dv"), full, half, strict=True):
        assert got.dtype == torch.bfloat16
        assert_close(got.float(), want, rtol=0.05, atol=0.05,
                     msg=lambda m, w=what: f"{w}: {m}")


@pytest.mark.skipif(DEVICE.type != "cuda", reason="a compiled run on a GPU only")
def test_the_pair_backward_gives_the_same_bits_on_every_run_on_a_gpu():
    """Chapter 9: each program of the pair backward writes only its own rows, with no
    atomic additions, so repeated runs give the same gradients to the last bit (the shape of
    the tuned test above, so the kernels are compiled once)."""
    q, k, v, grad_out = (t.bfloat16() for t in _qkv((1, 16), 512, 512, 64, 64, seed=23))
    first = _run("triton-blocks", q, k, v, grad_out, is_causal=True, backward="pair")
    for _ in range(3):
        again = _run("triton-blocks", q, k, v, grad_out, is_causal=True, backward="pair")
        for what, a, b in zip(("out", "dq", "dk", "dv"), first, again, strict=True):
            assert torch.equal(a, b), f"{what} changed from one run to the next"


@needs_triton
def test_the_interpreter_keeps_one_fixed_configuration():
    from course_attn.core import triton_kernels as kernels

    if DEVICE.type == "cuda":
        assert kernels.tuners is not None  # compiled: half precision is tuned
        return
    assert kernels.INTERPRETING and kernels.tuners is None
    q, k, v, grad_out = _qkv((1, 2), 12, 12, 32, 32, seed=18, dtype=torch.bfloat16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    with kernels.launches_recorded() as calls:
        attention(q, k, v, is_causal=True, impl="triton")[0].backward(grad_out)
    assert [name for name, _, _ in calls] == ["forward_kernel", "backward_delta_kernel",
                                              "backward_dk_dv_kernel", "backward_dq_kernel"]
    for name, _, options in calls:
        if name != "backward_delta_kernel":
            assert (options["BLOCK_Q"], options["BLOCK_K"]) == \
                module.default_triton_blocks(32, torch.float32)


@needs_triton
@pytest.mark.parametrize("layout", ["(B, H, T, d)", "(B, T, H, d) seen as (B, H, T, d)"])
def test_a_models_call_reaches_the_kernel_without_copies_or_a_mask(layout):
    """A model's q, k, v go to the kernel as they are (same memory, their strides), causal
    self-attention sends no mask at all, and the output is laid out like q, so that merging
    the heads afterwards is a view; in the backward the gradients keep that layout too."""
    from course_attn.core import triton_kernels as kernels

    b, h, t, d = 2, 3, 20, 16
    shape = (b, h, t, d) if layout.startswith("(B, H") else (b, t, h, d)
    q, k, v = (torch.randn(*shape, device=DEVICE, requires_grad=True) for _ in range(3))
    views = [x if layout.startswith("(B, H") else x.transpose(1, 2) for x in (q, k, v)]
    with kernels.launches_recorded() as calls:
        out, _ = module.attention_triton(*views, is_causal=True)
        grads = torch.autograd.grad(out, views, torch.ones_like(out))
    name, args, options = calls[0]
    assert name == "forward_kernel"
    assert [a.data_ptr() for a in args[:3]] == [x.data_ptr() for x in (q, k, v)]  # no copy
    assert options["IS_CAUSAL"] and not options["HAS_MASK"]  # no mask built
    assert args[5] is args[0]  # the mask's argument is only a placeholder
    assert out.stride() == views[0].stride()  # (B, T, H, d) memory stays (B, T, H, d)
    assert all(g.stride() == x.stride() for g, x in zip(grads, views, strict=True))


def test_the_backward_kind_is_checked():
    q = torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match=r"backward must be one of \('pair', 'atomic'\), "
                                         r"got 'single'"):
        triton_attention(q, q, q, backward="single")


@needs_triton
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN keys
def test_rows_with_no_allowed_key_give_zeros_and_zero_gradients():
    q, k, v, grad_out = _qkv((2, 2), 20, 12, 16, 16, seed=4)
    mask = torch.ones(2, 2, 20, 12, dtype=torch.bool, device=DEVICE)
    mask[0, 1, 5] = False  # one query of one head sees nothing
    mask[1] = False  # a whole batch row sees nothing
    k[1], v[1] = float("nan"), float("inf")  # ... and its keys are garbage
    out, grad_q, grad_k, grad_v = _run("triton", q, k, v, grad_out, mask, is_causal=True)
    for t in (out, grad_q, grad_k, grad_v):
        assert torch.isfinite(t).all()
    assert (out[0, 1, 5] == 0).all() and (out[1] == 0).all()
    assert (grad_q[0, 1, 5] == 0).all() and (grad_q[1] == 0).all()
    assert (grad_k[1] == 0).all() and (grad_v[1] == 0).all()
    # T_q > T_k under the causal mask: the first T_q - T_k queries see no key at all
    assert (out[0, 0, :8] == 0).all() and (out[0, 0, 8:].abs().sum(-1) > 0).all()


@needs_triton
def test_a_general_mask_a_bias_and_their_gradients():
    """A (T_q, T_k) mask of any pattern and ALiBi-like bias with its gradient."""
    q, k, v, grad_out = _qkv((2, 3), 21, 26, 16, 16, seed=5)
    g = torch.Generator().manual_seed(6)
    mask = (torch.rand(21, 26, generator=g) > 0.3).to(DEVICE)  # broadcast over B and H
    bias0 = torch.randn(3, 21, 26, generator=g).to(DEVICE)  # per head, broadcast over B
    results = {}
    for impl in ("manual", "triton"):
        bias = bias0.clone().requires_grad_()
        results[impl] = (*_run(impl, q, k, v, grad_out, mask, bias=bias, is_causal=True),)
        out, _ = attention(q, k, v, mask, bias=bias, is_causal=True, impl=impl)
        (grad_bias,) = torch.autograd.grad(out, bias, grad_out)
        results[impl] += (grad_bias,)
    for want, got in zip(results["manual"], results["triton"], strict=True):
        assert_close(got, want, **EXACT)


@needs_triton
def test_broadcast_batch_dimensions_sum_their_gradients():
    q, _, _, _ = _qkv((2, 1), 10, 10, 16, 16, seed=7)
    _, k, v, grad_out = _qkv((1, 3), 10, 10, 16, 16, seed=8)
    grad_out = grad_out.expand(2, 3, 10, 16).contiguous()
    manual = _run("manual", q, k, v, grad_out, is_causal=True)
    kernel = _run("triton", q, k, v, grad_out, is_causal=True)
    for want, got in zip(manual, kernel, strict=True):
        assert got.shape == want.shape
        assert_close(got, want, **EXACT)


@needs_triton
@pytest.mark.parametrize("backward", module.TRITON_BACKWARDS)
def test_gradcheck_in_float64_with_mask_bias_and_causal(backward):
    """float64 tiles multiply without tl.dot (Triton has no float64 MMA at these sizes); on a
    GPU with ``FLOAT64_ON_CUDA = False`` the path refuses float64 clearly instead."""
    q, k, v, _ = _qkv((1, 1), 5, 6, 4, 3, seed=9, dtype=torch.float64)
    bias = torch.randn(5, 6, dtype=torch.float64, device=DEVICE)
    mask = torch.tensor([True, True, False, True, True, True], device=DEVICE)
    inputs = tuple(t.requires_grad_() for t in (q, k, v, bias))

    def f(q, k, v, bias):
        return triton_attention(q, k, v, mask, is_causal=True, bias=bias, backward=backward)

    if DEVICE.type == "cuda" and not module.FLOAT64_ON_CUDA:
        with pytest.raises(TypeError, match=r"q has dtype torch.float64"):
            f(*inputs)
        return
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6)


def test_float64_on_cuda_is_refused_before_compiling_when_switched_off():
    cuda = torch.device("cuda")  # a device name: no GPU needed
    with pytest.raises(TypeError, match=r"impl='triton' on a CUDA GPU takes float32, float16 "
                                        r"or bfloat16 tensors: q has dtype torch.float64"):
        module.check_kernel_dtype(torch.float64, cuda, float64_on_cuda=False)
    module.check_kernel_dtype(torch.float64, cuda, float64_on_cuda=True)  # the kernel's tiles
    module.check_kernel_dtype(torch.float64, torch.device("cpu"), float64_on_cuda=False)
    module.check_kernel_dtype(torch.bfloat16, cuda, float64_on_cuda=False)
    assert module.default_triton_blocks(4, torch.float64) == (16, 16)


@needs_triton
def test_dropout_is_the_same_mask_in_forward_and_backward():
    """With v = I the output is the dropped weights themselves: read the mask off it, then
    check the kernel's gradients against the manual path with that very mask."""
    t, p = 24, 0.3
    q, k, _, grad_out = _qkv((2, 1), t, t, 16, t, seed=10)
    eye = torch.eye(t, device=DEVICE).expand(2, 1, t, t)
    torch.manual_seed(11)
    dropped = attention(q, k, eye, is_causal=True, dropout_p=p, impl="triton")[0]
    _, weights = attention(q, k, eye, is_causal=True, impl="manual")
    keep = dropped != 0
    allowed = torch.ones(t, t, dtype=torch.bool, device=DEVICE).tril()
    share = keep[..., allowed].float().mean().item()
    assert 0.6 < share < 0.8  # about 1 - p of the weights survive
    assert_close(dropped, torch.where(keep, weights / (1 - p), 0.0), **EXACT)

    _, _, v, _ = _qkv((2, 1), t, t, 16, 16, seed=12)
    torch.manual_seed(11)  # the same seed: the same dropout mask
    kernel = _run("triton", q, k, v, grad_out[..., :16], is_causal=True, dropout_p=p)
    q2, k2, v2 = (x.clone().requires_grad_() for x in (q, k, v))
    _, w = attention(q2, k2, v2, is_causal=True, impl="manual")
    out = torch.where(keep, w / (1 - p), 0.0) @ v2  # (2, 1, t, t) @ (2, 1, t, 16)
    out.backward(grad_out[..., :16])
    for want, got in zip((out, q2.grad, k2.grad, v2.grad), kernel, strict=True):
        assert_close(got, want, **EXACT)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_keeps_its_dtype_and_matches_float32(dtype):
    q, k, v, grad_out = _qkv((2, 2), 30, 30, 32, 32, seed=13)
    full = _run("manual", q, k, v, grad_out, is_causal=True)
    half = _run("triton", q.to(dtype), k.to(dtype), v.to(dtype), grad_out.to(dtype),
                is_causal=True)
    for want, got in zip(full, half, strict=True):
        assert got.dtype == dtype
        assert_close(got.float(), want, rtol=0.05, atol=0.05)


@needs_triton
def test_the_plain_case_equals_pytorchs_own_sdpa():
    q, k, v, _ = _qkv((2, 4), 50, 50, 32, 32, seed=14)
    out, weights = attention(q, k, v, is_causal=True, impl="triton")
    assert weights is None  # the kernel never forms the weights
    assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), **EXACT)


def test_shapes_on_the_meta_device_without_running_a_kernel():
    if not module.TRITON_FOUND:
        pytest.skip("triton is not installed (Linux only)")
    q = torch.randn(2, 3, 9, 16, device="meta", requires_grad=True)
    v = torch.randn(2, 3, 11, 8, device="meta")
    out, _ = attention(q, torch.randn(2, 3, 11, 16, device="meta"), v, is_causal=True,
                       dropout_p=0.1, impl="triton")
    out.sum().backward()
    assert out.shape == (2, 3, 9, 8) and out.device.type == "meta"
    assert q.grad is not None and q.grad.shape == q.shape


# ------------------------------------------------------------------- the model and the CLI
@needs_triton
def test_a_tiny_minigpt_trains_through_the_kernel_like_through_the_manual_path():
    idx = torch.randint(13, (2, 9), generator=torch.Generator().manual_seed(15)).to(DEVICE)
    grads = {}
    for impl in ("manual", "triton"):
        torch.manual_seed(0)
        model = MiniGPT(GPTConfig(vocab_size=13, context_length=12, n_layers=2, n_heads=2,
                                  d_model=32, impl=impl)).to(DEVICE)
        _, loss = model(idx, idx)
        loss.backward()
        grads[impl] = (loss.detach(), model.embed.weight.grad)
    assert torch.isfinite(grads["triton"][0])
    for want, got in zip(grads["manual"], grads["triton"], strict=True):
        assert_close(got, want, **EXACT)


def test_the_cli_and_the_config_accept_triton():
    assert "triton" in ATTENTION_IMPLS
    assert build_parser().parse_args(["--impl", "triton"]).impl == "triton"
    assert GPTConfig(vocab_size=5, context_length=8, impl="triton").impl == "triton"


# ------------------------------------------------------------------ what the door refuses
@pytest.mark.parametrize(("shapes", "match"), [
    (((4, 129), (4, 129), (4, 8)), r"impl='triton' takes head sizes up to 128: q has d_k = 129"),
    (((4, 8), (4, 8), (4, 200)), r"impl='triton' takes head sizes up to 128: v has d_v = 200"),
])
def test_heads_wider_than_128_are_refused_at_the_door(shapes, match):
    q, k, v = (torch.randn(*s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        attention(q, k, v, impl="triton")
    with pytest.raises(ValueError, match=match):
        triton_attention(q, k, v)


@pytest.mark.parametrize(("options", "error", "match"), [
    (dict(block_q=24), ValueError, r"block_q must be a power of two >= 16, got 24"),
    (dict(block_k=8), ValueError, r"block_k must be a power of two >= 16, got 8"),
    (dict(block_k=16.0), TypeError, r"block_k must be a positive int"),
    (dict(block_q=0), ValueError, r"block_q must be a positive int"),
])
def test_tile_sizes_are_checked(options, error, match):
    q = torch.randn(2, 4, 8)
    with pytest.raises(error, match=match):
        triton_attention(q, q, q, **options)


def test_without_triton_the_path_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(module, "TRITON_FOUND", False)
    q = torch.randn(2, 4, 8)
    with pytest.raises(ModuleNotFoundError, match=r"needs the triton package.*pip install"):
        attention(q, q, q, impl="triton")


@pytest.mark.skipif(DEVICE.type != "cpu" or not module.TRITON_FOUND,
                    reason="CPU tensors without the interpreter: a CPU-only run with triton")
def test_cpu_tensors_without_the_interpreter_say_how_to_turn_it_on(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = torch.randn(2, 4, 16)
    with pytest.raises(RuntimeError, match=r"TRITON_INTERPRET'\] = '1' before triton"):
        attention(q, q, q, impl="triton")


def test_importing_the_package_does_not_import_triton():
    code = "import sys, course_attn; print('triton' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120)
    assert result.stdout.split() == ["False"]


def test_a_layer_or_model_built_for_the_kernel_refuses_wide_heads_at_construction():
    with pytest.raises(ValueError, match=r"impl='triton' takes head sizes up to 128, got "
                                         r"head_dim = d_model / n_heads = 256"):
        GPTConfig(vocab_size=5, context_length=8, d_model=256, n_heads=1, impl="triton")
    with pytest.raises(ValueError, match=r"head_dim = d_model / n_heads = 160"):
        MultiHeadAttention(320, 2, impl="triton")
    assert MultiHeadAttention(256, 2, impl="triton").head_dim == 128  # the limit itself
