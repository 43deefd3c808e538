"""The host optimizer: zenflow.ops.cpu_* (zenflow/cpu_adamw.h) against torch.optim.AdamW / Adam and a float64
reference over 20 steps (every dtype combination, both modes, awkward sizes, every SIMD
level); zenflow.CPUAdamW as a drop-in; skipped columns; the accumulator; bad input."""

from __future__ import annotations

import copy
import functools
import math

import numpy as np
import pytest
import torch

import zenflow
from zenflow import ops

STEPS = 20
SIZES = [1, 7, 1000003]
GRAD_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
OUT_DTYPES = [None, torch.bfloat16, torch.float16]
MODES = ["adamw", "adam"]
HYPER = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)
GRAD_SCALE = 0.5  # a power of two: torch's reference can apply it exactly


def gradients(size: int, dtype: torch.dtype) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(size * 31 + GRAD_DTYPES.index(dtype))
    return [torch.randn(size, generator=gen).to(dtype) for _ in range(STEPS)]


def initial_param(size: int) -> torch.Tensor:
    return torch.randn(size, generator=torch.Generator().manual_seed(size))


@functools.cache
def references(size: int, grad_dtype: torch.dtype, mode: str):
    """torch's fp32 trajectory and a float64 one, on the same (widened, scaled) gradients."""
    torch_cls = torch.optim.AdamW if mode == "adamw" else torch.optim.Adam
    p32 = initial_param(size).requires_grad_()
    opt = torch_cls([p32], foreach=False, **HYPER)
    p64 = initial_param(size).double()
    m64 = torch.zeros_like(p64)
    v64 = torch.zeros_like(p64)
    lr, (b1, b2), eps, wd = HYPER["lr"], HYPER["betas"], HYPER["eps"], HYPER["weight_decay"]
    for t, g in enumerate(gradients(size, grad_dtype), start=1):
        p32.grad = g.float() * GRAD_SCALE
        opt.step()
        g64 = g.double() * GRAD_SCALE
        if mode == "adam":
            g64 = g64 + wd * p64
        else:
            p64 *= 1 - lr * wd
        m64.mul_(b1).add_(g64, alpha=1 - b1)
        v64.mul_(b2).addcmul_(g64, g64, value=1 - b2)
        denom = v64.sqrt() / math.sqrt(1 - b2**t) + eps
        p64 -= lr / (1 - b1**t) * m64 / denom
    return p32.detach().clone(), p64


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("grad_dtype", GRAD_DTYPES, ids=str)
def test_twenty_steps_match_torch_and_float64(grad_dtype, out_dtype, mode, size, simd_level):
    param = initial_param(size)
    exp_avg = torch.zeros(size)
    exp_avg_sq = torch.zeros(size)
    out = None if out_dtype is None else torch.empty(size, dtype=out_dtype)
    for t, g in enumerate(gradients(size, grad_dtype), start=1):
        ops.cpu_adamw_step(
            param,
            exp_avg,
            exp_avg_sq,
            g.clone(),
            step=t,
            mode=mode,
            grad_scale=GRAD_SCALE,
            out_params=out,
            **HYPER,
        )
    torch_param, p64 = references(size, grad_dtype, mode)
    ours = (param.double() - p64).abs().max().item()
    theirs = (torch_param.double() - p64).abs().max().item()
    # Flash-attention's criterion: no worse than twice torch's own fp32 error (plus a floor
    # for the cases where torch happens to be exact).
    assert ours <= 2 * theirs + 1e-6, (ours, theirs)
    torch.testing.assert_close(param, torch_param, rtol=1e-5, atol=1e-6)
    if out is not None:
        assert torch.equal(out, param.to(out_dtype)), (
            "upload copy is not the round-to-nearest-even master"
        )


