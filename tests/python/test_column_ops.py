"""zenflow.ops column ops on the host: adamw_selected_columns_, pack_columns,
scatter_columns and exchange_selected_columns against float64 torch references, on every
dtype and prime/1xN/Nx1/empty shapes, with poisoned outputs."""

from __future__ import annotations

import pytest
import torch
from column_ops_reference import (
    DTYPES,
    SHAPES,
    adamw_reference,
    make_adamw_case,
    packed_reference,
    random_selection,
    unselected,
)

from zenflow import ops

BETAS, EPS = (0.9, 0.999), 1e-8


@pytest.mark.parametrize("master", [False, True])
@pytest.mark.parametrize("grad_dtype", DTYPES)
@pytest.mark.parametrize("param_dtype", DTYPES)
def test_adamw_selected_matches_float64(param_dtype, grad_dtype, master):
    gen = torch.Generator().manual_seed(17)
    cases = [make_adamw_case(r, c, k, param_dtype, master, gen) for r, c, k in SHAPES]
    cases = [(w, g.to(grad_dtype), s, st) for w, g, s, st in cases]
    before = [
        (w.clone(), g, s, ops.ColumnState(*(None if t is None else t.clone() for t in st)))
        for w, g, s, st in cases
    ]
    lrs = [1e-3 * (1 + i / 10) for i in range(len(cases))]
    wds = [0.01 * i for i in range(len(cases))]
    scale = torch.tensor([0.37])  # the references take its fp32 value, the one the op sees
    ops.adamw_selected_columns_(
        [c[0] for c in cases],
        [c[1] for c in cases],
        [c[2] for c in cases],
        [c[3] for c in cases],
        lr=lrs,
        weight_decay=wds,
        betas=BETAS,
        eps=EPS,
        grad_scale=scale,
    )
    for i, ((w, _, sel, st), (w0, g0, _, st0)) in enumerate(zip(cases, before)):
        args = (w0, g0, sel, st0, lrs[i], wds[i], BETAS, EPS, float(scale))
        p64, m64, v64 = adamw_reference(*args)
        p32, m32, v32 = adamw_reference(*args, precision=torch.float32)
        # Our fp32 result may be off the float64 truth by at most 2x torch's own fp32 error.
        for got, exact, torch32 in ((st.exp_avg, m64, m32), (st.exp_avg_sq, v64, v32)):
            err = (got.double() - exact).abs()
            # (over the tensor: the worst element against torch's worst element).
            if err.numel():
                ulp = exact.abs().max() * 2**-23  # a floor for tiny tensors torch got lucky on
                assert err.max() <= 2 * (torch32.double() - exact).abs().max() + ulp, i
        p_got = st.master if master else w[:, sel.long()].float()
        tol = 0.0
        if p64.numel():
            tol = 2 * (p32.double() - p64).abs().max() + p64.abs().max() * 2**-23
        if not master and param_dtype != torch.float32:
            tol = tol + (p64.to(param_dtype).double() - p64).abs() * 2  # the final rounding
        assert torch.all((p_got.double() - p64).abs() <= tol), i
        if master:
            assert torch.equal(w[:, sel.long()], st.master.to(param_dtype))
        assert torch.equal(st.steps, st0.steps + 1)
        rest = unselected(sel, w.shape[1])
        assert torch.equal(w[:, rest], w0[:, rest])


def test_adamw_dense_and_noop():
    gen = torch.Generator().manual_seed(2)
    bias = torch.randn(37, generator=gen)
    g = torch.randn(37, generator=gen)
    state = ops.ColumnState(
        None, torch.zeros(37), torch.zeros(37), torch.zeros(37, dtype=torch.int32)
    )
    ref = bias.clone().requires_grad_()
    opt = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.1, foreach=False)
    ref.grad = g.clone()
    opt.step()
    ops.adamw_selected_columns_([bias], [g], None, [state], lr=1e-2, weight_decay=0.1)
    torch.testing.assert_close(bias, ref.detach(), rtol=0, atol=1e-7)
    assert state.steps.tolist() == [1] * 37
    noop = torch.ones((), dtype=torch.int32)
    before = bias.clone()
    ops.adamw_selected_columns_([bias], [g], None, [state], lr=1e-2, noop=noop)
    assert torch.equal(bias, before) and state.steps.tolist() == [1] * 37


