"""The CUDA AdamW of selected columns against its host twin, bit for bit, on the paths the
basic sweep (test_gpu_kernels.py) does not reach: several launches, row chunks of a tall
matrix, a tensor over 2^31 elements, a side stream, run-to-run determinism, and an lr
change between two replays of a captured graph. Marked `gpu`, skipped without a GPU."""

from __future__ import annotations

import os

import pytest
import torch
from column_ops_reference import make_adamw_case

from zenflow import ops

pytestmark = pytest.mark.gpu
SMALL = os.environ.get("ZENFLOW_GPU_SMALL", "0") == "1"
DEV = "cuda"
MATRICES_PER_LAUNCH = 160  # kAdamwMaxMatricesPerLaunch (cuda/optim/adamw_selected_kernel.cuh)


def _to(state, device):
    return ops.ColumnState(*(None if t is None else t.to(device) for t in state))


def _clone(state):
    return ops.ColumnState(*(None if t is None else t.clone() for t in state))


def _assert_state_equal(device_state, host_state, what):
    for a, b in zip(device_state, host_state):
        assert (a is None and b is None) or torch.equal(a.cpu(), b), what


def _run_both(cases, **kwargs):
    """Runs the host twin and the device on copies of `cases` [(w, g, sel, state)] (host
    tensors); returns (host, device) results as lists of (w, state)."""
    host = [(w.clone(), g, s, _clone(st)) for w, g, s, st in cases]
    dev = [(w.to(DEV), g.to(DEV), s.to(DEV), _to(st, DEV)) for w, g, s, st in cases]
    for batch in (host, dev):
        ops.adamw_selected_columns_(*(list(x) for x in zip(*batch)), **kwargs)
    torch.cuda.synchronize()
    return [(w, st) for w, _, _, st in host], [(w, st) for w, _, _, st in dev]


def test_more_matrices_than_one_launch_and_tall_row_chunks():
    gen = torch.Generator().manual_seed(11)
    count = MATRICES_PER_LAUNCH + 13 if not SMALL else MATRICES_PER_LAUNCH + 2
    dtypes = [torch.float32, torch.bfloat16, torch.float16]
    cases = []
    for i in range(count):
        rows = [1, 7, 33, 513][i % 4]  # 513: two row chunks of 512
        cols = 5 + (i * 7) % 40
        w, g, s, st = make_adamw_case(rows, cols, 1 + i % cols, dtypes[i % 3], i % 2 == 0, gen)
        cases.append((w, g.to(dtypes[(i + 1) % 3]), s, st))
    # One tall matrix: many row chunks per column tile, every chunk reading the same count.
    cases.append(make_adamw_case(1 if SMALL else 5000, 70, 40, torch.bfloat16, False, gen))
    lrs = [1e-3 * (1 + i % 5) for i in range(len(cases))]
    wds = [0.01 * (i % 3) for i in range(len(cases))]
    host, dev = _run_both(cases, lr=lrs, weight_decay=wds)
    for i, ((wh, sth), (wd, std)) in enumerate(zip(host, dev)):
        assert torch.equal(wd.cpu(), wh), i
        _assert_state_equal(std, sth, i)
        assert torch.equal(sth.steps, cases[i][3].steps + 1), i  # counted once per column


@pytest.mark.parametrize("mode", ["adamw", "adam"])
def test_run_to_run_bitwise_identical(mode):
    gen = torch.Generator().manual_seed(12)
    cases = [
        make_adamw_case(r, c, k, torch.bfloat16, True, gen)
        for r, c, k in ((1031, 300, 97), (64, 33, 33))
    ]
    results = []
    for _ in range(2):
        dev = [(w.to(DEV), g.to(DEV), s.to(DEV), _to(st, DEV)) for w, g, s, st in cases]
        for _step in range(3):
            ops.adamw_selected_columns_(
                *(list(x) for x in zip(*dev)), lr=1e-3, weight_decay=0.1, mode=mode
            )
        torch.cuda.synchronize()
        results.append([(w.cpu(), _to(st, "cpu")) for w, _, _, st in dev])
    for (w1, st1), (w2, st2) in zip(*results):
        assert torch.equal(w1, w2)
        _assert_state_equal(st1, st2, "run to run")


