"""Chapter 11: packed documents. The document mask, MiniGPT's doc_ids, the packed corpus and
the trainer's --pack-documents.

The exact test: a row packing three documents gives, for each document, what that document
gives alone, on every attention path and in the whole model (positions restart).
"""

from __future__ import annotations

import json

import pytest
import torch
from torch.testing import assert_close

from course_attn.core.attention import ATTENTION_IMPLS, attention
from course_attn.core.masks import causal_mask, document_mask, document_positions
from course_attn.data.text import CharCorpus, PackedBatch, PackedCorpus, document_ids
from course_attn.models.gpt import GPTConfig, MiniGPT
from course_attn.train import TrainConfig, estimate_loss, main, train

LENGTHS = (5, 3, 4)  # three documents packed into one row of 12 tokens
DOC_IDS = torch.tensor([d for d, n in enumerate(LENGTHS) for _ in range(n)])  # (12,)
EXACT = {"atol": 1e-12, "rtol": 1e-12}


def _pieces(x: torch.Tensor) -> list[torch.Tensor]:
    """The documents of a packed row, along the time axis (-2)."""
    return list(x.split(LENGTHS, dim=-2))


def test_document_mask_and_positions_on_a_worked_example():
    ids = torch.tensor([[0, 0, 0, 1, 1, 2], [3, 3, 4, 4, 4, 4]])
    assert document_mask(ids)[0].int().tolist() == [
        [1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 1]]
    assert document_positions(ids).tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, 3]]
    assert document_positions(DOC_IDS).tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_a_packed_row_of_three_documents_gives_each_document_alone(impl):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 12, 4, generator=g, dtype=torch.float64) for _ in range(3))
    packed, _ = attention(q, k, v, document_mask(DOC_IDS), is_causal=True, impl=impl)
    for alone_q, alone_k, alone_v, got in zip(*map(_pieces, (q, k, v, packed)), strict=True):
        alone, _ = attention(alone_q, alone_k, alone_v, is_causal=True, impl=impl)
        assert_close(got, alone, **EXACT)
    leaky, _ = attention(q, k, v, is_causal=True, impl=impl)  # without the mask: it leaks
    assert not torch.allclose(leaky[:, 5:], packed[:, 5:])


def _model(pos_encoding: str, impl: str) -> MiniGPT:
    torch.manual_seed(1)
    config = GPTConfig(vocab_size=11, context_length=12, n_layers=2, n_heads=2, d_model=16,
                       pos_encoding=pos_encoding, impl=impl)
    return MiniGPT(config).double().eval()


@pytest.mark.parametrize("impl", ["manual", "flex"])
@pytest.mark.parametrize("pos_encoding", ["learned", "sinusoidal", "rope", "alibi"])
def test_minigpt_on_a_packed_row_gives_each_document_what_it_gives_alone(pos_encoding, impl):
    model = _model(pos_encoding, impl)
    idx = torch.randint(11, (1, 12), generator=torch.Generator().manual_seed(2))
    packed, _ = model(idx, doc_ids=DOC_IDS[None])
    start = 0
    for n in LENGTHS:
        alone, _ = model(idx[:, start:start + n])
        assert_close(packed[:, start:start + n], alone, **EXACT)
        start += n
    crossing, _ = model(idx)  # one long document: the later ones read the earlier ones
    assert not torch.allclose(crossing[:, 5:], packed[:, 5:])


def test_minigpt_loss_on_a_packed_batch_unpacks_like_x_y():
    model = _model("learned", "manual")
    batch = PackedBatch(torch.randint(11, (2, 12)), torch.randint(11, (2, 12)),
                        DOC_IDS.expand(2, 12))
    logits, loss = model(*batch)
    assert logits.shape == (2, 12, 11) and loss.ndim == 0 and torch.isfinite(loss)


