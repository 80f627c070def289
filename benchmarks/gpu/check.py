"""The Python parts of ``benchmarks/gpu_check.sh``: one subcommand per section (issue 32).

    python benchmarks/gpu/check.py env                   # date, card, versions, CPU
    python benchmarks/gpu/check.py kernel                # Triton kernel against SDPA's backends
    python benchmarks/gpu/check.py calls                 # wall time per small call
    python benchmarks/gpu/check.py step [true|false]     # the training step against nanoGPT's
    python benchmarks/gpu/check.py nanogpt-loop TXT N    # nanoGPT's train.py loop, ms/iter
    python benchmarks/gpu/check.py trainer-ms M.json     # ms/iter from a --metrics-out file
    python benchmarks/gpu/check.py nanogpt-data TXT DIR  # nanoGPT's shakespeare_char files
    python benchmarks/gpu/check.py nanogpt-ms LOG        # median ms/iter of nanoGPT's log

Run from the repository root with ``PYTHONPATH=src``. It needs torch (with CUDA), triton and
numpy only; each section prints Markdown tables. Timings are medians of
``triton.testing.do_bench`` (or of CUDA-synchronised wall clocks), all paths in one process.
``GPU_CHECK_DRY=1`` runs the sections on the CPU at toy sizes (Triton's interpreter, a plain
timer), to test this script where no GPU is; its figures mean nothing.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import pickle
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

DRY = os.environ.get("GPU_CHECK_DRY", "0") == "1"
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")
DEVICE = "cpu" if DRY else "cuda"
#: (label, B, H, T, d): the issue's shapes, bf16, causal.
SHAPES = ([("T=1024 d=64", 4, 16, 1024, 64), ("T=4096 d=64", 4, 16, 4096, 64),
           ("T=4096 d=128", 4, 16, 4096, 128), ("T=16384 d=64 B=1", 1, 16, 16384, 64)]
          if not DRY else [("T=32 d=16", 1, 2, 32, 16), ("T=40 d=128", 1, 1, 40, 128)])


def _sync() -> None:
    if not DRY:
        torch.cuda.synchronize()


def _bench(fn: Callable[[], None], grad_to_none: list[torch.Tensor] | None = None) -> float:
    """Median ms of ``fn`` (``triton.testing.do_bench``; a plain timer in a dry run)."""
    if DRY:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=60, grad_to_none=grad_to_none)
#: SDPA's backends, each forced in turn (FlashAttention-2 first: the issue's yardstick).
BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")


def _shell(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        return f"({command[0]} failed: {error})"


def env() -> None:
    """Date, card, driver, versions, CPU model and whether it has AMX."""
    import triton

    smi = _shell(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                  "--format=csv,noheader"])
    lscpu = _shell(["lscpu"])
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                  if line.startswith("Model name")), "unknown")
    flags = next((line.split(":", 1)[1].split() for line in lscpu.splitlines()
                  if line.startswith("Flags")), [])
    amx = sorted(flag for flag in flags if flag.startswith("amx"))
    present = {name: importlib.util.find_spec(name) is not None
               for name in ("numpy", "pytest", "xdist", "tqdm", "hypothesis")}
    rows = [
        ("date", time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())),
        ("card (nvidia-smi name, driver, memory)", smi),
        ("torch.cuda device", torch.cuda.get_device_name() if torch.cuda.is_available()
         else "no CUDA device"),
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("triton", triton.__version__),
        ("CUDA (torch.version.cuda)", str(torch.version.cuda)),
        ("cuDNN", str(torch.backends.cudnn.version())),
        ("CPU", f"{model}, {os.cpu_count()} logical cores"),
        ("CPU AMX flags", ", ".join(amx) or "none"),
        ("optional packages found", ", ".join(f"{k} {'yes' if v else 'NO'}"
                                              for k, v in present.items())),
        ("git commit", _shell(["git", "rev-parse", "--short", "HEAD"]) or "unknown"),
    ]
    print("| what | value |\n|---|---|")
    for what, value in rows:
        print(f"| {what} | {value} |")


# ------------------------------------------------------------------------------ kernel
def _sdpa(backend: str) -> Callable[..., torch.Tensor]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return run


def _triton(backward: str) -> Callable[..., torch.Tensor]:
    from course_attn.core.triton_attention import attention_triton

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attention_triton(q, k, v, is_causal=True, backward=backward)[0]

    return run


def _times(fn: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor,
           v: torch.Tensor, grad_out: torch.Tensor) -> tuple[float, float]:
    """Median ms of a forward (no grad) and of a forward + backward."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]

    def forward() -> None:
        with torch.no_grad():
            fn(q, k, v)

    def forward_backward() -> None:
        fn(*leaves).backward(grad_out)

    forward_backward()  # compile and tune outside the timings
    forward()
    _sync()
    return _bench(forward), _bench(forward_backward, grad_to_none=leaves)


