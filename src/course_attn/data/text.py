"""Text data for the mini-Transformer (chapter 11): characters in, token ids out.

Everything here works offline. The default corpus is the Python standard
library's own source code (a fixed list of modules, read in a fixed order from
the running interpreter), so it exists on every machine without a download.
Real prose such as Tiny Shakespeare is read from a path the user gives, or
downloaded on request by :func:`download_tiny_shakespeare`, which checks the
file's SHA-256 and says clearly when the machine is offline.
"""

from __future__ import annotations

import hashlib
import os
import string
import sysconfig
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from .._validation import (
    check_cpu_generator,
    check_device,
    check_positive_int,
    check_positive_real,
    check_split,
)

__all__ = [
    "DEFAULT_CORPUS_MODULES",
    "TINY_SHAKESPEARE_SHA256",
    "TINY_SHAKESPEARE_URL",
    "CharCorpus",
    "CharTokenizer",
    "PackedBatch",
    "PackedCorpus",
    "default_corpus",
    "document_ids",
    "download_tiny_shakespeare",
    "get_batch",
    "load_text",
    "to_device",
    "train_val_split",
]

#: Standard-library modules that make up the offline default corpus, in this order.
#: All of them exist in CPython 3.11 and later, are plain Python and need no build step.
DEFAULT_CORPUS_MODULES: tuple[str, ...] = (
    "textwrap.py",
    "bisect.py",
    "heapq.py",
    "fractions.py",
    "statistics.py",
    "difflib.py",
    "calendar.py",
    "random.py",
    "functools.py",
    "dataclasses.py",
    "string.py",
    "queue.py",
    "contextlib.py",
)

#: Karpathy's char-rnn copy of Tiny Shakespeare (1,115,394 bytes), the corpus nanoGPT uses.
TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


class CharTokenizer:
    """Character-level tokenizer: one token id per distinct character (chapter 11).

    The vocabulary is the sorted set of characters of the text it was built
    from, so the same text always gives the same ids. ``encode`` refuses a
    character it has never seen (naming it and its position) rather than
    guessing.
    """

    def __init__(self, chars: str | Sequence[str]) -> None:
        if isinstance(chars, str):
            chars = list(chars)
        if not isinstance(chars, Sequence) or not all(
            isinstance(c, str) and len(c) == 1 for c in chars
        ):
            raise TypeError("chars must be a string or a sequence of single characters")
        if len(chars) == 0:
            raise ValueError("chars must contain at least one character, got an empty vocabulary")
        if len(set(chars)) != len(chars):
            raise ValueError("chars must not repeat a character")
        self.chars: str = "".join(chars)
        self._stoi = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """Build the vocabulary from every distinct character of ``text`` (sorted)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if not text:
            raise ValueError("text must not be empty: there is no vocabulary to build")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        """Number of distinct characters ``N_vocab``."""
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        """Characters -> token ids (a list of ``len(text)`` ints in ``[0, N_vocab)``)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        try:
            return [self._stoi[c] for c in text]
        except KeyError:
            position = next(i for i, c in enumerate(text) if c not in self._stoi)
            raise ValueError(
                f"text contains the character {text[position]!r} at position {position}, "
                f"which is not in the tokenizer's vocabulary of {self.vocab_size} characters"
            ) from None

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        """Token ids (a list or a 1-D long tensor) -> the string they stand for."""
        if isinstance(ids, Tensor):
            ids = _check_token_ids(ids, "ids").tolist()
        elif isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
            raise TypeError(f"ids must be a sequence of ints or a 1-D integer tensor, "
                            f"got {type(ids).__name__}")
        out = []
        for position, i in enumerate(ids):
            if isinstance(i, bool) or not isinstance(i, int):
                raise TypeError(f"ids[{position}] must be an int token id, got {i!r}")
            if not 0 <= i < self.vocab_size:
                raise ValueError(
                    f"ids[{position}] must be an int in [0, {self.vocab_size}), got {i!r}"
                )
            out.append(self.chars[i])
        return "".join(out)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def load_text(path: str | os.PathLike[str]) -> str:
    """Read a UTF-8 text file; a clear error for a missing, empty or binary file (Chapter 11)."""
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
    file = Path(path)
    if not file.exists():
        raise FileNotFoundError(f"path {str(file)!r} is not an existing file")
    if not file.is_file():
        kind = "a folder" if file.is_dir() else "a pipe or a device (not a regular file)"
        raise ValueError(f"path {str(file)!r} is {kind}: give a text file (save piped text to "
                         "a file first; a run records the file it trained on, to resume from)")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"path {str(file)!r} is not UTF-8 text ({error.reason})") from None
    if not text:
        raise ValueError(f"path {str(file)!r} is empty: there is no text to train on")
    return text


