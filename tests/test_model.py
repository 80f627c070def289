"""Chapter 11: MiniGPT (forward, causality, padding, KV-cache decoding, sampling, bad inputs)."""

from __future__ import annotations

import pytest
import torch

from course_attn import attention_maps
from course_attn._validation import trusting
from course_attn.core.layers import TransformerBlock
from course_attn.lab.measure import operator_counts
from course_attn.models.decoding import pick_next
from course_attn.models.gpt import GPTConfig, MiniGPT, next_token_loss

V = 13


def tiny(impl: str = "manual", **overrides) -> MiniGPT:
    torch.manual_seed(0)
    config = dict(vocab_size=V, context_length=12, n_layers=2, n_heads=2, d_model=16, impl=impl)
    config.update(overrides)
    return MiniGPT(GPTConfig(**config)).double().eval()


# Left-padded prompts: row lengths 5, 3, 1 (pads hold arbitrary ids on purpose).
IDX = torch.tensor([[3, 1, 4, 1, 5], [9, 9, 2, 6, 5], [7, 7, 7, 7, 3]])
MASK = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 1]], dtype=torch.bool)


def test_config_validation():
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(vocab_size=10, context_length=8, n_heads=3, d_model=16)
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig(vocab_size=10, context_length=8, dropout=1.0)
    with pytest.raises(ValueError, match="context_length"):
        GPTConfig(vocab_size=10, context_length=0)
    with pytest.raises(ValueError, match="impl"):
        GPTConfig(vocab_size=10, context_length=8, impl="flash")
    with pytest.raises(TypeError, match="n_layers"):
        GPTConfig(vocab_size=10, context_length=8, n_layers=2.0)  # type: ignore[arg-type]
    with pytest.raises(Exception, match="frozen|cannot assign"):
        GPTConfig(vocab_size=10, context_length=8).n_layers = 3  # type: ignore[misc]


def test_init_std_sets_the_scale_of_the_initial_weights():
    torch.manual_seed(0)
    small = MiniGPT(GPTConfig(vocab_size=50, context_length=8, n_layers=2, d_model=64))
    torch.manual_seed(0)
    large = MiniGPT(GPTConfig(vocab_size=50, context_length=8, n_layers=2, d_model=64,
                              init_std=0.1))
    for model, std in ((small, 0.02), (large, 0.1)):
        assert model.embed.weight.std().item() == pytest.approx(std, rel=0.05)
        assert model.blocks[0].self_attn.qkv_proj.weight.std().item() == pytest.approx(std, rel=0.1)
        # The projections into the residual stream start 1/sqrt(2 * n_layers) smaller.
        assert model.blocks[1].ff.linear2.weight.std().item() == pytest.approx(std / 2, rel=0.1)
    for bad, error in ((0.0, ValueError), (-0.1, ValueError), (float("nan"), ValueError),
                       (True, TypeError), ("0.1", TypeError)):
        with pytest.raises(error, match="init_std must be a positive finite number"):
            GPTConfig(vocab_size=10, context_length=8, init_std=bad)  # type: ignore[arg-type]


def test_built_from_the_course_blocks_with_tied_weights():
    model = tiny()
    assert len(model.blocks) == 2 and all(isinstance(b, TransformerBlock) for b in model.blocks)
    assert all(b.norm_first and b.cross_attn is None for b in model.blocks)
    assert model.lm_head.weight is model.embed.weight
    untied = tiny(tie_weights=False)
    assert untied.num_parameters() == model.num_parameters() + V * 16


def test_forward_shapes_and_loss_at_init_is_near_ln_v():
    model = tiny()
    idx = torch.randint(V, (4, 13), generator=torch.Generator().manual_seed(1))
    idx, targets = idx[:, :-1], idx[:, 1:]
    logits, loss = model(idx, targets)
    assert logits.shape == (4, 12, V)
    assert model(idx)[1] is None
    # Small initial weights give nearly uniform predictions: loss close to ln V.
    assert abs(loss.item() - torch.log(torch.tensor(float(V))).item()) < 0.1


