"""course_attn: the tested helper package of the attention course.

Each public name states in its docstring the chapter that derives it.
"""

# First, before torch: python -m course_attn.train owns its signals from here (_early_stop).
from ._early_stop import RECEIVED as _early_signals  # noqa: F401
from ._version import __version__
from .core.attention import (
    ATTENTION_FUNCTIONS,
    ATTENTION_IMPLS,
    attention,
    scaled_dot_product_attention,
)
from .core.flex_attention import (
    FlexFallbackWarning,
    causal_mask_mod,
    flex_attend,
    tensor_mask_mod,
    tensor_score_mod,
)
from .core.kv_cache import Cache, CrossKVCache, KVCache, new_caches
from .core.layers import (
    FeedForward,
    MultiHeadAttention,
    PositionalEncoding,
    TransformerBlock,
    merge_heads,
    sinusoidal_table,
    split_heads,
)
from .core.masks import (
    causal_mask,
    combine_masks,
    document_mask,
    document_positions,
    padding_mask,
    positions_from_attention_mask,
    to_additive_mask,
    to_torch_mha_mask,
)
from .core.self_attention import SelfAttention, simple_self_attention
from .core.softmax import attention_pool, softmax
from .core.tiled import (
    SoftmaxState,
    block_grid,
    merge_softmax_states,
    online_softmax,
    tiled_attention,
)
from .core.triton_attention import triton_attention
from .data.seq2seq import (
    ReverseTask,
    Seq2SeqBatch,
    Seq2SeqTask,
    SortTask,
    exact_match,
    exact_match_accuracy,
    greedy_answers,
    seq2seq_loss,
)
from .data.tasks import CopyTask, RecallTask
from .data.text import (
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
from .env import environment_report, pick_device, seed_everything
from .lab.analysis import (
    HeadScoreTracker,
    attention_maps,
    cross_attention_maps,
    cross_document_attention,
    induction_attention_score,
    offset_attention_score,
)
from .lab.experiments import (
    TIMED_MASKS,
    block_gradient_norms,
    cross_cache_step_ms,
    decode_step_seconds,
    masked_attention_seconds,
    residual_stream_rms,
    stream_gradient_norm,
)
from .lab.glue import glue
from .lab.hbm_traffic import HBM_ALGORITHMS, HBMTraffic, flash_block_sizes, hbm_traffic
from .lab.nanogpt import NanoGPT, NanoGPTConfig
from .lab.records import GPU_RECORDS, gpu_record
from .models.encoder_decoder import Decoder, Encoder, EncoderDecoder, EncoderDecoderConfig
from .models.gpt import POS_ENCODINGS, GPTConfig, MiniGPT
from .modern.alibi import alibi_attention, alibi_bias, alibi_slopes
from .modern.gqa import check_kv_heads, grouped_query_attention, repeat_kv
from .modern.kv_memory import KV_CACHE_KINDS, kv_cache_bytes
from .modern.latent import LatentKVCache, MultiHeadLatentAttention
from .modern.linear_attention import (
    LinearAttentionState,
    elu_feature_map,
    linear_attention,
    linear_attention_recurrent,
)
from .modern.mask_mods import (
    BlockTiles,
    alibi_score_mod,
    block_mask_grid,
    block_mask_tiles,
    document_mask_mod,
    padding_mask_mod,
    sliding_window_mask_mod,
)
from .modern.rope import apply_rope, apply_rotary, rope_cos_sin, rope_rotation, sinusoid_angles
from .modern.sliding_window import RollingKVCache, sliding_window_attention, sliding_window_mask

__all__ = [
    "GPU_RECORDS",
    "HBM_ALGORITHMS",
    "HBMTraffic",
    "NanoGPT",
    "NanoGPTConfig",
    "flash_block_sizes",
    "hbm_traffic",
    "glue",
    "gpu_record",
    "CharCorpus",
    "CharTokenizer",
    "CopyTask",
    "GPTConfig",
    "MiniGPT",
    "RecallTask",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "check",
    "default_corpus",
    "diagrams",
    "measure",
    "download_tiny_shakespeare",
    "HeadScoreTracker",
    "attention_maps",
    "cross_attention_maps",
    "induction_attention_score",
    "load_text",
    "offset_attention_score",
    "train_val_split",
    "__version__",
    "ATTENTION_FUNCTIONS",
    "ATTENTION_IMPLS",
    "Cache",
    "CrossKVCache",
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
    "cross_cache_step_ms",
    "decode_step_seconds",
    "residual_stream_rms",
    "stream_gradient_norm",
    "new_caches",
    "positions_from_attention_mask",
    "pick_device",
    "seed_everything",
    "simple_self_attention",
    "softmax",
    # issue 14, modern attention
    "KV_CACHE_KINDS",
    "LatentKVCache",
    "LinearAttentionState",
    "MultiHeadLatentAttention",
    "RollingKVCache",
    "alibi_attention",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "apply_rotary",
    "check_kv_heads",
    "elu_feature_map",
    "grouped_query_attention",
    "kv_cache_bytes",
    "linear_attention",
    "linear_attention_recurrent",
    "repeat_kv",
    "rope_cos_sin",
    "rope_rotation",
    "sinusoid_angles",
    "sliding_window_attention",
    "sliding_window_mask",
    "POS_ENCODINGS",
    # issue 16, training the encoder-decoder
    "ReverseTask",
    "Seq2SeqBatch",
    "Seq2SeqTask",
    "SortTask",
    "exact_match",
    "exact_match_accuracy",
    "greedy_answers",
    "seq2seq_loss",
    "SoftmaxState",
    "block_grid",
    "merge_softmax_states",
    "online_softmax",
    "tiled_attention",
    # issue 27, the FlashAttention-2 kernel in Triton
    "triton_attention",
    # issue 43, masks as code (FlexAttention) and packed documents
    "BlockTiles",
    "FlexFallbackWarning",
    "TIMED_MASKS",
    "cross_document_attention",
    "masked_attention_seconds",
    "PackedBatch",
    "PackedCorpus",
    "alibi_score_mod",
    "block_mask_grid",
    "block_mask_tiles",
    "causal_mask_mod",
    "document_ids",
    "document_mask",
    "document_mask_mod",
    "document_positions",
    "flex_attend",
    "padding_mask_mod",
    "sliding_window_mask_mod",
    "tensor_mask_mod",
    "tensor_score_mod",
]


def __getattr__(name: str):
    # The trainer is imported lazily: importing it here eagerly would make
    # ``python -m course_attn.train`` warn that the module was already loaded.
    if name in ("TrainConfig", "TrainResult", "TrainingDiverged"):
        from .train import loop

        return getattr(loop, name)
    if name in ("diagrams", "measure", "viz"):
        import importlib

        return importlib.import_module(f".lab.{name}", __name__)
    if name == "check":  # the learner's checks (Chapters 1-11): loaded when a chapter asks
        import importlib

        return importlib.import_module(".check", __name__)
    raise AttributeError(f"module 'course_attn' has no attribute {name!r}")
