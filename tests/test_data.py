"""Chapter 11 data: tokenizer, corpus, batches, the on-request download and the synthetic task."""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import math
import signal
import sysconfig
from pathlib import Path

import pytest
import torch

from course_attn.data.tasks import CopyTask, RecallTask, make_task
from course_attn.data.text import (
    DEFAULT_CORPUS_MODULES,
    CharCorpus,
    CharTokenizer,
    default_corpus,
    download_tiny_shakespeare,
    get_batch,
    load_text,
    train_val_split,
)
from course_attn.lab.analysis import induction_attention_score, offset_attention_score

TEXT = "To be, or not to be: that is the question.\nWhether 'tis nobler...\n"


# ----------------------------------------------------------------- tokenizer
def test_tokenizer_round_trip_and_sorted_vocabulary():
    tok = CharTokenizer.from_text(TEXT)
    assert tok.chars == "".join(sorted(set(TEXT)))
    ids = tok.encode(TEXT)
    assert len(ids) == len(TEXT) and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == TEXT
    assert tok.decode(torch.tensor(ids)) == TEXT


def test_tokenizer_rejects_unknown_characters_with_position():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(ValueError, match=r"'z' at position 2"):
        tok.encode("abz")


@pytest.mark.parametrize(
    ("bad", "error"),
    [([0, 3], ValueError), ([-1], ValueError), (torch.tensor([[0]]), ValueError),
     ([1.0], TypeError), ([True], TypeError), (torch.tensor([1.0]), TypeError), (5, TypeError),
     ("ab", TypeError)],
)
def test_tokenizer_decode_rejects_bad_ids(bad, error):
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(error, match="ids"):
        tok.decode(bad)


def test_tokenizer_bad_vocabularies():
    with pytest.raises(ValueError, match="empty"):
        CharTokenizer.from_text("")
    with pytest.raises(ValueError, match="repeat"):
        CharTokenizer("aab")
    with pytest.raises(TypeError, match="str"):
        CharTokenizer.from_text(b"abc")  # type: ignore[arg-type]


# --------------------------------------------------------------- text, split
def test_load_text_and_its_errors(tmp_path):
    good = tmp_path / "t.txt"
    good.write_text(TEXT, encoding="utf-8")
    assert load_text(good) == TEXT
    with pytest.raises(FileNotFoundError, match="not an existing file"):
        load_text(tmp_path / "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty"):
        load_text(empty)
    binary = tmp_path / "b.bin"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(ValueError, match="UTF-8"):
        load_text(binary)


def test_default_corpus_is_the_listed_stdlib_files_in_order():
    text = default_corpus()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    positions = [text.index(f"# ==== {name} ====\n") for name in DEFAULT_CORPUS_MODULES]
    assert positions == sorted(positions) and positions[0] == 0
    first = (stdlib / DEFAULT_CORPUS_MODULES[0]).read_text(encoding="utf-8")
    assert text[positions[0]:].split("\n", 1)[1].startswith(first[:500])
    assert text == default_corpus()  # the same text every time
    with pytest.raises(FileNotFoundError, match="no_such_module.py"):
        default_corpus(("no_such_module.py",))


def test_train_val_split_is_90_10_by_position():
    data = torch.arange(100)
    train, val = train_val_split(data)
    assert torch.equal(train, torch.arange(90)) and torch.equal(val, torch.arange(90, 100))
    with pytest.raises(ValueError, match="train_fraction"):
        train_val_split(data, 1.0)
    with pytest.raises(ValueError, match="1-D"):
        train_val_split(data.view(10, 10))


def test_get_batch_targets_are_inputs_shifted_and_seeded():
    data = torch.arange(50)
    x, y = get_batch(data, 4, 8, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 8)
    assert torch.equal(y, x + 1)  # data[i] = i, so the next token is i + 1
    x2, _ = get_batch(data, 4, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)
    with pytest.raises(ValueError, match="context_length"):
        get_batch(data, 4, 50)
    with pytest.raises(ValueError, match="batch_size"):
        get_batch(data, 0, 8)


