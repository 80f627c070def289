"""Data: text corpora, synthetic tasks with known floors, sequence-to-sequence tasks."""

from .text import (
    CharCorpus,
    CharTokenizer,
    PackedBatch,
    PackedCorpus,
    default_corpus,
    document_ids,
    download_tiny_shakespeare,
    load_text,
    train_val_split,
)

__all__ = [
    "CharCorpus",
    "CharTokenizer",
    "PackedBatch",
    "PackedCorpus",
    "default_corpus",
    "document_ids",
    "download_tiny_shakespeare",
    "load_text",
    "train_val_split",
]
