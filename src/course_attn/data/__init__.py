"""Data: text corpora, synthetic tasks with known floors, sequence-to-sequence tasks."""

from .text import (
    CharCorpus,
    CharTokenizer,
    default_corpus,
    download_tiny_shakespeare,
    load_text,
    train_val_split,
)

__all__ = [
    "CharCorpus",
    "CharTokenizer",
    "default_corpus",
    "download_tiny_shakespeare",
    "load_text",
    "train_val_split",
]
