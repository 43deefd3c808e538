"""CUDA kernels against their host twins and float64 torch references (marked `gpu`,
skipped without a GPU; run by benchmarks/device/check.sh).

ZENFLOW_GPU_SMALL=1 shrinks the sweep for compute-sanitizer runs."""

from __future__ import annotations

import os

import pytest
import torch
from column_ops_reference import (
    DTYPES,
    SHAPES,
    adamw_reference,
    assert_column_stats_match,
    make_adamw_case,
    packed_reference,
    random_selection,
)

from zenflow import ops

pytestmark = pytest.mark.gpu
SMALL = os.environ.get("ZENFLOW_GPU_SMALL", "0") == "1"
DEV = "cuda"


def _cuda_state(state):
    return ops.ColumnState(*(None if t is None else t.to(DEV) for t in state))


def _cpu_state(state):
    return ops.ColumnState(*(None if t is None else t.cpu() for t in state))


def _clone_state(state):
    return ops.ColumnState(*(None if t is None else t.clone() for t in state))


# ---- column_stats ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_column_stats_matches_host_and_float64(dtype):
    gen = torch.Generator().manual_seed(1)
    shapes = [(r, c) for r, c, _ in SHAPES] + ([] if SMALL else [(2048, 4104), (4097, 263)])
    grads = [torch.randn(r, c, generator=gen).to(dtype) for r, c in shapes]
    host = ops.column_stats(grads)
    dev = ops.column_stats([g.to(DEV) for g in grads])
    assert_column_stats_match(dev, host, grads)
    assert int(dev.nonfinite) == 0
    grads[1][0, 3] = float("inf")
    assert int(ops.column_stats([g.to(DEV) for g in grads]).nonfinite) == 1


# ---- select_topk_columns ----------------------------------------------------------------------


def _scores(n, pattern, gen):
    if pattern == "distinct":
        return torch.rand(n, generator=gen) * 10
    if pattern == "ties":
        return torch.randint(0, 4, (n,), generator=gen).float()
    if pattern == "equal_leading_bits":  # keys differ only in the last radix digit
        return 1.0 + torch.randint(0, 8, (n,), generator=gen).float() * 2**-23
    scores = torch.rand(n, generator=gen)
    scores[torch.randint(0, 4, (n,), generator=gen) == 0] = float("inf")
    scores[0] = -0.0
    return scores


