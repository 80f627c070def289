"""hbm_traffic counts what the algorithms move, checked against a brute-force count (Chapter 9).

Each algorithm is implemented here on real float64 tensors that live in a counting "HBM":
every block loaded or stored adds its elements to the count. The implementations must
compute attention exactly (so they are the algorithms, not a sketch of their loops), and
their counts must equal :func:`hbm_traffic`'s closed forms.
"""

from __future__ import annotations

import math

import pytest
import torch

from course_attn.lab.hbm_traffic import HBMTraffic, flash_block_sizes, hbm_traffic

NEG = -1e30  # a finite "minus infinity": every row meets key 0 first, so it is washed out


class CountingHBM:
    def __init__(self, **tensors: torch.Tensor) -> None:
        self.t = {k: v.clone() for k, v in tensors.items()}
        self.reads = self.writes = 0

    def load(self, name: str, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        block = self.t[name][lo:hi].clone()
        self.reads += block.numel()
        return block

    def store(self, name: str, value: torch.Tensor, lo: int = 0) -> None:
        if name not in self.t:
            self.t[name] = torch.empty_like(value)
        self.t[name][lo:lo + value.shape[0]] = value
        self.writes += value.numel()


def scores(q, k, q0, k0, causal):
    s = q @ k.T / math.sqrt(q.shape[-1])
    if causal:
        rows = torch.arange(q0, q0 + q.shape[0])[:, None]
        cols = torch.arange(k0, k0 + k.shape[0])[None, :]
        s = s.masked_fill(cols > rows, NEG)
    return s


def standard(hbm: CountingHBM, n, causal, **_):
    hbm.store("S", scores(hbm.load("Q"), hbm.load("K"), 0, 0, causal))
    hbm.store("P", torch.softmax(hbm.load("S"), dim=-1))
    hbm.store("O", hbm.load("P") @ hbm.load("V"))


def flash1(hbm: CountingHBM, n, causal, bq, bk, d):
    hbm.store("O", torch.zeros(n, d, dtype=torch.float64))
    hbm.store("l", torch.zeros(n, dtype=torch.float64))
    hbm.store("m", torch.full((n,), NEG, dtype=torch.float64))
    for k0 in range(0, n, bk):
        kj, vj = hbm.load("K", k0, k0 + bk), hbm.load("V", k0, k0 + bk)
        for q0 in range(0, n, bq):
            if causal and k0 > min(q0 + bq, n) - 1:
                continue
            qi, oi = hbm.load("Q", q0, q0 + bq), hbm.load("O", q0, q0 + bq)
            li, mi = hbm.load("l", q0, q0 + bq), hbm.load("m", q0, q0 + bq)
            s = scores(qi, kj, q0, k0, causal)
            m_ij = s.max(-1).values
            p = torch.exp(s - m_ij[:, None])
            m_new = torch.maximum(mi, m_ij)
            a, b = torch.exp(mi - m_new), torch.exp(m_ij - m_new)
            l_new = a * li + b * p.sum(-1)
            hbm.store("O", ((li * a)[:, None] * oi + b[:, None] * (p @ vj)) / l_new[:, None], q0)
            hbm.store("l", l_new, q0)
            hbm.store("m", m_new, q0)


def flash2(hbm: CountingHBM, n, causal, bq, bk, d):
    for q0 in range(0, n, bq):
        qi = hbm.load("Q", q0, q0 + bq)
        rows = qi.shape[0]
        o = torch.zeros(rows, d, dtype=torch.float64)
        l_i = torch.zeros(rows, dtype=torch.float64)
        m = torch.full((rows,), NEG, dtype=torch.float64)
        for k0 in range(0, n, bk):
            if causal and k0 > q0 + rows - 1:
                break
            kj, vj = hbm.load("K", k0, k0 + bk), hbm.load("V", k0, k0 + bk)
            s = scores(qi, kj, q0, k0, causal)
            m_new = torch.maximum(m, s.max(-1).values)
            p = torch.exp(s - m_new[:, None])
            a = torch.exp(m - m_new)
            l_i, o, m = a * l_i + p.sum(-1), a[:, None] * o + p @ vj, m_new
        hbm.store("O", o / l_i[:, None], q0)
        hbm.store("L", m + torch.log(l_i), q0)


ALGORITHMS = {"standard": standard, "flash1": flash1, "flash2": flash2}


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
@pytest.mark.parametrize("n, d, bq, bk", [
    (1, 1, 1, 1), (5, 3, 2, 2), (16, 8, 4, 4), (17, 8, 4, 8), (33, 3, 8, 3), (12, 4, 64, 64),
    (20, 2, 5, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_the_count_is_what_the_algorithm_moves(algorithm, n, d, bq, bk, causal):
    gen = torch.Generator().manual_seed(n * 100 + d)
    q, k, v = (torch.randn(n, d, generator=gen, dtype=torch.float64) for _ in range(3))
    hbm = CountingHBM(Q=q, K=k, V=v, O=torch.empty_like(q), L=torch.empty(n).double())
    ALGORITHMS[algorithm](hbm, n, causal, bq=bq, bk=bk, d=d)
    expected = torch.softmax(scores(q, k, 0, 0, causal), dim=-1) @ v
    torch.testing.assert_close(hbm.t["O"], expected, rtol=1e-12, atol=1e-12)
    counted = hbm_traffic(n, d, algorithm=algorithm, block_q=bq, block_k=bk, causal=causal)
    assert counted == HBMTraffic(reads=hbm.reads, writes=hbm.writes)


@pytest.mark.parametrize("block_q", [64, 128, 256])
def test_flash2_moves_less_by_about_twice_its_query_block_over_d(block_q):
    """S and P make the standard path's 4 N^2; FlashAttention-2 reads K and V once per query
    block, 2 N^2 d / B_r: the saving is about 2 B_r / d, not the whole N^2."""
    standard_ = hbm_traffic(4096, 64, algorithm="standard")
    flash2_ = hbm_traffic(4096, 64, algorithm="flash2", block_q=block_q, block_k=64)
    assert 4 * 4096**2 < standard_.total < 4.1 * 4096**2
    assert standard_.total / flash2_.total == pytest.approx(2 * block_q / 64, rel=0.05)


def test_causal_skipping_halves_the_key_traffic_of_flash2():
    full = hbm_traffic(4096, 64, algorithm="flash2", block_q=64, block_k=64)
    causal = hbm_traffic(4096, 64, algorithm="flash2", block_q=64, block_k=64, causal=True)
    kv_full, kv_causal = full.reads - 4096 * 64, causal.reads - 4096 * 64
    assert kv_causal / kv_full == pytest.approx((64 + 1) / 128)  # (T_r + 1) / (2 T_r)


def test_flash1_traffic_falls_like_one_over_the_sram_size():
    """Theorem 2 of Dao et al. 2022: Theta(N^2 d^2 / M) accesses."""
    def quadratic_part(m):
        bq, bk = flash_block_sizes(64, m)
        t = hbm_traffic(8192, 64, algorithm="flash1", block_q=bq, block_k=bk)
        return t.total - 3 * 8192 * 64  # less what every algorithm moves once
    assert quadratic_part(16384) / quadratic_part(32768) == pytest.approx(2, rel=0.05)


def test_block_sizes_of_the_paper():
    assert flash_block_sizes(64, 100 * 1024 // 2) == (64, 200)  # 100 KB of bf16
    assert flash_block_sizes(128, 1024) == (2, 2)


def test_bytes_and_bad_input():
    assert hbm_traffic(2, 1, algorithm="standard").bytes(4) == 4 * (3 * 2 + 8 + 8 + 2)
    with pytest.raises(ValueError, match="algorithm"):
        hbm_traffic(8, 8, algorithm="flash3")
    with pytest.raises(ValueError, match="n"):
        hbm_traffic(0, 8, algorithm="flash2")
    with pytest.raises(TypeError, match="causal"):
        hbm_traffic(8, 8, algorithm="flash2", causal="yes")