def test_doc_ids_are_checked_at_the_models_door():
    model = _model("learned", "manual")
    idx = torch.zeros(1, 12, dtype=torch.long)
    with pytest.raises(ValueError, match=r"doc_ids must have the shape of idx \(1, 12\)"):
        model(idx, doc_ids=DOC_IDS[None, :6])
    with pytest.raises(ValueError, match=r"doc_ids must never decrease along a row"):
        model(idx, doc_ids=DOC_IDS.flip(0)[None])
    with pytest.raises(TypeError, match=r"doc_ids must hold integer document ids"):
        model(idx, doc_ids=DOC_IDS[None].float())
    with pytest.raises(ValueError, match=r"cannot be combined with attention_mask"):
        model(idx, doc_ids=DOC_IDS[None], attention_mask=torch.ones(1, 12, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"cannot be combined with caches"):
        model(idx, doc_ids=DOC_IDS[None], caches=model.new_caches())


# ---------------------------------------------------------------- the packed corpus
TEXT = "First:\nAll of us.\n\nSecond:\nNot I.\n\n\nThird:\nWe are.\n\n" * 12


def test_document_ids_start_a_document_at_each_separator():
    ids = document_ids("ab\n\ncd\n\n\ne", "\n\n")
    assert ids.tolist() == [0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    with pytest.raises(ValueError, match=r"separator must be a non-empty str"):
        document_ids("ab", "")
    with pytest.raises(ValueError, match=r"separator '##' does not occur in the text"):
        PackedCorpus.from_text(TEXT, "##")


def test_packed_batches_are_the_corpus_windows_with_their_documents():
    corpus = PackedCorpus.from_text(TEXT, "\n\n")
    batch = corpus.get_batch("train", 4, 16, generator=torch.Generator().manual_seed(3))
    x, y = CharCorpus.from_text(TEXT).get_batch("train", 4, 16,
                                                generator=torch.Generator().manual_seed(3))
    assert isinstance(batch, PackedBatch) and torch.equal(batch.x, x) and torch.equal(batch.y, y)
    text = corpus.tokenizer.decode(batch.x[0])
    starts = [i for i in range(1, 16) if batch.doc_ids[0, i] != batch.doc_ids[0, i - 1]]
    assert all(text[i:i + 2] == "\n\n" or i == 15 for i in starts)  # a document opens there
    assert starts and batch.doc_ids.shape == (4, 16)
    meta = corpus.get_batch("val", 2, 8, device="meta")
    assert all(t.device.type == "meta" for t in meta)


def test_training_on_packed_documents_with_flex_runs_and_evaluates():
    corpus = PackedCorpus.from_text(TEXT, "\n\n")
    torch.manual_seed(0)
    model = MiniGPT(GPTConfig(vocab_size=corpus.vocab_size, context_length=16, n_layers=1,
                              n_heads=2, d_model=16, impl="flex"))
    config = TrainConfig(max_iters=4, batch_size=4, eval_interval=2, eval_iters=2,
                         warmup_iters=1, device="cpu", progress=False)
    result = train(model, corpus, config)
    assert len(result.train_losses) == 4 and all(map(torch.isfinite,
                                                     torch.tensor(result.train_losses)))
    losses = estimate_loss(model, corpus, config)
    assert set(losses) == {"train", "val"} and all(v > 0 for v in losses.values())


# ------------------------------------------------------------------------ the CLI
TINY = ["--n-layers", "1", "--n-heads", "2", "--d-model", "16", "--context-length", "16",
        "--batch-size", "4", "--eval-interval", "2", "--eval-iters", "1", "--device", "cpu",
        "--quiet", "--samples", "0"]


@pytest.fixture()
def speeches(tmp_path):
    path = tmp_path / "speeches.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def test_cli_packs_documents_records_the_separator_and_refuses_another_on_resume(
        tmp_path, speeches, capsys):
    ckpt, metrics = tmp_path / "run.pt", tmp_path / "run.json"
    code = main(["--data", str(speeches), *TINY, "--max-iters", "2", "--impl", "flex",
                 "--pack-documents", "--out", str(ckpt), "--metrics-out", str(metrics)])
    assert code == 0 and json.loads(metrics.read_text())["final_val_loss"] > 0
    stored = torch.load(ckpt, weights_only=True)["meta"]
    assert stored["document_separator"] == "\n\n"
    with pytest.raises(SystemExit) as stop:  # the same run must keep its documents
        main(["--data", str(speeches), *TINY, "--max-iters", "4", "--impl", "flex",
              "--pack-documents", "\\n\\n\\n", "--resume", str(ckpt)])
    assert stop.value.code == 2
    assert "document_separator '\\n\\n' -> '\\n\\n\\n'" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--pack-documents", "\\q"], r"only \\n, \\t and \\\\ are escapes"),
    (["--pack-documents", "##"], r"--pack-documents '##': separator '##' does not occur"),
    (["--task", "copy", "--pack-documents"], r"--pack-documents cuts a text into documents"),
])
def test_cli_refuses_a_bad_separator(args, message, speeches, capsys):
    data = [] if "--task" in args else ["--data", str(speeches)]
    with pytest.raises(SystemExit) as stop:
        main([*data, *args, "--max-iters", "1"])
    assert stop.value.code == 2
    import re

    assert re.search(message, capsys.readouterr().err)


# ------------------------------------------------------- what a model attends to (lab)
def test_cross_document_attention_is_the_weight_on_other_documents():
    from course_attn.lab.analysis import cross_document_attention

    weights = causal_mask(4).double()
    weights = (weights / weights.sum(-1, keepdim=True))[None, None]  # (B, H, T, T): uniform
    shares = cross_document_attention(weights, torch.tensor([[0, 0, 1, 1]]))
    # queries 2 and 3 (document 1) put 2/3 and 2/4 of their weight on document 0
    assert_close(shares, torch.tensor([(2 / 3 + 2 / 4) / 2], dtype=torch.float64))


def test_a_model_with_the_document_mask_attends_nowhere_else_and_one_without_does():
    from course_attn.lab.analysis import attention_maps, cross_document_attention

    model = _model("learned", "manual")
    idx = torch.randint(11, (1, 12), generator=torch.Generator().manual_seed(3))
    masked = attention_maps(model, idx, doc_ids=DOC_IDS[None])  # (L, B, H, T, T)
    crossing = attention_maps(model, idx)
    assert masked.shape == crossing.shape == (2, 1, 2, 12, 12)
    assert (cross_document_attention(masked, DOC_IDS[None]) == 0).all()
    assert (cross_document_attention(crossing, DOC_IDS[None]) > 0.1).all()  # (L, H)


def test_masked_attention_seconds_times_the_three_paths():
    from course_attn.lab.experiments import TIMED_MASKS, masked_attention_seconds

    for mask in TIMED_MASKS:
        seconds = masked_attention_seconds(48, mask, heads=2, head_dim=8, window=16,
                                           document=20, repeats=1)
        assert set(seconds) == {"flex first call", "flex", "sdpa", "manual"}
        assert all(value > 0 for value in seconds.values())
