"""Chapter 7 (and chapter 10, section 10.1): sinusoidal encodings seen through W_Q and W_K.

The cell proposed in plans/issue24_edits.md, section 7.2, with the names it takes from the
chapter's cell "Built by hand" (float64 `table`, `two_i`, `max_len`, `d_model`) rebuilt here.
Run: PYTHONPATH=src .venv/bin/python plans/scratch_ch07_pe_projections.py
and again under ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE OMP_NUM_THREADS=1: the output
is the same.
"""
import math

import torch
from torch.testing import assert_close

from course_attn import sinusoidal_table

# --- the chapter's cell "Built by hand" (c8)
max_len, d_model = 64, 32
p = torch.arange(max_len, dtype=torch.float64)[:, None]
two_i = torch.arange(0, d_model, 2, dtype=torch.float64)[None, :]
angle = p / 10000 ** (two_i / d_model)
table = torch.stack([angle.sin(), angle.cos()], dim=-1).reshape(max_len, d_model)
assert_close(table.float(), sinusoidal_table(max_len, d_model))

# --- the proposed cell
omega = 1.0 / 10000 ** (two_i[0] / d_model)  # (D/2,) the angular speeds


def rotation(k):  # (D, D): one 2 x 2 rotation per (sin, cos) pair
    R = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i, w in enumerate(omega.tolist()):
        c, s = math.cos(k * w), math.sin(k * w)
        R[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[c, -s], [s, c]])
    return R


for k in (1, 5, 20):  # PE_(p+k) = PE_p R_k, the same R_k for every p
    assert_close(table[k:k + 40], table[:40] @ rotation(k))
gen = torch.Generator().manual_seed(0)
W_Q, W_K = (torch.randn(d_model, 8, generator=gen, dtype=torch.float64)
            / math.sqrt(d_model) for _ in range(2))  # (D, d_k): a random layer
plain = table[:40] @ table.T  # (40, max_len): PE_p . PE_j
projected = (table[:40] @ W_Q) @ (table @ W_K).T  # (40, max_len): q_p . k_j
print("PE_(p+k) = PE_p R_k for every p and k = 1, 5, 20: True")
print(" k   PE_p . PE_(p+k), p = 0..19   (PE_p W_Q) . (PE_(p+k) W_K), p = 0..19")
for k in (1, 5, 20):
    a = torch.stack([plain[q, q + k] for q in range(20)])
    b = torch.stack([projected[q, q + k] for q in range(20)])
    print(f"{k:2d}   {a.min():6.3f} to {a.max():6.3f}"
          f"            {b.min():6.3f} to {b.max():6.3f}")
    assert a.max() - a.min() < 1e-9 and b.max() - b.min() > 0.1
