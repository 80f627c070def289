"""The trainer's two presets (chapter 11), and the check that a preset suits the machine.

``gpu`` is nanoGPT's "baby GPT" on Tiny Shakespeare (best validation loss
1.4697 in about 3 minutes on one A100, by nanoGPT's README); ``cpu`` is its
laptop recipe (4 layers, 4 heads, width 128, context 64, batch 12). The keys are fields of
:class:`~course_attn.models.gpt.GPTConfig` and :class:`~course_attn.train.TrainConfig`.
"""

from __future__ import annotations

from typing import Any

import torch

from .._validation import check_choice, check_device, check_positive_int, check_positive_real
from ..models.gpt import GPTConfig, MiniGPT
from .hardware import cpu_flops_per_second

__all__ = ["PRESETS", "check_preset_device"]

#: Model and training sizes of the two presets. Both are nanoGPT's Shakespeare-char runs, and
#: like them without biases (nanoGPT's train.py default): a bias-free step dispatches fewer
#: operators (benchmarks/host_cost.py prints both counts), and nanoGPT's model.py notes that
#: bias-free layers are "a bit better and faster".
PRESETS: dict[str, dict[str, Any]] = {
    "cpu": dict(n_layers=4, n_heads=4, d_model=128, context_length=64, batch_size=12, dropout=0.0,
                bias=False, lr=1e-3, max_iters=2000, eval_interval=250, eval_iters=20,
                warmup_iters=100),
    "gpu": dict(n_layers=6, n_heads=6, d_model=384, context_length=256, batch_size=64, dropout=0.2,
                bias=False, lr=1e-3, max_iters=5000, eval_interval=250, eval_iters=200,
                warmup_iters=100),
}


def check_preset_device(preset: str, device: torch.device | str, *, vocab_size: int = 65,
                        cpu_flops: float | None = None) -> None:
    """Refuse to start the ``gpu`` preset on a CPU, saying what it would cost (chapter 11).

    The estimate is :meth:`MiniGPT.flops_per_token` times the tokens of the
    whole run, over this CPU's measured matrix-multiply speed (``cpu_flops``,
    FLOP/s, measured when ``None``): a lower bound, since training never runs
    as fast as one large matrix product. Any other preset or device passes.
    Raises ``ValueError`` with the estimate and the two ways on.
    """
    if not isinstance(preset, str):
        raise TypeError(f"preset must be a str, one of {tuple(PRESETS)}, got "
                        f"{type(preset).__name__}")
    check_choice(preset, "preset", tuple(PRESETS))
    device = check_device(device, "device", allow_none=False)
    check_positive_int(vocab_size, "vocab_size")
    if cpu_flops is not None:
        check_positive_real(cpu_flops, "cpu_flops")
    if preset != "gpu" or device.type != "cpu":
        return
    sizes = PRESETS["gpu"]
    with torch.device("meta"):  # sizes only: no memory, no time
        model = MiniGPT(GPTConfig(vocab_size=vocab_size, context_length=sizes["context_length"],
                                  n_layers=sizes["n_layers"], n_heads=sizes["n_heads"],
                                  d_model=sizes["d_model"]))
    tokens = sizes["max_iters"] * sizes["batch_size"] * sizes["context_length"]
    flops = model.flops_per_token() * tokens
    speed = cpu_flops_per_second() if cpu_flops is None else float(cpu_flops)
    hours = flops / speed / 3600
    raise ValueError(
        f"the gpu preset trains a {model.num_parameters() / 1e6:.1f}M-parameter model on "
        f"{tokens / 1e6:.0f}M tokens ({flops:.1e} floating-point operations), and no GPU was "
        f"found: this CPU multiplies matrices at {speed / 1e9:.0f} GFLOP/s, so it would take "
        f"at least {hours:.0f} hours. Use the cpu preset, run on a GPU (on Colab: Runtime > "
        "Change runtime type > GPU), or ask for the CPU explicitly (--device cpu) to run it "
        "anyway"
    )