def default_corpus(modules: Sequence[str] = DEFAULT_CORPUS_MODULES) -> str:
    """The offline default corpus (Chapter 11): standard-library files joined in a fixed order.

    Each file is preceded by a ``# ==== name ====`` line. The text depends on
    the Python version (the standard library changes a little between
    releases), never on the network.
    """
    if isinstance(modules, str) or not isinstance(modules, Sequence) or not all(
            isinstance(name, str) for name in modules):
        raise TypeError(f"modules must be a sequence of file names (str), got {modules!r}")
    if not modules:
        raise ValueError("modules must name at least one standard-library file, got none")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for name in modules:
        file = stdlib / name
        if not file.is_file():
            raise FileNotFoundError(
                f"the default corpus needs the standard-library file {name!r}, not found in "
                f"{str(stdlib)!r}; pass a text file with --data / load_text instead"
            )
        parts.append(f"# ==== {name} ====\n" + file.read_text(encoding="utf-8"))
    return "\n".join(parts)


def _check_token_ids(data: object, name: str) -> Tensor:
    """A 1-D tensor of integer token ids (not float, not bool); return it."""
    if not isinstance(data, Tensor):
        raise TypeError(f"{name} must be a 1-D tensor of token ids, got {type(data).__name__}")
    if data.is_floating_point() or data.is_complex() or data.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids (e.g. torch.long), got dtype "
                        f"{data.dtype}")
    if data.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor of token ids, got shape "
                         f"{tuple(data.shape)}")
    return data


def train_val_split(data: Tensor, train_fraction: float = 0.9) -> tuple[Tensor, Tensor]:
    """A 1-D token tensor's first ``train_fraction`` and the rest (Chapter 11; nanoGPT: 90/10).

    The split is by position, not random, so validation text is text the model
    has never read.
    """
    _check_token_ids(data, "data")
    if isinstance(train_fraction, bool) or not isinstance(train_fraction, float | int):
        raise TypeError(f"train_fraction must be a number in (0, 1), got {train_fraction!r}")
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    n = int(train_fraction * len(data))
    if n == 0 or n == len(data):
        raise ValueError(f"data of {len(data)} token{'s' * (len(data) != 1)} splits into {n} "
                         f"training and {len(data) - n} validation tokens at train_fraction="
                         f"{train_fraction}: each part needs at least one; use a longer text")
    return data[:n], data[n:]


