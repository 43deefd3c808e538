"""float64 torch references of the column ops, and input builders, shared by the host tests
(test_column_ops.py) and the GPU tests (test_gpu_kernels.py)."""

from __future__ import annotations

import torch

from zenflow import ops

DTYPES = [torch.float32, torch.bfloat16, torch.float16]

# Column sums of squares (zenflow/norms.h): the host twin is within 5e-7 of the exact sum
# (fp32 blocks of 8 rows, fp64 across blocks); the GPU sums in fp64 and rounds once, so it
# is within half an fp32 ulp (2^-24) of the exact sum. Device against host may therefore
# differ by the sum of the two, a few ulps; device against float64 by one rounding.
COLUMN_SUM_RTOL_HOST = 5e-7
COLUMN_SUM_RTOL_DEVICE = 2**-24
COLUMN_SUM_RTOL_DEVICE_VS_HOST = COLUMN_SUM_RTOL_HOST + COLUMN_SUM_RTOL_DEVICE


def assert_column_stats_match(dev, host, grads) -> None:
    """A device ops.column_stats result against the host twin's and against float64."""
    torch.cuda.synchronize()
    for g, h, d in zip(grads, host.col_sq, dev.col_sq):
        exact = g.cpu().double().square().sum(0)
        torch.testing.assert_close(d.cpu().double(), exact, rtol=COLUMN_SUM_RTOL_DEVICE, atol=0)
        torch.testing.assert_close(h.double(), exact, rtol=COLUMN_SUM_RTOL_HOST, atol=0)
        torch.testing.assert_close(d.cpu(), h, rtol=COLUMN_SUM_RTOL_DEVICE_VS_HOST, atol=0)
    # The totals are sums of the column sums (positive terms): the same relative bounds.
    torch.testing.assert_close(
        dev.total_sq.cpu(), host.total_sq, rtol=COLUMN_SUM_RTOL_DEVICE_VS_HOST + 2**-24, atol=0
    )
    assert int(dev.nonfinite) == int(host.nonfinite)


# (rows, cols, k): primes, 1xN, Nx1, k = 0, k = n, empty.
SHAPES = [
    (1, 1, 1),
    (1, 4099, 409),
    (4099, 1, 1),
    (7, 13, 3),
    (97, 263, 26),
    (33, 64, 64),
    (5, 40, 0),
    (0, 12, 4),
]


def random_selection(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    return torch.sort(torch.randperm(n, generator=gen)[:k]).values.to(torch.int32)


def unselected(selected: torch.Tensor, n: int) -> torch.Tensor:
    mask = torch.ones(n, dtype=torch.bool)
    mask[selected.long()] = False
    return torch.nonzero(mask).flatten()


def make_adamw_case(rows, cols, k, dtype, master, gen, device="cpu"):
    w = torch.randn(rows, cols, generator=gen).to(dtype)
    g = (0.1 * torch.randn(rows, cols, generator=gen)).to(dtype)
    sel = random_selection(cols, k, gen)
    m = 0.02 * (torch.rand(rows, k, generator=gen) - 0.5)
    v = 1e-4 * torch.rand(rows, k, generator=gen)
    steps = torch.randint(0, 7, (k,), generator=gen, dtype=torch.int32)
    mw = None
    if master:
        mw = w[:, sel.long()].float() + 1e-4 * (torch.rand(rows, k, generator=gen) - 0.5)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(w), to(g), to(sel), ops.ColumnState(to(mw), to(m), to(v), to(steps))


def adamw_reference(w, g, sel, state, lr, wd, betas, eps, scale, precision=torch.float64):
    """AdamW on W[:, sel] in `precision` (torch.optim.AdamW's formula, per-column steps).
    Returns (W columns, master, exp_avg, exp_avg_sq) in that precision."""
    cols = sel.long()
    p = (state.master if state.master is not None else w[:, cols]).to(precision)
    grad = g[:, cols].to(precision) * scale
    m, v = state.exp_avg.to(precision), state.exp_avg_sq.to(precision)
    step = state.steps.to(torch.float64) + 1
    bc1 = (1 - betas[0] ** step).to(precision)
    bc2 = (1 - betas[1] ** step).to(precision)
    p = p * (1 - lr * wd)
    m = m.lerp(grad, 1 - betas[0])
    v = v * betas[1] + (1 - betas[1]) * grad * grad
    p = p - (lr / bc1) * m / (v.sqrt() / bc2.sqrt() + eps)
    return p, m, v


def packed_reference(grads, selected, dtype, scale=1.0):
    parts = []
    for g, sel in zip(grads, selected):
        rest = unselected(sel.cpu(), g.shape[1])
        cols = g.cpu().float()[:, rest] * scale  # one fp32 product, as the op
        parts.append(cols.to(dtype).t().reshape(-1))
    return torch.cat(parts) if parts else torch.empty(0, dtype=dtype)