def test_explicit_side_stream_orders_after_its_own_work():
    """The call runs on the given stream: the gradient is written on that stream behind a
    long sleep, so a kernel on any other stream would read the stale (zero) gradient."""
    gen = torch.Generator().manual_seed(13)
    w, g, s, st = make_adamw_case(300, 200, 20, torch.float16, True, gen)
    host_w, host_st = w.clone(), _clone(st)
    ops.adamw_selected_columns_([host_w], [g], [s], [host_st], lr=2e-3, weight_decay=0.05)
    dw, ds, dst = w.to(DEV), s.to(DEV), _to(st, DEV)
    dg = torch.zeros_like(g, device=DEV)
    g_dev = g.to(DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # tens of milliseconds of GPU time
        dg.copy_(g_dev)
    ops.adamw_selected_columns_(
        [dw], [dg], [ds], [dst], lr=2e-3, weight_decay=0.05, stream=side.cuda_stream
    )
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(dw.cpu(), host_w)
    _assert_state_equal(dst, host_st, "side stream")


@pytest.mark.parametrize("mode", ["adamw", "adam"])
def test_captured_graph_follows_lr_between_replays_bitwise_as_host(mode):
    gen = torch.Generator().manual_seed(14)
    cases = [make_adamw_case(r, 96, 40, torch.bfloat16, True, gen) for r in (700, 9)]
    host = [(w.clone(), g, s, _clone(st)) for w, g, s, st in cases]
    dev = [(w.to(DEV), g.to(DEV), s.to(DEV), _to(st, DEV)) for w, g, s, st in cases]
    wds = [0.1, 0.02]
    lr_tensor = torch.zeros(2, device=DEV)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            # No host lr at all: the graph reads lr_tensor when it replays.
            ops.adamw_selected_columns_(
                *(list(x) for x in zip(*dev)), weight_decay=wds, lr_tensor=lr_tensor, mode=mode
            )
    for lrs in ([1e-2, 2e-3], [5e-4, 3e-2]):
        lr_tensor.copy_(torch.tensor(lrs))
        graph.replay()
        # The host twin takes the fp32 value of each lr, which is what the kernel reads.
        ops.adamw_selected_columns_(
            *(list(x) for x in zip(*host)),
            lr=[float(torch.tensor(v, dtype=torch.float32)) for v in lrs],
            weight_decay=wds,
            mode=mode,
        )
    torch.cuda.synchronize()
    for (wh, _, _, sth), (wd, _, _, std), (_, _, _, st0) in zip(host, dev, cases):
        assert torch.equal(wd.cpu(), wh)
        _assert_state_equal(std, sth, "graph")
        assert torch.equal(sth.steps, st0.steps + 2)


@pytest.mark.skipif(SMALL, reason="4 GiB tensors: not under compute-sanitizer")
def test_tensor_over_two_to_the_31_elements():
    """W and G of 2^31 + 4096 bf16 elements (8 GiB together): the last rows sit past 2^31.
    Only the selected columns are compared with the host twin (each element's update is
    independent, so the twin runs on the gathered [m, k] columns as a dense matrix)."""
    rows, cols = 2**31 // 4096 + 1, 4096
    free, _ = torch.cuda.mem_get_info()
    if free < 10 * 2**30:
        pytest.skip("needs 10 GiB of free GPU memory")
    gen = torch.Generator(device=DEV).manual_seed(15)
    w = torch.randn(rows, cols, generator=gen, device=DEV, dtype=torch.bfloat16)
    g = torch.randn(rows, cols, generator=gen, device=DEV, dtype=torch.bfloat16)
    sel = torch.tensor([0, 1, 2047, 4000, 4095], dtype=torch.int32, device=DEV)
    k = sel.numel()
    cols_long = sel.long()
    w_cols, g_cols = w[:, cols_long].cpu(), g[:, cols_long].cpu()
    last_row = w[-1].clone()
    state = ops.ColumnState(
        None,
        torch.zeros(rows, k, device=DEV),
        torch.zeros(rows, k, device=DEV),
        torch.tensor([0, 3, 0, 7, 1], dtype=torch.int32, device=DEV),
    )
    host_state = _to(state, "cpu")
    ops.adamw_selected_columns_([w], [g], [sel], [state], lr=1e-3, weight_decay=0.01)
    ops.adamw_selected_columns_([w_cols], [g_cols], None, [host_state], lr=1e-3, weight_decay=0.01)
    torch.cuda.synchronize()
    assert torch.equal(w[:, cols_long].cpu(), w_cols)
    _assert_state_equal(state, host_state, "2^31")
    unselected = torch.ones(cols, dtype=torch.bool, device=DEV)
    unselected[cols_long] = False
    assert torch.equal(w[-1][unselected], last_row[unselected])  # past 2^31, untouched