@pytest.mark.parametrize("impl", ["manual", "sdpa"])
def test_future_tokens_never_change_earlier_logits(impl):
    model = tiny(impl)
    idx = torch.randint(V, (2, 10), generator=torch.Generator().manual_seed(2))
    changed = idx.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % V
    before, _ = model(idx)
    after, _ = model(changed)
    torch.testing.assert_close(before[:, :6], after[:, :6])
    assert not torch.allclose(before[:, 6:], after[:, 6:])


def test_manual_and_sdpa_paths_agree():
    a, b = tiny("manual"), tiny("sdpa")
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(a(IDX, attention_mask=MASK)[0], b(IDX, attention_mask=MASK)[0])


@pytest.mark.parametrize("impl", ["manual", "sdpa"])
def test_left_padded_rows_equal_the_rows_alone(impl):
    model = tiny(impl)
    logits, _ = model(IDX, attention_mask=MASK)
    for row in range(3):
        alone, _ = model(IDX[row:row + 1, MASK[row]])
        torch.testing.assert_close(logits[row:row + 1, MASK[row]], alone)
    assert torch.isfinite(logits).all()


def test_loss_ignores_padding_and_minus_one():
    model = tiny()
    targets = torch.randint(V, IDX.shape, generator=torch.Generator().manual_seed(3))
    _, loss = model(IDX, targets, attention_mask=MASK)
    kept = targets.masked_fill(~MASK, -1)
    _, same = model(IDX, kept)  # without the mask the padded rows differ, so compare by hand
    logits, _ = model(IDX, attention_mask=MASK)
    manual = torch.nn.functional.cross_entropy(logits[MASK], targets[MASK])
    torch.testing.assert_close(loss, manual)
    assert same.item() != loss.item()