def _grads(fn: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           grad_out: torch.Tensor) -> list[torch.Tensor]:
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves)
    out.backward(grad_out)
    return [out.detach(), *(x.grad for x in leaves)]


def kernel() -> None:
    """The Triton kernel (both backwards) against SDPA's backends, forced one by one."""
    from course_attn.core import triton_kernels

    paths: dict[str, Callable[..., torch.Tensor]] = {
        f"SDPA {name.split('_')[0]}": _sdpa(name) for name in BACKENDS}
    paths["Triton pair"] = _triton("pair")
    paths["Triton atomic"] = _triton("atomic")
    fa2 = "SDPA FLASH"
    results: dict[str, dict[str, tuple[float, float] | str]] = {}
    errors: dict[str, list[float]] = {}
    for label, b, h, t, d in SHAPES:
        g = torch.Generator(device=DEVICE).manual_seed(t + d)
        q, k, v, grad_out = (torch.randn(b, h, t, d, generator=g, device=DEVICE,
                                         dtype=torch.bfloat16) for _ in range(4))
        results[label] = {}
        for name, fn in paths.items():
            if name == "Triton atomic" and d == 128:
                results[label][name] = "not run (compile time)"
                continue
            try:
                results[label][name] = _times(fn, q, k, v, grad_out)
            except Exception as error:  # a backend that refuses these inputs, say
                results[label][name] = f"{type(error).__name__}: {str(error)[:40]}"
            if not DRY:
                torch.cuda.empty_cache()
        reference = _grads(paths[fa2], q, k, v, grad_out)
        for name in ("Triton pair", "Triton atomic"):
            if isinstance(results[label][name], tuple):
                got = _grads(paths[name], q, k, v, grad_out)
                errors[f"{label}, {name}"] = [(a.float() - r.float()).abs().max().item()
                                              for a, r in zip(got, reference, strict=True)]
        print(f"measured {label} (forward, forward + backward ms): " + "; ".join(
            f"{n} {r[0]:.3f}, {r[1]:.3f}" if isinstance(r, tuple) else f"{n} {r}"
            for n, r in results[label].items()), flush=True)

    for kind, index in (("forward", 0), ("forward + backward", 1)):
        print(f"\n**{kind}, ms** (bf16, causal, B=4 H=16 unless said; median of "
              "triton.testing.do_bench; fastest: the fastest SDPA backend)\n")
        print("| shape | " + " | ".join(paths) + " | pair / FA2 | pair / fastest | atomic / FA2 "
              "| atomic / fastest | pair TFLOP/s |")
        print("|---" * (len(paths) + 6) + "|")
        for label, b, h, t, d in SHAPES:
            row = results[label]
            ms = {n: row[n][index] for n in paths if isinstance(row[n], tuple)}
            cells = [f"{ms[n]:.3f}" if n in ms else str(row[n]) for n in paths]
            sdpa = {n: ms[n] for n in ms if n.startswith("SDPA")}
            fastest = min(sdpa, key=sdpa.__getitem__) if sdpa else None
            for mine in ("Triton pair", "Triton atomic"):
                for base in (fa2, fastest):
                    cells.append(f"{ms[mine] / ms[base]:.2f}x" + ("" if base == fa2 else
                                 f" ({base.split()[1]})") if mine in ms and base in ms else "-")
            flops = 4 * b * h * t * t * d / 2 * (1.0 if index == 0 else 3.5)
            cells.append(f"{flops / ms['Triton pair'] / 1e9:.0f}" if "Triton pair" in ms
                         else "-")
            print(f"| {label} | " + " | ".join(cells) + " |")
    print("\n**Triton against SDPA FLASH in bf16, max |difference|** (out, dq, dk, dv; both "
          "differ from the exact result by about as much)\n")
    print("| shape, path | out | dq | dk | dv |\n|---|---|---|---|---|")
    for name, values in errors.items():
        print(f"| {name} | " + " | ".join(f"{x:.2e}" for x in values) + " |")
    if not DRY:
        graph_times()
    tuners = triton_kernels.tuners
    if tuners is not None:
        print("\n**configurations the tuner chose** (key: dtype, length bucket, D_K, D_V, ...)\n")
        print("| kernel | key | BLOCK_Q x BLOCK_K, warps, stages |\n|---|---|---|")
        for kind in ("forward", "dk_dv", "dq", "dk_dv_dq"):
            for key, chosen in getattr(tuners, kind).chosen.items():
                print(f"| {kind} | {key[:4]} | {chosen['BLOCK_Q']} x {chosen['BLOCK_K']}, "
                      f"{chosen['num_warps']}, {chosen['num_stages']} |")


