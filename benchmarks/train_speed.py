"""Training speed of MiniGPT: manual vs fused (sdpa) attention, eager vs compiled (chapter 11).

Two measurements, both printed with ratios taken in the same run:

1. **Model step**: forward, backward and AdamW on batches already on the device,
   mixed precision as the trainer picks it (:func:`course_attn.train.amp_dtype`).
   The variants train identical copies of one model on the same batches,
   interleaved round by round so that all see the same machine load; the device
   is synchronised only at the ends of a timed stretch. On CUDA it also counts
   the host-device synchronisations of one step (``torch.cuda.set_sync_debug_mode``).
2. **Trainer**: ``course_attn.train.train`` itself (batches sampled and copied,
   learning-rate schedule, clipping, loss read-back), its own ``ms_per_iter``.

Shapes: on the CPU, nanoGPT's CPU recipe for Shakespeare-char (4 layers, 4 heads,
width 128, context 64, batch 12); on a GPU, its "baby GPT" (6 layers, 6 heads,
width 384, context 256, batch 64, dropout 0.2). MFU (model FLOPs utilisation) is
the achieved FLOP/s (:meth:`MiniGPT.flops_per_token` x tokens/s) over the GPU's
dense bf16/fp16 peak, from ``course_attn.train.GPU_PEAK_FLOPS``.

    python benchmarks/train_speed.py                   # CPU (what make bench runs)
    python benchmarks/train_speed.py --device cuda     # eager and compiled, both paths
"""

from __future__ import annotations

import argparse
import statistics
import string
import time
import warnings

import torch

from course_attn.data.text import CharCorpus
from course_attn.env import pick_device
from course_attn.models.gpt import GPTConfig, MiniGPT
from course_attn.train import PRESETS, TrainConfig, amp_dtype, gpu_peak_flops, train


def peak_flops(device: torch.device) -> float | None:
    """The package's table's peak for this GPU, or None (CPU, or a GPU not in the table)."""
    return gpu_peak_flops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(model: MiniGPT, device: torch.device, compiled: bool):
    """One optimisation step as a function of a batch, like the trainer's inner loop."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device.type == "cuda")
    forward = torch.compile(model) if compiled else model
    dtype = amp_dtype(device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            _, loss = forward(x, y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    return step


def time_steps(step, batches: list, device: torch.device) -> float:
    """Seconds for one step per batch, with a single synchronisation at each end."""
    sync(device)
    start = time.perf_counter()
    for x, y in batches:
        step(x, y)
    sync(device)
    return time.perf_counter() - start


def count_syncs(step, batch, device: torch.device) -> int | None:
    """Host-device synchronisations in one step (CUDA only): each one stalls the pipeline."""
    if device.type != "cuda":
        return None
    sync(device)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step(*batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def random_corpus(vocab: int, n_chars: int = 1_000_000, seed: int = 0) -> CharCorpus:
    """A text of ``vocab`` distinct characters (Tiny Shakespeare has 65), made in code."""
    alphabet = (string.ascii_letters + string.digits + string.punctuation + " \n")[:vocab]
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(alphabet), (n_chars,), generator=g).tolist()
    return CharCorpus.from_text("".join(alphabet[i] for i in picks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu or cuda (default: best available)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20, help="steps per variant per round")
    parser.add_argument("--compile", dest="compile", action="store_true", default=None,
                        help="also time torch.compile (default: on CUDA only)")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--trainer-iters", type=int, default=None,
                        help="iterations of the trainer measurement (default 100 CPU, 300 GPU)")
    args = parser.parse_args()
    device = pick_device(args.device)
    gpu = device.type == "cuda"
    preset = PRESETS["gpu" if gpu else "cpu"]
    compiled_too = gpu if args.compile is None else args.compile
    vocab = 65  # the character vocabulary of Tiny Shakespeare
    batch, block = preset["batch_size"], preset["context_length"]

    variants = {}
    for impl in ("manual", "sdpa"):
        for compiled in (False, True) if compiled_too else (False,):
            torch.manual_seed(0)  # same initial weights for every variant
            config = GPTConfig(vocab_size=vocab, context_length=block, n_layers=preset["n_layers"],
                               n_heads=preset["n_heads"], d_model=preset["d_model"],
                               dropout=preset["dropout"], impl=impl)
            model = MiniGPT(config).to(device).train()
            name = f"{impl}{' compiled' if compiled else ''}"
            variants[name] = (model, make_step(model, device, compiled))
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(vocab, (args.iters, batch, block + 1), generator=generator)
    batches = [(t[:, :-1].to(device), t[:, 1:].to(device)) for t in tokens]  # (B, T) each

    for _, step in variants.values():  # warm-up: allocator, kernel choice, compilation
        time_steps(step, batches[:3], device)
    seconds = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (_, step) in variants.items():  # interleaved: the same machine load
            seconds[name].append(time_steps(step, batches, device))

    model0 = next(iter(variants.values()))[0]
    peak = peak_flops(device)
    where = torch.cuda.get_device_name(device) if gpu else f"{torch.get_num_threads()} threads"
    print(f"MiniGPT {model0.num_parameters() / 1e6:.2f}M parameters: {preset['n_layers']} layers "
          f"x {preset['n_heads']} heads, width {preset['d_model']}, context {block}, batch "
          f"{batch}; {device} ({where}), {amp_dtype(device) or torch.float32}, "
          f"torch {torch.__version__}")
    print(f"1. model step (forward, backward, AdamW), median of {args.rounds} rounds of "
          f"{args.iters}:")
    ms = {}
    for name, values in seconds.items():
        ms[name] = 1000 * statistics.median(values) / args.iters
        tokens_per_s = batch * block / ms[name] * 1000
        line = f"   {name:16s} {ms[name]:8.2f} ms/iter  {tokens_per_s:10,.0f} tokens/s"
        if peak is not None:
            mfu = model0.flops_per_token() * tokens_per_s / peak
            line += f"  MFU {100 * mfu:5.1f} %"
        syncs = count_syncs(variants[name][1], batches[0], device)
        if syncs is not None:
            line += f"  {syncs} host syncs"
        print(line)
    print(f"   ratio manual / sdpa time (eager): {ms['manual'] / ms['sdpa']:.2f}x")
    if compiled_too:
        print(f"   ratio eager / compiled time (sdpa): {ms['sdpa'] / ms['sdpa compiled']:.2f}x")
    if peak is None and gpu:
        print("   (no MFU: this GPU is not in course_attn.train.GPU_PEAK_FLOPS)")

    iters = args.trainer_iters or (300 if gpu else 100)
    corpus = random_corpus(vocab)
    print(f"2. the trainer, course_attn.train.train, {iters} iterations (first one left out):")
    for impl in ("manual", "sdpa"):
        for compiled in (False, True) if compiled_too else (False,):
            torch.manual_seed(0)
            config = GPTConfig(vocab_size=vocab, context_length=block, n_layers=preset["n_layers"],
                               n_heads=preset["n_heads"], d_model=preset["d_model"],
                               dropout=preset["dropout"], impl=impl)
            result = train(MiniGPT(config), corpus,
                           TrainConfig(max_iters=iters, batch_size=batch, eval_interval=iters,
                                       eval_iters=1, device=str(device), compile=compiled,
                                       progress=False))
            name = f"{impl}{' compiled' if compiled else ''}"
            print(f"   {name:16s} {result.ms_per_iter:8.2f} ms/iter  "
                  f"{result.tokens_per_s:10,.0f} tokens/s")


if __name__ == "__main__":
    main()
