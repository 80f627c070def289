"""course_attn: the tested helper package of the attention course.

Each public name states in its docstring the chapter that derives it.
"""

from . import diagrams, measure
from .attention import ATTENTION_IMPLS, attention, scaled_dot_product_attention
from .data import (
    CharCorpus,
    CharTokenizer,
    default_corpus,
    download_tiny_shakespeare,
    load_text,
    train_val_split,
)
from .encoder_decoder import (
    Decoder,
    Encoder,
    EncoderDecoder,
    EncoderDecoderConfig,
    block_gradient_norms,
    decode_step_seconds,
    positions_from_padding_mask,
)
from .env import environment_report, pick_device, seed_everything
from .layers import (
    FeedForward,
    KVCache,
    MultiHeadAttention,
    PositionalEncoding,
    TransformerBlock,
    merge_heads,
    sinusoidal_table,
    split_heads,
)
from .masks import causal_mask, combine_masks, padding_mask, to_additive_mask, to_torch_mha_mask
from .model import GPTConfig, MiniGPT
from .self_attention import SelfAttention, simple_self_attention
from .softmax import attention_pool, softmax
from .tasks import CopyTask, RecallTask, induction_attention_score, offset_attention_score
from .tiled import (
    SoftmaxState,
    block_grid,
    merge_softmax_states,
    online_softmax,
    tiled_attention,
)

__version__ = "0.1.0"

__all__ = [
    "CharCorpus",
    "CharTokenizer",
    "CopyTask",
    "GPTConfig",
    "MiniGPT",
    "RecallTask",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "default_corpus",
    "diagrams",
    "measure",
    "download_tiny_shakespeare",
    "induction_attention_score",
    "load_text",
    "offset_attention_score",
    "train_val_split",
    "__version__",
    "ATTENTION_IMPLS",
    "FeedForward",
    "KVCache",
    "MultiHeadAttention",
    "PositionalEncoding",
    "SelfAttention",
    "TransformerBlock",
    "attention",
    "causal_mask",
    "combine_masks",
    "merge_heads",
    "padding_mask",
    "scaled_dot_product_attention",
    "sinusoidal_table",
    "split_heads",
    "to_additive_mask",
    "to_torch_mha_mask",
    "attention_pool",
    "environment_report",
    "Decoder",
    "Encoder",
    "EncoderDecoder",
    "EncoderDecoderConfig",
    "block_gradient_norms",
    "decode_step_seconds",
    "positions_from_padding_mask",
    "pick_device",
    "seed_everything",
    "simple_self_attention",
    "softmax",
    "SoftmaxState",
    "block_grid",
    "merge_softmax_states",
    "online_softmax",
    "tiled_attention",
]


def __getattr__(name: str):
    # The trainer is imported lazily: importing it here eagerly would make
    # ``python -m course_attn.train`` warn that the module was already loaded.
    if name in ("TrainConfig", "TrainResult", "TrainingDiverged"):
        from . import train

        return getattr(train, name)
    raise AttributeError(f"module 'course_attn' has no attribute {name!r}")