@pytest.mark.parametrize("bad", [torch.arange(60.0), torch.ones(60, dtype=torch.bool),
                                 torch.arange(60) * 1j])
def test_float_or_bool_token_ids_are_refused(bad):
    with pytest.raises(TypeError, match="data must hold integer token ids"):
        train_val_split(bad)
    with pytest.raises(TypeError, match="data must hold integer token ids"):
        get_batch(bad, 2, 4)
    tokenizer = CharTokenizer("ab")
    with pytest.raises(TypeError, match="train_data"):
        CharCorpus(tokenizer, bad, torch.arange(3))


def test_split_and_batch_wrong_types_are_type_errors():
    for call in (lambda: train_val_split(list(range(60))),  # type: ignore[arg-type]
                 lambda: get_batch(list(range(60)), 2, 4)):  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="data must be a 1-D tensor"):
            call()
    data = torch.arange(60)
    with pytest.raises(TypeError, match="generator"):
        get_batch(data, 2, 4, generator=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device"):
        get_batch(data, 2, 4, device="gpu")
    with pytest.raises(TypeError, match="device"):
        get_batch(data, 2, 4, device=0)  # type: ignore[arg-type]
    corpus = CharCorpus.from_text(TEXT * 5)
    with pytest.raises(TypeError, match="split"):
        corpus.get_batch(0, 2, 4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tokenizer"):
        CharCorpus("ab", data, data)  # type: ignore[arg-type]


def test_char_corpus_splits_and_batches():
    corpus = CharCorpus.from_text(TEXT * 5)
    assert len(corpus.train_data) == int(0.9 * len(TEXT * 5))
    x, y = corpus.get_batch("val", 3, 4)
    assert x.shape == (3, 4) and torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ValueError, match="split"):
        corpus.get_batch("test", 3, 4)


# ------------------------------------------------------------------ download
def _local_source(tmp_path: Path, content: bytes) -> tuple[str, str]:
    source = tmp_path / "source.txt"
    source.write_bytes(content)
    return source.as_uri(), hashlib.sha256(content).hexdigest()


def test_download_from_a_local_file_url_and_cache_reuse(tmp_path):
    url, digest = _local_source(tmp_path, TEXT.encode())
    path = download_tiny_shakespeare(tmp_path / "cache", url=url, sha256=digest)
    assert path.read_text() == TEXT

    def no_network(*args, **kwargs):
        raise AssertionError("a cached file with the right checksum must not be downloaded")

    again = download_tiny_shakespeare(tmp_path / "cache", url=url, sha256=digest, opener=no_network)
    assert again == path


def test_download_checksum_mismatch_is_refused_and_deleted(tmp_path):
    url, _ = _local_source(tmp_path, TEXT.encode())
    with pytest.raises(ValueError, match="SHA-256"):
        download_tiny_shakespeare(tmp_path / "cache", url=url, sha256="0" * 64)
    assert list((tmp_path / "cache").iterdir()) == []


def test_download_offline_gives_a_clear_error(tmp_path):
    import urllib.error

    def offline(url, timeout):
        raise urllib.error.URLError("no route to host")

    with pytest.raises(ConnectionError, match="offline"):
        download_tiny_shakespeare(tmp_path, opener=offline)


def test_download_with_a_stand_in_opener(tmp_path):
    payload = b"First Citizen:\nBefore we proceed any further, hear me speak.\n"

    def opener(url, timeout):
        assert url == "https://example.invalid/x.txt"
        return io.BytesIO(payload)

    path = download_tiny_shakespeare(tmp_path, url="https://example.invalid/x.txt",
                                     sha256=hashlib.sha256(payload).hexdigest(), opener=opener)
    assert path.read_bytes() == payload


def _no_network(*args, **kwargs):
    raise AssertionError("a refused argument must be caught before any download")


@pytest.mark.parametrize("filename", ["../x.txt", "sub/x.txt", "sub\\x.txt", "..", ".", "",
                                      "/tmp/x.txt"])
def test_download_filename_must_be_a_plain_name_inside_the_cache(tmp_path, filename):
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="filename must be a plain file name"):
        download_tiny_shakespeare(cache, filename=filename, opener=_no_network)
    assert not cache.exists() and not (tmp_path / "x.txt").exists()  # nothing written


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        (dict(sha256="g" * 64), ValueError, "sha256 must be a 64-character hex digest"),
        (dict(sha256="0" * 63), ValueError, "sha256"),
        (dict(sha256=b"0" * 64), TypeError, "sha256"),
        (dict(timeout=0), ValueError, "timeout"),
        (dict(timeout=-5.0), ValueError, "timeout"),
        (dict(timeout=float("nan")), ValueError, "timeout"),
        (dict(timeout=float("inf")), ValueError, "timeout"),
        (dict(timeout="30"), TypeError, "timeout"),
        (dict(timeout=None), TypeError, "timeout"),
        (dict(filename=None), TypeError, "filename"),
        (dict(url=""), ValueError, "url"),
        (dict(url=None), TypeError, "url"),
        (dict(opener="urlopen"), TypeError, "opener"),
    ],
)
def test_download_arguments_are_checked_before_any_network(tmp_path, options, error, match):
    options.setdefault("opener", _no_network)
    with pytest.raises(error, match=match):
        download_tiny_shakespeare(tmp_path / "cache", **options)
    assert not (tmp_path / "cache").exists()
    with pytest.raises(TypeError, match="cache_dir"):
        download_tiny_shakespeare(None, opener=_no_network)  # type: ignore[arg-type]


