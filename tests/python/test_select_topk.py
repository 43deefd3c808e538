"""zenflow.ops.select_topk_columns on the host: tie-aware reference, edge cases, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import zenflow
from zenflow import ops


def reference_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    # Stable sort by descending score keeps the lower index first among equals.
    order = torch.sort(-scores.double(), stable=True).indices[:k]
    return torch.sort(order).values.to(torch.int32)


def make_scores(n: int, pattern: str, gen: torch.Generator) -> torch.Tensor:
    if pattern == "distinct":
        return torch.rand(n, generator=gen) * 10
    if pattern == "ties":
        return torch.randint(0, 4, (n,), generator=gen).float()
    if pattern == "equal":
        return torch.full((n,), 2.5)
    scores = torch.rand(n, generator=gen)
    scores[torch.randint(0, 4, (n,), generator=gen) == 0] = float("inf")
    return scores


@pytest.mark.parametrize("pattern", ["distinct", "ties", "equal", "inf"])
@pytest.mark.parametrize("n", [1, 2, 7, 13, 257, 4099])
def test_matches_tie_aware_reference(pattern, n):
    gen = torch.Generator().manual_seed(n)
    scores = make_scores(n, pattern, gen)
    for k in sorted({0, 1, n // 10, n // 2, n - 1, n}):
        out = [torch.full((k,), -99, dtype=torch.int32)]
        got = ops.select_topk_columns([scores], k, out_indices=out)[0]
        assert got is out[0]
        assert torch.equal(got, reference_topk(scores, k)), (n, k, pattern)


def test_per_matrix_k_and_thread_counts(restore_threads):
    gen = torch.Generator().manual_seed(3)
    scores = [torch.randint(0, 6, (50 + 31 * i,), generator=gen).float() for i in range(37)]
    ks = [len(s) // 10 for s in scores]
    expected = [reference_topk(s, k) for s, k in zip(scores, ks)]
    for threads in (1, 2, 3):
        zenflow.set_num_threads(threads)
        got = ops.select_topk_columns(scores, ks)
        assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_from_column_stats_and_topk_count():
    grads = [torch.randn(64, 100), torch.randn(3, 7)]
    stats = ops.column_stats(grads)
    ks = [ops.topk_count(g.shape[1], 0.1) for g in grads]
    assert ks == [10, 1]
    got = ops.select_topk_columns(stats.col_sq, ks)
    for g, k, idx in zip(grads, ks, got):
        assert torch.equal(idx, reference_topk(g.double().square().sum(0).float(), k))
    assert ops.topk_count(10, 0.0) == 0 and ops.topk_count(10, 1.0) == 10
    assert ops.topk_count(5, 0.01) == 1
    with pytest.raises(ValueError, match="topk_ratio"):
        ops.topk_count(10, 1.5)


def test_numpy_and_empty():
    got = ops.select_topk_columns([np.array([1.0, 3.0, 2.0], dtype=np.float32)], 2)
    assert isinstance(got[0], np.ndarray) and got[0].tolist() == [1, 2]
    assert ops.select_topk_columns([torch.zeros(0)], 0)[0].numel() == 0
    assert ops.select_topk_columns([], 3) == []


def test_nan_raises_and_writes_nothing():
    good, bad = torch.tensor([3.0, 1.0, 2.0]), torch.tensor([1.0, float("nan"), 0.0])
    outs = [torch.full((2,), -99, dtype=torch.int32) for _ in range(2)]
    with pytest.raises(ValueError, match=r"col_sq\[1\].*NaN"):
        ops.select_topk_columns([good, bad], 2, out_indices=outs)
    assert all((o == -99).all() for o in outs)


def test_bad_k_and_inputs():
    scores = [torch.tensor([3.0, 1.0, 2.0])]
    with pytest.raises(ValueError, match="k"):
        ops.select_topk_columns(scores, 4)
    with pytest.raises(ValueError, match="k"):
        ops.select_topk_columns(scores, -1)
    with pytest.raises(TypeError, match="k"):
        ops.select_topk_columns(scores, 1.5)
    with pytest.raises(TypeError, match="k"):
        ops.select_topk_columns(scores, True)
    with pytest.raises(ValueError, match="k"):
        ops.select_topk_columns(scores, [1, 2])
    with pytest.raises(TypeError, match=r"col_sq\[0\]"):
        ops.select_topk_columns([torch.tensor([1.0, 2.0], dtype=torch.float64)], 1)
    with pytest.raises(ValueError, match=r"col_sq\[0\]"):
        ops.select_topk_columns([torch.ones(2, 2)], 1)
    with pytest.raises(ValueError, match=r"col_sq\[0\].*contiguous"):
        ops.select_topk_columns([torch.arange(6.0)[::2]], 1)
    out = [torch.full((2,), -99, dtype=torch.int64)]
    with pytest.raises(TypeError, match=r"out_indices\[0\]"):
        ops.select_topk_columns(scores, 2, out_indices=out)
    assert (out[0] == -99).all()