def get_batch(
    data: Tensor,
    batch_size: int,
    context_length: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """Random windows of ``data``: inputs ``x (B, T)`` and next-token targets ``y (B, T)``.

    ``y[b, t] = x[b, t + 1]``'s successor in the text, i.e. ``y`` is ``x``
    shifted left by one. The window starts come from ``generator`` (a seeded
    CPU ``torch.Generator`` makes batches reproducible; its state can be saved).
    The windows are cut on ``data``'s own device: when ``data`` already lives on
    the GPU, only the ``B`` start indices cross from the host (see :func:`to_device`).
    ``device`` is where ``x`` and ``y`` go (default: ``data``'s device).
    """
    _check_token_ids(data, "data")
    check_positive_int(batch_size, "batch_size")
    check_positive_int(context_length, "context_length")
    check_cpu_generator(generator)
    if device is not None:
        check_device(device, "device", exists=True)
    if len(data) < context_length + 1:
        raise ValueError(
            f"data has {len(data)} tokens, fewer than context_length + 1 = {context_length + 1}: "
            "use a longer text or a smaller context_length"
        )
    index = _windows(len(data), batch_size, context_length, generator, data.device)  # (B, T)
    x, y = data[index], data[index + 1]  # (B, T), (B, T)
    if device is not None:
        x, y = to_device(x, device), to_device(y, device)
    return x, y


def _windows(n: int, batch_size: int, context_length: int, generator: torch.Generator | None,
             device: torch.device) -> Tensor:
    """``(B, T)`` positions of ``B`` random windows of ``T`` tokens (and their successors)
    in ``n`` tokens, the starts drawn on the CPU from ``generator``."""
    starts = torch.randint(n - context_length, (batch_size,), generator=generator)  # (B,)
    starts = to_device(starts, device)  # (B,) index tensor, copied without blocking
    offsets = torch.arange(context_length, device=device)  # (T,)
    return starts[:, None] + offsets[None, :]  # (B, 1) + (1, T) -> (B, T)


def to_device(tensor: Tensor, device: torch.device | str) -> Tensor:
    """Move ``tensor`` to ``device`` without making the host wait for the GPU.

    A copy from ordinary (pageable) host memory to CUDA blocks the Python thread
    until the GPU has finished all its queued work. From page-locked ("pinned")
    memory with ``non_blocking=True`` the copy is queued like a kernel instead,
    so the host can prepare the next step meanwhile (nanoGPT's ``get_batch``
    does the same). On other devices it is a plain ``.to(device)``.
    """
    if not isinstance(tensor, Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    device = check_device(device, "device", allow_none=False, exists=True)
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


@dataclass(frozen=True, eq=False)
class CharCorpus:
    """A text, its tokenizer and its 90/10 train/validation token tensors (chapter 11)."""

    tokenizer: CharTokenizer
    train_data: Tensor
    val_data: Tensor
    # Copies of the splits on the devices batches were asked for, made once each: the
    # text (a few MB of ids) then stays on the GPU and a batch is cut there.
    _on_device: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.tokenizer, CharTokenizer):
            raise TypeError(f"tokenizer must be a CharTokenizer, got "
                            f"{type(self.tokenizer).__name__}")
        _check_token_ids(self.train_data, "train_data")
        _check_token_ids(self.val_data, "val_data")

    @classmethod
    def from_text(cls, text: str, train_fraction: float = 0.9) -> CharCorpus:
        """Tokenize ``text`` with a vocabulary built from it and split it 90/10."""
        tokenizer = CharTokenizer.from_text(text)
        data = torch.tensor(tokenizer.encode(text), dtype=torch.long)  # (N,)
        train, val = train_val_split(data, train_fraction)
        return cls(tokenizer, train, val)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def get_batch(
        self,
        split: str,
        batch_size: int,
        context_length: int,
        *,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
    ) -> tuple[Tensor, Tensor]:
        """A random batch ``(x, y)``, both ``(B, T)``, from the ``"train"`` or ``"val"`` split."""
        check_split(split)
        if device is not None:
            check_device(device, "device", exists=True)
        data = self.train_data if split == "train" else self.val_data
        if device is not None and torch.device(device) != data.device:
            key = (split, str(torch.device(device)))
            if key not in self._on_device:
                self._on_device[key] = data.to(device)
            data = self._on_device[key]
        return get_batch(data, batch_size, context_length, generator=generator)


def document_ids(text: str, separator: str) -> Tensor:
    """The document of each character of ``text``, cut at every ``separator`` (Chapter 11).

    ``(len(text),)`` long ids ``0, 0, ..., 1, 1, ...``: a document starts at the text's
    first character and at each occurrence of ``separator`` (found left to right, without
    overlap), which opens its document as a beginning-of-document mark would. For Tiny
    Shakespeare, ``separator="\\n\\n"`` makes each speech a document.
    """
    if not isinstance(text, str) or not isinstance(separator, str):
        raise TypeError(f"text and separator must be str, got {type(text).__name__} and "
                        f"{type(separator).__name__}")
    if not separator:
        raise ValueError("separator must be a non-empty str, got ''")
    starts, at = [], text.find(separator, 1)
    while at != -1:
        starts.append(at)
        at = text.find(separator, at + len(separator))
    begins = torch.zeros(len(text), dtype=torch.long)  # (N,): 1 where a document begins
    begins[starts] = 1
    return begins.cumsum(0)  # (N,)


class PackedBatch(NamedTuple):
    """A batch of packed rows (Chapter 11): ``x``, ``y`` and ``doc_ids``, each ``(B, T)``.

    It unpacks into ``MiniGPT(x, y, doc_ids)``, as ``(x, y)`` does into ``MiniGPT(x, y)``.
    """

    x: Tensor
    y: Tensor
    doc_ids: Tensor


@dataclass(frozen=True, eq=False)
class PackedCorpus:
    """A :class:`CharCorpus` cut into documents at a separator (Chapter 11).

    Its batches are the corpus's windows (the same ones for the same generator), each with
    the document id of every token: a row packs the end of one document, whole ones, and
    the start of another, and ``MiniGPT(x, y, doc_ids)`` keeps attention and positions
    inside each document.
    """

    corpus: CharCorpus
    separator: str
    train_docs: Tensor  # (N_train,) the document of each training token
    val_docs: Tensor  # (N_val,)
    _on_device: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.corpus, CharCorpus):
            raise TypeError(f"corpus must be a CharCorpus, got {type(self.corpus).__name__}")
        for docs, data, name in ((self.train_docs, self.corpus.train_data, "train_docs"),
                                 (self.val_docs, self.corpus.val_data, "val_docs")):
            if _check_token_ids(docs, name).shape != data.shape:
                raise ValueError(f"{name} must hold one id per token, {tuple(data.shape)}, "
                                 f"got {tuple(docs.shape)}")

    @classmethod
    def from_text(cls, text: str, separator: str, train_fraction: float = 0.9
                  ) -> PackedCorpus:
        """Tokenize and split ``text`` as :meth:`CharCorpus.from_text`, documents cut at
        ``separator`` (which must occur in it)."""
        docs = document_ids(text, separator)
        if not isinstance(text, str) or len(text) < 2 or int(docs[-1]) == 0:
            raise ValueError(f"separator {separator!r} does not occur in the text (after its "
                             "first character): it would be one single document")
        corpus = CharCorpus.from_text(text, train_fraction)
        n = len(corpus.train_data)
        return cls(corpus, separator, docs[:n], docs[n:])

    @property
    def tokenizer(self) -> CharTokenizer:
        return self.corpus.tokenizer

    @property
    def vocab_size(self) -> int:
        return self.corpus.vocab_size

    @property
    def train_data(self) -> Tensor:
        return self.corpus.train_data

    @property
    def val_data(self) -> Tensor:
        return self.corpus.val_data

    def get_batch(self, split: str, batch_size: int, context_length: int, *,
                  generator: torch.Generator | None = None,
                  device: torch.device | str | None = None) -> PackedBatch:
        """A random batch ``(x, y, doc_ids)``, each ``(B, T)``, from ``"train"`` or ``"val"``:
        the windows :meth:`CharCorpus.get_batch` cuts, with their documents."""
        check_split(split)
        check_positive_int(batch_size, "batch_size")
        check_positive_int(context_length, "context_length")
        check_cpu_generator(generator)
        target = torch.device("cpu") if device is None else check_device(
            device, "device", allow_none=False, exists=True)
        data, docs = self._split_on(split, target)
        if len(data) < context_length + 1:
            raise ValueError(f"the {split} split has {len(data)} tokens, fewer than "
                             f"context_length + 1 = {context_length + 1}")
        index = _windows(len(data), batch_size, context_length, generator, data.device)
        return PackedBatch(data[index], data[index + 1], docs[index])  # (B, T) each

    def _split_on(self, split: str, device: torch.device) -> tuple[Tensor, Tensor]:
        """A split's tokens and document ids on ``device``, copied there once."""
        data, docs = ((self.train_data, self.train_docs) if split == "train"
                      else (self.val_data, self.val_docs))
        if device == data.device:
            return data, docs
        key = (split, str(device))
        if key not in self._on_device:
            self._on_device[key] = (data.to(device), docs.to(device))
        return self._on_device[key]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_file_name(filename: object) -> None:
    """A plain file name: no folder part, so the download stays inside the cache folder."""
    if not isinstance(filename, str):
        raise TypeError(f"filename must be a str, got {type(filename).__name__}")
    separators = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())
    if (not filename or filename in (".", "..") or any(c in filename for c in separators)
            or "\0" in filename or Path(filename).is_absolute()):
        raise ValueError(f"filename must be a plain file name inside cache_dir (no folder, "
                         f"no '..'), got {filename!r}")


