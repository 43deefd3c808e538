"""Layout checks of the low-level ops (docs/design.md section 4, docs/c-api.md "Layout checks").

A tensor whose layout another argument fixes (the host layout [n, m] of W [m, n], the
compact [m, k], the packed host list [L, m], params[i]'s shape in the whole-tensor steps) is
refused with a ValueError naming it when its shape says it is in another layout, and the call
writes nothing. A transposed view is refused as such. Flat (1-D) buffers stay accepted. A
square matrix cannot be told from its transpose: those ops say their layout in the first line
of their docstring.
"""

from __future__ import annotations

import pytest
import torch

from zenflow import ops

M, N = 6, 10  # W [M, N]: not square, so a transposed tensor has another shape
SELECTED = torch.tensor([1, 3], dtype=torch.int32)
K = len(SELECTED)


def host_state(shape=(N, M), master_shape=None, sq_shape=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return ops.ColumnState(
        torch.randn(*(master_shape or shape), generator=gen),
        torch.rand(*shape, generator=gen),
        torch.rand(*(sq_shape or shape), generator=gen),
        torch.ones(shape[0], dtype=torch.int32),
    )


def compact_state(shape=(M, K)):
    return ops.ColumnState(
        None, torch.rand(*shape), torch.rand(*shape), torch.ones(K, dtype=torch.int32)
    )


def list_state(shape=(K, M)):
    return ops.ColumnState(
        torch.rand(*shape), torch.rand(*shape), torch.rand(*shape), torch.ones(K, dtype=torch.int32)
    )


def snapshot(*tensors):
    return [t.clone() for t in tensors if t is not None]


def assert_unchanged(before, tensors):
    after = [t for t in tensors if t is not None]
    assert all(torch.equal(a, b) for a, b in zip(before, after)), "a refused call wrote"


def grad():
    return torch.randn(M, N, generator=torch.Generator().manual_seed(1))


# (case id, callable, the argument the error must name, tensors that must stay unchanged)
def refused_cases():
    cases = []

    s = host_state()
    g = grad()  # W's own row-major gradient where the host layout is expected
    cases.append(
        (
            "skip_columns grads row-major",
            lambda s=s, g=g: ops.cpu_adamw_step_skip_columns(
                [s], [SELECTED], grads=[g], lr=1e-3, increment_steps=True
            ),
            "grads[0]",
            [*s, g],
        )
    )
    s = host_state(master_shape=(M, N))  # the weights as they are, not transposed
    acc = torch.randn(N, M)
    cases.append(
        (
            "skip_columns master row-major",
            lambda s=s, a=acc: ops.cpu_adamw_step_skip_columns(
                [s], [SELECTED], grads=[a], lr=1e-3, increment_steps=True
            ),
            "state[0].master",
            [*s, acc],
        )
    )
    s = host_state(sq_shape=(M, N))
    cases.append(
        (
            "skip_columns exp_avg_sq row-major",
            lambda s=s, a=acc: ops.cpu_adamw_step_skip_columns(
                [s], [SELECTED], grads=[a], lr=1e-3, increment_steps=True
            ),
            "state[0].exp_avg_sq",
            [*s, acc],
        )
    )
    s = host_state()
    gt = grad().t()  # a transposed view: right shape, wrong memory order
    cases.append(
        (
            "skip_columns grads transposed view",
            lambda s=s, g=gt: ops.cpu_adamw_step_skip_columns(
                [s], [SELECTED], grads=[g], lr=1e-3, increment_steps=True
            ),
            "grads[0]: is a transposed view",
            [*s],
        )
    )
    w, g, st = torch.randn(M, N), grad(), compact_state((K, M))
    cases.append(
        (
            "adamw_selected_columns_ state [k, m]",
            lambda w=w, g=g, st=st: ops.adamw_selected_columns_(
                [w], [g], [SELECTED], [st], lr=1e-3
            ),
            "state[0].exp_avg",
            [w, *st],
        )
    )
    w = torch.randn(M, N)
    cases.append(
        (
            "adamw_selected_columns_ grads transposed view",
            lambda w=w: ops.adamw_selected_columns_(
                [w], [grad().t().contiguous().t()], [SELECTED], [compact_state()], lr=1e-3
            ),
            "grads[0]: is a transposed view",
            [w],
        )
    )
    p, m, v, g = torch.randn(M, N), torch.rand(M, N), torch.rand(M, N), grad()
    for name, args in (
        ("grads[0]", (p, m, v, g.t().contiguous())),
        ("exp_avgs[0]", (p, m.t().contiguous(), v, g)),
        ("exp_avg_sqs[0]", (p, m, v.t().contiguous(), g)),
    ):
        cases.append(
            (
                f"cpu_adamw_step {name} transposed",
                lambda args=args: ops.cpu_adamw_step(*args, step=1, lr=1e-3),
                name,
                list(args),
            )
        )
    out = torch.zeros(N, M, dtype=torch.bfloat16)
    cases.append(
        (
            "cpu_adamw_step out_params transposed",
            lambda p=p, m=m, v=v, g=g, o=out: ops.cpu_adamw_step(
                p, m, v, g, step=1, lr=1e-3, out_params=o
            ),
            "out_params[0]",
            [p, m, v, g, out],
        )
    )
    flat_m, flat_v = torch.rand(M * N), torch.rand(M * N)
    cases.append(
        (
            "cpu_adamw_step_flat grads transposed",
            lambda p=p, fm=flat_m, fv=flat_v, g=g: ops.cpu_adamw_step_flat(
                fm, fv, [g.t().contiguous()], [0], params=[p], step=1, lr=1e-3
            ),
            "grads[0]",
            [p, flat_m, flat_v],
        )
    )
    master = torch.randn(M * N)
    cases.append(
        (
            "cpu_adamw_step_flat out_params transposed",
            lambda ms=master, fm=flat_m, fv=flat_v, g=g, o=out: ops.cpu_adamw_step_flat(
                fm, fv, [g], [0], master=ms, out_params=[o], step=1, lr=1e-3
            ),
            "out_params[0]",
            [master, flat_m, flat_v, out],
        )
    )
    h, lst = host_state(master_shape=(M, N)), list_state()
    cases.append(
        (
            "cpu_gather_columns host master row-major",
            lambda h=h, lst=lst: ops.cpu_gather_columns([h], [SELECTED], [lst]),
            "host[0].master",
            [*h, *lst],
        )
    )
    h, lst = host_state(), list_state((M, K))
    cases.append(
        (
            "cpu_gather_columns out [m, L]",
            lambda h=h, lst=lst: ops.cpu_gather_columns([h], [SELECTED], [lst]),
            "out[0].master",
            [*h, *lst],
        )
    )
    h, lst = host_state(sq_shape=(M, N)), list_state()
    cases.append(
        (
            "cpu_scatter_columns host exp_avg_sq row-major",
            lambda h=h, lst=lst: ops.cpu_scatter_columns([lst], [SELECTED], [h]),
            "host[0].exp_avg_sq",
            [*h, *lst],
        )
    )
    h, lst = host_state(), list_state((M, K))
    cases.append(
        (
            "cpu_scatter_columns in [m, L]",
            lambda h=h, lst=lst: ops.cpu_scatter_columns([lst], [SELECTED], [h]),
            "in[0].master",
            [*h, *lst],
        )
    )
    for op_name, call in (
        ("column_stats", lambda: ops.column_stats([grad().t()])),
        ("pack_columns", lambda: ops.pack_columns([grad().t()], [SELECTED])),
    ):
        cases.append((f"{op_name} transposed view", call, "grads[0]: is a transposed view", []))
    w = torch.randn(N, M)
    cases.append(
        (
            "scatter_columns into a transposed view",
            lambda w=w: ops.scatter_columns(
                ops.pack_columns([grad()], [SELECTED]), [w.t()], [SELECTED]
            ),
            "params[0]: is a transposed view",
            [w],
        )
    )
    return cases


CASES = refused_cases()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_wrong_layout_is_refused_and_writes_nothing(case):
    _, call, name, tensors = case
    before = snapshot(*tensors)
    with pytest.raises(ValueError, match=name.replace("[", r"\[").replace("]", r"\]")):
        call()
    assert_unchanged(before, tensors)


def test_error_says_which_layout_was_expected():
    with pytest.raises(ValueError) as error:
        ops.cpu_adamw_step_skip_columns(
            [host_state()], [SELECTED], grads=[grad()], lr=1e-3, increment_steps=True
        )
    message = str(error.value)
    assert "[6, 10]" in message and "[10, 6]" in message and "host layout" in message
    assert "state[0].exp_avg" in message


def test_flat_buffers_in_the_layout_still_work():
    """1-D buffers are read in the documented layout, as they are: the same update as the
    shaped tensors, bit for bit."""
    g_host = grad().t().contiguous()  # the host layout of W's gradient
    shaped, other = host_state(), host_state()
    # exp_avg gives the shape; the master, v and the gradient may be flat.
    flat = other._replace(master=other.master.view(-1), exp_avg_sq=other.exp_avg_sq.view(-1))
    ops.cpu_adamw_step_skip_columns(
        [shaped], [SELECTED], grads=[g_host.clone()], lr=1e-3, increment_steps=True
    )
    ops.cpu_adamw_step_skip_columns(
        [flat], [SELECTED], grads=[g_host.view(-1)], lr=1e-3, increment_steps=True
    )
    assert torch.equal(shaped.master, other.master)
    assert torch.equal(shaped.exp_avg_sq, other.exp_avg_sq)

    w_shaped = torch.randn(M, N)
    w_flat = w_shaped.clone()
    s_shaped = compact_state()
    s_flat = ops.ColumnState(
        None,
        s_shaped.exp_avg.clone().view(-1),
        s_shaped.exp_avg_sq.clone().view(-1),
        s_shaped.steps.clone(),
    )
    ops.adamw_selected_columns_([w_shaped], [grad()], [SELECTED], [s_shaped], lr=1e-3)
    ops.adamw_selected_columns_([w_flat], [grad()], [SELECTED], [s_flat], lr=1e-3)
    assert torch.equal(w_shaped, w_flat)

    p1, m1, v1 = torch.randn(M, N), torch.rand(M, N), torch.rand(M, N)
    p2, m2, v2 = p1.clone(), m1.clone().view(-1), v1.clone().view(-1)
    ops.cpu_adamw_step(p1, m1, v1, grad(), step=1, lr=1e-3)
    ops.cpu_adamw_step(p2, m2, v2, grad().view(-1), step=1, lr=1e-3)
    assert torch.equal(p1, p2) and torch.equal(m1.view(-1), m2)


def test_size_one_dimensions_do_not_count():
    """A [1, n] parameter's state may be [k] or [1, k]; a [n, 1] gradient matches [1, n]
    elementwise: the order of the elements is the same."""
    w = torch.randn(1, N)
    g = torch.randn(1, N)
    state = ops.ColumnState(None, torch.zeros(K), torch.zeros(K), torch.zeros(K, dtype=torch.int32))
    ops.adamw_selected_columns_([w], [g], [SELECTED], [state], lr=1e-3)
    p = torch.randn(1, N)
    ops.cpu_adamw_step(p, torch.zeros(N, 1), torch.zeros(N), g.reshape(N, 1), step=1, lr=1e-3)


# Ops where a square matrix cannot be told from its transpose: their docstring's first line
# names the layout (the fact a user needs before calling them).
FIRST_LINE_LAYOUTS = {
    ops.cpu_adamw_step_skip_columns: ("host layout [n, m]", "W.grad"),
    ops.cpu_accumulate: ("host layout [n, m]",),
    ops.cpu_gather_columns: ("host layout",),
    ops.cpu_scatter_columns: ("host layout",),
    ops.cpu_adamw_step: ("params[i]'s layout",),
    ops.cpu_adamw_step_flat: ("grads[i]'s layout",),
    ops.adamw_selected_columns_: ("row-major [m, n]", "compact [m, k]"),
    ops.column_stats: ("row-major", "[m, n]"),
    ops.pack_columns: ("row-major",),
    ops.scatter_columns: ("row-major",),
    ops.packed_offsets: ("(m, n), rows first",),
    ops.exchange_selected_columns: ("[m, k]", "[E, m]"),
}


@pytest.mark.parametrize("op", FIRST_LINE_LAYOUTS, ids=lambda op: op.__name__)
def test_undetectable_layouts_are_on_the_first_line(op):
    first = op.__doc__.strip().splitlines()[0]
    for fragment in FIRST_LINE_LAYOUTS[op]:
        assert fragment in first, f"{op.__name__}: {fragment!r} not in {first!r}"
