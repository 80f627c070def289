"""The gaps found in the doors by trying bad inputs (issue 23), each answered clearly now.

Each was once a raw torch error, a silent wrong result or a message about something
else; each is now a ``TypeError`` / ``ValueError`` naming the argument. Also: a model
checks its inputs once per call, and nothing inside a generation loop.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import course_attn._validation as validation
import course_attn.core.checks as core_checks
import course_attn.models.checks as model_checks
from course_attn import (
    CharCorpus,
    EncoderDecoder,
    EncoderDecoderConfig,
    FeedForward,
    GPTConfig,
    MiniGPT,
    MultiHeadAttention,
    PositionalEncoding,
    TransformerBlock,
    attention,
    causal_mask,
    load_text,
    padding_mask,
    scaled_dot_product_attention,
    sliding_window_mask,
)
from course_attn.lab.measure import operator_counts

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("fn", [attention, scaled_dot_product_attention])
def test_query_key_and_value_on_different_devices(fn):
    q = torch.randn(1, 3, 4)
    with pytest.raises(ValueError, match=r"^q, k and v must be on one device, got cpu, meta"):
        fn(q, q.to("meta"), q)  # once a silent meta result
    with pytest.raises(ValueError, match=r"must be on one device"):
        MultiHeadAttention(4, 2)(q, q.to("meta"), q.to("meta"))
    model = MiniGPT(GPTConfig(vocab_size=5, context_length=4, n_layers=1, n_heads=1,
                              d_model=4))
    with pytest.raises(ValueError, match=r"^idx is on meta but the model is on cpu"):
        model(torch.zeros(1, 3, dtype=torch.long, device="meta"))


def test_a_text_too_short_to_split_is_refused_naming_the_parts():
    with pytest.raises(ValueError, match=r"^data of 1 token splits into 0 training and 1 "
                                         r"validation tokens"):
        CharCorpus.from_text("a")  # once an empty training split, without a word
    corpus = CharCorpus.from_text("ab")
    assert len(corpus.train_data) == len(corpus.val_data) == 1


@pytest.mark.parametrize("make", [
    lambda: causal_mask(10**6),
    lambda: sliding_window_mask(10**6, window=3),
])
def test_a_mask_too_large_for_memory_says_which_call_and_how_many_bytes(make):
    with pytest.raises(ValueError, match=r"\(t_q=1000000, t_k=1000000\) needs 1e\+12 bytes"):
        make()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("make", [
    lambda: causal_mask(3, device="cuda"),
    lambda: padding_mask([1, 2], device="cuda:0"),
    lambda: sliding_window_mask(3, window=2, device="cuda"),
])
def test_a_device_this_machine_lacks_is_named(make):
    with pytest.raises(ValueError, match=r"^device='cuda(:0)?' but no CUDA device is available"):
        make()  # once an AssertionError from deep inside torch


def test_a_pipe_given_as_data_is_refused_for_what_it_is(tmp_path):
    with pytest.raises(ValueError, match=r"is a folder: give a text file"):
        load_text(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "course_attn.train", "--data", "/dev/stdin", "--max-iters", "1"],
        input="some text\n", capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2
    assert "--data '/dev/stdin'" in result.stderr
    assert "a pipe or a device (not a regular file)" in result.stderr


def _count_checks(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the calls of every check of ``_validation`` wherever it was imported."""
    counts = {"n": 0}
    for name in validation.__all__:
        original = getattr(validation, name)
        if not name.startswith("check_") or not callable(original):
            continue

        def counting(*args, _original=original, **kwargs):
            counts["n"] += 1
            return _original(*args, **kwargs)

        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("course_attn") and \
                    getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, counting)
    return counts


def test_generate_checks_its_arguments_once_not_per_step(monkeypatch):
    torch.manual_seed(0)
    model = MiniGPT(GPTConfig(vocab_size=7, context_length=32, n_layers=4, n_heads=2,
                              d_model=8)).eval()
    idx = torch.randint(7, (2, 3))
    counts = _count_checks(monkeypatch)
    model.generate(idx, 1)
    one_step = counts["n"]
    counts["n"] = 0
    model.generate(idx, 20)
    assert counts["n"] == one_step > 0  # the door's checks, once, whatever the length
    counts["n"] = 0
    model(idx, idx)
    forward = counts["n"]
    model.blocks[0](torch.randn(2, 3, 8))  # a block built into a model trusts its parent
    assert counts["n"] == forward
    counts["n"] = 0
    block = type(model.blocks[0])(8, 2)
    block(torch.randn(2, 3, 8))
    assert counts["n"] > 0  # a block a reader builds checks its inputs