def test_levels_and_thread_counts_agree_bitwise(restore_threads):
    size = 300007
    grads = gradients(size, torch.bfloat16)[:3]
    results = []
    for level in zenflow.supported_simd_levels():
        for threads in (1, 2, 3):
            zenflow.set_simd_level(level)
            zenflow.set_num_threads(threads)
            p, m, v = initial_param(size), torch.zeros(size), torch.zeros(size)
            out = torch.empty(size, dtype=torch.bfloat16)
            for t, g in enumerate(grads, start=1):
                ops.cpu_adamw_step(p, m, v, g, step=t, out_params=out, **HYPER)
            results.append((level, threads, p, m, v, out))
    zenflow.set_simd_level(zenflow.supported_simd_levels()[-1])
    first = results[0]
    for level, threads, *tensors in results[1:]:
        for a, b in zip(first[2:], tensors):
            assert torch.equal(
                a.view(torch.int16) if a.dtype == torch.bfloat16 else a.view(torch.int32),
                b.view(torch.int16) if b.dtype == torch.bfloat16 else b.view(torch.int32),
            ), (
                level,
                threads,
            )


# ---- zenflow.CPUAdamW ----


def make_model(dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(33, 17), (17,), (5, 7, 3), (1,)]
    return [torch.randn(s, generator=gen).to(dtype).requires_grad_() for s in shapes]


