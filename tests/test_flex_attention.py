"""Chapter 10: impl="flex", FlexAttention's compiled kernel, against the manual path.

Every mask of chapters 5 and 10 (causal, padding on either side, a sliding window, ALiBi, a
KV cache's offset, packed documents, a query with no key), forward and gradients, through
the compiled kernel. Compiling is what takes time here (seconds per kernel, a C++ build
on the CPU), so every case has the shapes (B, H) = (2, 2), lengths up to 16 and head sizes
up to 16: the path pads them all to one shape, and the cases share three kernels (causal
as code, a mask tensor, a mask tensor and a bias). The rest of the test suite runs
impl="flex" uncompiled (tests/conftest.py), and so does float64 here (the CPU kernel
takes none).
"""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch
from torch._dynamo.utils import counters
from torch.nn.attention.flex_attention import and_masks
from torch.testing import assert_close

from course_attn.core import flex_attention as flex
from course_attn.core.attention import attention
from course_attn.core.flex_attention import causal_mask_mod
from course_attn.core.masks import causal_mask, document_mask, padding_mask
from course_attn.modern.alibi import alibi_bias, alibi_slopes
from course_attn.modern.mask_mods import document_mask_mod
from course_attn.modern.sliding_window import sliding_window_mask

B, H, T, D = 2, 2, 12, 8
CXX = shutil.which(flex._cpp_compiler()) is not None
compiled = pytest.mark.skipif(not CXX, reason="no C++ compiler: the kernel cannot compile")


def _qkv(seed: int, t_q: int = T, t_k: int = T, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, t, D, generator=g, dtype=dtype) for t in (t_q, t_k, t_k))


def _doc_ids() -> torch.Tensor:
    """Two packed rows: documents of 5, 3 and 4 tokens, and of 2 and 10."""
    return torch.tensor([[0] * 5 + [1] * 3 + [2] * 4, [7] * 2 + [8] * 10])


def _cases() -> dict[str, dict]:
    """The masks of chapters 5 and 10 as attention() arguments (T_q = T_k = 12 unless said)."""
    right, left = (padding_mask([T, 7], T, side=side)[:, None, None, :]
                   for side in ("right", "left"))
    empty = causal_mask(T).clone()
    empty[3] = False  # query 3 may attend nothing: zeros, no NaN
    return {
        "causal": dict(is_causal=True),
        "padding right": dict(mask=right, is_causal=True),
        "padding left": dict(mask=left, is_causal=True),
        "sliding window": dict(mask=sliding_window_mask(T, window=4)),
        "alibi": dict(is_causal=True, bias=alibi_bias(T, T, alibi_slopes(H))),
        "kv cache offset": dict(is_causal=True, t_q=3),
        "documents": dict(mask=document_mask(_doc_ids())[:, None], is_causal=True),
        "fully masked row": dict(mask=empty),
    }


@compiled
@pytest.mark.parametrize("case", list(_cases()))
def test_the_compiled_kernel_equals_the_manual_path_in_outputs_and_gradients(case):
    kwargs = dict(_cases()[case])
    q0, k0, v0 = _qkv(3, t_q=kwargs.pop("t_q", T))
    results = []
    for impl in ("manual", "flex"):
        q, k, v = (x.clone().requires_grad_() for x in (q0, k0, v0))
        out, _ = attention(q, k, v, impl=impl, **kwargs)
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        results.append((out, q.grad, k.grad, v.grad))
    for manual, flexed in zip(*results, strict=True):
        assert torch.isfinite(flexed).all()
        assert_close(flexed, manual, atol=2e-5, rtol=1e-4)
    if case == "fully masked row":
        assert (results[1][0][:, :, 3] == 0).all() and (results[1][1][:, :, 3] == 0).all()
    assert getattr(flex.flex_kernel("cpu"), "_torchdynamo_orig_callable", None) is \
        flex.flex_attention  # the compiled kernel ran, not the uncompiled path


