"""What one training step costs the host: operators and milliseconds (Chapter 11, issue 42).

Every PyTorch operator a step dispatches costs the host Python and dispatcher work; on a GPU
most of them launch a kernel (views launch none), and when the model is small the GPU waits
for the host to issue them. Both are
measured here without a GPU, for ``MiniGPT`` and for nanoGPT's model
(:class:`~course_attn.lab.nanogpt.NanoGPT`) built with the same layers, heads, dropout and
bias setting, and the same AdamW (weight decay on matrices only):

* :func:`step_operator_counts`: the aten operators of one step (forward with the loss,
  backward, AdamW, ``zero_grad(set_to_none=True)``) at the gpu preset's sizes
  (:data:`GPU_SIZES`) on the ``meta`` device, where nothing is computed: the count depends
  only on the code, the same on every machine;
* :func:`step_host_ms`: the median host milliseconds of a step at :data:`TINY_SIZES`, where
  the arithmetic is small and the same for both models, the two models' steps taken in turn.

``benchmarks/host_cost.py`` prints both as a table.

Where the trainers differ on a CPU, AdamW's form: :func:`update_ms` times its three forms
at :data:`CPU_SIZES`, and :data:`CPU_RECIPE_RECORD` holds the whole trainers timed on
nanoGPT's CPU recipe (``benchmarks/cpu_recipe.py --record``).
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import torch
from torch import nn

from ..core.layers import MultiHeadAttention
from ..models.gpt import GPTConfig, MiniGPT
from .measure import operator_counts
from .nanogpt import NanoGPT, NanoGPTConfig

__all__ = ["CPU_RECIPE_RECORD", "CPU_SIZES", "GPU_SIZES", "TINY_SIZES", "host_ms_rounds",
           "layer_step_operator_counts", "step_batch", "step_host_ms", "step_model",
           "step_operator_counts", "training_step", "update_ms"]

#: The gpu preset's model and batch (nanoGPT's "baby GPT").
GPU_SIZES: dict[str, Any] = dict(n_layers=6, n_heads=6, d_model=384, context_length=256,
                                 batch=64, dropout=0.2)
#: The same layers at sizes where a step's arithmetic is small, and the same for both models.
TINY_SIZES: dict[str, Any] = dict(GPU_SIZES, d_model=48, context_length=8, batch=1)
#: The cpu preset's model and batch (nanoGPT's CPU recipe).
CPU_SIZES: dict[str, Any] = dict(n_layers=4, n_heads=4, d_model=128, context_length=64,
                                 batch=12, dropout=0.0)
VOCAB = 65  # Tiny Shakespeare's characters
#: nanoGPT's CPU recipe trained by the course's trainer and by nanoGPT's ``train.py`` loop,
#: taking turns on one machine: data written by ``benchmarks/cpu_recipe.py --record``; its
#: ``"about"`` says what each field is.
CPU_RECIPE_RECORD: dict[str, Any] = json.loads(
    resources.files(__package__).joinpath("cpu_recipe_runs.json").read_text(encoding="utf-8"))
KINDS = ("course", "nanoGPT")


def step_model(kind: str, sizes: dict[str, Any], *, bias: bool, impl: str = "sdpa",
               device: str = "cpu", foreach: bool = True, nanogpt: tuple[type, type] | None = None
               ) -> tuple[nn.Module, torch.optim.Optimizer]:
    """``(model, AdamW)`` on ``device`` in training mode: ``kind`` is ``"course"`` (MiniGPT)
    or ``"nanoGPT"`` (``nanogpt``'s ``(GPT, GPTConfig)``, by default the package's copy)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    with torch.device(device):
        if kind == "course":
            model: nn.Module = MiniGPT(GPTConfig(
                vocab_size=VOCAB, context_length=sizes["context_length"],
                n_layers=sizes["n_layers"], n_heads=sizes["n_heads"], d_model=sizes["d_model"],
                dropout=sizes["dropout"], bias=bias, impl=impl))
        else:
            gpt, gpt_config = nanogpt or (NanoGPT, NanoGPTConfig)
            model = gpt(gpt_config(
                block_size=sizes["context_length"], vocab_size=VOCAB,
                n_layer=sizes["n_layers"], n_head=sizes["n_heads"], n_embd=sizes["d_model"],
                dropout=sizes["dropout"], bias=bias))
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return model.train(), torch.optim.AdamW(groups, lr=1e-3, foreach=foreach)