def test_overfits_one_batch():
    torch.manual_seed(0)
    model = MiniGPT(GPTConfig(vocab_size=V, context_length=8, n_layers=1, n_heads=2, d_model=32))
    idx = torch.randint(V, (4, 9), generator=torch.Generator().manual_seed(4))
    x, y = idx[:, :-1], idx[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = None
    for _ in range(150):
        _, loss = model(x, y)
        first = loss.item() if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert first > 2.0 and loss.item() < 0.05


@pytest.mark.parametrize("impl", ["manual", "sdpa"])
def test_kv_cache_logits_equal_full_forward_at_every_step(impl):
    model = tiny(impl)
    extra = torch.randint(V, (3, 6), generator=torch.Generator().manual_seed(5))
    seq = torch.cat([IDX, extra], dim=1)  # (3, 11), left-padded
    mask = torch.cat([MASK, torch.ones_like(extra, dtype=torch.bool)], dim=1)
    full, _ = model(seq, attention_mask=mask)
    caches = model.new_caches()
    step, _ = model(seq[:, :5], attention_mask=mask[:, :5], caches=caches)  # prefill
    torch.testing.assert_close(step[mask[:, :5]], full[:, :5][mask[:, :5]])
    for t in range(5, seq.shape[1]):
        step, _ = model(seq[:, t:t + 1], attention_mask=mask[:, :t + 1], caches=caches)
        torch.testing.assert_close(step[:, 0], full[:, t])
    assert all(cache.length == seq.shape[1] for cache in caches)


@pytest.mark.parametrize("impl", ["manual", "sdpa"])
def test_greedy_identical_with_and_without_cache_past_block_size(impl):
    model = tiny(impl)
    with_cache = model.generate(IDX, 14, temperature=0, attention_mask=MASK)  # 5 + 14 > 12
    without = model.generate(IDX, 14, temperature=0, attention_mask=MASK, use_cache=False)
    assert with_cache.shape == (3, 19)
    assert torch.equal(with_cache, without)
    assert torch.equal(with_cache[:, :5], IDX)


def test_left_padded_batch_generates_what_each_prompt_gets_alone():
    model = tiny()
    batch = model.generate(IDX, 6, temperature=0, attention_mask=MASK)
    for row in range(3):
        alone = model.generate(IDX[row:row + 1, MASK[row]], 6, temperature=0)
        assert torch.equal(batch[row, -6:], alone[0, -6:])


def test_seeded_sampling_is_reproducible_and_top_k_restricts():
    model = tiny()
    prompt = IDX[:1]
    a = model.generate(prompt, 20, top_k=3, generator=torch.Generator().manual_seed(7))
    b = model.generate(prompt, 20, top_k=3, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
    nocache = model.generate(prompt, 20, top_k=3, use_cache=False,
                             generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, nocache)
    # top_k=1 is greedy whatever the temperature.
    assert torch.equal(model.generate(prompt, 8, top_k=1, temperature=5.0),
                       model.generate(prompt, 8, temperature=0))
    assert model.generate(prompt, 0).shape == prompt.shape


def test_generate_keeps_training_mode():
    model = tiny().train()
    model.generate(IDX[:1], 2, temperature=0)
    assert model.training


@pytest.mark.parametrize("impl", ["manual", "sdpa"])
def test_attention_maps_rows_sum_to_one_on_real_keys(impl):
    model = tiny(impl)
    maps = attention_maps(model, IDX, attention_mask=MASK)
    assert maps.shape == (2, 3, 2, 5, 5)
    sums = maps.sum(-1).transpose(1, 2)  # (L, H, B, T)
    torch.testing.assert_close(sums[:, :, MASK], torch.ones_like(sums[:, :, MASK]))
    assert (sums[:, :, ~MASK] == 0).all()  # padding queries attend to nothing
    assert (maps.triu(1) == 0).all()  # causal


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda m: m(IDX.float()), TypeError, "torch.long"),
        (lambda m: m(IDX[0]), ValueError, r"\(B, T\)"),
        (lambda m: m(IDX + V), ValueError, "vocab_size"),
        (lambda m: m(torch.zeros(1, 13, dtype=torch.long)), ValueError, "context_length"),
        (lambda m: m(IDX, attention_mask=MASK.long()), TypeError, "attention_mask"),
        (lambda m: m(IDX, attention_mask=MASK[:, :4]), ValueError, "attention_mask"),
        (lambda m: m(IDX, attention_mask=torch.zeros_like(MASK)), ValueError, "real token"),
        (lambda m: m(IDX, IDX[:, :3]), ValueError, "targets"),
        (lambda m: m(IDX, IDX - 3), ValueError, "targets"),
        (lambda m: m.generate(IDX, -1), ValueError, "max_new_tokens"),
        (lambda m: m.generate(IDX, 2, temperature=-1.0), ValueError, "temperature"),
        (lambda m: m.generate(IDX, 2, top_k=V + 1), ValueError, "top_k"),
        (lambda m: m.generate(IDX, 2, attention_mask=MASK.flip(1)), ValueError, "left padding"),
        (lambda m: m.generate(IDX, 2, generator=0), TypeError, "generator"),
        (lambda m: m(IDX, caches=[1, 2]), TypeError, "caches"),
    ],
)
def test_bad_inputs_raise_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call(tiny())


# ------------------------------- issue 18: empty loss, B = 0, tiny temperatures, flags


def test_loss_is_bit_identical_to_cross_entropy_when_a_target_counts():
    """The loss is sum / count (no value read); whenever a target counts it must be the
    very number F.cross_entropy(..., ignore_index=-1) gives, gradients included."""
    for dtype in (torch.float32, torch.float64):
        model = tiny().to(dtype).train()
        g = torch.Generator().manual_seed(5)
        targets = torch.randint(-1, V, IDX.shape, generator=g)
        targets[0, 0] = 2  # at least one counts
        logits, loss = model(IDX, targets)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        logits, _ = model(IDX)
        reference = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1),
                                                      ignore_index=-1)
        assert torch.equal(loss, reference)
        for got, want in zip(grads, torch.autograd.grad(reference, list(model.parameters())),
                             strict=True):
            assert torch.equal(got, want)