def test_adamw_rejects_bad_indices_and_writes_nothing():
    w, g = torch.randn(4, 10), torch.randn(4, 10)
    state = ops.ColumnState(
        None, torch.zeros(4, 3), torch.zeros(4, 3), torch.zeros(3, dtype=torch.int32)
    )
    before = w.clone()
    with pytest.raises(ValueError, match="ascending"):
        ops.adamw_selected_columns_(
            [w], [g], [torch.tensor([5, 2, 7], dtype=torch.int32)], [state], lr=1e-3
        )
    with pytest.raises(ValueError, match="selected\\[0\\]"):
        ops.adamw_selected_columns_(
            [w], [g], [torch.tensor([1, 2, 10], dtype=torch.int32)], [state], lr=1e-3
        )
    assert torch.equal(w, before) and state.steps.sum() == 0


@pytest.mark.parametrize("packed_dtype", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_pack_matches_reference_and_scatter_inverts_it(dtype, packed_dtype):
    gen = torch.Generator().manual_seed(5)
    grads = [torch.randn(r, c, generator=gen).to(dtype) for r, c, _ in SHAPES]
    selected = [random_selection(c, k, gen) for _, c, k in SHAPES]
    total = ops.packed_offsets([(r, c) for r, c, _ in SHAPES], [k for *_, k in SHAPES])[-1]
    for scale in (None, 0.3):
        out = torch.full((total,), float("nan"), dtype=packed_dtype)  # poisoned
        scale_t = None if scale is None else torch.tensor([scale])
        got = ops.pack_columns(grads, selected, out=out, scale=scale_t)
        assert got is out
        assert torch.equal(out, packed_reference(grads, selected, packed_dtype, scale or 1.0))
    packed = ops.pack_columns(grads, selected, dtype=str(packed_dtype).replace("torch.", ""))
    params = [g.clone() for g in grads]
    for p, sel in zip(params, selected):
        p[:, unselected(sel, p.shape[1])] = 1234.0
    ops.scatter_columns(packed, params, selected)
    for p, g, sel in zip(params, grads, selected):
        rest = unselected(sel, p.shape[1])
        assert torch.equal(p[:, sel.long()], g[:, sel.long()])
        assert torch.equal(p[:, rest], g[:, rest].to(packed_dtype).to(dtype))


def test_pack_without_selection_is_a_transpose():
    g = torch.randn(31, 17)
    assert torch.equal(ops.pack_columns([g]), g.t().reshape(-1))


def test_pack_rejects_wrong_size():
    with pytest.raises(ValueError, match="packed"):
        ops.pack_columns(
            [torch.randn(4, 6)], [torch.tensor([1], dtype=torch.int32)], out=torch.empty(19)
        )


def _state(rows, cols, master, host_layout, gen=None):
    shape = (cols, rows) if host_layout else (rows, cols)
    if gen is None:
        nan = float("nan")
        mk = lambda: torch.full(shape, nan)  # noqa: E731
        return ops.ColumnState(
            mk() if master else None, mk(), mk(), torch.full((cols,), -7, dtype=torch.int32)
        )
    mk = lambda: torch.randn(shape, generator=gen)  # noqa: E731
    steps = torch.randint(0, 1000, (cols,), generator=gen, dtype=torch.int32)
    return ops.ColumnState(mk() if master else None, mk(), mk(), steps)


def _columns(state, host_layout):
    """Per-column tensors [k, rows] of every state field."""
    fields = [state.exp_avg, state.exp_avg_sq] + (
        [state.master] if state.master is not None else []
    )
    return [f if host_layout else f.t() for f in fields], state.steps


@pytest.mark.parametrize("master", [False, True])
def test_exchange_moves_only_changing_columns(master):
    gen = torch.Generator().manual_seed(9)
    cases = [
        (5, 40, 8, 8),
        (1, 17, 3, 5),
        (37, 101, 10, 10),
        (4, 9, 0, 4),
        (6, 9, 4, 0),
        (3, 12, 12, 12),
    ]
    old_sel, new_sel, old_s, new_s, ent, lea = [], [], [], [], [], []
    for rows, n, k_old, k_new in cases:
        o, nw = random_selection(n, k_old, gen), random_selection(n, k_new, gen)
        staying = int(torch.isin(nw, o).sum())
        old_sel.append(o)
        new_sel.append(nw)
        old_s.append(_state(rows, k_old, master, False, gen))
        new_s.append(_state(rows, k_new, master, False))
        ent.append(_state(rows, k_new - staying, master, True, gen))
        lea.append(_state(rows, k_old - staying, master, True))
    ops.exchange_selected_columns(old_sel, new_sel, old_s, new_s, ent, lea)
    for o, nw, os_, ns, es, ls in zip(old_sel, new_sel, old_s, new_s, ent, lea):
        (old_cols, old_steps), (new_cols, new_steps) = _columns(os_, False), _columns(ns, False)
        (in_cols, in_steps), (out_cols, out_steps) = _columns(es, True), _columns(ls, True)
        stay_new, stay_old = torch.isin(nw, o), torch.isin(o, nw)
        # Staying columns keep their state; entering come from `entering` in order.
        for f_new, f_old, f_in in zip(new_cols, old_cols, in_cols):
            assert torch.equal(f_new[stay_new], f_old[stay_old])
            assert torch.equal(f_new[~stay_new], f_in)
        for f_out, f_old in zip(out_cols, old_cols):
            assert torch.equal(f_out, f_old[~stay_old])
        assert torch.equal(new_steps[stay_new], old_steps[stay_old])
        assert torch.equal(new_steps[~stay_new], in_steps)
        assert torch.equal(out_steps, old_steps[~stay_old])


def _packed(states, master):
    """One packed host-layout ColumnState of per-matrix [E_i, m_i] states (the packed form)."""

    def cat(field):
        return torch.cat([getattr(st, field).reshape(-1) for st in states])

    return ops.ColumnState(
        cat("master") if master else None, cat("exp_avg"), cat("exp_avg_sq"), cat("steps")
    )


def _exchange_case(gen, master, cases):
    old_sel, new_sel, old_s, ent = [], [], [], []
    for rows, n, k_old, k_new in cases:
        o, nw = random_selection(n, k_old, gen), random_selection(n, k_new, gen)
        old_sel.append(o)
        new_sel.append(nw)
        old_s.append(_state(rows, k_old, master, False, gen))
        ent.append(_state(rows, k_new - int(torch.isin(nw, o).sum()), master, True, gen))
    return old_sel, new_sel, old_s, ent


@pytest.mark.parametrize("master", [False, True])
def test_exchange_packed_form_equals_per_matrix_form(master):
    gen = torch.Generator().manual_seed(10)
    cases = [
        (5, 40, 8, 8),
        (1, 17, 3, 5),
        (37, 101, 10, 10),
        (4, 9, 0, 4),
        (6, 9, 4, 0),
        (7, 1, 1, 1),
    ]
    cases += [(0, 10, 2, 2), (3, 12, 12, 12), (13, 31, 7, 11)]
    old_sel, new_sel, old_s, ent = _exchange_case(gen, master, cases)
    rows = [r for r, *_ in cases]
    e_counts = [st.steps.numel() for st in ent]
    l_counts = [len(o) - (len(nw) - e) for o, nw, e in zip(old_sel, new_sel, e_counts)]
    new_a = [_state(r, len(nw), master, False) for r, nw in zip(rows, new_sel)]
    new_b = [_state(r, len(nw), master, False) for r, nw in zip(rows, new_sel)]
    lea = [_state(r, c, master, True) for r, c in zip(rows, l_counts)]
    ops.exchange_selected_columns(old_sel, new_sel, old_s, new_a, ent, lea)
    packed_in = _packed(ent, master)
    packed_out = _packed([_state(r, c, master, True) for r, c in zip(rows, l_counts)], master)
    # Matrix i's part starts where packed_offsets of [m_i, E_i] (nothing selected) says.
    offsets = ops.packed_offsets([(r, e) for r, e in zip(rows, e_counts)], [0] * len(rows))
    assert offsets[-1] == packed_in.exp_avg.numel()
    ops.exchange_selected_columns(
        old_sel,
        new_sel,
        old_s,
        new_b,
        packed_in,
        packed_out,
        entering_counts=e_counts,
        leaving_counts=l_counts,
    )
    for a, b in zip(new_a, new_b):
        for x, y in zip(a, b):
            assert (x is None and y is None) or torch.equal(x, y)
    expected_out = _packed(lea, master)
    for x, y in zip(packed_out, expected_out):
        assert (x is None and y is None) or torch.equal(x, y)


def test_exchange_packed_form_bad_input_names_it_and_writes_nothing():
    gen = torch.Generator().manual_seed(11)
    cases = [(5, 40, 8, 8), (4, 17, 3, 5), (4, 9, 2, 4)]
    old_sel, new_sel, old_s, ent = _exchange_case(gen, True, cases)
    rows = [r for r, *_ in cases]
    e_counts = [st.steps.numel() for st in ent]
    l_counts = [len(o) - (len(nw) - e) for o, nw, e in zip(old_sel, new_sel, e_counts)]
    new_s = [_state(r, len(nw), True, False) for r, nw in zip(rows, new_sel)]
    packed_in = _packed(ent, True)
    packed_out = _packed([_state(r, c, True, True) for r, c in zip(rows, l_counts)], True)

    def call(entering=packed_in, leaving=packed_out, ec=e_counts, lc=l_counts, **kw):
        ops.exchange_selected_columns(
            old_sel,
            new_sel,
            old_s,
            new_s,
            entering,
            leaving,
            entering_counts=ec,
            leaving_counts=lc,
            **kw,
        )

    moved = list(e_counts)
    moved[1] += 1
    moved[2] -= 1  # same totals (equal rows): only the lists can tell
    bad = [
        (ValueError, r"entering\[1\]", lambda: call(ec=moved)),
        (ValueError, "leaving_counts", lambda: call(lc=l_counts[:2])),
        (ValueError, r"leaving_counts\[0\]", lambda: call(lc=[-1] + l_counts[1:])),
        (TypeError, r"entering_counts\[0\]", lambda: call(ec=["1"] + e_counts[1:])),
        (
            ValueError,
            "leaving_counts",
            lambda: ops.exchange_selected_columns(
                old_sel, new_sel, old_s, new_s, packed_in, packed_out, entering_counts=e_counts
            ),
        ),
        (
            ValueError,
            "entering.exp_avg",
            lambda: call(entering=packed_in._replace(exp_avg=packed_in.exp_avg[1:])),
        ),
        (
            TypeError,
            "leaving.steps",
            lambda: call(leaving=packed_out._replace(steps=packed_out.steps.float())),
        ),
        (
            ValueError,
            "entering.exp_avg_sq",
            lambda: call(
                entering=packed_in._replace(
                    exp_avg_sq=torch.zeros(2 * packed_in.exp_avg_sq.numel())[::2]
                )
            ),
        ),
        (
            ValueError,
            r"entering\[0\].master",
            lambda: call(entering=packed_in._replace(master=None)),
        ),
        (TypeError, "leaving", lambda: call(leaving=[packed_out])),
    ]
    before_new = [[t.clone() for t in st] for st in new_s]
    before_out = [t.clone() for t in packed_out]
    for error, match, fn in bad:
        with pytest.raises(error, match=match):
            fn()
        for st, ref in zip(new_s, before_new):
            for x, y in zip(st, ref):
                assert torch.equal(x.nan_to_num(), y.nan_to_num())  # still the poison
        for x, y in zip(packed_out, before_out):
            assert torch.equal(x.nan_to_num(), y.nan_to_num())