def graph_times() -> None:
    """The forward at T = 1,024 with the host taken out: each path's call captured in a CUDA
    graph and replayed (``triton.testing.do_bench_cudagraph``), against the plain timing. A
    kernel of tens of microseconds is shorter than the host's work per call, so the plain
    timing measures the host, and varies with it; the replayed one measures the GPU."""
    from triton.testing import do_bench, do_bench_cudagraph

    _, b, h, t, d = SHAPES[0]
    g = torch.Generator(device=DEVICE).manual_seed(t + d)
    q, k, v = (torch.randn(b, h, t, d, generator=g, device=DEVICE, dtype=torch.bfloat16)
               for _ in range(3))
    print(f"\n**forward at T={t} d={d}, ms: plain (host included) and replayed from a CUDA "
          "graph (GPU only), median of 5 rounds each**\n")
    print("| path | plain | CUDA graph |\n|---|---|---|")
    paths = {"SDPA FLASH": _sdpa("FLASH_ATTENTION"), "Triton pair": _triton("pair"),
             "Triton atomic": _triton("atomic")}
    for name, fn in paths.items():
        def call(fn: Callable[..., torch.Tensor] = fn) -> None:
            with torch.no_grad():
                fn(q, k, v)
        call()
        plain = statistics.median(do_bench(call, warmup=10, rep=60) for _ in range(5))
        graph = statistics.median(do_bench_cudagraph(call, rep=60) for _ in range(5))
        print(f"| {name} | {plain:.3f} | {graph:.3f} |")


def calls() -> None:
    """Wall time per call at a model's small size, where the host's work shows."""
    from course_attn.core.attention import attention

    q, k, v = (torch.randn(4, 6, 256, 64, device=DEVICE, dtype=torch.bfloat16)
               for _ in range(3))
    n = 2 if DRY else 1000
    print("| path, (4, 6, 256, 64) bf16 causal, forward | us per call (1000 calls, then one "
          "sync) |\n|---|---|")
    for impl in ("sdpa", "triton"):
        fn = functools.partial(attention, q, k, v, is_causal=True, impl=impl)
        with torch.no_grad():
            for _ in range(2 if DRY else 20):
                fn()
            _sync()
            start = time.perf_counter()
            for _ in range(n):
                fn()
            _sync()
        print(f"| attention(impl={impl!r}) | {(time.perf_counter() - start) / n * 1e6:.1f} |")


# ---------------------------------------------------------------------------- training
def _models(bias: bool) -> dict[str, Callable[[], torch.nn.Module]]:
    """The baby GPT as MiniGPT (sdpa, triton) and as nanoGPT's model, the same bias setting."""
    from course_attn.lab.nanogpt import NanoGPT, NanoGPTConfig
    from course_attn.models.gpt import GPTConfig, MiniGPT

    def course(impl: str) -> Callable[[], torch.nn.Module]:
        return lambda: MiniGPT(GPTConfig(vocab_size=65, context_length=256, n_layers=6,
                                         n_heads=6, d_model=384, dropout=0.2, bias=bias,
                                         impl=impl))

    def nano() -> torch.nn.Module:
        return NanoGPT(NanoGPTConfig(
            block_size=256, vocab_size=65, n_layer=6, n_head=6, n_embd=384, dropout=0.2,
            bias=bias))

    return {"course, sdpa": course("sdpa"), "course, triton": course("triton"),
            "nanoGPT's model": nano}