def test_download_accepts_an_uppercase_digest(tmp_path):
    url, digest = _local_source(tmp_path, TEXT.encode())
    path = download_tiny_shakespeare(tmp_path / "cache", url=url, sha256=digest.upper())
    assert path.parent == tmp_path / "cache" and path.read_text() == TEXT


# -------------------------------------------------------------- copy task
def test_copy_task_sequences_repeat_their_first_half():
    task = CopyTask(vocab_size=5, half_length=6)
    x, y = task.get_batch("train", 7, generator=torch.Generator().manual_seed(1))
    assert x.shape == y.shape == (7, task.context_length) == (7, 11)
    seq = torch.cat([x, y[:, -1:]], dim=1)  # (B, 2n)
    assert torch.equal(seq[:, :6], seq[:, 6:])
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert int(seq.max()) < 5


def test_copy_task_floor_is_ln_v_on_the_noise_only():
    task = CopyTask(vocab_size=16, half_length=8)
    assert task.loss_floor() == pytest.approx(7 * math.log(16) / 15)
    assert task.position_floor().mean().item() == pytest.approx(task.loss_floor())
    # The floor is reached by the model that knows the rule: uniform on the first
    # half, certain on the copy. Its cross-entropy on real batches equals the floor.
    x, y = task.get_batch("val", 64, generator=torch.Generator().manual_seed(0))
    logits = torch.zeros(64, task.context_length, 16)
    n = task.half_length
    logits[:, n - 1:, :] = -1e9
    logits[:, n - 1:].scatter_(2, y[:, n - 1:, None], 0.0)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 16), y.reshape(-1))
    assert loss.item() == pytest.approx(task.loss_floor(), abs=1e-6)


def test_copy_task_bad_inputs():
    with pytest.raises(ValueError, match="vocab_size"):
        CopyTask(vocab_size=1)
    with pytest.raises(TypeError, match="half_length"):
        CopyTask(half_length=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="context_length"):
        CopyTask(4, 4).get_batch("train", 2, 9)
    with pytest.raises(ValueError, match="name"):
        make_task("reverse")