@pytest.mark.parametrize("left_out", [0, 1, 5])
def test_a_loss_that_may_read_is_the_plain_mean_with_the_same_bits(left_out):
    """Issue 42: on the CPU the loss may read its own value (MiniGPT's door says so for a
    training call without cache or padding): then it is the plain mean, read once, with the
    same bits forward and backward as the guarded sum / count, and without the counting
    operators, whether or not some targets are -1."""
    g = torch.Generator().manual_seed(7)
    targets = torch.randint(0, V, IDX.shape, generator=g)
    targets.view(-1)[:left_out] = -1
    for dtype in (torch.float32, torch.float64):
        logits = torch.randn(*IDX.shape, V, generator=g, dtype=dtype, requires_grad=True)
        guarded = next_token_loss(logits, targets)
        plain = next_token_loss(logits, targets, may_read=True)
        assert torch.equal(guarded, plain)
        assert torch.equal(*(torch.autograd.grad(loss, logits)[0] for loss in (guarded, plain)))
    model = tiny().train()
    counts = operator_counts(lambda: model(IDX, targets)[1].backward())
    assert counts["clamp"] == 0 and counts["_local_scalar_dense"] == 1 and not counts["aminmax"]
    assert operator_counts(lambda: model(IDX, torch.full_like(IDX, -1)))["clamp"] == 1  # 0/0


def test_the_loss_checks_the_targets_range_where_the_door_left_it_to_it():
    """The door no longer reads a plain training call's targets: the CPU loss checks each
    one anyway, and its IndexError becomes the door's ValueError, not chained (after the
    forward: its hooks have run). With a cache or padding the door still reads them first:
    a cache would grow, and padding would hide a bad target at a padded position."""
    model = tiny().train()
    ran = []
    model.blocks[0].register_forward_hook(lambda *_: ran.append(True))
    message = rf"^targets must hold token ids in \[0, vocab_size={V}\) or -1 \(ignored\)"
    for bad in (V, -2):
        targets = torch.zeros_like(IDX)
        targets[0, 1] = bad
        with pytest.raises(ValueError, match=message + rf", got values in \[{min(bad, 0)}, "
                                                       rf"{max(bad, 0)}\]$") as caught:
            model(IDX, targets)
        assert caught.value.__context__ is None and caught.value.__cause__ is None
        assert ran  # the price of reading nothing: the error comes after the forward
        ran.clear()
        padded = targets.clone()
        padded[1, 0] = bad  # a padded position of MASK's row 1
        padded[0, 1] = 0
        with pytest.raises(ValueError, match=message):
            model(IDX, padded, attention_mask=MASK)
        caches = model.new_caches()
        with pytest.raises(ValueError, match=message):
            model(IDX, targets, caches=caches)
        assert not ran and caches[0].length == 0  # refused at the door, the cache as it was


def test_nan_logits_still_give_a_nan_loss_on_either_path():
    """The loss that may read turns only 0/0 into 0: NaN logits on a counted target give
    NaN, as the guarded formula does (a fallback that zeroed every NaN would hide a
    diverged run)."""
    logits = torch.randn(1, 3, V, dtype=torch.float64)
    logits[0, 1, 2] = float("nan")
    targets = torch.tensor([[1, 2, -1]])
    for may_read in (False, True):
        assert next_token_loss(logits, targets, may_read=may_read).isnan()
    assert next_token_loss(logits, torch.full_like(targets, -1), may_read=True) == 0


def test_a_shut_door_past_the_position_table_fails_loudly():
    """With the door shut (``trusting``), positions past the learned or fixed table fail,
    as a lookup did, and do not give a silently shorter output: the table's rows are taken
    with ``narrow``, which refuses to run past the end."""
    for pos_encoding in ("learned", "sinusoidal"):
        model = tiny(context_length=6, pos_encoding=pos_encoding)
        caches = model.new_caches()
        model(IDX[:1, :5].repeat(1, 2)[:, :6], caches=caches)  # 6 cached positions
        with trusting(model), pytest.raises(RuntimeError):
            model(IDX[:1, :1], caches=caches)


@pytest.mark.parametrize("how", ["all -1", "all padding"])
def test_loss_with_no_target_counting_is_zero_with_zero_gradients_not_nan(how):
    model = tiny().train()
    if how == "all -1":
        _, loss = model(IDX, torch.full_like(IDX, -1))
    else:  # only the last column is real, and its targets are -1
        targets = torch.zeros_like(IDX)
        targets[:, -1] = -1
        mask = torch.zeros_like(MASK)
        mask[:, -1] = True
        _, loss = model(IDX, targets, attention_mask=mask)
    assert loss.item() == 0.0
    loss.backward()
    assert all(p.grad is None or (p.grad == 0).all() for p in model.parameters())