LAYERS = {  # issue 33: each layer a chapter builds and calls alone, with its call
    "FeedForward": (lambda: FeedForward(8), lambda layer, x: layer(x)),
    "PositionalEncoding": (lambda: PositionalEncoding(8, 16), lambda layer, x: layer(x)),
    "MultiHeadAttention": (lambda: MultiHeadAttention(8, 2), lambda layer, x: layer(x)),
    "TransformerBlock": (lambda: TransformerBlock(8, 2), lambda layer, x: layer(x)),
    "decoder TransformerBlock": (lambda: TransformerBlock(8, 2, cross_attention=True),
                                 lambda layer, x: layer(x, memory=x)),
}


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize(("layer_device", "input_device"), [("cpu", "meta"), ("meta", "cpu")])
def test_a_layer_called_with_inputs_on_another_device_names_both(name, layer_device,
                                                                  input_device):
    make, call = LAYERS[name]
    layer = make().to(layer_device)
    x = torch.randn(2, 3, 8, device=input_device)
    argument = "query" if name == "MultiHeadAttention" else "x"
    with pytest.raises(ValueError, match=rf"^{argument} is on {input_device} but the layer is "
                                         rf"on {layer_device}; move one of them, e\.g\. "
                                         rf"{argument}\.to\('{layer_device}'\)$"):
        call(layer, x)  # once "Tensor on device cpu is not on the expected device meta!"
    out = call(layer, torch.randn(2, 3, 8, device=layer_device))  # on one device it runs
    assert (out if isinstance(out, torch.Tensor) else out[0]).device.type == layer_device


def test_the_device_check_runs_at_the_models_door_not_in_every_layer(monkeypatch):
    calls = {"n": 0}
    original = core_checks.check_on_device

    def counting(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)

    for module in (core_checks, model_checks):
        monkeypatch.setattr(module, "check_on_device", counting)
    counts = []
    for n_layers in (1, 4):
        model = EncoderDecoder(EncoderDecoderConfig(src_vocab_size=5, tgt_vocab_size=5,
                                                    d_model=8, n_heads=2, n_layers=n_layers))
        calls["n"] = 0
        model(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))
        counts.append(calls["n"])
    # the encoder's door (src) and the decoder's (tgt, memory), whatever the depth
    assert counts == [3, 3]
    calls["n"] = 0
    model.greedy_decode(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 1, dtype=torch.long),
                        6)
    assert calls["n"] == 2  # src at the encoder's door, the prompt; none in the 6 steps


@pytest.mark.parametrize("bad", [7, -1, -8])
def test_an_id_outside_the_table_is_named_by_the_lookup_not_a_raw_index_error(bad):
    """Issue 42: MiniGPT's door no longer reads idx (a reduction and two reads in every step);
    the CPU's lookup checks each id anyway, and its IndexError becomes the door's ValueError,
    with nothing chained to it and nothing run after it."""
    model = MiniGPT(GPTConfig(vocab_size=7, context_length=8, n_layers=1, n_heads=2,
                              d_model=8))
    idx = torch.tensor([[1, bad, 2]])
    ran = []
    model.blocks[0].register_forward_hook(lambda *_: ran.append(True))
    with pytest.raises(ValueError, match=rf"^idx must hold token ids in \[0, vocab_size=7\), "
                                         rf"got values in \[{min(bad, 1)}, {max(bad, 2)}\]$"
                       ) as caught:
        model(idx, torch.zeros_like(idx))
    assert caught.value.__context__ is None and caught.value.__cause__ is None
    assert not ran  # refused before the first block
    caches = model.new_caches()
    with pytest.raises(ValueError, match=r"^idx must hold token ids"):
        model(idx, caches=caches)
    assert caches[0].length == 0  # a cache is left as it was


def test_a_training_call_reads_its_loss_once_and_its_ids_and_targets_never():
    """The lookup checks the ids' range and the loss the targets'; the loss reads its own
    value once (0/0 gives NaN, then 0): a forward makes no aminmax and one read, where it
    once made two and four (issue 42)."""
    model = MiniGPT(GPTConfig(vocab_size=7, context_length=8, n_layers=2, n_heads=2,
                              d_model=8)).train()
    idx = torch.randint(7, (2, 5))
    counts = operator_counts(lambda: model(idx, torch.roll(idx, 1, dims=1)))
    assert counts["aminmax"] == 0 and counts["_local_scalar_dense"] == 1
    assert operator_counts(lambda: model(idx))["_local_scalar_dense"] == 0
