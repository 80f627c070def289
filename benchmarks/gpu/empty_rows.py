"""What a query with no allowed key (an empty row of the mask) gives on a GPU (chapter 5).

    python benchmarks/gpu/empty_rows.py [OUT.json]

Chapter 5 says that the course, like ``F.scaled_dot_product_attention`` on the CPU since
PyTorch 2.5, gives such a query zero weights, a zero output and finite gradients. This script
asks the same of every SDPA backend PyTorch has on the machine's GPU (forced one at a time
with ``torch.nn.attention.sdpa_kernel``), in float32, float16 and bfloat16, with the mask as
a boolean tensor and as an additive one (0 / -inf), and of ``nn.MultiheadAttention`` with
and without ``need_weights``. It prints Markdown tables (commit them as a record under
``benchmarks/records/``; a ``|`` inside a cell is escaped as ``\\|``) and, given a path,
writes the same results, unescaped, as JSON. It needs torch only, and runs on the CPU too
(where the GPU backends say "not run").
"""

from __future__ import annotations

import datetime
import json
import platform
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
BACKENDS = {"MATH": SDPBackend.MATH, "EFFICIENT_ATTENTION": SDPBackend.EFFICIENT_ATTENTION,
            "CUDNN_ATTENTION": SDPBackend.CUDNN_ATTENTION,
            "FLASH_ATTENTION": SDPBackend.FLASH_ATTENTION}
B, H, T, D_HEAD, EMPTY = 2, 4, 64, 64, 8  # rows 0 .. EMPTY-1 of the mask allow no key


def environment() -> dict[str, str]:
    try:
        import triton  # type: ignore[import-not-found]

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    card = torch.cuda.get_device_name() if DEVICE == "cuda" else platform.processor() or "cpu"
    return {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "card": card, "torch": torch.__version__, "triton": triton_version,
            "cuda": str(torch.version.cuda), "cudnn": str(torch.backends.cudnn.version()),
            "python": platform.python_version()}


def the_mask() -> torch.Tensor:
    """(T, T) bool, True = may attend: causal, and the first EMPTY queries allow nothing."""
    mask = torch.ones(T, T, dtype=torch.bool, device=DEVICE).tril()
    mask[:EMPTY] = False
    return mask


def _short(err: Exception) -> str:
    """The first sentence of an error, at most 60 characters."""
    return str(err).strip().splitlines()[0].split(". ")[0][:60]


def verdict(rows: torch.Tensor) -> str:
    """What the empty rows hold: zeros, NaN, or something else (its largest |entry|)."""
    if rows.isnan().any():
        return "NaN"
    if (rows == 0).all():
        return "zeros"
    return f"other (max |x| {rows.abs().max().item():.2g})"


def cell(text: str) -> str:
    """``text`` for a Markdown table cell: a ``|`` in it (``max |x|``) would split the cell."""
    return str(text).replace("|", r"\|")


def sdpa_case(backend: SDPBackend, dtype: torch.dtype, additive: bool) -> dict[str, str]:
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D_HEAD, generator=gen, device=DEVICE, dtype=dtype)
               .requires_grad_() for _ in range(3))
    mask = the_mask()
    attn_mask = (torch.zeros(T, T, device=DEVICE, dtype=dtype)
                 .masked_fill(~mask, float("-inf")) if additive else mask)
    try:
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
            out.float().sum().backward()
    except RuntimeError as err:
        return {"output": "not run", "gradients": "not run", "error": _short(err)}
    grads = (q.grad, k.grad, v.grad)
    nan_grad = any(g is None or g.isnan().any().item() for g in grads)
    real = out[..., EMPTY:, :].float()
    return {"output": verdict(out[..., :EMPTY, :].float()),
            "gradients": "NaN" if nan_grad else "finite",
            "real_rows_finite": str(bool(real.isfinite().all().item()))}


