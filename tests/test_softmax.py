"""Chapter 1: ``softmax`` and ``attention_pool`` (unit, property, gradient and bad-input tests)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_attn import attention_pool, softmax

# The 14 token weights of the source article 002 (see SEEDS.md).
SEED_WEIGHTS = [2.1, 1.3, 0.1, 0, -0.2, -1.3, 0.5, 0.2, -0.8, 0, 0.1, -0.7, -1.2, -0.4]
ARTICLE_SUM = 21.858  # what the article printed; wrong

LOW_PRECISION = [torch.float16, torch.bfloat16]
FLOATS = [torch.float32, torch.float64, *LOW_PRECISION]

finite = st.floats(min_value=-50.0, max_value=50.0, allow_nan=False, allow_infinity=False)
rows = st.lists(finite, min_size=1, max_size=16)
temperatures = st.floats(min_value=0.05, max_value=20.0)
fast = settings(max_examples=60, deadline=None)


def _tensor(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


# ---------------------------------------------------------------- worked example


def test_worked_example_of_the_source_article_with_the_corrected_sum():
    w = _tensor(SEED_WEIGHTS)
    total = w.exp().sum().item()
    alpha = softmax(w)
    assert round(total, 3) == 21.925
    assert round(alpha[0].item(), 4) == 0.3725
    assert round(alpha[1].item(), 4) == 0.1674
    assert round(alpha[5].item(), 4) == 0.0124
    # The article's denominator is not the sum of the 14 exponentials ...
    assert abs(total - ARTICLE_SUM) > 0.05
    # ... and its alpha_1 = 0.374 comes from that wrong sum: 8.166 / 21.858.
    assert round(math.exp(2.1) / ARTICLE_SUM, 3) == 0.374
    assert round(alpha[0].item(), 3) != 0.374
    # The alphas are exp(w_i) / sum: the definition, written out.
    torch.testing.assert_close(alpha, w.exp() / total)


# ---------------------------------------------------------------- properties


@fast
@given(rows, st.floats(min_value=-1e3, max_value=1e3), temperatures)
def test_shift_invariance(values, shift, temperature):
    x = _tensor(values)
    torch.testing.assert_close(
        softmax(x + shift, temperature=temperature), softmax(x, temperature=temperature)
    )


@fast
@given(rows, temperatures)
def test_output_is_a_distribution(values, temperature):
    p = softmax(_tensor(values), temperature=temperature)
    assert p.shape == (len(values),)
    assert (p >= 0).all()
    assert (p <= 1).all()
    torch.testing.assert_close(p.sum(), torch.tensor(1.0, dtype=torch.float64))


@fast
@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 6), st.integers(0, 2), st.data())
def test_every_slice_along_dim_sums_to_one(a, b, c, dim, data):
    seed = data.draw(st.integers(0, 2**16))
    x = torch.randn(a, b, c, generator=torch.Generator().manual_seed(seed)) * 10
    p = softmax(x, dim=dim)
    assert p.shape == x.shape
    torch.testing.assert_close(p.sum(dim=dim), torch.ones(x.sum(dim=dim).shape))
    torch.testing.assert_close(softmax(x, dim=dim - 3), p)  # negative dims too


@fast
@given(rows.filter(lambda v: sorted(v)[-1] - sorted(v + [-1e9])[-2] > 1e-6), temperatures)
def test_argmax_is_preserved(values, temperature):
    x = _tensor(values)
    assert softmax(x, temperature=temperature).argmax() == x.argmax()


@fast
@given(rows.filter(lambda v: len(v) > 1 and sorted(v)[-1] - sorted(v)[-2] > 0.1))
def test_small_temperature_approaches_one_hot(values):
    x = _tensor(values)
    one_hot = torch.nn.functional.one_hot(x.argmax(), len(values)).double()
    torch.testing.assert_close(softmax(x, temperature=1e-3), one_hot, atol=1e-12, rtol=0)
    # Far below any float's resolution: still exactly one-hot, never NaN.
    torch.testing.assert_close(softmax(x, temperature=1e-300), one_hot, atol=0, rtol=0)


@fast
@given(rows)
def test_large_temperature_approaches_uniform(values):
    p = softmax(_tensor(values), temperature=1e6)
    uniform = torch.full_like(p, 1 / len(values))
    torch.testing.assert_close(p, uniform, atol=1e-3 / len(values), rtol=0)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("temperature", [1e-50, 1e-300, 1e50, 1e300])
def test_extreme_temperatures_never_give_nan(dtype, temperature):
    # Such temperatures round to 0 or inf in float32 and below: 0/0 and -inf/inf are NaN.
    x = torch.tensor([1.0, 0.0, -1.0, float("-inf")], dtype=dtype)
    p = softmax(x, temperature=temperature)
    assert not torch.isnan(p).any()
    expected = [1.0, 0.0, 0.0, 0.0] if temperature < 1 else [1 / 3, 1 / 3, 1 / 3, 0.0]
    tolerance = 1e-2 if dtype in LOW_PRECISION else 1e-6
    torch.testing.assert_close(p.double(), torch.tensor(expected, dtype=torch.float64),
                               atol=tolerance, rtol=0)


def test_temperature_sharpens_and_flattens_monotonically():
    x = _tensor(SEED_WEIGHTS)
    top = [softmax(x, temperature=t)[0].item() for t in (0.25, 0.5, 1.0, 2.0, 4.0)]
    assert all(a > b for a, b in zip(top, top[1:], strict=False))
    torch.testing.assert_close(softmax(x, temperature=2.0), torch.softmax(x / 2.0, dim=-1))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("magnitude", [1e2, 1e3, 1e4])
def test_no_overflow_for_large_scores(dtype, magnitude):
    x = torch.tensor([[magnitude, magnitude - 1, 0.0, -magnitude],
                      [magnitude, magnitude, magnitude, magnitude]], dtype=dtype)
    naive = x.exp() / x.exp().sum(dim=-1, keepdim=True)
    if magnitude >= 1e3:  # exp(1000) is inf even in float64: the naive formula gives NaN
        assert torch.isnan(naive).any()
    p = softmax(x)
    assert p.dtype == dtype
    assert torch.isfinite(p).all()
    reference = torch.softmax(x.double(), dim=-1)
    tolerance = 1e-2 if dtype in LOW_PRECISION else 1e-6
    torch.testing.assert_close(p.double(), reference, atol=tolerance, rtol=0)
    torch.testing.assert_close(p[1].double(), torch.full((4,), 0.25, dtype=torch.float64))


@pytest.mark.parametrize("dtype", FLOATS)
def test_matches_torch_softmax_in_every_dtype(dtype):
    x = (torch.randn(6, 9, generator=torch.Generator().manual_seed(0)) * 5).to(dtype)
    expected = torch.softmax(x.float(), dim=-1).to(dtype)
    tolerance = {"atol": 1e-2, "rtol": 0} if dtype in LOW_PRECISION else {}
    torch.testing.assert_close(softmax(x), expected, **tolerance)
    torch.testing.assert_close(softmax(x, dim=0), torch.softmax(x.float(), 0).to(dtype),
                               **tolerance)


@fast
@given(st.integers(1, 3), st.integers(1, 7), st.integers(0, 2**16), temperatures)
def test_matches_torch_softmax_property(batch, t, seed, temperature):
    x = torch.randn(batch, t, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(softmax(x, temperature=temperature),
                               torch.softmax(x / temperature, dim=-1))


def test_a_single_minus_inf_gets_zero_weight():
    x = torch.tensor([1.0, float("-inf"), 0.0])
    p = softmax(x)
    assert p[1] == 0
    torch.testing.assert_close(p, torch.softmax(x, dim=-1))


# ---------------------------------------------------------------- gradients


def test_softmax_gradcheck_float64():
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: softmax(t), (x,))
    assert torch.autograd.gradcheck(lambda t: softmax(t, dim=0, temperature=0.7), (x,))
    assert torch.autograd.gradgradcheck(lambda t: softmax(t, temperature=2.5), (x,))


def test_softmax_gradient_matches_torch():
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    g = torch.randn(4, 6, dtype=torch.float64)
    (mine,) = torch.autograd.grad(softmax(x, temperature=0.5), x, g)
    (theirs,) = torch.autograd.grad(torch.softmax(x / 0.5, dim=-1), x, g)
    torch.testing.assert_close(mine, theirs)


@pytest.mark.parametrize("scale", [True, False])
def test_attention_pool_gradcheck_float64(scale):
    x = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    q = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: attention_pool(a, b, scale=scale), (x, q))


# ---------------------------------------------------------------- attention_pool


def _pool_by_hand(x: torch.Tensor, q: torch.Tensor, scale: bool) -> tuple[torch.Tensor, ...]:
    """One sequence, one query, written as the chapter derives it."""
    scores = torch.stack([x_t @ q for x_t in x])  # (T,)
    if scale:
        scores = scores / math.sqrt(x.shape[-1])
    weights = torch.softmax(scores, dim=-1)  # (T,)
    return sum(w * x_t for w, x_t in zip(weights, x, strict=True)), weights  # (D,), (T,)


@pytest.mark.parametrize(
    ("x_shape", "q_shape", "batch"),
    [
        ((5, 4), (4,), ()),
        ((3, 5, 4), (4,), (3,)),  # one query shared by a batch
        ((3, 5, 4), (3, 4), (3,)),  # one query per sequence
        ((2, 3, 5, 4), (3, 4), (2, 3)),  # queries broadcast over the first dim
        ((1, 5, 4), (6, 4), (6,)),  # one sequence, six queries
        ((2, 1, 5, 4), (1, 3, 4), (2, 3)),  # both sides broadcast
    ],
)
@pytest.mark.parametrize("scale", [True, False])
def test_attention_pool_shapes_and_values(x_shape, q_shape, batch, scale):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(x_shape, dtype=torch.float64, generator=gen)
    q = torch.randn(q_shape, dtype=torch.float64, generator=gen)
    pooled, weights = attention_pool(x, q, scale=scale)
    assert pooled.shape == (*batch, x_shape[-1])
    assert weights.shape == (*batch, x_shape[-2])
    xb = x.expand(*batch, *x_shape[-2:])
    qb = q.expand(*batch, q_shape[-1])
    for index in np.ndindex(*batch):
        expected_pooled, expected_weights = _pool_by_hand(xb[index], qb[index], scale)
        torch.testing.assert_close(pooled[index], expected_pooled)
        torch.testing.assert_close(weights[index], expected_weights)


def test_attention_pool_scale_divides_scores_by_sqrt_width():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(7, 16, dtype=torch.float64, generator=gen)
    q = torch.randn(16, dtype=torch.float64, generator=gen)
    _, scaled = attention_pool(x, q, scale=True)
    _, unscaled = attention_pool(x, q, scale=False)
    torch.testing.assert_close(scaled, torch.softmax(x @ q / 4.0, dim=-1))
    torch.testing.assert_close(unscaled, torch.softmax(x @ q, dim=-1))
    # Scaling the scores by 1/sqrt(D) is the same as a flatter temperature.
    torch.testing.assert_close(scaled, softmax(x @ q, temperature=4.0))
    assert scaled.max() < unscaled.max()  # dividing flattens the distribution here


@fast
@given(st.integers(1, 8), st.integers(1, 6), st.integers(0, 2**16), st.booleans())
def test_attention_pool_is_a_convex_combination(t, d, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, d, dtype=torch.float64, generator=gen) * 3
    q = torch.randn(d, dtype=torch.float64, generator=gen) * 3
    pooled, weights = attention_pool(x, q, scale=scale)
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert (pooled >= x.min(dim=0).values - 1e-12).all()
    assert (pooled <= x.max(dim=0).values + 1e-12).all()


def test_attention_pool_query_equal_to_a_token_picks_it_when_sharp():
    x = torch.eye(4, dtype=torch.float64) * 30  # four orthogonal tokens
    pooled, weights = attention_pool(x, x[2], scale=False)
    assert weights.argmax() == 2
    torch.testing.assert_close(pooled, x[2], atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", LOW_PRECISION)
def test_attention_pool_low_precision_keeps_dtype(dtype):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6, 8, generator=gen) * 100
    q = torch.randn(8, generator=gen)
    pooled, weights = attention_pool(x.to(dtype), q.to(dtype))
    assert pooled.dtype == weights.dtype == dtype
    assert torch.isfinite(pooled).all()
    torch.testing.assert_close(weights.float().sum(-1), torch.ones(2), atol=1e-2, rtol=0)


# ---------------------------------------------------------------- bad input

_t = torch.tensor
NAN, INF = float("nan"), float("inf")


def bad(name: str, error: type[Exception], pattern: str, *args: object, **kwargs: object):
    """One bad call: ``pattern`` must match the start of the message (it names the argument)."""
    return pytest.param(args, kwargs, error, pattern, id=name)


ONE = _t([1.0])
M23 = torch.ones(2, 3)
SOFTMAX_BAD = [
    bad("x list", TypeError, r"^x must be a torch\.Tensor", [1.0, 2.0]),
    bad("x numpy", TypeError, r"^x must be a torch\.Tensor", np.ones(3)),
    bad("x None", TypeError, r"^x must be a torch\.Tensor", None),
    bad("x int tensor", TypeError, r"^x must be a floating-point", _t([1, 2, 3])),
    bad("x bool tensor", TypeError, r"^x must be a floating-point", _t([True, False])),
    bad("x complex", TypeError, r"^x must be a floating-point", _t([1 + 1j])),
    bad("x 0-dim", ValueError, r"^x must have at least 1 dim", _t(1.0)),
    bad("x NaN", ValueError, r"^x contains NaN", _t([1.0, NAN])),
    bad("x all -inf", ValueError, r"^x has a slice that is all -inf", _t([[0.0, 1], [-INF, -INF]])),
    bad("x +inf", ValueError, r"^x has a slice .*\+inf", _t([1.0, INF])),
    bad("temperature 0", ValueError, r"^temperature must be a positive", ONE, temperature=0),
    bad("temperature -1", ValueError, r"^temperature must be a positive", ONE, temperature=-1.0),
    bad("temperature inf", ValueError, r"^temperature must be a positive finite", ONE,
        temperature=INF),
    bad("temperature nan", ValueError, r"^temperature must be a positive finite", ONE,
        temperature=NAN),
    bad("temperature bool", TypeError, r"^temperature must be a positive", ONE, temperature=True),
    bad("temperature str", TypeError, r"^temperature must be a positive", ONE, temperature="1"),
    bad("temperature None", TypeError, r"^temperature must be a positive", ONE, temperature=None),
    bad("temperature tensor", TypeError, r"^temperature must be a positive", ONE,
        temperature=_t(1.0)),
    bad("dim too big", ValueError, r"^dim must be in \[-2, 1\]", M23, dim=2),
    bad("dim too small", ValueError, r"^dim must be in \[-2, 1\]", M23, dim=-3),
    bad("dim str", TypeError, r"^dim must be an int", M23, dim="rows"),
    bad("dim float", TypeError, r"^dim must be an int", M23, dim=1.0),
    bad("dim bool", TypeError, r"^dim must be an int", M23, dim=True),
    bad("empty dim", ValueError, r"^x has size 0 along dim -1", torch.ones(3, 0)),
    bad("empty dim 0", ValueError, r"^x has size 0 along dim 0", torch.ones(0, 3), dim=0),
]

X32, Q2 = torch.ones(3, 2), torch.ones(2)
POOL_BAD = [
    bad("x list", TypeError, r"^x must be a torch\.Tensor", [[1.0, 2.0]], Q2),
    bad("query list", TypeError, r"^query must be a torch\.Tensor", X32, [1.0, 2.0]),
    bad("x int", TypeError, r"^x must be a floating", torch.ones(3, 2, dtype=torch.long), Q2),
    bad("query int", TypeError, r"^query must be a floating", X32, _t([1, 2])),
    bad("x 1-D", ValueError, r"^x must have at least 2 dim", torch.ones(4), torch.ones(4)),
    bad("query 0-D", ValueError, r"^query must have at least 1 dim", X32, _t(1.0)),
    bad("width mismatch", ValueError, r"^query must have the tokens' width D=4",
        torch.ones(3, 4), torch.ones(5)),
    bad("dtype mismatch", TypeError, r"^query dtype torch\.float64 differs from x dtype",
        torch.ones(3, 4), torch.ones(4, dtype=torch.float64)),
    bad("batch mismatch", ValueError, r"^query's leading dims \(5,\) do not broadcast",
        torch.ones(2, 3, 4), torch.ones(5, 4)),
    bad("batch mismatch 4-D", ValueError, r"^query's leading dims",
        torch.ones(2, 3, 5, 4), torch.ones(2, 4, 4)),
    bad("x NaN", ValueError, r"^x contains NaN or inf", _t([[NAN, 1.0], [0.0, 1.0]]), Q2),
    bad("x inf", ValueError, r"^x contains NaN or inf", _t([[INF, 1.0], [0.0, 1.0]]), Q2),
    bad("query NaN", ValueError, r"^query contains NaN or inf", X32, _t([NAN, 1.0])),
    bad("query -inf", ValueError, r"^query contains NaN or inf", X32, _t([-INF, 1.0])),
    bad("no tokens", ValueError, r"^x must have at least one token",
        torch.ones(2, 0, 4), torch.ones(4)),
    bad("zero width", ValueError, r"^x must have at least one token .* width D >= 1",
        torch.ones(3, 0), torch.ones(0)),
    bad("device mismatch", ValueError, r"^query is on cpu but x is on meta",
        torch.ones(3, 2, device="meta"), Q2),
    bad("scale str", TypeError, r"^scale must be a bool", X32, Q2, scale="yes"),
    bad("scale int", TypeError, r"^scale must be a bool", X32, Q2, scale=1),
    bad("scale None", TypeError, r"^scale must be a bool", X32, Q2, scale=None),
]


@pytest.mark.parametrize(("args", "kwargs", "error", "pattern"), SOFTMAX_BAD)
def test_softmax_bad_input_names_the_argument(args, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        softmax(*args, **kwargs)


@pytest.mark.parametrize(("args", "kwargs", "error", "pattern"), POOL_BAD)
def test_attention_pool_bad_input_names_the_argument(args, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        attention_pool(*args, **kwargs)


def test_bad_input_messages_say_what_came():
    with pytest.raises(ValueError, match=r"got -0\.5"):
        softmax(torch.ones(2), temperature=-0.5)
    with pytest.raises(TypeError, match=r"got dtype torch\.int64"):
        softmax(torch.ones(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"got query of shape \(5,\) for x of shape \(3, 4\)"):
        attention_pool(torch.ones(3, 4), torch.ones(5))
    with pytest.raises(ValueError, match=r"batch dims \(2,\)"):
        attention_pool(torch.ones(2, 3, 4), torch.ones(5, 4))



# ------------------------------------- issue 18: fp16 overflow and the NaN policy


def test_attention_pool_scores_half_precision_in_float32_instead_of_blaming_the_input():
    """fp16 tokens of 300: the dot products (360 000) exceed fp16's 65504. Scored in
    float32 they are fine; the input was never the problem."""
    x = torch.full((3, 4), 300.0, dtype=torch.float16)
    x[1] = 299.0
    pooled, weights = attention_pool(x, torch.full((4,), 300.0, dtype=torch.float16))
    assert pooled.dtype == weights.dtype == torch.float16
    assert torch.isfinite(pooled).all() and torch.isfinite(weights).all()
    reference, ref_weights = attention_pool(x.double(), torch.full((4,), 300.0,
                                                                   dtype=torch.float64))
    torch.testing.assert_close(weights.double(), ref_weights, atol=1e-3, rtol=0)
    torch.testing.assert_close(pooled.double(), reference, atol=0.5, rtol=0)


def test_attention_pool_says_when_finite_inputs_overflow_the_scores():
    x = torch.full((3, 4), 1e20)  # finite float32, but x . query = 4e40 > 3.4e38
    with pytest.raises(ValueError, match=r"^the scores x \. query overflowed torch.float32 "
                                         r"although x and query are finite"):
        attention_pool(x, torch.full((4,), 1e20))


def test_value_checks_of_the_teaching_functions_run_only_where_values_are_checkable():
    """The policy: softmax and attention_pool refuse NaN on the CPU, but never read values
    on a device where that costs a sync or has no values (meta stands in for a GPU)."""
    nan = torch.tensor([[1.0, float("nan")]])
    with pytest.raises(ValueError, match="x contains NaN"):
        softmax(nan)
    assert softmax(nan.to("meta")).device.type == "meta"
    pooled, weights = attention_pool(torch.ones(3, 2, device="meta"), torch.ones(2, device="meta"))
    assert pooled.shape == (2,) and weights.shape == (3,)
