"""Chapter 5, fill-in-the-middle: a check that a wrong mask would fail.

Proposed replacement for the cell after "**Fill-in-the-middle (FIM).**" (it keeps the
cell's names: code, prefix, middle, suffix, vecs). For every token of the middle, in the
FIM order, it finds exactly which tokens of the document its attention output depends on
(by changing one token at a time and comparing outputs exactly), and asserts that this set
is "the whole prefix, the whole suffix, and the middle tokens before it and itself" -- no
more, no less. The same function is then run with three wrong masks, each of which must
fail the check. Run: PYTHONPATH=src .venv/bin/python plans/scratch_ch05_fim_check.py
"""
import torch

from course_attn import causal_mask, scaled_dot_product_attention

code = "def add ( a , b ) : return a + b".split()
prefix, middle, suffix = code[:7], code[7:9], code[9:]
P, M = len(prefix), len(middle)  # 7, 2
pre, mid, suf = list(range(P)), list(range(P, P + M)), list(range(P + M, len(code)))
fim_order = [*pre, *suf, *mid]  # positions in the original text, in FIM order
T = len(fim_order)
vecs = torch.randn(len(code), 4, generator=torch.Generator().manual_seed(0))  # (T, d)


def reads(mask, order):
    """{middle position: document positions its output depends on}, `order` under `mask`."""
    x = vecs[order]  # (T, d) the document in this order
    base, _ = scaled_dot_product_attention(x, x, x, mask)  # (T, d)
    deps = {m: set() for m in mid}
    for j in range(T):  # change one token at a time
        x2 = x.clone()
        x2[j] += 1.0
        out, _ = scaled_dot_product_attention(x2, x2, x2, mask)  # (T, d)
        for m in mid:
            row = order.index(m)
            if (out[row] != base[row]).any():  # exact: a masked key changes nothing
                deps[m].add(order[j])
    return deps


def check(mask, order=fim_order):
    """True when every middle token reads the whole prefix and suffix and no later middle."""
    deps = reads(mask, order)
    return all(deps[m] == set(pre) | set(suf) | {p for p in mid if p <= m} for m in mid)


wrong = {
    "no mask (bidirectional)": torch.ones(T, T, dtype=torch.bool),
    "sliding window of 6": causal_mask(T) & torch.ones(T, T, dtype=torch.bool).triu(-5),
}
original = list(range(len(code)))  # the document as written: the middle before the suffix
print("causal mask, FIM order: every middle token reads prefix + suffix, no future:",
      check(causal_mask(T)))
assert check(causal_mask(T))
for name, mask in wrong.items():
    print(f"{name:24s}: passes the check: {check(mask)}")
    assert not check(mask)
print(f"{'causal, original order':24s}: passes the check: {check(causal_mask(T), original)}")
assert not check(causal_mask(T), original)