def download_tiny_shakespeare(
    cache_dir: str | os.PathLike[str],
    *,
    url: str = TINY_SHAKESPEARE_URL,
    sha256: str = TINY_SHAKESPEARE_SHA256,
    filename: str = "tiny_shakespeare.txt",
    opener: Callable[..., object] = urllib.request.urlopen,
    timeout: float = 30.0,
) -> Path:
    """Download Tiny Shakespeare into ``cache_dir``, only when asked; its path (Chapter 11).

    A cached file with the right SHA-256 is reused with no network access; a download
    with another SHA-256 is deleted (``ValueError``); no network is a ``ConnectionError``
    saying how to fetch the file by hand. ``filename`` is a plain name inside
    ``cache_dir``; ``opener`` is ``urllib.request.urlopen`` (tests pass a stand-in).
    """
    if not isinstance(cache_dir, str | os.PathLike):
        raise TypeError(f"cache_dir must be a str or a path, got {type(cache_dir).__name__}")
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    if not url:
        raise ValueError("url must be a non-empty str, got ''")
    if not isinstance(sha256, str):
        raise TypeError(f"sha256 must be a str of 64 hex digits, got {type(sha256).__name__}")
    if len(sha256) != 64 or not set(sha256) <= set(string.hexdigits):
        raise ValueError(f"sha256 must be a 64-character hex digest (0-9, a-f), got {sha256!r}")
    _check_file_name(filename)
    if not callable(opener):
        raise TypeError(f"opener must be callable like urllib.request.urlopen, got "
                        f"{type(opener).__name__}")
    check_positive_real(timeout, "timeout")
    folder = Path(cache_dir)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"cache_dir {str(folder)!r} exists and is not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / filename
    if target.is_file() and _sha256(target) == sha256.lower():
        return target
    partial = target.with_name(target.name + ".part")
    try:
        with opener(url, timeout=timeout) as response, partial.open("wb") as f:  # type: ignore[attr-defined]
            for chunk in iter(lambda: response.read(1 << 20), b""):
                f.write(chunk)
    except (urllib.error.URLError, OSError) as error:
        partial.unlink(missing_ok=True)
        raise ConnectionError(
            f"could not download {url} ({error}); the machine may be offline. Download the "
            f"file by hand, save it as {str(target)!r} and pass that path instead"
        ) from None
    actual = _sha256(partial)
    if actual != sha256.lower():
        partial.unlink()
        raise ValueError(
            f"the file downloaded from {url} has SHA-256 {actual}, expected {sha256}; "
            "it was deleted (a changed or truncated download)"
        )
    partial.replace(target)
    return target
