"""What a new user hit (issue 7, item 9), each with a test: length mismatches, failed steps
that must change nothing, autograd version counters, step-count and aliasing checks,
validation in the pure-Python helpers, clear errors for unsupported arrays and arguments,
numpy/torch scalars where numbers are taken, and the ZENFLOW_SIMD warning."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import zenflow
from zenflow import ops

INT32_MAX = 2**31 - 1


def compact_state(rows, k, steps=0):
    return ops.ColumnState(
        None, torch.zeros(rows, k), torch.zeros(rows, k), torch.full((k,), steps, dtype=torch.int32)
    )


# ---- select_topk_columns: out_indices must hold exactly k entries ----


def test_topk_out_indices_length_must_equal_k():
    scores = [torch.tensor([3.0, 1.0, 2.0, 5.0, 4.0])]
    out = [torch.full((4,), -9, dtype=torch.int32)]
    with pytest.raises(ValueError, match=r"out_indices\[0\].*4 entries.*k is 1"):
        ops.select_topk_columns(scores, 1, out_indices=out)
    assert (out[0] == -9).all()
    got = ops.select_topk_columns(scores, 4, out_indices=out)[0]
    assert got.tolist() == [0, 2, 3, 4]


# ---- CPUAdamW: a step that raises changes nothing ----


def _model(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(5, 3, generator=gen).requires_grad_() for _ in range(3)]


def _grads(params, seed):
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)


def _snapshot(opt, params):
    return [p.detach().clone() for p in params], {
        id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in params if p in opt.state
    }


def _assert_same(opt, params, snapshot):
    values, states = snapshot
    for p, v in zip(params, values):
        assert torch.equal(p.detach(), v), "a failed step changed a parameter"
    assert {id(p) for p in params if p in opt.state and opt.state[p]} == set(states)
    for p in params:
        for key, v in states.get(id(p), {}).items():
            assert torch.equal(opt.state[p][key], v), f"a failed step changed state[{key!r}]"


@pytest.mark.parametrize("steps_before", [0, 2])
def test_failed_step_bad_eps_changes_nothing(steps_before):
    params = _model()
    opt = zenflow.CPUAdamW(params, lr=1e-2)
    for t in range(steps_before):
        _grads(params, t)
        opt.step()
    _grads(params, 10)
    snapshot = _snapshot(opt, params)
    opt.param_groups[0]["eps"] = -1.0
    with pytest.raises(ValueError, match="eps"):
        opt.step()
    _assert_same(opt, params, snapshot)
    # The next good step uses the right bias correction: the same as an optimizer that
    # never failed.
    opt.param_groups[0]["eps"] = 1e-8
    opt.step()
    ref_params = _model()
    ref = torch.optim.AdamW(ref_params, lr=1e-2, foreach=False)
    for t in [*range(steps_before), 10]:
        _grads(ref_params, t)
        ref.step()
    for a, b in zip(params, ref_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert float(opt.state[a]["step"]) == steps_before + 1


def test_failed_step_later_parameter_rejected_changes_nothing():
    params = _model()
    opt = zenflow.CPUAdamW([{"params": params[:2]}, {"params": params[2:], "lr": 1e-3}], lr=1e-2)
    _grads(params, 0)
    opt.step()
    _grads(params, 1)
    # The last parameter of the last group is rejected by the native call (its state was
    # replaced by one of the wrong size), after the others were accepted.
    opt.state[params[2]]["exp_avg"] = torch.zeros(4)
    snapshot = _snapshot(opt, params)
    with pytest.raises(ValueError, match=r"exp_avgs\[2\]"):
        opt.step()
    _assert_same(opt, params, snapshot)
    # A parameter that has never been stepped gets no state from a failed step either.
    fresh = _model(1)
    strided = torch.empty_strided((5, 3), (1, 5)).normal_().requires_grad_()
    opt2 = zenflow.CPUAdamW([*fresh, strided])
    _grads([*fresh, strided], 0)
    with pytest.raises(ValueError, match="contiguous"):
        opt2.step()
    assert len(opt2.state) == 0


# ---- autograd version counters ----


def test_cpu_adamw_step_then_backward_raises_like_torch():
    for make in (
        lambda ps: torch.optim.AdamW(ps, lr=1e-2),
        lambda ps: zenflow.CPUAdamW(ps, lr=1e-2),
    ):
        w = torch.randn(4, 4, requires_grad=True)
        x = torch.randn(4, 4, requires_grad=True)
        opt = make([w])
        loss = (w * x).sum()  # saves w for x's gradient
        w.grad = torch.ones_like(w)
        opt.step()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_adamw_bumps_the_parameter_version(dtype):
    w = torch.randn(8, dtype=dtype, requires_grad=True)
    opt = zenflow.CPUAdamW([w])
    w.grad = torch.ones(8, dtype=dtype)
    before = w._version
    opt.step()
    assert w._version > before


def test_every_op_bumps_the_versions_of_what_it_writes_only():
    w, g = torch.randn(4, 10), torch.randn(4, 10)
    sel = torch.tensor([1, 5], dtype=torch.int32)
    st = compact_state(4, 2)
    written = [w, st.exp_avg, st.exp_avg_sq, st.steps]
    before = [t._version for t in written]
    read = [g._version, sel._version]
    ops.adamw_selected_columns_([w], [g], [sel], [st], lr=1e-3)
    assert all(t._version > b for t, b in zip(written, before))
    assert [g._version, sel._version] == read

    out = torch.empty(4 * 8)
    v = out._version
    ops.pack_columns([g], [sel], out=out)
    assert out._version > v and g._version == read[0]
    v = w._version
    ops.scatter_columns(out, [w], [sel])
    assert w._version > v

    scores = [torch.rand(10)]
    idx = [torch.empty(3, dtype=torch.int32)]
    v = idx[0]._version
    ops.select_topk_columns(scores, 3, out_indices=idx)
    assert idx[0]._version > v
    col = [torch.empty(10)]
    v = col[0]._version
    ops.column_stats([g], col)
    assert col[0]._version > v

    acc = torch.zeros(10, 4)
    v = acc._version
    ops.cpu_accumulate(acc, out, selected=sel)
    assert acc._version > v
    p, m, s, grad = (torch.rand(6) for _ in range(4))
    vs = [t._version for t in (p, m, s, grad)]
    ops.cpu_adamw_step(p, m, s, grad, step=1, lr=1e-3)
    assert [t._version > b for t, b in zip((p, m, s, grad), vs)] == [True, True, True, False]
    ops.cpu_adamw_step(p, m, s, grad, step=2, lr=1e-3, zero_grad=True)
    assert grad._version > vs[3]


def test_failed_call_bumps_nothing():
    w, g = torch.randn(4, 10), torch.randn(4, 10)
    st = compact_state(4, 2)
    v = w._version
    with pytest.raises(ValueError):
        ops.adamw_selected_columns_(
            [w], [g], [torch.tensor([5, 1], dtype=torch.int32)], [st], lr=1e-3
        )
    assert w._version == v


# ---- adamw_selected_columns_: step counts, aliasing ----


@pytest.mark.parametrize("count", [-1, -(2**31), INT32_MAX])
def test_adamw_selected_rejects_bad_step_counts(count):
    w, g = torch.randn(3, 6), torch.randn(3, 6)
    st = compact_state(3, 2)
    st.steps[1] = count
    w0 = w.clone()
    with pytest.raises(ValueError, match=r"state\[0\]\.steps|steps"):
        ops.adamw_selected_columns_(
            [w], [g], [torch.tensor([0, 4], dtype=torch.int32)], [st], lr=1e-3
        )
    assert torch.equal(w, w0) and st.steps.tolist() == [0, count]
    assert (st.exp_avg == 0).all()


def test_adamw_selected_detects_aliasing():
    w, g = torch.randn(3, 6), torch.randn(3, 6)
    sel = [torch.tensor([0, 4], dtype=torch.int32)]
    shared = torch.zeros(3, 2)
    st = ops.ColumnState(None, shared, shared, torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="overlap"):
        ops.adamw_selected_columns_([w], [g], sel, [st], lr=1e-3)
    with pytest.raises(ValueError, match="overlap"):
        ops.adamw_selected_columns_([w], [w], sel, [compact_state(3, 2)], lr=1e-3)
    w0 = w.clone()
    assert torch.equal(w, w0)


# ---- the pure-Python helpers validate ----


def test_packed_offsets_validates_and_uses_the_c_layout():
    assert ops.packed_offsets([(2, 3), (4, 5), (1, 7)], [1, 5, 0]) == [0, 4, 4, 11]
    with pytest.raises(ValueError, match="count|selected|cols|columns"):
        ops.packed_offsets([(2, 3)], [5])
    with pytest.raises(ValueError):
        ops.packed_offsets([(-2, 3)], [0])
    with pytest.raises(ValueError, match="ks"):
        ops.packed_offsets([(2, 3)], [1, 2])
    with pytest.raises(TypeError, match="shapes"):
        ops.packed_offsets([3], [1])
    with pytest.raises(ValueError, match="shapes"):
        ops.packed_offsets([(2**70, 3)], [1])


def test_topk_count_validates():
    with pytest.raises(ValueError, match="n"):
        ops.topk_count(-5, 0.5)
    with pytest.raises(ValueError, match="topk_ratio"):
        ops.topk_count(5, float("nan"))
    with pytest.raises(TypeError, match="n"):
        ops.topk_count(5.5, 0.5)
    assert ops.topk_count(np.int64(10), np.float32(0.5)) == 5


# ---- clear errors ----


def test_pack_columns_bad_dtype_names_it():
    with pytest.raises(ValueError, match="dtype"):
        ops.pack_columns([torch.randn(3, 4)], dtype="float64")


def test_none_lists_are_type_errors_naming_the_argument():
    t = torch.randn(3, 4)
    sel = [torch.tensor([1], dtype=torch.int32)]
    st = [compact_state(3, 1)]
    cases = [
        ("grads", lambda: ops.column_stats(None)),
        ("col_sq", lambda: ops.select_topk_columns(None, 1)),
        ("params", lambda: ops.adamw_selected_columns_(None, [t], sel, st, lr=1e-3)),
        ("grads", lambda: ops.adamw_selected_columns_([t], None, sel, st, lr=1e-3)),
        ("state", lambda: ops.adamw_selected_columns_([t], [t.clone()], sel, None, lr=1e-3)),
        ("grads", lambda: ops.pack_columns(None)),
        ("params", lambda: ops.scatter_columns(torch.zeros(9), None, sel)),
        ("accumulators", lambda: ops.cpu_accumulate(None, torch.zeros(3))),
        ("old_selected", lambda: ops.exchange_selected_columns(None, sel, st, st, st, st)),
        ("new_state", lambda: ops.exchange_selected_columns(sel, sel, st, None, st, st)),
        ("state", lambda: ops.cpu_adamw_step_skip_columns(None, grads=[t], lr=1e-3)),
        ("host", lambda: ops.cpu_gather_columns(None, sel, st)),
        ("params", lambda: ops.cpu_adamw_step(None, t, t, t, step=1, lr=1e-3)),
    ]
    for name, call in cases:
        with pytest.raises(TypeError, match=name) as info:
            call()
        assert "incompatible function arguments" not in str(info.value)


def test_set_num_threads_out_of_range(restore_threads):
    for bad in (2**31, 2**64, 0, -1, 1000):
        with pytest.raises(ValueError, match="num_threads"):
            zenflow.set_num_threads(bad)
    with pytest.raises(TypeError, match="cores"):
        zenflow.set_num_threads(1, cores=5)
    with pytest.raises(ValueError, match=r"cores\[0\]"):
        zenflow.set_num_threads(1, cores=[2**40])


def test_unsupported_arrays_name_the_argument():
    good = torch.randn(3, 4)
    big_endian = np.ones((3, 4), dtype=">f4")
    with pytest.raises(TypeError, match=r"grads\[1\]"):
        ops.column_stats([good, big_endian], [torch.empty(4), torch.empty(4)])
    conj = torch.randn(3, 4, dtype=torch.complex64).conj()
    with pytest.raises(TypeError, match=r"grads\[0\]"):
        ops.column_stats([conj], [torch.empty(4)])
    neg = torch.randn(3, 4, dtype=torch.complex64).conj().imag
    assert neg.is_neg()
    with pytest.raises(ValueError, match=r"grads\[0\].*negative"):
        ops.column_stats([neg], [torch.empty(4)])
    sparse = good.to_sparse()
    with pytest.raises(TypeError, match=r"grads\[0\]"):
        ops.column_stats([sparse], [torch.empty(4)])
    meta = torch.empty(3, 4, device="meta")
    with pytest.raises(TypeError, match=r"grads\[0\].*meta"):
        ops.column_stats([meta], [torch.empty(4)])
    with pytest.raises(TypeError, match=r"out_col_sq\[0\].*meta"):
        ops.column_stats([good], [torch.empty(4, device="meta")])
    with pytest.raises(TypeError, match=r"grads\[0\]"):
        ops.column_stats([[1.0, 2.0]], [torch.empty(2)])


def test_numpy_and_torch_scalars_are_numbers():
    scores = [torch.tensor([3.0, 1.0, 2.0])]
    assert ops.select_topk_columns(scores, np.int64(2))[0].tolist() == [0, 2]
    assert ops.select_topk_columns(scores, [torch.tensor(1)])[0].tolist() == [0]
    w, g = torch.randn(3, 6), torch.randn(3, 6)
    ref_w = w.clone()
    st, ref_st = compact_state(3, 6), compact_state(3, 6)
    ops.adamw_selected_columns_(
        [w], [g], None, [st], lr=torch.tensor(1e-3), weight_decay=np.float32(0.5)
    )
    ops.adamw_selected_columns_(
        [ref_w], [g], None, [ref_st], lr=1e-3, weight_decay=float(np.float32(0.5))
    )
    assert torch.equal(w, ref_w)
    p, m, v, grad = (torch.rand(5) for _ in range(4))
    ops.cpu_adamw_step(
        p, m, v, grad, step=np.int64(1), lr=np.float64(1e-3), grad_scale=torch.tensor(0.5)
    )
    with pytest.raises(TypeError, match="lr"):
        ops.cpu_adamw_step(p, m, v, grad, step=1, lr="0.1")
    with pytest.raises(ValueError, match="lr"):
        ops.cpu_adamw_step(p, m, v, grad, step=1, lr=torch.tensor([1e-3, 2e-3]))
    with pytest.raises(TypeError, match="k"):
        ops.select_topk_columns(scores, np.float64(1.0))
    opt = zenflow.CPUAdamW([torch.zeros(3, requires_grad=True)], lr=torch.tensor(1e-3))
    opt.param_groups[0]["params"][0].grad = torch.ones(3)
    opt.step()


def test_bogus_simd_environment_warns_visibly():
    env = dict(os.environ, ZENFLOW_SIMD="bogus")
    out = subprocess.run(
        [sys.executable, "-W", "always", "-c", "import zenflow; print(zenflow.simd_level())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "ZENFLOW_SIMD" in out.stderr and "RuntimeWarning" in out.stderr, out.stderr
    assert out.stdout.strip() in zenflow.supported_simd_levels()
    env["ZENFLOW_SIMD"] = "scalar"
    out = subprocess.run(
        [sys.executable, "-c", "import zenflow"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "RuntimeWarning" not in out.stderr


def test_failed_step_with_several_native_calls_changes_nothing():
    """fp32 and bf16 parameters, and groups with other betas, need separate native calls;
    a parameter rejected in a later call must not leave the earlier calls' writes."""
    fp32 = torch.randn(6, 4, requires_grad=True)
    bf16 = torch.randn(6, 4).bfloat16().requires_grad_()
    strided = torch.empty_strided((4, 6), (1, 4)).normal_().requires_grad_()
    opt = zenflow.CPUAdamW(
        [{"params": [fp32, bf16]}, {"params": [strided], "betas": (0.8, 0.9)}], lr=1e-2
    )
    for p in (fp32, bf16, strided):
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in (fp32, bf16, strided)]
    with pytest.raises(ValueError, match="contiguous"):
        opt.step()
    for p, b in zip((fp32, bf16, strided), before):
        assert torch.equal(p.detach(), b)
    assert len(opt.state) == 0