def test_an_empty_batch_is_refused():
    empty = torch.zeros(0, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^idx must have shape \(B, T\) with B >= 1"):
        tiny()(empty, empty)
    with pytest.raises(ValueError, match=r"^idx must have shape"):
        tiny().generate(empty, 2)


@pytest.mark.parametrize("temperature", [1e-45, 1e-300, 5e-324])
@pytest.mark.parametrize("top_k", [None, 3])
def test_a_tiny_temperature_samples_like_softmax_the_best_token_never_nan(temperature, top_k):
    model = tiny()
    greedy = model.generate(IDX, 6, temperature=0, attention_mask=MASK)
    sampled = model.generate(IDX, 6, temperature=temperature, top_k=top_k, attention_mask=MASK,
                             generator=torch.Generator().manual_seed(0))
    assert torch.equal(sampled, greedy)


def test_the_tempered_sampler_shares_ties_and_keeps_ordinary_temperatures_bit_for_bit():
    logits = torch.tensor([[2.0, 2.0, -1.0, 0.5], [1e30, -1e30, 0.0, 3.0]])
    picks = torch.cat([pick_next(logits, 1e-45, None, torch.Generator().manual_seed(s))
                       for s in range(40)], dim=1)  # (2, 40)
    assert set(picks[0].tolist()) == {0, 1}  # the two best share the probability, as softmax
    assert set(picks[1].tolist()) == {0}
    # an ordinary temperature takes the plain route: torch.softmax(logits / T) exactly
    for seed in range(5):
        got = pick_next(logits[:1], 0.7, 2, torch.Generator().manual_seed(seed))
        scaled = logits[:1] / 0.7
        scaled = scaled.masked_fill(scaled < scaled.topk(2).values[:, -1:], float("-inf"))
        want = torch.multinomial(torch.softmax(scaled, -1), 1,
                                 generator=torch.Generator().manual_seed(seed))
        assert torch.equal(got, want)


def test_sampling_from_nan_logits_says_so():
    model = tiny()
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"NaN or \+inf logits"):
        model.generate(IDX, 1)


@pytest.mark.parametrize("flag", ["bias", "tie_weights"])
@pytest.mark.parametrize("value", ["no", 0, None])
def test_config_flags_must_be_bools(flag, value):
    with pytest.raises(TypeError, match=rf"^{flag} must be a bool"):
        GPTConfig(vocab_size=V, context_length=8, **{flag: value})


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda m: m.generate(IDX, 2, use_cache="no"), "use_cache"),
        (lambda m: m.generate(IDX, 2, use_cache=0), "use_cache"),
        (lambda m: m.num_parameters(non_embedding="yes"), "non_embedding"),
    ],
)
def test_method_flags_must_be_bools(call, name):
    with pytest.raises(TypeError, match=rf"^{name} must be a bool"):
        call(tiny())


def test_positions_are_a_slice_of_the_table_with_the_lookups_bits():
    """Issue 42: a call without padding or packed documents adds the learned table's rows
    past .. past + T - 1 as a view, with no arange and no second lookup; the rows and their
    gradients are the lookup's, bit for bit, over a batch."""
    g = torch.Generator().manual_seed(3)
    table = torch.nn.Embedding(8, 6)
    x = torch.randn(3, 5, 6, generator=g)
    sliced, looked_up = x + table.weight[2:7], x + table(torch.arange(2, 7))  # (3, 5, 6)
    assert torch.equal(sliced, looked_up)
    upstream = torch.randn(3, 5, 6, generator=g)
    grads = [torch.autograd.grad(y, table.weight, upstream)[0] for y in (sliced, looked_up)]
    assert torch.equal(*grads)
    model = tiny().train()
    counts = operator_counts(lambda: model(IDX, IDX)[1].backward())
    assert counts["embedding"] == 1 and counts["arange"] == 0  # the tokens' lookup only
    assert counts["embedding_dense_backward"] == 1
