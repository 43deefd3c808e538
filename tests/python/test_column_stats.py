"""zenflow.ops.column_stats on the host against a float64 torch reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import zenflow
from zenflow import ops

SHAPES = [(1, 1), (1, 4099), (4099, 1), (7, 13), (31, 17), (257, 263), (16, 1024), (3, 0), (0, 5)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def reference(grads):
    cols = [g.double().square().sum(0) for g in grads]
    total = sum(float(c.sum()) for c in cols)
    return cols, total


def poisoned_outputs(grads):
    return [torch.full((g.shape[1],), float("nan")) for g in grads]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_float64_reference(dtype, simd_level):
    gen = torch.Generator().manual_seed(11)
    grads = [torch.randn(m, n, generator=gen).to(dtype) for m, n in SHAPES]
    outs = poisoned_outputs(grads)
    stats = ops.column_stats(grads, outs)
    expected, total = reference(grads)
    for got, want, g in zip(stats.col_sq, expected, grads):
        assert got is not None and got.dtype == torch.float32
        assert torch.isfinite(got).all(), f"unwritten element for shape {tuple(g.shape)}"
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)
    assert math.isclose(float(stats.total_sq), total, rel_tol=1e-6)
    assert int(stats.nonfinite) == 0


def test_allocates_outputs_and_accepts_numpy():
    rng = np.random.default_rng(0)
    grads = [
        rng.standard_normal((9, 5)).astype(np.float32),
        rng.standard_normal((2, 3)).astype(np.float16),
    ]
    stats = ops.column_stats(grads)
    assert isinstance(stats.col_sq[0], np.ndarray)
    for got, g in zip(stats.col_sq, grads):
        np.testing.assert_allclose(got, np.square(g.astype(np.float64)).sum(0), rtol=1e-6)


def test_requires_grad_tensors_are_read_without_copy():
    g = torch.randn(4, 6, requires_grad=True)
    stats = ops.column_stats([g])
    torch.testing.assert_close(stats.col_sq[0], g.detach().square().sum(0))


def test_bitwise_identical_across_threads_and_levels(restore_threads):
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(513, 1031, generator=gen).bfloat16(), torch.randn(2000, 3, generator=gen)]
    reference_stats = ops.column_stats(grads)
    for threads in (1, 2, 3):
        zenflow.set_num_threads(threads)
        for level in zenflow.supported_simd_levels():
            zenflow.set_simd_level(level)
            again = ops.column_stats(grads)
            for a, b in zip(again.col_sq, reference_stats.col_sq):
                assert torch.equal(a, b)
            assert torch.equal(again.total_sq, reference_stats.total_sq)
    zenflow.set_simd_level(zenflow.supported_simd_levels()[-1])


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nonfinite_flag(bad, dtype):
    grads = [torch.randn(8, 9).to(dtype), torch.randn(5, 21).to(dtype)]
    grads[1][3, 20] = bad
    stats = ops.column_stats(grads)
    assert int(stats.nonfinite) == 1
    assert not math.isfinite(float(stats.col_sq[1][20]))
    assert torch.isfinite(stats.col_sq[1][:20]).all()
    assert not math.isfinite(float(stats.total_sq))


def test_accumulate_adds_into_existing_scores():
    grads = [torch.randn(20, 37)]
    first = ops.column_stats(grads).col_sq
    scores = [first[0].clone()]
    ops.column_stats(grads, scores, accumulate=True)
    torch.testing.assert_close(scores[0], 2 * first[0])
    with pytest.raises(ValueError, match="out_col_sq"):
        ops.column_stats(grads, accumulate=True)


def _assert_rejected(exc, match, grads, outs=None):
    outs = outs if outs is not None else [torch.full((g.shape[-1],), -1.0) for g in grads]
    before = [o.clone() for o in outs]
    with pytest.raises(exc, match=match):
        ops.column_stats(grads, outs)
    for o, b in zip(outs, before):
        assert torch.equal(o, b), "a failed call wrote its output"


def test_bad_input_names_the_argument_and_writes_nothing():
    good = torch.randn(4, 6)
    _assert_rejected(
        TypeError, r"grads\[1\].*dtype", [good, torch.randn(4, 6, dtype=torch.float64)]
    )
    _assert_rejected(TypeError, r"grads\[1\].*dtype", [good, torch.ones(4, 6, dtype=torch.int32)])
    _assert_rejected(ValueError, r"grads\[1\].*contiguous", [good, torch.randn(6, 4).t()])
    _assert_rejected(ValueError, r"grads\[0\].*2-D", [torch.randn(24)], [torch.full((24,), -1.0)])
    _assert_rejected(
        ValueError, r"out_col_sq\[0\]", [good], [torch.full((5,), -1.0)]
    )  # wrong length
    _assert_rejected(
        ValueError, r"out_col_sq", [good, good], [torch.full((6,), -1.0)]
    )  # list lengths
    buffer = bytearray(4 * 24 + 1)
    unaligned = np.ndarray((4, 6), dtype=np.float32, buffer=buffer, offset=1)
    out = np.full(6, -1.0, dtype=np.float32)
    with pytest.raises(ValueError, match=r"grads\[0\].*aligned"):
        ops.column_stats([unaligned], [out])
    assert (out == -1.0).all()
    with pytest.raises(TypeError, match="grads"):
        ops.column_stats("not a list")
    with pytest.raises(TypeError, match=r"grads\[0\]"):
        ops.column_stats([[1.0, 2.0]])
    with pytest.raises(ValueError, match="grads"):
        ops.column_stats([])


def test_outputs_in_fp16_are_rejected():
    grads = [torch.randn(4, 6)]
    _assert_rejected(
        TypeError, r"out_col_sq\[0\].*f32", grads, [torch.zeros(6, dtype=torch.float16)]
    )


def test_read_only_output_is_rejected():
    grad = np.ones((3, 4), dtype=np.float32)
    out = np.zeros(4, dtype=np.float32)
    out.setflags(write=False)
    with pytest.raises((ValueError, TypeError, BufferError)):
        ops.column_stats([grad], [out])
    assert (out == 0).all()