def test_offset_attention_score_picks_the_diagonal():
    eye_prev = torch.zeros(6, 6)
    eye_prev[0, 0] = 1.0
    eye_prev[torch.arange(1, 6), torch.arange(0, 5)] = 1.0  # every query looks one back
    assert offset_attention_score(eye_prev, 1).item() == pytest.approx(1.0)
    assert offset_attention_score(eye_prev, 2).item() == pytest.approx(0.0)
    batch = torch.stack([eye_prev, torch.eye(6)])  # (2, T, T)
    assert torch.allclose(offset_attention_score(batch, 0), torch.tensor([1 / 6, 1.0]))
    with pytest.raises(ValueError, match="offset"):
        offset_attention_score(eye_prev, 6)
    with pytest.raises(ValueError, match="first_query"):
        offset_attention_score(eye_prev, 2, first_query=1)


# ------------------------------------------------------------ recall task
def test_recall_task_sequences_follow_the_rules():
    task = RecallTask(n_keys=6, n_values=5, n_pairs=9, max_step=3)
    seq = task.sample(50, generator=torch.Generator().manual_seed(3))  # (B, 2P)
    assert seq.shape == (50, 18) and task.vocab_size == 11 and task.context_length == 17
    keys, values = seq[:, 0::2], seq[:, 1::2]  # (B, P) each
    assert int(keys.min()) >= 0 and int(keys.max()) < 6
    assert int(values.min()) >= 6 and int(values.max()) < 11
    steps = (keys[:, 1:] - keys[:, :-1]) % 6
    assert int(steps.min()) == 1 and int(steps.max()) == 3  # every step size occurs
    for row_keys, row_values in zip(keys.tolist(), values.tolist(), strict=True):
        table: dict[int, int] = {}
        for key, value in zip(row_keys, row_values, strict=True):
            assert table.setdefault(key, value) == value  # a key keeps its value
    x, y = task.get_batch("val", 4, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 17) and torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(task.key_positions, torch.arange(0, 17, 2))
    assert torch.equal(task.value_positions, torch.arange(1, 17, 2))


@pytest.mark.parametrize(("n_keys", "max_step", "n_pairs"),
                         [(5, 3, 6), (4, 1, 7), (6, 2, 5), (16, 15, 3), (3, 2, 9)])
def test_recall_new_key_probability_matches_every_walk(n_keys, max_step, n_pairs):
    # Enumerate every start and every sequence of steps: all walks are equally likely.
    task = RecallTask(n_keys=n_keys, n_values=3, n_pairs=n_pairs, max_step=max_step)
    counts = torch.zeros(n_pairs, dtype=torch.float64)
    walks = 0
    for start in range(n_keys):
        for steps in itertools.product(range(1, max_step + 1), repeat=n_pairs - 1):
            walk = [start]
            for step in steps:
                walk.append((walk[-1] + step) % n_keys)
            counts += torch.tensor([float(k not in walk[:i]) for i, k in enumerate(walk)],
                                   dtype=torch.float64)
            walks += 1
    assert torch.allclose(task.new_key_probability(), counts / walks, atol=1e-12)


