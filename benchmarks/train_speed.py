"""Training speed of MiniGPT with the manual and the fused (sdpa) attention path (chapter 8).

Shape: nanoGPT's CPU recipe for Shakespeare-char (4 layers, 4 heads, width 128,
context 64, batch 12, dropout 0). The two paths train identical copies of one
model on the same batches, interleaved round by round so that both see the same
machine load. Prints ms per iteration and tokens per second of each, and the
ratio manual / sdpa (> 1 means the fused path is faster).

    python benchmarks/train_speed.py [--rounds 5] [--iters 20] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from course_attn.env import pick_device
from course_attn.model import GPTConfig, MiniGPT


def time_iters(model: MiniGPT, optimizer: torch.optim.Optimizer, batches: list, device) -> float:
    """Seconds for one optimisation step per batch in ``batches``."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for x, y in batches:
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    loss.item()  # wait for the device
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20, help="iterations per path per round")
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    device = pick_device(args.device)
    batch, block, vocab = 12, 64, 65  # 65 = the character vocabulary of Tiny Shakespeare
    models, optimizers = {}, {}
    for impl in ("manual", "sdpa"):
        torch.manual_seed(0)  # same initial weights for both paths
        config = GPTConfig(vocab_size=vocab, block_size=block, n_layer=4, n_head=4, d_model=128,
                           dropout=0.0, impl=impl)
        models[impl] = MiniGPT(config).to(device).train()
        optimizers[impl] = torch.optim.AdamW(models[impl].parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(vocab, (args.iters, batch, block + 1), generator=generator)
    batches = [(t[:, :-1].to(device), t[:, 1:].to(device)) for t in tokens]  # (B, T) each

    for impl in models:  # warm-up: allocator, kernels, caches
        time_iters(models[impl], optimizers[impl], batches[:3], device)
    seconds = {impl: [] for impl in models}
    for _ in range(args.rounds):
        for impl in models:  # interleaved: both paths share each round's machine load
            seconds[impl].append(time_iters(models[impl], optimizers[impl], batches, device))

    print(f"MiniGPT training step, 4 layers x 4 heads, width 128, context {block}, batch {batch}; "
          f"device {device}, {torch.get_num_threads()} CPU threads, torch {torch.__version__}")
    ms = {}
    for impl, values in seconds.items():
        ms[impl] = 1000 * statistics.median(values) / args.iters
        print(f"  {impl:6s}: {ms[impl]:7.2f} ms/iter  {batch * block / ms[impl] * 1000:9.0f} "
              f"tokens/s  (median of {args.rounds} rounds of {args.iters} iterations)")
    print(f"  ratio manual / sdpa time: {ms['manual'] / ms['sdpa']:.2f}x")


if __name__ == "__main__":
    main()