def mha_case(dtype: torch.dtype, need_weights: bool, training: bool) -> dict[str, str]:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(H * D_HEAD, H, batch_first=True).to(DEVICE, dtype)
    mha.train(training)
    x = torch.randn(B, T, H * D_HEAD, device=DEVICE, dtype=dtype)
    blocked = ~the_mask()  # nn.MultiheadAttention: True = blocked
    try:
        with torch.no_grad():
            out, _ = mha(x, x, x, attn_mask=blocked, need_weights=need_weights)
    except RuntimeError as err:
        return {"output": "not run", "error": _short(err)}
    return {"output": verdict(out[:, :EMPTY].float())}


def course_case(impl: str, dtype: torch.dtype) -> dict[str, str]:
    """The course's own attention (course_attn.attention), where the package imports."""
    try:
        from course_attn import attention
    except ImportError as err:
        return {"output": "not run", "gradients": "not run", "error": _short(err)}
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D_HEAD, generator=gen, device=DEVICE, dtype=dtype)
               .requires_grad_() for _ in range(3))
    out, _ = attention(q, k, v, the_mask(), impl=impl)
    out.float().sum().backward()
    nan_grad = any(g is None or g.isnan().any().item() for g in (q.grad, k.grad, v.grad))
    return {"output": verdict(out[..., :EMPTY, :].float()),
            "gradients": "NaN" if nan_grad else "finite"}


def main(argv: list[str]) -> int:
    env = environment()
    print("# Empty rows of the mask on", env["card"], "(benchmarks/gpu/empty_rows.py)\n")
    print("| what | value |\n|---|---|")
    for key, value in env.items():
        print(f"| {key} | {value} |")
    print(f"\nq, k, v ({B}, {H}, {T}, {D_HEAD}); a causal mask whose first {EMPTY} rows allow "
          f"no key; the loss out.float().sum(); device {DEVICE}.\n")
    print("## F.scaled_dot_product_attention, one backend at a time\n")
    print("| backend | dtype | mask | empty rows' output | gradients | other rows finite |")
    print("|---|---|---|---|---|---|")
    sdpa = {}
    for bname, backend in BACKENDS.items():
        for dname, dtype in DTYPES.items():
            for form in ("bool", "additive"):
                res = sdpa_case(backend, dtype, form == "additive")
                sdpa[f"{bname} {dname} {form}"] = res
                shown = res["output"] if "error" not in res else f"not run: {res['error']}"
                print(f"| {bname} | {dname} | {form} | {cell(shown)} | {res['gradients']} | "
                      f"{res.get('real_rows_finite', '-')} |")
    print("\n## nn.MultiheadAttention (attn_mask blocks the same rows), no_grad\n")
    print("| dtype | need_weights | mode | empty rows' output |\n|---|---|---|---|")
    mha = {}
    for dname in ("float32", "float16"):
        for need_weights in (True, False):
            for training in (True, False):
                res = mha_case(DTYPES[dname], need_weights, training)
                mode = "train" if training else "eval"
                mha[f"{dname} need_weights={need_weights} {mode}"] = res
                shown = res["output"] if "error" not in res else f"not run: {res['error']}"
                print(f"| {dname} | {need_weights} | {mode} | {cell(shown)} |")
    print("\n## course_attn.attention (PYTHONPATH=src), boolean mask\n")
    print("| impl | dtype | empty rows' output | gradients |\n|---|---|---|---|")
    course = {}
    for impl in ("manual", "sdpa"):
        for dname, dtype in DTYPES.items():
            res = course_case(impl, dtype)
            course[f"{impl} {dname}"] = res
            shown = res["output"] if "error" not in res else f"not run: {res['error']}"
            print(f"| {impl} | {dname} | {cell(shown)} | {res['gradients']} |")
    if len(argv) > 1:
        with open(argv[1], "w", encoding="utf-8") as f:
            json.dump({"environment": env, "sdpa": sdpa, "multihead": mha,
                       "course_attn": course}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