@compiled
def test_hand_written_mods_compile_and_differentiate_like_the_manual_path():
    """The decoder's mask on packed rows, as code: and_masks(causal, document), compiled.
    (course_attn.modern.mask_mods is tested on its own in tests/test_mask_mods.py.)"""
    g = torch.Generator().manual_seed(1)
    doc_ids = _doc_ids()
    q0, k0, v0 = (torch.randn(2, 2, 12, 8, generator=g) for _ in range(3))
    mod = and_masks(causal_mask_mod(), document_mask_mod(doc_ids))
    results = []
    for run in (lambda q, k, v: flex.flex_attend(q, k, v, mask_mod=mod),
                lambda q, k, v: attention(q, k, v, document_mask(doc_ids)[:, None],
                                          is_causal=True)[0]):  # the manual path
        q, k, v = (x.clone().requires_grad_() for x in (q0, k0, v0))
        out = run(q, k, v)
        out.pow(2).sum().backward()
        results.append((out, q.grad, k.grad, v.grad))
    for got, manual in zip(*results, strict=True):
        assert_close(got, manual, atol=2e-5, rtol=1e-4)
    assert getattr(flex.flex_kernel("cpu"), "_torchdynamo_orig_callable", None) is \
        flex.flex_attention


def test_gradcheck_in_float64_with_a_mask_and_a_bias(monkeypatch):
    """The forward is FlexAttention (uncompiled: the CPU kernel takes no float64), the
    backward the dense recomputation: gradcheck proves the two are one function (and the
    bias's gradient right)."""
    monkeypatch.setattr(flex, "FLEX_COMPILE", False)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 1, 4, 3, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    bias = torch.randn(4, 4, generator=g, dtype=torch.float64, requires_grad=True)
    mask = causal_mask(4) & torch.tensor([[[[1, 1, 0, 1]]], [[[1, 0, 1, 1]]]]).bool()
    mask[1, 0, 1] = False  # and a query with no key

    def run(q, k, v, bias):
        return attention(q, k, v, mask, bias=bias, impl="flex")[0]

    assert torch.autograd.gradcheck(run, (q, k, v, bias), fast_mode=True)


@compiled
def test_a_growing_kv_cache_reuses_its_kernel_until_its_length_doubles():
    """Decoding with a cache: one query, one more key at each step. The keys are padded to
    16 and the causal offset is a tensor the kernel reads: one kernel for all the steps."""
    q = torch.randn(B, H, 1, D)
    attention(q, *(torch.randn(B, H, 9, D) for _ in range(2)), is_causal=True, impl="flex")
    before = counters["stats"]["unique_graphs"]
    for t_k in range(10, 17):
        k, v = torch.randn(B, H, t_k, D), torch.randn(B, H, t_k, D)
        out, _ = attention(q, k, v, is_causal=True, impl="flex")
        assert_close(out, attention(q, k, v, is_causal=True)[0], atol=2e-6, rtol=1e-5)
    assert before >= 1  # the counter counts this process's kernels ...
    assert counters["stats"]["unique_graphs"] == before  # ... and the steps made none


def test_the_block_mask_of_a_mask_is_made_once_and_again_after_an_in_place_change(
        monkeypatch):
    made = []

    def counting(*args, **kwargs):
        made.append(args[3:5])
        return real(*args, **kwargs)

    real = flex.create_block_mask
    monkeypatch.setattr(flex, "create_block_mask", counting)
    monkeypatch.setattr(flex, "FLEX_COMPILE", False)
    q, k, v = _qkv(4)
    mask = sliding_window_mask(T, window=3)
    first = [attention(q, k, v, mask, impl="flex")[0] for _ in range(3)]  # three "layers"
    assert len(made) == 1 and made[0] == (16, 16)  # padded to 16 x 16, made once
    mask[:, :2] = True  # the same tensor, changed: its BlockMask is made again
    changed, _ = attention(q, k, v, mask, impl="flex")
    assert len(made) == 2
    assert_close(changed, attention(q, k, v, mask)[0])
    assert not torch.allclose(changed, first[0])


