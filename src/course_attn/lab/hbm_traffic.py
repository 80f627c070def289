"""Traffic to main memory of one attention forward pass, counted (Chapter 9).

FlashAttention's claim is about memory traffic, not arithmetic: the standard path writes the
$N \times N$ scores and weights to the GPU's main memory (HBM) and reads them back, while a
tiled kernel keeps each block of them in on-chip memory (SRAM) and moves only $Q$, $K$, $V$,
$O$ and a few numbers per row (Dao et al. 2022, Theorem 2). :func:`hbm_traffic` counts the
elements each algorithm reads from HBM and writes to it, for one head, following the
algorithms as the papers write them:

* ``"standard"``: Dao et al. 2022, Algorithm 0. Read Q and K, write S = QK^T; read S, write
  P = softmax(S); read P and V, write O. A causal mask is applied as S is written (no pass
  of its own, the cheapest standard path), so the whole matrices still travel and nothing
  more is counted; masking S in a separate pass would add 2n^2.
* ``"flash1"``: FlashAttention, Dao et al. 2022, Algorithm 1 (forward). O, the running sums
  l and the running maxima m start in HBM (written once); the outer loop runs over blocks of
  keys and values, each read once; the inner loop over blocks of queries reads Q_i, O_i,
  l_i and m_i and writes O_i, l_i, m_i back for every key block it meets.
* ``"flash2"``: FlashAttention-2, Dao 2023, Algorithm 1 (forward). The outer loop runs over
  blocks of queries: Q_i is read once, the key and value blocks it meets are read, and O_i
  and the log-sum-exp L_i are written once, at the end.

With ``causal=True`` the flash algorithms skip every key block that lies wholly after the
last query of a query block (chapter 9's block skipping). The counts depend only on the
sizes, so they are exact and the same on every machine; ``tests/test_hbm_traffic.py`` checks
each against a brute-force count, an implementation of the algorithm that moves real
tensors through a counting memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._validation import check_bool, check_positive_int

__all__ = ["HBM_ALGORITHMS", "HBMTraffic", "flash_block_sizes", "hbm_traffic"]

HBM_ALGORITHMS = ("standard", "flash1", "flash2")


@dataclass(frozen=True)
class HBMTraffic:
    """Elements read from and written to main memory by one attention forward (Chapter 9)."""

    reads: int
    writes: int

    @property
    def total(self) -> int:
        return self.reads + self.writes

    def bytes(self, element_bytes: int = 2) -> int:
        """The traffic in bytes, for elements of ``element_bytes`` (2 for bfloat16).

        Every element is billed at ``element_bytes``, the float32 statistics (l, m, L) too.
        """
        return self.total * check_positive_int(element_bytes, "element_bytes")


def flash_block_sizes(head_dim: int, sram_elements: int) -> tuple[int, int]:
    """FlashAttention's block sizes for on-chip memory of ``sram_elements`` elements (Chapter 9).

    Dao et al. 2022, Algorithm 1, line 1: ``B_c = ceil(M / 4d)`` keys and
    ``B_r = min(ceil(M / 4d), d)`` queries per block, so that the blocks of Q, K, V and O fit
    in the M elements of SRAM. Returns ``(block_q, block_k)`` = ``(B_r, B_c)``.
    """
    head_dim = check_positive_int(head_dim, "head_dim")
    sram_elements = check_positive_int(sram_elements, "sram_elements")
    block_k = math.ceil(sram_elements / (4 * head_dim))
    return min(block_k, head_dim), block_k


def _visited_blocks(n: int, block_q: int, block_k: int, causal: bool) -> list[tuple[int, int]]:
    """The (query rows, key rows) of every pair of blocks an algorithm computes."""
    pairs = []
    for q0 in range(0, n, block_q):
        rows = min(block_q, n - q0)
        last_query = q0 + rows - 1
        for k0 in range(0, n, block_k):
            if causal and k0 > last_query:
                break  # every key of this block and the next ones is in the future
            pairs.append((rows, min(block_k, n - k0)))
    return pairs


def hbm_traffic(n: int, head_dim: int, *, algorithm: str, block_q: int = 64,
                block_k: int = 64, causal: bool = False) -> HBMTraffic:
    """Elements one head's attention forward moves to and from main memory (Chapter 9).

    ``n`` queries and keys of width ``head_dim``; ``algorithm`` is one of
    :data:`HBM_ALGORITHMS`; ``block_q`` and ``block_k`` are the flash algorithms' tile sizes
    (ignored by ``"standard"``; :func:`flash_block_sizes` derives the paper's from the
    on-chip memory). Multiply by the batch size and the heads for a whole call.
    """
    n, d = check_positive_int(n, "n"), check_positive_int(head_dim, "head_dim")
    block_q = check_positive_int(block_q, "block_q")
    block_k = check_positive_int(block_k, "block_k")
    causal = check_bool(causal, "causal")
    if algorithm not in HBM_ALGORITHMS:
        raise ValueError(f"hbm_traffic: algorithm must be one of {HBM_ALGORITHMS}, "
                         f"got {algorithm!r}")
    if algorithm == "standard":
        # read Q, K; write S; read S; write P; read P, V; write O
        return HBMTraffic(reads=3 * n * d + 2 * n * n, writes=2 * n * n + n * d)
    pairs = _visited_blocks(n, block_q, block_k, causal)
    if algorithm == "flash2":
        key_rows = sum(cols for _, cols in pairs)
        # Q once, K_j and V_j for every pair; O and the log-sum-exp L once
        return HBMTraffic(reads=n * d + 2 * key_rows * d, writes=n * d + n)
    query_rows = sum(rows for rows, _ in pairs)
    # K and V once; Q_i, O_i, l_i, m_i read and O_i, l_i, m_i written for every pair,
    # after O, l and m are initialised in HBM
    return HBMTraffic(reads=2 * n * d + query_rows * (2 * d + 2),
                      writes=n * d + 2 * n + query_rows * (d + 2))