def set_grads(params, step, dtype=None):
    gen = torch.Generator().manual_seed(1000 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(dtype or p.dtype)


def step_both(ours, ref, ours_params, ref_params, step):
    """One step of zenflow's optimizer and of its torch peer on the same gradients."""
    set_grads(ours_params, step)
    set_grads(ref_params, step)
    ours.step()
    ref.step()


def groups(params, **overrides):
    return [
        {"params": params[:2], **overrides},
        {"params": params[2:], "lr": 3e-3, "weight_decay": 0.0, "betas": (0.8, 0.99)},
    ]


@pytest.mark.parametrize(
    "torch_cls, kwargs",
    [
        (torch.optim.AdamW, {}),
        (torch.optim.AdamW, {"maximize": True}),
        (torch.optim.Adam, {"weight_decay": 0.1}),
    ],
    ids=["adamw", "maximize", "adam-l2"],
)
def test_cpu_adamw_matches_torch(torch_cls, kwargs, simd_level):
    ours_params, ref_params = make_model(), make_model()
    decoupled = torch_cls is torch.optim.AdamW
    ours = zenflow.CPUAdamW(
        groups(ours_params), lr=1e-2, decoupled_weight_decay=decoupled, **kwargs
    )
    ref = torch_cls(groups(ref_params), lr=1e-2, foreach=False, **kwargs)
    for t in range(STEPS):
        step_both(ours, ref, ours_params, ref_params, t)
    for a, b in zip(ours_params, ref_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(ours_params, ref_params):
        assert float(ours.state[a]["step"]) == float(ref.state[b]["step"]) == STEPS


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_cpu_adamw_low_precision_params_keep_fp32_master(dtype):
    ours_params = make_model(dtype)
    ref_params = [p.detach().float().requires_grad_() for p in ours_params]
    ours = zenflow.CPUAdamW(ours_params, lr=1e-2)
    ref = torch.optim.AdamW(ref_params, lr=1e-2, foreach=False)
    for t in range(STEPS):
        set_grads(ours_params, t)
        for a, b in zip(ours_params, ref_params):
            b.grad = a.grad.float()
        ours.step()
        ref.step()
    for a, b in zip(ours_params, ref_params):
        master = ours.state[a]["master"]
        assert master.dtype == torch.float32 and ours.state[a]["exp_avg"].dtype == torch.float32
        torch.testing.assert_close(master, b.detach(), rtol=1e-5, atol=1e-6)
        assert torch.equal(a.detach(), master.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_state_dict_round_trip_continues_the_same_trajectory(dtype):
    straight = make_model(dtype)
    opt = zenflow.CPUAdamW(groups(straight), lr=1e-2)
    for t in range(STEPS):
        set_grads(straight, t)
        opt.step()

    first = make_model(dtype)
    opt1 = zenflow.CPUAdamW(groups(first), lr=1e-2)
    for t in range(STEPS // 2):
        set_grads(first, t)
        opt1.step()
    saved = copy.deepcopy(opt1.state_dict())
    resumed = [p.detach().clone().requires_grad_() for p in first]
    opt2 = zenflow.CPUAdamW(groups(resumed), lr=0.5)  # hyper-parameters come from the state dict
    opt2.load_state_dict(saved)
    assert opt2.param_groups[0]["lr"] == 1e-2
    for t in range(STEPS // 2, STEPS):
        set_grads(resumed, t)
        opt2.step()
    for a, b in zip(straight, resumed):
        assert torch.equal(a, b)


def test_loads_a_torch_adamw_state_dict():
    ours_params, ref_params = make_model(), make_model()
    ref = torch.optim.AdamW(ref_params, lr=1e-2, foreach=False)
    for t in range(3):
        set_grads(ref_params, t)
        ref.step()
    ours_params = [p.detach().clone().requires_grad_() for p in ref_params]
    ours = zenflow.CPUAdamW(ours_params, lr=1e-2)
    ours.load_state_dict(ref.state_dict())
    for t in range(3, 8):
        step_both(ours, ref, ours_params, ref_params, t)
    for a, b in zip(ours_params, ref_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_cpu_adamw_rejects_what_it_does_not_implement():
    params = make_model()
    with pytest.raises(ValueError, match="amsgrad"):
        zenflow.CPUAdamW(params, amsgrad=True)
    with pytest.raises(ValueError, match="lr"):
        zenflow.CPUAdamW(params, lr=float("nan"))
    with pytest.raises(ValueError, match="betas"):
        zenflow.CPUAdamW(params, betas=(1.0, 0.999))
    with pytest.raises(TypeError, match="float64"):
        zenflow.CPUAdamW([torch.zeros(3, dtype=torch.float64, requires_grad=True)])


def test_num_threads_and_default_split(restore_threads):
    cores = zenflow._native.native().host_cpu_count()
    assert zenflow.default_num_threads() == max(1, cores - cores // 2)
    assert zenflow.default_num_threads(0.0) == cores
    zenflow.CPUAdamW(make_model(), num_threads=2)
    assert zenflow.get_num_threads() == 2
    with pytest.raises(ValueError, match="pt_reserved_cores_perc"):
        zenflow.default_num_threads(1.5)


# ---- selected columns, accumulate ----


def column_major(n, m, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, m, generator=gen) for _ in range(3)]


@pytest.mark.parametrize("packed", [False, True], ids=["full", "packed"])
def test_skip_columns_untouched_and_unselected_updated(packed, simd_level):
    n, m = 97, 131
    selected = torch.tensor([0, 3, 4, 5, 50, 96], dtype=torch.int32)
    unselected = torch.tensor([j for j in range(n) if j not in set(selected.tolist())])
    param, exp_avg, exp_avg_sq = column_major(n, m, 1)
    exp_avg_sq.abs_()
    # The packed form is the 1-D buffer of pack_columns: the unselected columns in order.
    grad = torch.randn(len(unselected) if packed else n, m).to(torch.bfloat16)
    out = torch.full((len(unselected) * m,), 7.0, dtype=torch.bfloat16)
    before = [t.clone() for t in (param, exp_avg, exp_avg_sq, grad)]
    counts = torch.full((n,), 4, dtype=torch.int32)
    state = ops.ColumnState(param, exp_avg, exp_avg_sq, counts)
    ops.cpu_adamw_step_skip_columns(
        [state],
        [selected],
        grads=None if packed else [grad],
        packed_grads=grad.view(-1) if packed else None,
        packed_out=out,
        increment_steps=True,
        zero_grad=True,
        **HYPER,
    )
    for after, old in zip((param, exp_avg, exp_avg_sq), before[:3]):
        assert torch.equal(
            after[selected.long()].view(torch.int32), old[selected.long()].view(torch.int32)
        )
    # The unselected columns are exactly one plain step with count 5.
    p, mm, v = (t[unselected].clone() for t in before[:3])
    g = before[3] if packed else before[3][unselected]
    ops.cpu_adamw_step(p, mm, v, g.contiguous(), step=5, **HYPER)
    assert torch.equal(param[unselected], p) and torch.equal(exp_avg[unselected], mm)
    assert torch.equal(counts[selected.long()], torch.full((len(selected),), 4, dtype=torch.int32))
    assert torch.equal(counts[unselected], torch.full((len(unselected),), 5, dtype=torch.int32))
    assert torch.equal(out, p.to(torch.bfloat16).view(-1)), "upload copy is not the new weights"
    if packed:
        assert torch.equal(grad, torch.zeros_like(grad))
    else:
        assert torch.equal(grad[selected.long()], before[3][selected.long()]), (
            "selected gradient was zeroed"
        )
        assert torch.equal(grad[unselected], torch.zeros_like(grad[unselected]))


def test_skip_columns_without_increment_uses_counts_as_given():
    n, m = 9, 5
    param, exp_avg, exp_avg_sq = column_major(n, m, 2)
    exp_avg_sq.abs_()
    counts = torch.arange(1, n + 1, dtype=torch.int32)
    grad = torch.randn(n, m)
    expected = [t.clone() for t in (param, exp_avg, exp_avg_sq)]
    for j in range(n):
        cols = [t[j].clone() for t in expected]
        ops.cpu_adamw_step(*cols, grad[j].clone(), step=j + 1, **HYPER)
        for t, c in zip(expected, cols):
            t[j] = c
    state = ops.ColumnState(param, exp_avg, exp_avg_sq, counts)
    ops.cpu_adamw_step_skip_columns([state], None, grads=[grad], **HYPER)
    assert torch.equal(param, expected[0]) and torch.equal(exp_avg_sq, expected[2])
    assert counts.tolist() == list(range(1, n + 1))


def test_accumulator_zeroed_exactly_when_asked():
    param, exp_avg, exp_avg_sq = (torch.randn(1000) for _ in range(3))
    exp_avg_sq.abs_()
    acc = torch.randn(1000)
    kept = acc.clone()
    ops.cpu_adamw_step(param, exp_avg, exp_avg_sq, acc, step=1, lr=1e-3)
    assert torch.equal(acc, kept)
    ops.cpu_adamw_step(param, exp_avg, exp_avg_sq, acc, step=2, lr=1e-3, zero_grad=True)
    assert torch.equal(
        acc.view(torch.int32), torch.zeros(1000, dtype=torch.int32)
    )  # +0.0 bit patterns


@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=str)
def test_accumulate_matches_torch_add(dtype, simd_level):
    acc = torch.randn(1000003)
    block = torch.randn(1000003).to(dtype)
    expected = acc.clone().add_(block.float(), alpha=0.37)
    ops.cpu_accumulate(acc, block, scale=0.37)
    torch.testing.assert_close(acc, expected, rtol=1.2e-7, atol=1e-30)

    n, m = 50, 33
    acc2 = torch.randn(n, m)
    selected = torch.tensor([1, 2, 30, 49], dtype=torch.int32)
    unselected = torch.tensor([j for j in range(n) if j not in (1, 2, 30, 49)])
    packed = torch.randn(len(unselected), m).to(dtype)
    expected2 = acc2.clone()
    expected2[unselected] += 2.0 * packed.float()
    ops.cpu_accumulate(acc2, packed.view(-1), scale=2.0, selected=selected)
    assert torch.equal(acc2, expected2)


def test_accumulate_consumes_the_pack_columns_buffer():
    """End to end on the one packed layout: pack_columns on row-major gradients, then
    cpu_accumulate into host-layout (column-major) accumulators."""
    gen = torch.Generator().manual_seed(8)
    shapes = [(7, 13, 3), (1, 5, 0), (4, 9, 9), (33, 17, 4)]
    grads = [torch.randn(m, n, generator=gen).bfloat16() for m, n, _ in shapes]
    selected = [torch.sort(torch.randperm(n, generator=gen)[:k]).values.int() for _, n, k in shapes]
    accs = [torch.randn(n, m, generator=gen) for m, n, _ in shapes]
    expected = [a.clone() for a in accs]
    for e, g, sel in zip(expected, grads, selected):
        rest = [j for j in range(g.shape[1]) if j not in set(sel.tolist())]
        e[rest] += 0.5 * g.float().t()[rest]
    packed = ops.pack_columns(grads, selected)
    ops.cpu_accumulate(accs, packed, scale=0.5, selected=selected)
    for a, e in zip(accs, expected):
        assert torch.equal(a, e)


def test_gather_scatter_round_trip_is_lossless():
    gen = torch.Generator().manual_seed(12)
    n, m = 23, 6
    host = ops.ColumnState(
        torch.randn(n, m, generator=gen),
        torch.randn(n, m, generator=gen),
        torch.rand(n, m, generator=gen),
        torch.randint(0, 50, (n,), generator=gen, dtype=torch.int32),
    )
    cols = torch.tensor([0, 4, 5, 22], dtype=torch.int32)
    out = ops.ColumnState(
        *(torch.full((4, m), float("nan")) for _ in range(3)),
        torch.full((4,), -1, dtype=torch.int32),
    )
    ops.cpu_gather_columns([host], [cols], [out])
    for got, full in zip(out, host):
        assert torch.equal(got, full[cols.long()])
    before = [t.clone() for t in host]
    for t in host:
        t[cols.long()] = 0
    ops.cpu_scatter_columns([out], [cols], [host])
    for got, want in zip(host, before):
        assert torch.equal(got, want)


# ---- bad input: ValueError/TypeError naming the argument, nothing written ----


def fresh(n=64):
    return [torch.full((n,), v) for v in (1.0, 0.5, 0.25, 2.0)]


def assert_untouched(tensors):
    for t, v in zip(tensors, (1.0, 0.5, 0.25, 2.0)):
        assert torch.equal(t, torch.full_like(t, v)), "a failed call wrote to its buffers"


@pytest.mark.parametrize(
    "change, error, match",
    [
        ({"lr": float("nan")}, ValueError, "lr"),
        ({"betas": (float("nan"), 0.999)}, ValueError, "beta1"),
        ({"betas": (0.9, 1.5)}, ValueError, "beta2"),
        ({"eps": float("nan")}, ValueError, "eps"),
        ({"weight_decay": -1.0}, ValueError, "weight_decay"),
        ({"grad_scale": float("inf")}, ValueError, "grad_scale"),
        ({"step": 0}, ValueError, "steps"),
        ({"mode": "sgd"}, ValueError, "mode"),
        ({"lr": "fast"}, TypeError, "lr"),
    ],
)
def test_bad_hyper_parameters(change, error, match):
    tensors = fresh()
    kwargs = {"step": 1, "lr": 1e-3, "zero_grad": True, **change}
    with pytest.raises(error, match=match):
        ops.cpu_adamw_step(*tensors, **kwargs)
    assert_untouched(tensors)


def test_bad_buffers():
    p, m, v, g = fresh()
    with pytest.raises(ValueError, match="exp_avg_sqs"):
        ops.cpu_adamw_step(p, m, v[:63], g, step=1, lr=1e-3, zero_grad=True)
    with pytest.raises(ValueError, match="grads"):
        ops.cpu_adamw_step(p[:32], m[:32], v[:32], g[::2], step=1, lr=1e-3, zero_grad=True)
    with pytest.raises(TypeError, match="grads"):
        ops.cpu_adamw_step(p, m, v, g.to(torch.int32), step=1, lr=1e-3, zero_grad=True)
    with pytest.raises(ValueError, match="overlaps"):
        ops.cpu_adamw_step(p, p, v, g, step=1, lr=1e-3, zero_grad=True)
    # A float32 array whose data is not 4-byte aligned.
    raw = np.zeros(4 * 64 + 1, dtype=np.uint8)
    misaligned = np.frombuffer(raw.data, dtype=np.float32, count=32, offset=1)
    aligned = [np.full(32, 1.0, dtype=np.float32) for _ in range(3)]
    with pytest.raises(ValueError, match="exp_avgs"):
        ops.cpu_adamw_step(aligned[0], misaligned, aligned[1], aligned[2], step=1, lr=1e-3)
    assert (aligned[0] == 1.0).all() and (aligned[2] == 1.0).all()
    assert_untouched((p, m, v, g))


@pytest.mark.parametrize(
    "selected, match",
    [
        ([3, 1], "strictly increasing"),
        ([2, 2], "strictly increasing"),
        ([0, 8], "outside"),
        ([-1], "outside"),
    ],
)
def test_bad_selected_indices(selected, match):
    tensors = [t.view(8, 8) for t in fresh()]
    steps = torch.ones(8, dtype=torch.int32)
    with pytest.raises(ValueError, match=match):
        ops.cpu_adamw_step_skip_columns(
            [ops.ColumnState(tensors[0], tensors[1], tensors[2], steps)],
            [torch.tensor(selected, dtype=torch.int32)],
            grads=[tensors[3]],
            lr=1e-3,
            zero_grad=True,
        )
    assert_untouched(tensors)
    assert steps.tolist() == [1] * 8
    acc, block = torch.full((8, 8), 1.0), torch.full(((8 - len(selected)) * 8,), 2.0)
    with pytest.raises(ValueError, match=match):
        ops.cpu_accumulate(acc, block, selected=torch.tensor(selected, dtype=torch.int32))
    assert torch.equal(acc, torch.full((8, 8), 1.0))


def test_openmp_pause_leaves_torch_working():
    from zenflow import _omp

    a = torch.randn(1 << 20)
    expected = a.double() * 3
    assert isinstance(_omp.pause_openmp_workers(), bool)
    torch.testing.assert_close((a * 3).double(), expected)  # torch's workers start again
    _omp.set_enabled(False)
    try:
        assert _omp.pause_openmp_workers() is False
    finally:
        _omp.set_enabled(True)


def test_large_step_with_openmp_pause_matches_torch(monkeypatch, restore_threads):
    import zenflow.cpu_adamw as module

    zenflow.set_host_threads("zenflow")  # the pause only runs with zenflow's own threads
    monkeypatch.setattr(module, "_PAUSE_OPENMP_MIN_ELEMENTS", 1)
    ours_params, ref_params = make_model(), make_model()
    ours = zenflow.CPUAdamW(ours_params, lr=1e-2)
    ref = torch.optim.AdamW(ref_params, lr=1e-2, foreach=False)
    for t in range(3):
        step_both(ours, ref, ours_params, ref_params, t)
    for a, b in zip(ours_params, ref_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_step_counts_of_any_tensor_kind_are_incremented():
    params = make_model()
    opt = zenflow.CPUAdamW(params, lr=1e-2)
    set_grads(params, 0)
    opt.step()
    opt.state[params[0]]["step"] = torch.tensor(1.0, dtype=torch.float64)  # not fp32
    versions = [opt.state[p]["step"]._version for p in params[1:]]
    set_grads(params, 1)
    opt.step()
    assert [float(opt.state[p]["step"]) for p in params] == [2.0] * len(params)
    assert all(opt.state[p]["step"]._version > v for p, v in zip(params[1:], versions))


def test_group_values_changed_between_steps_are_used():
    """A steady-state step reuses the validated group values only while they are the same
    immutable objects: a new float, a tensor lr changed in place and a list of betas changed
    in place all reach the kernel, as they reach torch's AdamW."""
    ours_params, ref_params = make_model(), make_model()
    ours = zenflow.CPUAdamW(groups(ours_params, lr=torch.tensor(1e-2)), lr=1e-2)
    ref = torch.optim.AdamW(groups(ref_params, lr=torch.tensor(1e-2)), lr=1e-2, foreach=False)
    ours.param_groups[1]["betas"] = [0.8, 0.99]
    ref.param_groups[1]["betas"] = [0.8, 0.99]
    changes = [
        lambda g: g[0]["lr"].fill_(3e-3),  # in place
        lambda g: g[1].__setitem__("lr", 5e-4),  # a new float
        lambda g: g[1]["betas"].__setitem__(0, 0.5),  # a list, in place
        lambda g: g[0].__setitem__("weight_decay", 0.3),
        lambda g: None,
    ]
    for t, change in enumerate(changes):
        step_both(ours, ref, ours_params, ref_params, t)
        for a, b in zip(ours_params, ref_params):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        change(ours.param_groups)
        change(ref.param_groups)
    ours.param_groups[1]["betas"][1] = 1.5  # invalid, in place: still caught
    set_grads(ours_params, 9)
    with pytest.raises(ValueError, match=r"param_groups\[1\]\.betas\[1\]"):
        ours.step()
    ours.param_groups[1]["betas"] = (0.9, 0.999)
    ours.step()
    ours.param_groups[0]["eps"] = -1.0  # a new object after a cached step
    with pytest.raises(ValueError, match=r"param_groups\[0\]\.eps"):
        ours.step()