def step(bias: str = "false") -> None:
    """The training step (forward, backward, clipping, AdamW) on chapter 11's gpu preset,
    eager, bf16 autocast: MiniGPT against nanoGPT's model with the same biases. Timed as a
    trainer runs, 30 steps queued back to back, synchronised only at both ends."""
    torch.backends.cuda.matmul.allow_tf32 = True
    batch, t, steps, warm = (2, 16, 3, 1) if DRY else (64, 256, 35, 5)
    g = torch.Generator(device=DEVICE).manual_seed(0)
    idx = torch.randint(65, (batch, t + 1), generator=g, device=DEVICE)
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()  # (B, T) each, as batches are
    print(f"| model, biases {bias} | step ms (mean of {steps - warm}, after {warm} warm-up "
          "steps) |\n|---|---|")
    for name, build in _models(bias == "true").items():
        torch.manual_seed(0)
        model = build().to(DEVICE)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
            lr=1e-3, betas=(0.9, 0.99), fused=not DRY)
        start = 0.0
        for i in range(steps):
            if i == warm:
                _sync()
                start = time.perf_counter()
            with torch.autocast(DEVICE, dtype=torch.bfloat16):
                _, loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        _sync()
        print(f"| {name} | {(time.perf_counter() - start) * 1e3 / (steps - warm):.2f} |")
        del model, optimizer
        if not DRY:
            torch.cuda.empty_cache()


def nanogpt_loop(text_path: str, iters: str) -> None:
    """nanoGPT's train.py loop (benchmarks/nanogpt_train.py) on the baby GPT: ms/iter, as
    a stand-in where no checkout of nanoGPT is given."""
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import nanogpt_train

    sizes = nanogpt_train.BABY_GPT if not DRY else dict(
        nanogpt_train.CPU_RECIPE, block_size=16, batch_size=2, n_layer=1, eval_iters=1)
    with tempfile.TemporaryDirectory() as tmp:
        vocab = nanogpt_train.prepare(Path(text_path).read_text(encoding="utf-8"), Path(tmp))
        ms, val = nanogpt_train.run(Path(tmp), vocab, sizes, int(iters), device=DEVICE,
                                    lr_decay_iters=5000, warmup=min(10, int(iters) // 2))
    print(f"nanoGPT's loop: val {val:.4f} after {iters} iterations")
    print(f"{ms:.2f}")


def trainer_ms(path: str) -> None:
    """ms/iter of one ``python -m course_attn.train --metrics-out`` file."""
    metrics = json.loads(Path(path).read_text())
    print(f"{metrics.get('ms_per_iter', float('nan')):.2f}")


def nanogpt_data(text_path: str, folder: str) -> None:
    """train.bin, val.bin and meta.pkl from a text file, as nanoGPT's
    data/shakespeare_char/prepare.py makes them (which downloads the text itself)."""
    import numpy as np

    data = Path(text_path).read_text()
    chars = sorted(set(data))
    stoi = {ch: i for i, ch in enumerate(chars)}
    itos = dict(enumerate(chars))
    n = len(data)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", data[:int(n * 0.9)]), ("val", data[int(n * 0.9):])):
        np.array([stoi[c] for c in part], dtype=np.uint16).tofile(out / f"{name}.bin")
    with open(out / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": itos, "stoi": stoi}, f)
    print(f"{len(chars)} characters, {int(n * 0.9):,} train and {n - int(n * 0.9):,} val tokens "
          f"in {out}")


def nanogpt_ms(log_path: str) -> None:
    """The median of nanoGPT's logged ``time ...ms`` after iteration 0 (its own figure)."""
    times = [float(m.group(2)) for m in re.finditer(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms",
                                                     Path(log_path).read_text())
             if int(m.group(1)) > 0]
    print(f"{statistics.median(times):.2f}" if times else "nan")


if __name__ == "__main__":
    commands: dict[str, Callable[..., None]] = {
        "env": env, "kernel": kernel, "calls": calls, "step": step, "trainer-ms": trainer_ms,
        "nanogpt-data": nanogpt_data, "nanogpt-ms": nanogpt_ms, "nanogpt-loop": nanogpt_loop}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(commands)}}} [args]")
    commands[sys.argv[1]](*sys.argv[2:])