@pytest.mark.parametrize("pattern", ["distinct", "ties", "equal_leading_bits", "inf"])
def test_topk_equals_host_tie_aware(pattern):
    gen = torch.Generator().manual_seed(2)
    ns = [1, 2, 7, 13, 257, 4099] + ([] if SMALL else [11008, 65537])
    scores, ks = [], []
    for n in ns:
        for k in sorted({0, 1, n // 10, n // 2, n - 1, n}):
            scores.append(_scores(n, pattern, gen))
            ks.append(k)
    host = ops.select_topk_columns(scores, ks)
    dev = ops.select_topk_columns([s.to(DEV) for s in scores], ks)
    for s, k, h, d in zip(scores, ks, host, dev):
        reference = torch.sort(torch.sort(-s.double(), stable=True).indices[:k]).values.int()
        assert torch.equal(h, reference)
        assert torch.equal(d.cpu(), h), (len(s), k, pattern)


def test_topk_nan_fills_minus_one_and_never_hangs():
    scores = [torch.rand(100, device=DEV), torch.rand(50, device=DEV)]
    scores[1][7] = float("nan")
    out = ops.select_topk_columns(scores, [10, 5])
    assert (out[0] >= 0).all() and out[1].tolist() == [-1] * 5


# ---- adamw_selected_columns_ ------------------------------------------------------------------

BETAS, EPS = (0.9, 0.999), 1e-8


@pytest.mark.parametrize("master", [False, True])
@pytest.mark.parametrize("grad_dtype", DTYPES)
@pytest.mark.parametrize("param_dtype", DTYPES)
def test_adamw_equals_host_twin_and_float64(param_dtype, grad_dtype, master):
    gen = torch.Generator().manual_seed(3)
    cases = []
    for r, c, k in SHAPES:
        w, g, s, st = make_adamw_case(r, c, k, param_dtype, master, gen)
        cases.append((w, g.to(grad_dtype), s, st))
    lrs = [1e-3 * (1 + i) for i in range(len(cases))]
    wds = [0.01 * i for i in range(len(cases))]
    scale = torch.tensor([0.37])
    host = [(w.clone(), g, s, _clone_state(st)) for w, g, s, st in cases]
    dev = [(w.to(DEV), g.to(DEV), s.to(DEV), _cuda_state(st)) for w, g, s, st in cases]
    for batch, sc in ((host, scale), (dev, scale.to(DEV))):
        ops.adamw_selected_columns_(
            *(list(x) for x in zip(*batch)), lr=lrs, weight_decay=wds, grad_scale=sc
        )
    torch.cuda.synchronize()
    for i, ((w0, g0, s0, st0), (wh, _, _, sth), (wd, _, _, std)) in enumerate(
        zip(cases, host, dev)
    ):
        std = _cpu_state(std)
        # Same rounding on both sides by construction (adam_math.hpp): bit for bit.
        for a, b in zip(std, sth):
            assert (a is None and b is None) or torch.equal(a, b), i
        assert torch.equal(wd.cpu(), wh), i
        p64, m64, _ = adamw_reference(w0, g0, s0, st0, lrs[i], wds[i], BETAS, EPS, float(scale))
        if p64.numel():
            err = (std.exp_avg.double() - m64).abs().max()
            assert err <= 4 * 2**-23 * max(m64.abs().max(), g0.abs().max().double())


def test_adamw_graph_capture_reads_scale_and_noop_from_device():
    gen = torch.Generator().manual_seed(4)
    w, g, s, st = make_adamw_case(256, 512, 51, torch.bfloat16, True, gen, device=DEV)
    eager_w, eager_st = w.clone(), _clone_state(st)
    scale = torch.ones(1, device=DEV)
    noop = torch.zeros((), dtype=torch.int32, device=DEV)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            ops.adamw_selected_columns_([w], [g], [s], [st], lr=1e-3, grad_scale=scale, noop=noop)
    for value, skip in ((0.5, 0), (0.25, 1), (2.0, 0)):
        scale.fill_(value)
        noop.fill_(skip)
        graph.replay()
        if not skip:
            ops.adamw_selected_columns_(
                [eager_w],
                [g],
                [s],
                [eager_st],
                lr=1e-3,
                grad_scale=torch.tensor([value], device=DEV),
            )
    torch.cuda.synchronize()
    assert torch.equal(w, eager_w) and torch.equal(st.master, eager_st.master)
    assert st.steps.cpu().tolist() == (eager_st.steps.cpu()).tolist()


def test_adamw_lr_tensor_lets_a_captured_graph_follow_an_lr_schedule():
    gen = torch.Generator().manual_seed(8)
    cases = [make_adamw_case(64, 96, 9, torch.bfloat16, True, gen, device=DEV) for _ in range(2)]
    eager = [(w.clone(), g, s, _clone_state(st)) for w, g, s, st in cases]
    lr_tensor = torch.zeros(2, device=DEV)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            ops.adamw_selected_columns_(
                *(list(x) for x in zip(*cases)),
                lr=[0.0, 0.0],  # replaced by lr_tensor
                weight_decay=[0.01, 0.02],
                lr_tensor=lr_tensor,
            )
    for lrs in ([1e-3, 2e-3], [5e-4, 1e-4], [3e-3, 0.0]):
        lr_tensor.copy_(torch.tensor(lrs))
        graph.replay()
        # The eager twin takes the fp32 value of each lr, which is what the kernel reads.
        ops.adamw_selected_columns_(
            *(list(x) for x in zip(*eager)),
            lr=[float(torch.tensor(v, dtype=torch.float32)) for v in lrs],
            weight_decay=[0.01, 0.02],
        )
    torch.cuda.synchronize()
    for (w, _, _, st), (ew, _, _, est) in zip(cases, eager):
        assert torch.equal(w, ew) and torch.equal(st.master, est.master)
        assert torch.equal(st.steps, est.steps)


def test_adamw_device_step_counts_negative_and_int32_max():
    """Documented device behaviour (zenflow/optim.h): the host does not read the counts on
    CUDA; a negative count is treated as 0 and a count at INT32_MAX stays there."""
    w, g = torch.randn(4, 8, device=DEV), torch.randn(4, 8, device=DEV)
    st = ops.ColumnState(
        None,
        torch.zeros(4, 3, device=DEV),
        torch.zeros(4, 3, device=DEV),
        torch.tensor([-5, 2**31 - 1, 0], dtype=torch.int32, device=DEV),
    )
    sel = torch.tensor([1, 4, 6], dtype=torch.int32, device=DEV)
    ops.adamw_selected_columns_([w], [g], [sel], [st], lr=1e-3)
    torch.cuda.synchronize()
    assert st.steps.cpu().tolist() == [1, 2**31 - 1, 1]
    assert torch.isfinite(w).all()


def test_adamw_skips_minus_one_indices():
    w, g = torch.randn(8, 16, device=DEV), torch.randn(8, 16, device=DEV)
    st = ops.ColumnState(
        None,
        torch.zeros(8, 2, device=DEV),
        torch.zeros(8, 2, device=DEV),
        torch.zeros(2, dtype=torch.int32, device=DEV),
    )
    before = w.clone()
    sel = torch.full((2,), -1, dtype=torch.int32, device=DEV)  # a NaN top-k result
    ops.adamw_selected_columns_([w], [g], [sel], [st], lr=1e-3)
    torch.cuda.synchronize()
    assert torch.equal(w, before) and st.steps.sum().item() == 0


# ---- pack, scatter, exchange ------------------------------------------------------------------


@pytest.mark.parametrize("packed_dtype", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_pack_and_scatter_equal_host(dtype, packed_dtype):
    gen = torch.Generator().manual_seed(5)
    shapes = SHAPES + ([] if SMALL else [(4096, 1100, 110), (257, 4099, 0)])
    grads = [torch.randn(r, c, generator=gen).to(dtype) for r, c, _ in shapes]
    sels = [random_selection(c, k, gen) for _, c, k in shapes]
    name = str(packed_dtype).replace("torch.", "")
    scale = torch.tensor([0.3])
    host = ops.pack_columns(grads, sels, dtype=name, scale=scale)
    total = host.numel()
    out = torch.full((total,), float("nan"), dtype=packed_dtype, device=DEV)  # poisoned
    dev = ops.pack_columns(
        [g.to(DEV) for g in grads], [s.to(DEV) for s in sels], out=out, scale=scale.to(DEV)
    )
    assert torch.equal(dev.cpu(), host)
    assert torch.equal(host, packed_reference(grads, sels, packed_dtype, float(scale)))
    params_h = [torch.zeros_like(g) for g in grads]
    params_d = [p.to(DEV) for p in params_h]
    ops.scatter_columns(host, params_h, sels)
    ops.scatter_columns(dev, params_d, [s.to(DEV) for s in sels])
    for a, b in zip(params_d, params_h):
        assert torch.equal(a.cpu(), b)


def _state(rows, cols, host, gen, poisoned=False):
    shape = (cols, rows) if host else (rows, cols)

    def make():
        return torch.full(shape, float("nan")) if poisoned else torch.randn(shape, generator=gen)

    steps = torch.randint(0, 100, (cols,), generator=gen, dtype=torch.int32)
    return ops.ColumnState(make(), make(), make(), steps)


def test_exchange_equals_host():
    gen = torch.Generator().manual_seed(6)
    cases = [
        (5, 40, 8, 8),
        (1, 17, 3, 5),
        (37, 1001, 100, 100),
        (4, 9, 0, 4),
        (6, 9, 4, 0),
        (300, 600, 60, 60),
    ]
    args_h = [[] for _ in range(6)]
    for rows, n, k_old, k_new in cases:
        o, nw = random_selection(n, k_old, gen), random_selection(n, k_new, gen)
        stay = int(torch.isin(nw, o).sum())

        for lst, item in zip(
            args_h,
            (
                o,
                nw,
                _state(rows, k_old, False, gen),
                _state(rows, k_new, False, gen, True),
                _state(rows, k_new - stay, True, gen),
                _state(rows, k_old - stay, True, gen, True),
            ),
        ):
            lst.append(item)
    args_d = [[x.to(DEV) for x in args_h[0]], [x.to(DEV) for x in args_h[1]]]
    args_d += [[_cuda_state(s) for s in lst] for lst in args_h[2:]]
    ops.exchange_selected_columns(*args_h)
    ops.exchange_selected_columns(*args_d)
    torch.cuda.synchronize()
    for lst_h, lst_d in zip(args_h[3:], args_d[3:]):
        for sh, sd in zip(lst_h, lst_d):
            for a, b in zip(sh, sd):
                assert torch.equal(a, b.cpu())
    # The packed form (one entering and one leaving state for all matrices) on the device
    # equals the per-matrix form on the host.
    e_counts = [st.steps.numel() for st in args_h[4]]
    l_counts = [st.steps.numel() for st in args_h[5]]

    def packed(states):
        return ops.ColumnState(
            *(torch.cat([t.reshape(-1) for t in fields]) for fields in zip(*states))
        )

    new_d = [
        _cuda_state(_state(r, len(nw), False, gen, True)) for (r, *_), nw in zip(cases, args_h[1])
    ]
    out_d = _cuda_state(
        packed([_state(r, c, True, gen, True) for (r, *_), c in zip(cases, l_counts)])
    )
    ops.exchange_selected_columns(
        args_d[0],
        args_d[1],
        args_d[2],
        new_d,
        _cuda_state(packed(args_h[4])),
        out_d,
        entering_counts=e_counts,
        leaving_counts=l_counts,
    )
    torch.cuda.synchronize()
    for sh, sd in zip(args_h[3], new_d):
        for a, b in zip(sh, sd):
            assert torch.equal(a, b.cpu())
    for a, b in zip(packed(args_h[5]), out_d):
        assert torch.equal(a, b.cpu())


# ---- cupy arrays through the same ops ---------------------------------------------------------


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    g = cupy.random.standard_normal((64, 40), dtype=cupy.float32)
    stats = ops.column_stats([g])
    assert isinstance(stats.col_sq[0], cupy.ndarray)
    sel = ops.select_topk_columns(stats.col_sq, 4)[0]
    expected = torch.topk(torch.as_tensor(cupy.asnumpy(stats.col_sq[0])), 4).indices.sort().values
    assert cupy.asnumpy(sel).tolist() == expected.tolist()
    packed = ops.pack_columns([g], [sel])
    assert isinstance(packed, cupy.ndarray) and packed.size == 64 * 36
    w = cupy.zeros((64, 40), dtype=cupy.float32)
    ops.scatter_columns(packed, [w], [sel])
    mask = cupy.ones(40, dtype=bool)
    mask[sel] = False
    assert bool((w[:, mask] == g[:, mask]).all()) and bool((w[:, sel] == 0).all())
    st = ops.ColumnState(
        None,
        cupy.zeros((64, 4), cupy.float32),
        cupy.zeros((64, 4), cupy.float32),
        cupy.zeros(4, cupy.int32),
    )
    ops.adamw_selected_columns_([w], [g], [sel], [st], lr=1e-2)
    assert int(st.steps.sum()) == 4 and bool((w[:, sel] != 0).all())


# ---- long random sweep ------------------------------------------------------------------------


def test_long_random_sweep():
    gen = torch.Generator().manual_seed(7)
    for it in range(5 if SMALL else 200):
        count = int(torch.randint(1, 6, (1,), generator=gen))
        dtype = DTYPES[it % 3]
        shapes = [
            (
                int(torch.randint(0, 300, (1,), generator=gen)),
                int(torch.randint(1, 700, (1,), generator=gen)),
            )
            for _ in range(count)
        ]
        grads = [torch.randn(r, c, generator=gen).to(dtype) for r, c in shapes]
        ks = [int(torch.randint(0, c + 1, (1,), generator=gen)) for _, c in shapes]
        stats_d = ops.column_stats([g.to(DEV) for g in grads])
        scores = [s.cpu() for s in stats_d.col_sq]
        sel_h = ops.select_topk_columns(scores, ks)
        sel_d = ops.select_topk_columns(stats_d.col_sq, ks)
        for a, b in zip(sel_h, sel_d):
            assert torch.equal(a, b.cpu()), it
        packed_h = ops.pack_columns(grads, sel_h)
        packed_d = ops.pack_columns([g.to(DEV) for g in grads], sel_d)
        assert torch.equal(packed_h, packed_d.cpu()), it