def test_recall_floor_is_what_the_bayes_optimal_predictor_pays():
    task = RecallTask(n_keys=8, n_values=8, n_pairs=12, max_step=4)
    floor = task.position_floor()
    assert floor[task.value_positions].tolist() == pytest.approx([math.log(4)] * 11)
    assert floor.mean().item() == pytest.approx(task.loss_floor())
    # The predictor that knows the rules: the next key is one of the R steps
    # round; a key's value is certain if the key came before, else uniform.
    x, y = task.get_batch("val", 2000, generator=torch.Generator().manual_seed(0))
    probs = torch.zeros(*x.shape, task.vocab_size, dtype=torch.float64)  # (B, T, K + V)
    for b in range(x.shape[0]):
        row = x[b].tolist()
        for t, token in enumerate(row):
            if t % 2:  # a value: the key before it walks 1..R steps on
                for step in range(1, task.max_step + 1):
                    probs[b, t, (row[t - 1] + step) % task.n_keys] = 1 / task.max_step
            elif token in row[:t:2]:
                probs[b, t, row[row.index(token) + 1]] = 1.0
            else:
                probs[b, t, task.n_keys:] = 1 / task.n_values
    paid = -probs.gather(2, y[:, :, None]).log().squeeze(2)  # (B, T)
    assert torch.isfinite(paid).all()  # the rules never rule out the real next token
    per_position = paid.mean(dim=0)
    spread = paid.std(dim=0) / math.sqrt(x.shape[0])
    assert ((per_position - floor).abs() <= 4 * spread + 1e-9).all()
    assert paid.mean().item() == pytest.approx(task.loss_floor(), abs=0.02)