def training_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                  y: torch.Tensor, **call: Any) -> None:
    """One step as nanoGPT's loop takes it: loss, backward, AdamW, gradients set to None."""
    _, loss = model(x, y, **call)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def step_batch(sizes: dict[str, Any], device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded batch ``(x, y)``, each ``(batch, context_length)``, on ``device``."""
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(VOCAB, (sizes["batch"], sizes["context_length"] + 1), generator=gen)
    return data[:, :-1].to(device), data[:, 1:].to(device)  # (B, T) each


def step_operator_counts(kind: str, *, bias: bool, impl: str = "sdpa", foreach: bool = True,
                         padded: bool = False, nanogpt: tuple[type, type] | None = None,
                         sizes: dict[str, Any] = GPU_SIZES, device: str = "meta"
                         ) -> Counter[str]:
    """aten operators of one training step at ``sizes`` on ``device`` (by default the gpu
    preset's on ``meta``), counted after a first step (which creates AdamW's state).
    ``padded``: the course's model is also given an all-real padding mask, so that it takes
    the masked path of a padded batch. On the CPU the course's loss reads its value once
    and skips its count (``next_token_loss``), and PyTorch may pick other kernels than on
    ``meta``: :data:`TINY_SIZES` on ``"cpu"`` counts the step that :func:`host_ms_rounds`
    times."""
    model, optimizer = step_model(kind, sizes, bias=bias, impl=impl, device=device,
                                  foreach=foreach, nanogpt=nanogpt)
    x, y = step_batch(sizes, device)
    call = {"attention_mask": torch.ones_like(x, dtype=torch.bool)} if padded else {}
    training_step(model, optimizer, x, y, **call)
    return operator_counts(lambda: training_step(model, optimizer, x, y, **call))


def layer_step_operator_counts(*, fused_qkv: bool, bias: bool = False) -> Counter[str]:
    """aten operators of a causal self-attention layer's forward and backward at
    :data:`GPU_SIZES` on ``meta``: one ``q, k, v`` projection (``fused_qkv``) or three."""
    d, batch, time = GPU_SIZES["d_model"], GPU_SIZES["batch"], GPU_SIZES["context_length"]
    with torch.device("meta"):
        layer = MultiHeadAttention(d, GPU_SIZES["n_heads"], bias=bias, fused_qkv=fused_qkv)
        x = torch.empty(batch, time, d, requires_grad=True)  # (B, T, D)

    def forward_backward() -> None:
        out, _ = layer(x, is_causal=True)  # (B, T, D)
        out.sum().backward()

    return operator_counts(forward_backward)


def step_host_ms(kinds: Sequence[str] = KINDS, *, bias: bool, steps: int = 100,
                 rounds: int = 2, warmup: int = 10, impl: str = "sdpa",
                 nanogpt: tuple[type, type] | None = None) -> dict[str, float]:
    """Median host milliseconds of a training step at :data:`TINY_SIZES` on the CPU, per
    kind: the median of :func:`host_ms_rounds`' rounds (see there how they are taken)."""
    times = host_ms_rounds(kinds, bias=bias, steps=steps, rounds=rounds, warmup=warmup,
                           impl=impl, nanogpt=nanogpt)
    return {label: statistics.median(values) for label, values in times.items()}


def host_ms_rounds(kinds: Sequence[str] = KINDS, *, bias: bool, steps: int = 100,
                   rounds: int = 2, warmup: int = 10, impl: str = "sdpa",
                   nanogpt: tuple[type, type] | None = None) -> dict[str, list[float]]:
    """Each round's median host milliseconds of a training step at :data:`TINY_SIZES` on
    the CPU, per kind: ``rounds`` rounds, each with fresh models and ``steps`` steps of each.

    A run of nanoGPT's model against a second copy of itself (``benchmarks/host_cost.py``'s
    control) shows figures that differ with nothing in the code to differ; the order the
    models were built in and the order of their steps are two things that can favour one of
    them. So round ``r`` builds the models starting from kind ``r`` (over an even number of
    rounds each of two kinds is built first as often), and the steps alternate: A B, B A,
    A B, ... so a busy moment of the machine hits every kind. A kind named twice
    (``("nanoGPT", "nanoGPT")``, that control) is reported as ``"nanoGPT"`` and
    ``"nanoGPT #2"``."""
    labels = [kind if kinds.index(kind) == i else f"{kind} #{kinds[:i + 1].count(kind)}"
              for i, kind in enumerate(kinds)]
    times: dict[str, list[float]] = {label: [] for label in labels}
    for r in range(rounds):
        runs = {}
        for i in (*range(r % len(kinds), len(kinds)), *range(r % len(kinds))):
            torch.manual_seed(0)
            model, optimizer = step_model(kinds[i], TINY_SIZES, bias=bias, impl=impl,
                                          nanogpt=nanogpt)
            runs[labels[i]] = (model, optimizer, *step_batch(TINY_SIZES))
            for _ in range(warmup):
                training_step(*runs[labels[i]])
        each: dict[str, list[float]] = {label: [] for label in labels}
        order = list(runs.items())
        for _ in range(steps):
            for label, run in order:
                start = time.perf_counter()
                training_step(*run)
                each[label].append(time.perf_counter() - start)
            order.reverse()  # A B, B A, ...: neither kind always follows the other
        for label in labels:
            times[label].append(1e3 * statistics.median(each[label]))
    return times


def update_ms(sizes: dict[str, Any] = CPU_SIZES, *, steps: int = 100, warmup: int = 5
              ) -> dict[str, float]:
    """Median milliseconds of AdamW's update of one step on the CPU, by form: its loop over
    the tensors (``foreach=False``, what PyTorch picks on the CPU when asked for neither,
    as nanoGPT's ``configure_optimizers`` does there), ``foreach=True`` and ``fused=True``
    (weight decay on matrices only), on the parameters of the course's model at ``sizes``
    with fixed random gradients, at the current thread count; the forms are timed in turn,
    step after step, so that a busy moment hits all of them."""
    torch.manual_seed(0)
    model, _ = step_model("course", sizes, bias=False)
    params = list(model.parameters())
    for param in params:
        param.grad = torch.randn_like(param)
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    adamw = {form: torch.optim.AdamW([dict(g) for g in groups], lr=1e-3, foreach=foreach,
                                     fused=fused)
             for form, foreach, fused in (("loop", False, None), ("foreach", True, None),
                                          ("fused", None, True))}
    forms: dict[str, Callable[[], object]] = {
        f"AdamW {form}": optimizer.step for form, optimizer in adamw.items()}
    times: dict[str, list[float]] = {form: [] for form in forms}
    for i in range(warmup + steps):
        for form, call in forms.items():
            start = time.perf_counter()
            call()
            if i >= warmup:
                times[form].append(time.perf_counter() - start)
    return {form: 1e3 * statistics.median(each) for form, each in times.items()}
