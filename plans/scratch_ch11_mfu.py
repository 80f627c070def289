"""Chapter 11, section 11.1: what the published A100 time can and cannot say about MFU.

Proposed replacement for the cell that prints "A100 (published)  3 min  MFU 10%". The
published "about 3 minutes" (nanoGPT README) is the wall time of the whole run: 5,001
training iterations, 21 evaluations (at iterations 0, 250, ..., 5000) of eval_iters = 200
batches on each split, and torch.compile's compilation. nanoGPT's train.py counts
iterations 0..max_iters and evaluates when iter_num % eval_interval == 0 (checked against
karpathy/nanoGPT train.py and config/train_shakespeare_char.py). An evaluation batch costs
a forward pass, a third of a training step (2N + 4LTD of 6N + 12LTD per token). So the
cell prints the FLOPs of training and of evaluation separately and two MFU figures, both
lower bounds (the wall time still includes compilation and data loading), instead of one
"MFU 10%" labelled as if it were the training steps'. Run:
    PYTHONPATH=src .venv/bin/python plans/scratch_ch11_mfu.py
"""
import torch

from course_attn import GPTConfig, MiniGPT
from course_attn.train import PRESETS, gpu_peak_flops

gpu = PRESETS["gpu"]
with torch.device("meta"):  # shapes only
    baby = MiniGPT(GPTConfig(vocab_size=65, block_size=gpu["block_size"],
                             n_layers=gpu["n_layers"], n_heads=gpu["n_heads"],
                             d_model=gpu["d_model"]))
tokens_per_batch = gpu["batch_size"] * gpu["block_size"]
train_iters = gpu["max_iters"] + 1  # nanoGPT trains iterations 0 .. max_iters
n_evals = gpu["max_iters"] // gpu["eval_interval"] + 1  # 0, 250, ..., 5000
eval_batches = n_evals * 2 * gpu["eval_iters"]  # both splits
train_flops = baby.flops_per_token() * train_iters * tokens_per_batch
eval_flops = baby.flops_per_token() // 3 * eval_batches * tokens_per_batch  # forward only
a100_s = 3 * 60  # nanoGPT's README: "about 3 minutes" on one A100, whole run
peak = gpu_peak_flops("A100")
print(f"training: {train_iters:,} iterations, {train_flops:.1e} FLOPs")
print(f"evaluation: {n_evals} x 2 splits x {gpu['eval_iters']} batches = {eval_batches:,} "
      f"forward passes, {eval_flops:.1e} FLOPs ({eval_flops / train_flops:.0%} of training)")
print(f"A100, about {a100_s // 60} min for the whole run (published): "
      f"MFU at least {train_flops / a100_s / peak:.0%} counting training FLOPs only, "
      f"at least {(train_flops + eval_flops) / a100_s / peak:.0%} counting evaluation too")