def test_without_a_cpp_compiler_it_says_so_once_and_runs_uncompiled(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-c++-compiler")
    monkeypatch.setattr(flex, "_WARNED", set())
    problem = flex.flex_compile_problem("cpu")
    assert "C++ compiler" in problem and "'no-such-c++-compiler' was not found" in problem
    assert "not float64" in flex.flex_compile_problem("cpu", torch.float64)
    q, k, v = _qkv(6)
    with pytest.warns(flex.FlexFallbackWarning, match=r"runs FlexAttention uncompiled on cpu"):
        out, _ = attention(q, k, v, is_causal=True, impl="flex")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, not at every call
        again, _ = attention(q, k, v, is_causal=True, impl="flex")
    assert getattr(flex.flex_kernel("cpu"), "_torchdynamo_orig_callable", None) is None
    for result in (out, again):
        assert_close(result, attention(q, k, v, is_causal=True)[0], atol=2e-6, rtol=1e-5)


@compiled
def test_a_compilation_that_fails_falls_back_with_its_reason(monkeypatch):
    from torch._inductor.exc import InvalidCxxCompiler

    def broken_kernel(*args, **kwargs):  # what a compiler that cannot build does
        raise InvalidCxxCompiler()

    for name, value in (("_WARNED", set()), ("_COMPILED", {"cpu": broken_kernel}),
                        ("_BROKEN", {})):
        monkeypatch.setattr(flex, name, value)
    q, k, v = _qkv(7)
    with pytest.warns(flex.FlexFallbackWarning, match=r"compiling it failed \(InvalidCxx"):
        out, _ = attention(q, k, v, causal_mask(T), impl="flex")
    assert_close(out, attention(q, k, v, causal_mask(T))[0], atol=2e-6, rtol=1e-5)
    assert flex.flex_kernel("cpu") is not broken_kernel  # not tried again


def test_dropout_is_computed_densely_with_one_warning_and_the_manual_paths_draws(monkeypatch):
    monkeypatch.setattr(flex, "_WARNED", set())
    q, k, v = _qkv(8)
    with pytest.warns(flex.FlexFallbackWarning, match=r"FlexAttention has no dropout"):
        torch.manual_seed(0)
        dropped, _ = attention(q, k, v, is_causal=True, dropout_p=0.3, impl="flex")
    torch.manual_seed(0)
    manual, _ = attention(q, k, v, is_causal=True, dropout_p=0.3, impl="manual")
    assert_close(dropped, manual)  # the same random draws, in the same order
    plain, _ = attention(q, k, v, is_causal=True, impl="manual")
    assert not torch.allclose(dropped, plain)


def test_half_precision_keeps_its_dtype_and_matches_float32(monkeypatch):
    monkeypatch.setattr(flex, "FLEX_COMPILE", False)
    q, k, v = _qkv(9)
    out16, _ = attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True,
                         impl="flex")
    assert out16.dtype == torch.bfloat16
    assert_close(out16.float(), attention(q, k, v, is_causal=True)[0], atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5, 3), (2, 3, 2, 5, 3)])
def test_any_batch_shape_is_seen_as_batch_and_heads_and_given_back(shape, monkeypatch):
    monkeypatch.setattr(flex, "FLEX_COMPILE", False)
    g = torch.Generator().manual_seed(10)
    q = torch.randn(shape, generator=g)
    k, v = torch.randn(shape, generator=g), torch.randn(*shape[:-1], 7, generator=g)
    mask = torch.rand(shape[-2], shape[-2], generator=g) > 0.5
    out, weights = attention(q, k, v, mask, impl="flex")
    assert weights is None and out.shape == (*shape[:-1], 7)
    assert_close(out, attention(q, k, v, mask)[0], atol=2e-6, rtol=1e-5)


def test_the_kernel_reads_the_course_convention_true_means_may_attend(monkeypatch):
    """A mask that allows one key per query copies that key's value."""
    monkeypatch.setattr(flex, "FLEX_COMPILE", False)
    q, k, v = _qkv(11)
    pick = torch.zeros(T, T, dtype=torch.bool)
    pick[torch.arange(T), torch.arange(T).flip(0)] = True  # query i sees key T - 1 - i only
    out, _ = attention(q, k, v, pick, impl="flex")
    assert_close(out, v.flip(-2))


@pytest.mark.skipif(flex.flex_compile_problem("cpu") is not None, reason="no C++ compiler")
def test_the_compiled_kernel_outlives_dynamos_default_of_eight_recompilations(monkeypatch):
    # each new mask_mod or shape recompiles the one compiled flex_attention; past dynamo's
    # default limit (8) it would run uncompiled, silently slower (chapter 10 compiles more)
    limits = []

    def fake_compile(fn, **options):
        return lambda *args, **kwargs: limits.append(torch._dynamo.config.recompile_limit)

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(flex, "_COMPILED", {})
    flex.flex_kernel("cpu")(None, None, None)
    assert limits and limits[0] >= 32
    assert torch._dynamo.config.recompile_limit == 8  # raised for the call only