@contextlib.contextmanager
def _deadline(seconds: int):
    """Fail instead of hanging (SIGALRM, on Unix): a guard against minutes-long runs."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_recall_floor_of_long_sequences_is_exact_and_does_not_hang():
    # It used to follow every set of keys seen so far (2**15 sets) for every pair: minutes.
    task = RecallTask(n_keys=16, n_values=8, n_pairs=2000, max_step=15)
    with _deadline(30):
        p_new = task.new_key_probability()
        floor = task.loss_floor()
    # sum_i P(key i is new) is the expected number of distinct keys in a sequence; in
    # 2000 steps all 16 keys show up (but for a chance below 16 * (14/15)**1999 ~ 1e-58).
    assert p_new.sum().item() == pytest.approx(16.0, abs=1e-9)
    assert floor == pytest.approx((16 * math.log(8) + 1999 * math.log(15)) / 3999, abs=1e-12)
    short = RecallTask(n_keys=16, n_values=8, n_pairs=12, max_step=15)
    assert torch.equal(p_new[:12], short.new_key_probability())  # a prefix of the same walk
    assert bool((p_new[1:] <= p_new[:-1]).all())  # a later key is less likely new


def test_recall_task_bad_inputs():
    with pytest.raises(ValueError, match="n_keys"):
        RecallTask(n_keys=17)
    with pytest.raises(ValueError, match="max_step"):
        RecallTask(n_keys=4, max_step=4)
    with pytest.raises(ValueError, match="n_values"):
        RecallTask(n_values=1)
    with pytest.raises(TypeError, match="n_pairs"):
        RecallTask(n_pairs=3.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="context_length"):
        RecallTask().get_batch("train", 2, 24)
    with pytest.raises(TypeError, match="context_length"):
        RecallTask().get_batch("train", 2, 23.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="generator"):
        RecallTask().sample(2, generator=1)  # type: ignore[arg-type]
    assert isinstance(make_task("recall", n_keys=4, max_step=2), RecallTask)
    with pytest.raises(TypeError, match="'n_key'.*n_keys"):
        make_task("recall", n_key=4)
    with pytest.raises(TypeError, match="name"):
        make_task(None)  # type: ignore[arg-type]


def test_induction_attention_score_finds_the_token_after_the_earlier_copy():
    tokens = torch.tensor([[5, 2, 7, 5, 2, 7]])  # (B=1, T=6)
    perfect = torch.zeros(1, 6, 6)
    perfect[0, torch.arange(6), torch.tensor([0, 0, 0, 1, 2, 3])] = 1.0  # t -> j + 1 for t >= 3
    previous = torch.zeros(1, 6, 6)
    previous[0, torch.arange(6), torch.tensor([0, 0, 1, 2, 3, 4])] = 1.0
    assert induction_attention_score(perfect, tokens).item() == pytest.approx(1.0)
    assert induction_attention_score(previous, tokens).item() == pytest.approx(0.0)
    heads = torch.stack([perfect, previous, torch.full((1, 6, 6), 1 / 6)], dim=1)  # (B, H, T, T)
    layers = torch.stack([heads, heads.flip(1)])  # (L, B, H, T, T)
    score = induction_attention_score(layers, tokens)
    assert score.shape == (2, 3)
    assert torch.allclose(score[0], torch.tensor([1.0, 0.0, 1 / 6]))
    with pytest.raises(ValueError, match="tokens"):
        induction_attention_score(perfect, tokens[0])
    with pytest.raises(ValueError, match="attn_weights"):
        induction_attention_score(perfect[:, :5, :5], tokens)
    with pytest.raises(ValueError, match="occurred earlier"):
        induction_attention_score(perfect, torch.arange(6)[None])


def _recall_oracle_head(task: RecallTask, tokens: torch.Tensor) -> torch.Tensor:
    """(B, T, T): a key query looks at the value after its key's latest earlier copy;
    every other query (values, new keys) looks at itself."""
    batch, time = tokens.shape
    weights = torch.zeros(batch, time, time)
    for b in range(batch):
        for t in range(time):
            earlier = [j for j in range(0, t - 1, 2) if tokens[b, j] == tokens[b, t]]
            source = earlier[-1] + 1 if t % 2 == 0 and earlier else t
            weights[b, t, source] = 1.0
    return weights


def test_induction_score_on_recall_counts_key_queries_only():
    task = RecallTask()
    tokens, targets = task.get_batch("val", 64, generator=torch.Generator().manual_seed(3))
    oracle = _recall_oracle_head(task, tokens)  # (B, T, T)
    keys = task.key_positions
    # the oracle's key queries read exactly the value they must predict
    looked_up = tokens.gather(1, oracle.argmax(dim=-1))[:, keys]  # (B, P)
    repeated = torch.stack([(tokens[:, :t:2] == tokens[:, t:t + 1]).any(1) for t in keys], 1)
    assert torch.equal(looked_up[repeated], targets[:, keys][repeated])
    assert induction_attention_score(oracle, tokens, queries=keys).item() == pytest.approx(1.0)
    everything = induction_attention_score(oracle, tokens).item()
    assert 0.3 < everything < 0.7  # value queries with an earlier copy drag it to about 1/2
    as_mask = torch.zeros(task.context_length, dtype=torch.bool)
    as_mask[keys] = True
    per_row = as_mask.expand(64, -1)
    for form in (as_mask, per_row):
        assert induction_attention_score(oracle, tokens, queries=form).item() == pytest.approx(1.0)
    stacked = torch.stack([oracle, torch.full_like(oracle, 1 / task.context_length)], 1)  # (B, H=2)
    score = induction_attention_score(stacked, tokens, queries=keys)
    assert score.shape == (2,) and score[0].item() == pytest.approx(1.0) and score[1] < 0.2


@pytest.mark.parametrize(
    "queries, error, phrase",
    [
        ([0, 2], TypeError, "queries must be None, a tensor"),
        (torch.tensor([0.0, 2.0]), TypeError, "integer positions"),
        (torch.tensor([[0, 2]]), TypeError, "integer positions"),
        (torch.tensor([0, 6]), ValueError, r"positions in \[0, T=6\)"),
        (torch.tensor([-1]), ValueError, r"positions in \[0, T=6\)"),
        (torch.ones(5, dtype=torch.bool), ValueError, r"shape \(T=6,\) or \(B=1, T=6\)"),
        (torch.tensor([0, 1, 2]), ValueError, "no scored query"),  # none has an earlier copy
    ],
)
def test_induction_score_bad_queries(queries, error, phrase):
    tokens = torch.tensor([[5, 2, 7, 5, 2, 7]])
    with pytest.raises(error, match=phrase):
        induction_attention_score(torch.full((1, 6, 6), 1 / 6), tokens, queries=queries)
