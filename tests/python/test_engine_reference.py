"""The float64 engine reference (engine_reference.py) checked against first principles:
torch.optim.AdamW in float64 for the cases that must be exact, and hand-derived expectations
(written here from the contract, not from the reference's code) for staleness, the "auto"
update interval, the selection schedules and scores, loss scaling and the byte counters.

These tests do not need zenflow's compiled module: they prove the reference that
test_engine.py then holds the engine to.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from engine_reference import ReferenceZenFlow

# Shapes of the "model": odd matrices (3-d ones are viewed [m, n]), 1xN, Nx1, a vector, a
# scalar, and a matrix in a dense group.
SHAPES = [(5, 7), (1, 11), (13, 1), (3, 2, 5), (6,), (), (4, 3)]
GROUPS = [
    {"params": [0, 1, 4], "lr": 1e-2, "weight_decay": 0.1},
    {"params": [2, 3, 5], "lr": 3e-2, "weight_decay": 0.0},
    {"params": [6], "lr": 2e-2, "weight_decay": 0.05, "dense": True},
]
BETAS, EPS = (0.9, 0.999), 1e-8
STEPS = 9


def initial_params(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]


def gradient_sequence(steps, seed=1, rotate=False):
    """Random gradients; with rotate, each step also boosts a different column band of every
    matrix so that the top-k set changes from one selection to the next."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t in range(steps):
        grads = []
        for s in SHAPES:
            g = torch.randn(s, generator=gen, dtype=torch.float64)
            if rotate and len(s) >= 2:
                view = g.reshape(s[0], -1)
                view[:, t % view.shape[1]] *= 8.0
            grads.append(g)
        out.append(grads)
    return out


def lr_schedule(t):
    """A different lr per group and per step (exercises `lrs`)."""
    return [g["lr"] * (1.0 + 0.1 * t) for g in GROUPS]


def torch_adamw_trajectory(params, grad_seq, max_grad_norm=None, loss_scales=None):
    """torch.optim.AdamW (float64), clip_grad_norm_ over every parameter; weights per step."""
    tp = [p.clone().requires_grad_() for p in params]
    groups = [
        {"params": [tp[i] for i in g["params"]], "lr": g["lr"], "weight_decay": g["weight_decay"]}
        for g in GROUPS
    ]
    opt = torch.optim.AdamW(groups, betas=BETAS, eps=EPS, foreach=False)
    out = []
    for t, grads in enumerate(grad_seq):
        for p, g in zip(tp, grads):
            scale = 1.0 if loss_scales is None else loss_scales[t]
            p.grad = g.clone() / scale
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(tp, max_grad_norm, foreach=False)
        for group, lr in zip(opt.param_groups, lr_schedule(t)):
            group["lr"] = lr
        opt.step()
        out.append([p.detach().numpy().copy() for p in tp])
    return out


def assert_close_to_torch(ref, expected, context):
    for i, want in enumerate(expected):
        np.testing.assert_allclose(
            ref.weights(i), want, rtol=1e-12, atol=1e-14, err_msg=f"{context}: param {i}"
        )


EXACT_CASES = {
    # Every column on the device.
    "topk_1": dict(topk_ratio=1.0, update_interval=3),
    # Everything on the host every step, synchronously.
    "host_every_step": dict(topk_ratio=0.0, update_interval=1, overlap_step=False),
    # Warm-up covers the run.
    "warm_up_covers_run": dict(topk_ratio=0.3, update_interval="auto", full_warm_up_rounds=STEPS),
    # S = 1 without overlap gives every column its own gradient every step, whichever side
    # holds it: re-selecting every step must then still be AdamW (lossless exchange).
    "reselect_every_step": dict(
        topk_ratio=0.3,
        update_interval=1,
        overlap_step=False,
        select_strategy="step",
        select_interval=1,
    ),
}


@pytest.mark.parametrize("max_grad_norm", [None, 0.5])
@pytest.mark.parametrize("case", sorted(EXACT_CASES))
def test_exact_cases_equal_torch_adamw(case, max_grad_norm):
    params = initial_params()
    grad_seq = gradient_sequence(STEPS, rotate=True)
    config = dict(EXACT_CASES[case], betas=BETAS, eps=EPS, max_grad_norm=max_grad_norm)
    ref = ReferenceZenFlow(params, GROUPS, config)
    expected = torch_adamw_trajectory(params, grad_seq, max_grad_norm)
    selections = set()
    for t, grads in enumerate(grad_seq):
        ref.step(grads, lr_schedule(t))
        assert_close_to_torch(ref, expected[t], f"{case} step {t + 1}")
        if ref.selected(0) is not None:
            selections.add(tuple(ref.selected(0).tolist()))
    if case == "reselect_every_step":
        # The rotation really moved columns between the sides at the selections.
        assert ref.stats()["reselections"] == STEPS - 1
        assert len(selections) > 1


@pytest.mark.parametrize("overlap", [False, True])
def test_flush_after_every_step_equals_torch_adamw(overlap):
    """A flush applies everything accumulated: flushing after every step is plain AdamW for
    any selection, S and overlap (the later grid closes find nothing to do)."""
    params = initial_params()
    grad_seq = gradient_sequence(STEPS, rotate=True)
    config = dict(topk_ratio=0.3, update_interval=3, overlap_step=overlap, betas=BETAS, eps=EPS)
    ref = ReferenceZenFlow(params, GROUPS, config)
    expected = torch_adamw_trajectory(params, grad_seq)
    for t, grads in enumerate(grad_seq):
        ref.step(grads, lr_schedule(t))
        ref.flush()
        assert_close_to_torch(ref, expected[t], f"step {t + 1}")
    assert ref.stats()["windows"] == STEPS  # each flush runs one host update


# ---- staleness, shown directly ----
#
# One matrix [2, 12], k = floor(0.25 * 12) = 3. Column s-1 (s = 1..9) gets gradient 1 at step
# s only: it encodes step s. Columns 9..11 get 10 every step, so they are the selected ones.
# With betas (0, 0), weight decay 0 and lr 1, AdamW moves a column by -g/(|g| + eps): by
# almost exactly -1 when its gradient is non-zero, and by exactly 0 when it is zero. So
# after each step, the encoding columns that moved name the steps whose gradients have
# reached the weights.

STALE_STEPS = 9
STALE_S = 3


def staleness_engine(overlap):
    param = np.zeros((2, 12))
    config = dict(
        topk_ratio=0.25,
        update_interval=STALE_S,
        overlap_step=overlap,
        update_lag="window",
        betas=(0.0, 0.0),
        eps=1e-8,
        window_scaling="none",  # each window's update moves a column by -1: timing only
    )
    return ReferenceZenFlow([param], [{"params": [0], "lr": 1.0, "weight_decay": 0.0}], config)


def staleness_grad(step):
    g = np.zeros((2, 12))
    g[:, step - 1] = 1.0
    g[:, 9:] = 10.0
    return g


def reflected_steps(values):
    """Steps s whose gradient has reached these weights (column s-1 moved by ~-1)."""
    moved = []
    for s in range(1, STALE_STEPS + 1):
        column = values[:, s - 1]
        if np.all(column == 0.0):
            continue
        np.testing.assert_allclose(column, -1.0, atol=1e-6)
        moved.append(s)
    return moved


# Hand-written from the contract. Overlap off: window w's update is written at its close.
# Overlap on: it is written at the close of window w + 1.
STALENESS_EXPECTED = {
    False: {1: [], 2: [], 3: [1, 2, 3], 4: [1, 2, 3], 5: [1, 2, 3], 6: [1, 2, 3, 4, 5, 6]},
    True: {1: [], 2: [], 3: [], 4: [], 5: [], 6: [1, 2, 3], 7: [1, 2, 3], 8: [1, 2, 3]},
}
STALENESS_EXPECTED[False].update({7: list(range(1, 7)), 8: list(range(1, 7))})
STALENESS_EXPECTED[False][9] = list(range(1, 10))
STALENESS_EXPECTED[True][9] = list(range(1, 7))


@pytest.mark.parametrize("overlap", [False, True])
def test_staleness_scripted(overlap):
    ref = staleness_engine(overlap)
    for t in range(1, STALE_STEPS + 1):
        ref.step([staleness_grad(t)])
        w = ref.weights(0)
        assert reflected_steps(w) == STALENESS_EXPECTED[overlap][t], f"step {t}"
        # The selected columns are fresh: every step so far moved them by -1.
        np.testing.assert_allclose(w[:, 9:], -float(t), atol=1e-5)
        # The host state is never stale: it has every closed window.
        closed = STALE_S * (t // STALE_S)
        assert reflected_steps(ref.state(0)["master"]) == list(range(1, closed + 1))
    ref.flush()
    assert reflected_steps(ref.weights(0)) == list(range(1, STALE_STEPS + 1))


# update_lag L: window w's update is written after the L-th step of window w + 1; an L no
# shorter than the window is the same as the close (the default, "window").
LAG_EXPECTED = {
    1: {4: [1, 2, 3], 6: [1, 2, 3], 7: list(range(1, 7)), 9: list(range(1, 7))},
    2: {4: [], 5: [1, 2, 3], 7: [1, 2, 3], 8: list(range(1, 7)), 9: list(range(1, 7))},
    5: {t: STALENESS_EXPECTED[True][t] for t in range(1, STALE_STEPS + 1)},
}


@pytest.mark.parametrize("lag", sorted(LAG_EXPECTED))
def test_update_lag_scripted(lag):
    ref = staleness_engine(True)
    ref.config["update_lag"] = lag
    for t in range(1, STALE_STEPS + 1):
        ref.step([staleness_grad(t)])
        w = ref.weights(0)
        if t <= 3:
            assert reflected_steps(w) == [], f"step {t}"
        if t in LAG_EXPECTED[lag]:
            assert reflected_steps(w) == LAG_EXPECTED[lag][t], f"step {t}"
        np.testing.assert_allclose(w[:, 9:], -float(t), atol=1e-5)
    ref.flush()
    assert reflected_steps(ref.weights(0)) == list(range(1, STALE_STEPS + 1))


# A flush after step 4 (inside window 2 = steps 4..6) applies everything; the grid is not
# reset, so window 2 still closes at step 6 with steps 5 and 6 only.
FLUSH_EXPECTED = {
    False: [[], [], [1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4], list(range(1, 7))],
    True: [[], [], [], [1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]],
}
FLUSH_EXPECTED[False] += [list(range(1, 7)), list(range(1, 7)), list(range(1, 10))]
FLUSH_EXPECTED[True] += [[1, 2, 3, 4], [1, 2, 3, 4], list(range(1, 7))]


@pytest.mark.parametrize("overlap", [False, True])
def test_staleness_with_a_flush_mid_window(overlap):
    ref = staleness_engine(overlap)
    for t in range(1, STALE_STEPS + 1):
        ref.step([staleness_grad(t)])
        if t == 4:
            ref.flush()
        assert reflected_steps(ref.weights(0)) == FLUSH_EXPECTED[overlap][t - 1], f"step {t}"
    # Host updates: close at 3, the flush's own at 4 (step 4), close at 6 (steps 5, 6),
    # close at 9. Uploads: overlap off 3 (closes) + 1 (flush); overlap on: flush at 4
    # (pending window 1 + open window), close at 9 (window 2's).
    stats = ref.stats()
    assert stats["windows"] == 4
    uploads = 4 if not overlap else 3
    assert stats["bytes_up"] == uploads * 2 * 9 * 8


# ---- update_interval "auto" ----
#
# The rule compares column norms (sqrt c). Matrices [1, 4] with k = floor(0.25 * 4) = 1.
# Matrix "a": column 0 has gradient 4 (norm 4), the others 1 (norm 1). So column 0 is
# selected, E_sel = 4 every step, and after s steps E_def = 3 * s / 3 = s: "a" is due from
# s = 4 (E_def >= E_sel, equality counts). Matrix "b": column 0 has gradient 9: due from
# s = 9. A [3, 1] matrix has k = n = 1 and is not counted; a vector is dense and not counted.


def auto_problem():
    params = [np.zeros((1, 4)), np.zeros((1, 4)), np.zeros((3, 1)), np.zeros(5)]
    grads = [np.array([[4.0, 1, 1, 1]]), np.array([[9.0, 1, 1, 1]]), np.ones((3, 1)), np.ones(5)]
    return params, grads


def close_steps(ref, grads, steps, warm_up):
    closes, windows = [], 0
    for t in range(1, steps + 1):
        before = ref.weights(0)[0, 1:].copy()
        ref.step(grads)
        if t <= warm_up:
            continue
        if ref.stats()["windows"] > windows:
            windows = ref.stats()["windows"]
            closes.append(t)
            # Without overlap a close writes the deferred columns at once.
            assert np.all(ref.weights(0)[0, 1:] != before)
        else:
            assert np.all(ref.weights(0)[0, 1:] == before)
    return closes


@pytest.mark.parametrize(
    "auto_ratio, max_interval, warm_up, expected",
    [
        (0.5, 16, 0, [4, 8, 12, 16, 20]),  # one of two counted matrices due: "a" at s = 4
        (0.99, 16, 0, [9, 18]),  # both due: "b" at s = 9
        (1.0, 16, 0, [9, 18]),
        (0.99, 6, 0, [6, 12, 18]),  # the hard bound
        (0.5, 16, 2, [6, 10, 14, 18]),  # windows start after warm-up
    ],
)
def test_auto_interval_rule(auto_ratio, max_interval, warm_up, expected):
    params, grads = auto_problem()
    config = dict(
        topk_ratio=0.25,
        update_interval="auto",
        auto_ratio=auto_ratio,
        max_update_interval=max_interval,
        full_warm_up_rounds=warm_up,
        overlap_step=False,
    )
    ref = ReferenceZenFlow(params, [{"params": [0, 1, 2, 3], "lr": 0.1}], config)
    assert [ref.k(i) for i in range(3)] == [1, 1, 1]
    assert close_steps(ref, grads, 20, warm_up) == expected


def test_auto_interval_uses_column_norms_per_step():
    """E_sel is the norm of a selected column per step, E_def the norms of a deferred column
    summed over the window: with deferred norms 4x lower per step (1 vs 4, so 16x lower in
    squares) the window is 4 steps, and a step of larger deferred gradients (column gradients
    4) makes it due at once."""
    params = [np.zeros((1, 4))]
    config = dict(topk_ratio=0.25, update_interval="auto", overlap_step=False)
    ref = ReferenceZenFlow(params, [{"params": [0], "lr": 0.1}], config)
    quiet, loud = np.array([[4.0, 1, 1, 1]]), np.array([[4.0, 4, 4, 4]])
    sequence = [quiet, quiet, quiet, quiet, loud, quiet, loud]
    closes = []
    for g in sequence:
        ref.step([g])
        closes.append(ref.stats()["windows"])
    # Window 1: s=1..4 quiet -> due at 4. Window 2: step 5 loud: E_def = 12/3 = 4 >= 4 -> 1
    # step. Window 3: step 6 quiet (E_def 1), step 7 loud (E_def (3 + 12)/3 = 5 >= 4).
    assert closes == [0, 0, 0, 1, 2, 2, 3]


@pytest.mark.parametrize("ratio", [0.0, 1.0])
def test_auto_interval_without_counted_matrices_closes_at_the_bound(ratio):
    params, grads = auto_problem()
    config = dict(topk_ratio=ratio, update_interval="auto", max_update_interval=5)
    ref = ReferenceZenFlow(params, [{"params": [0, 1, 2, 3], "lr": 0.1}], config)
    windows = []
    for _ in range(11):
        ref.step(grads)
        windows.append(ref.stats()["windows"])
    assert windows == [0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2]


# ---- selection: schedules, scores, ties ----


def rotating_grad(step, n=8):
    """[1, n]: column step % n has gradient 2 (c = 4), the rest 1: the step's top column."""
    g = np.ones((1, n))
    g[0, step % n] = 2.0
    return g


@pytest.mark.parametrize(
    "config, expected",
    [
        (dict(select_strategy="step", select_interval=5, update_interval=2), [1, 7, 13]),
        (dict(select_strategy="step", select_interval=4, update_interval=2), [1, 5, 9, 13]),
        (dict(select_strategy="step", select_interval=1, update_interval=3), [1, 4, 7, 10, 13]),
        (
            dict(select_strategy="epoch", select_interval=2, steps_per_epoch=3, update_interval=2),
            [1, 7, 13],
        ),
        (dict(select_strategy="epoch", steps_per_epoch=4, update_interval=3), [1, 7, 13]),
        (dict(select_strategy="auto", steps_per_epoch=5, update_interval=2), [1, 7, 13]),
        (dict(select_strategy="auto", update_interval=2), [1]),
        (dict(select_strategy="step", update_interval=2), [1]),  # select_interval "auto"
        (
            dict(
                select_strategy="step",
                select_interval=3,
                update_interval=2,
                full_warm_up_rounds=2,
            ),
            [3, 7, 11],
        ),
    ],
)
def test_selection_schedule(config, expected):
    ref = ReferenceZenFlow([np.zeros((1, 8))], [{"params": [0], "lr": 0.1}], config)
    assert ref.k(0) == 1  # floor(0.1 * 8) = 0 -> max(1, 0) = 1
    selections, previous = [], None
    for t in range(1, 15):
        ref.step([rotating_grad(t)])
        sel = ref.selected(0)
        if sel is not None and (previous is None or sel.tolist() != previous):
            # The step's own top column: a selection happened at this step.
            assert sel.tolist() == [t % 8]
            selections.append(t)
        previous = None if sel is None else sel.tolist()
    assert selections == expected
    assert ref.stats()["reselections"] == len(expected) - 1


@pytest.mark.parametrize(
    "score, expected", [("step", [[0], [1], [2]]), ("window", [[0], [0], [1]])]
)
def test_selection_score(score, expected):
    """Selections at steps 1, 3, 5 (S = 2, every 2 steps). "window" scores by the previous
    window's summed c (window 1: [10, 2, 2, 5] -> 0; window 2 alone: [2, 8, 2, 2] -> 1, while
    windows 1 and 2 together would give 0); the first selection has no previous window and
    uses its step's c."""
    per_step_c = [[9, 1, 1, 1], [1, 1, 1, 4], [1, 4, 1, 1], [1, 4, 1, 1], [1, 1, 9, 1]]
    config = dict(
        topk_ratio=0.25,
        update_interval=2,
        select_strategy="step",
        select_interval=2,
        selection_score=score,
    )
    ref = ReferenceZenFlow([np.zeros((1, 4))], [{"params": [0], "lr": 0.1}], config)
    got = []
    for t, c in enumerate(per_step_c, start=1):
        ref.step([np.sqrt(np.array([c], dtype=np.float64))])
        if t in (1, 3, 5):
            got.append(ref.selected(0).tolist())
    assert got == expected


def test_selection_ties_go_to_the_lower_index_and_are_sorted():
    ref = ReferenceZenFlow([np.zeros((2, 6))], [{"params": [0], "lr": 0.1}], {"topk_ratio": 0.5})
    ref.step([np.ones((2, 6))])
    assert ref.selected(0).tolist() == [0, 1, 2]
    ref = ReferenceZenFlow([np.zeros((1, 5))], [{"params": [0], "lr": 0.1}], {"topk_ratio": 0.4})
    ref.step([np.array([[1.0, 2.0, 2.0, 0.0, 2.0]])])
    assert ref.selected(0).tolist() == [1, 2]
    ref = ReferenceZenFlow([np.zeros((1, 5))], [{"params": [0], "lr": 0.1}], {"topk_ratio": 0.4})
    ref.step([np.array([[0.0, 1.0, 0.5, 3.0, 1.0]])])
    assert ref.selected(0).tolist() == [1, 3]


def test_k_per_matrix():
    shapes = [(3, 10), (3, 9), (4, 1), (2, 3, 4), (5,)]
    ref = ReferenceZenFlow(
        [np.zeros(s) for s in shapes], [{"params": list(range(5)), "lr": 0.1}], {"topk_ratio": 0.3}
    )
    # floor(0.3 n) with at least 1 and at most n; n = product of the trailing dimensions.
    assert [ref.k(i) for i in range(4)] == [3, 2, 1, 3]


# ---- loss scaling and non-finite gradients ----


def test_dynamic_loss_scaling_skips_backs_off_and_grows():
    """topk 1 (every column on the device): with the overflow step removed and gradients
    unscaled, the trajectory is torch.optim.AdamW's. Scale: 1024, 1024, overflow -> 512,
    then 3 good steps (growth_interval) -> 1024."""
    params = initial_params()
    grad_seq = gradient_sequence(8)
    overflow_at = 2  # 0-based: the third call
    config = dict(
        topk_ratio=1.0,
        update_interval=2,
        loss_scaling="dynamic",
        initial_scale=1024.0,
        growth_interval=3,
        max_grad_norm=0.5,
        betas=BETAS,
        eps=EPS,
    )
    ref = ReferenceZenFlow(params, GROUPS, config)
    scales_used, good_grads = [], []
    expected_scales = [1024.0, 1024.0, 1024.0, 512.0, 512.0, 512.0, 1024.0, 1024.0]
    t_good = 0
    for call, grads in enumerate(grad_seq):
        scale = ref.loss_scale
        scales_used.append(scale)
        scaled = [g * scale for g in grads]
        if call == overflow_at:
            scaled[3] = scaled[3].clone()
            scaled[3].view(-1)[1] = math.inf
            before = [ref.weights(i) for i in range(len(SHAPES))]
            assert ref.step(scaled, lr_schedule(t_good)) is False
            for i, w in enumerate(before):
                assert np.array_equal(ref.weights(i), w)
            continue
        assert ref.step(scaled, lr_schedule(t_good)) is True
        good_grads.append(grads)
        t_good += 1
    assert scales_used == expected_scales
    assert ref.loss_scale == 1024.0
    stats = ref.stats()
    assert (stats["steps"], stats["skipped_steps"]) == (7, 1)
    expected = torch_adamw_trajectory(params, good_grads, max_grad_norm=0.5)
    assert_close_to_torch(ref, expected[-1], "after 7 good steps")


def test_overflow_step_is_not_counted_anywhere():
    """With deferred columns, windows and selections: a run with an overflow step in the
    middle equals the run without that step (weights, state, counters but skipped_steps)."""
    params = initial_params()
    grad_seq = gradient_sequence(8, rotate=True)
    base = dict(topk_ratio=0.3, update_interval=3, select_strategy="step", select_interval=3)
    ref = ReferenceZenFlow(params, GROUPS, dict(base, loss_scaling="dynamic", initial_scale=4.0))
    plain = ReferenceZenFlow(params, GROUPS, base)
    for call, grads in enumerate(grad_seq):
        scale = ref.loss_scale
        if call == 4:
            bad = [g * scale for g in grads]
            bad[0] = bad[0].clone()
            bad[0][0, 0] = math.nan
            assert ref.step(bad) is False
            continue
        ref.step([g * scale for g in grads])
        plain.step(grads)
        for i in range(len(SHAPES)):
            np.testing.assert_allclose(ref.weights(i), plain.weights(i), rtol=1e-13, atol=0)
    stats, plain_stats = ref.stats(), plain.stats()
    assert stats.pop("skipped_steps") == 1
    plain_stats.pop("skipped_steps")
    assert stats == plain_stats
    for i in range(len(SHAPES)):
        assert np.array_equal(ref.state(i)["steps"], plain.state(i)["steps"])


def test_non_finite_without_loss_scaling_raises_and_changes_nothing():
    params = initial_params()
    grad_seq = gradient_sequence(5)
    config = dict(topk_ratio=0.3, update_interval=2)
    ref = ReferenceZenFlow(params, GROUPS, config)
    twin = ReferenceZenFlow(params, GROUPS, config)
    for grads in grad_seq[:3]:
        ref.step(grads)
        twin.step(grads)
    bad = [g.clone() for g in grad_seq[3]]
    bad[2].view(-1)[0] = -math.inf
    weights = [ref.weights(i) for i in range(len(SHAPES))]
    stats = ref.stats()
    with pytest.raises(ValueError, match=r"parameter 2\b"):
        ref.step(bad)
    assert ref.stats() == stats
    for i, w in enumerate(weights):
        assert np.array_equal(ref.weights(i), w)
    ref.step(grad_seq[4])
    twin.step(grad_seq[4])
    for i in range(len(SHAPES)):
        assert np.array_equal(ref.weights(i), twin.weights(i))


def test_bad_shapes_and_counts_raise():
    ref = ReferenceZenFlow(initial_params(), GROUPS, {})
    grads = gradient_sequence(1)[0]
    with pytest.raises(ValueError, match="grads"):
        ref.step(grads[:-1])
    wrong = list(grads)
    wrong[1] = torch.zeros(11, 1, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"grads\[1\]"):
        ref.step(wrong)
    with pytest.raises(ValueError, match="lrs"):
        ref.step(grads, [0.1])
    with pytest.raises(ValueError, match="steps_per_epoch"):
        ReferenceZenFlow(initial_params(), GROUPS, {"select_strategy": "epoch"})


# ---- byte counters ----


@pytest.mark.parametrize("overlap", [False, True])
def test_bytes_counters_follow_the_formula(overlap):
    """fp32 and bf16 tensors, warm-up 2, S = 3, 7 steps then a flush. k per matrix with
    topk 0.3: (5,7) -> 2, (1,11) -> 3, (13,1) -> 1, (3,2,5) -> 3; the dense-group matrix and
    the vectors never count. Deferred elements per step: 5*5 + 1*8 + 13*0 + 3*7 = 54."""
    dtypes = [torch.float32, torch.bfloat16, torch.float32, torch.bfloat16] + [torch.float32] * 3
    params = [p.to(d) for p, d in zip(initial_params(), dtypes)]
    config = dict(
        topk_ratio=0.3,
        update_interval=3,
        full_warm_up_rounds=2,
        overlap_step=overlap,
        update_lag="window",
    )
    ref = ReferenceZenFlow(params, GROUPS, config)
    grad_seq = gradient_sequence(7)
    for grads in grad_seq:
        ref.step([g.to(d) for g, d in zip(grads, dtypes)])
    bytes_per_step = 5 * 5 * 4 + 1 * 8 * 2 + 0 + 3 * 7 * 2  # gradient dtype = param dtype
    # Warm-up steps 1, 2: no selection yet, every matrix goes down and up whole.
    warm_up_bytes = 2 * (5 * 7 * 4 + 1 * 11 * 2 + 13 * 1 * 4 + 3 * 2 * 5 * 2)
    assert ref.stats()["bytes_down"] == 5 * bytes_per_step + warm_up_bytes  # + steps 3..7
    # Window 1 = steps 3..5 closes at 5: written at once without overlap, pending with it.
    assert ref.stats()["bytes_up"] == (0 if overlap else 1) * bytes_per_step + warm_up_bytes
    ref.flush()  # writes the pending result (overlap) and the open window's (steps 6, 7)
    assert ref.stats()["bytes_up"] == 2 * bytes_per_step + warm_up_bytes
    assert ref.stats()["windows"] == 2


def window_test_setup(scaling):
    """The window tests' model: matrices 0-3 in two groups, the reference with topk 0, S = 3,
    no overlap and `scaling`, and torch copies of the parameters."""
    matrices = [0, 1, 2, 3]
    params = initial_params()
    groups = [
        {"params": [0, 1], "lr": 1e-2, "weight_decay": 0.1},
        {"params": [2, 3], "lr": 3e-2, "weight_decay": 0.0},
    ]
    config = dict(
        topk_ratio=0.0,
        update_interval=3,
        overlap_step=False,
        betas=BETAS,
        eps=EPS,
        window_scaling=scaling,
    )
    ref = ReferenceZenFlow([params[i] for i in matrices], groups, config)
    tp = [params[i].clone().requires_grad_() for i in matrices]
    return matrices, groups, ref, tp


def test_deferred_columns_step_once_per_window_on_the_mean_gradient():
    """topk 0, S = 3, no overlap, a flush after step 4: the host steps at 3 (steps 1-3), 4
    (flush: step 4), 6 (steps 5-6) and 9 (steps 7-9). Each is torch.optim.AdamW applied once
    to the mean of those steps' gradients with the lr of the last of them, and the weights
    change only then."""
    matrices, groups, ref, tp = window_test_setup("none")
    opt = torch.optim.AdamW(
        [{**g, "params": [tp[i] for i in g["params"]]} for g in groups],
        betas=BETAS,
        eps=EPS,
        foreach=False,
    )
    grad_seq = gradient_sequence(STEPS)
    host_steps = {3: [1, 2, 3], 4: [4], 6: [5, 6], 9: [7, 8, 9]}
    for t in range(1, STEPS + 1):
        lrs = [1e-2 * t, 3e-2 / t]
        ref.step([grad_seq[t - 1][i] for i in matrices], lrs)
        if t == 4:
            ref.flush()
        if t in host_steps:
            window = host_steps[t]
            for j, p in enumerate(tp):
                p.grad = sum(grad_seq[s - 1][matrices[j]] for s in window) / len(window)
            for group, lr in zip(opt.param_groups, lrs):
                group["lr"] = lr
            opt.step()
        for j, p in enumerate(tp):
            np.testing.assert_allclose(
                ref.weights(j), p.detach().numpy(), rtol=1e-12, atol=1e-14, err_msg=f"step {t}"
            )


@pytest.mark.parametrize("scaling", ["sqrt", "linear"])
def test_a_scaled_window_update_is_adamw_over_the_window_with_window_betas(scaling):
    """window_scaling sqrt / linear, topk 0, S = 3, no overlap: the update that stands for a
    window's 3 steps is torch.optim.AdamW applied once per window to the mean gradient with
    betas (beta1^3, beta2^3), lr * sqrt(3) (or * 3) and the weight decay that makes its decay
    (1 - lr wd)^3. torch counts windows, the reference steps: torch's bias corrections
    (beta^3)^windows are the reference's beta^steps."""
    matrices, groups, ref, tp = window_test_setup(scaling)
    window_betas = (BETAS[0] ** 3, BETAS[1] ** 3)
    opt = torch.optim.AdamW(
        [{**g, "params": [tp[i] for i in g["params"]]} for g in groups],
        betas=window_betas,
        eps=EPS,
        foreach=False,
    )
    factor = math.sqrt(3) if scaling == "sqrt" else 3.0
    grad_seq = gradient_sequence(STEPS)
    for t in range(1, STEPS + 1):
        lrs = [1e-2 * t, 3e-2 / t]
        ref.step([grad_seq[t - 1][i] for i in matrices], lrs)
        if t % 3 == 0:
            for j, p in enumerate(tp):
                p.grad = sum(grad_seq[s - 1][matrices[j]] for s in (t - 2, t - 1, t)) / 3
            for group, base, lr in zip(opt.param_groups, groups, lrs):
                decay = (1.0 - lr * base["weight_decay"]) ** 3
                group.update(lr=lr * factor, weight_decay=(1.0 - decay) / (lr * factor))
            opt.step()
        for j, p in enumerate(tp):
            np.testing.assert_allclose(
                ref.weights(j), p.detach().numpy(), rtol=1e-12, atol=1e-14, err_msg=f"step {t}"
            )
        if t % 3 == 0:
            np.testing.assert_array_equal(ref.state(0)["steps"], t)  # counts in steps


# ---- per-step hyper-parameters ----


def hparams_at(t):
    """Betas, eps and weight decays (per group of GROUPS) that change at every step t
    (1-based): momentum cycles as OneCycleLR's does."""
    phase = (t % 4) / 4.0
    betas = (0.85 + 0.1 * phase, 0.99 + 0.009 * phase)
    eps = 1e-8 * (1.0 + t)
    weight_decays = [g["weight_decay"] * (1.0 + 0.2 * t) for g in GROUPS]
    return betas, eps, weight_decays


@pytest.mark.parametrize("case", ["topk_1", "reselect_every_step", "warm_up_covers_run"])
def test_per_step_hyperparameters_equal_torch_adamw_where_exact(case):
    """Where the reference is plain AdamW, setting betas, eps and weight decay before each
    step is torch.optim.AdamW with the same values set in its param_groups."""
    params = initial_params()
    grad_seq = gradient_sequence(STEPS, rotate=True)
    config = dict(EXACT_CASES[case], betas=BETAS, eps=EPS)
    ref = ReferenceZenFlow(params, GROUPS, config)
    tp = [p.clone().requires_grad_() for p in params]
    opt = torch.optim.AdamW(
        [{**g, "params": [tp[i] for i in g["params"]]} for g in GROUPS],
        betas=BETAS,
        eps=EPS,
        foreach=False,
    )
    for t, grads in enumerate(grad_seq, start=1):
        betas, eps, wds = hparams_at(t)
        ref.set_hyperparameters(betas, eps, wds)
        for p, g in zip(tp, grads):
            p.grad = g.clone()
        for group, lr, wd in zip(opt.param_groups, lr_schedule(t - 1), wds):
            group.update(lr=lr, betas=betas, eps=eps, weight_decay=wd)
        opt.step()
        ref.step(grads, lr_schedule(t - 1))
        assert_close_to_torch(ref, [p.detach().numpy() for p in tp], f"{case} step {t}")


def test_a_windows_host_update_takes_its_last_steps_hyperparameters():
    """topk 0, S = 3, no overlap: each host step is torch.optim.AdamW applied once to the
    window's mean gradient with the lr, betas, eps and weight decay of the window's last
    step, whatever the earlier steps of the window had."""
    matrices, groups, ref, tp = window_test_setup("none")
    opt = torch.optim.AdamW(
        [{**g, "params": [tp[i] for i in g["params"]]} for g in groups], foreach=False
    )
    grad_seq = gradient_sequence(STEPS)
    for t in range(1, STEPS + 1):
        lrs = [1e-2 * t, 3e-2 / t]
        betas, eps = (0.8 + 0.02 * t, 0.95 + 0.004 * t), 1e-8 * t
        wds = [0.1 * t, 0.01 * t]
        ref.set_hyperparameters(betas, eps, wds)
        ref.step([grad_seq[t - 1][i] for i in matrices], lrs)
        if t % 3 == 0:
            for j, p in enumerate(tp):
                p.grad = sum(grad_seq[s - 1][matrices[j]] for s in (t - 2, t - 1, t)) / 3
            for group, lr, wd in zip(opt.param_groups, lrs, wds):
                group.update(lr=lr, betas=betas, eps=eps, weight_decay=wd)
            opt.step()
        for j, p in enumerate(tp):
            np.testing.assert_allclose(
                ref.weights(j), p.detach().numpy(), rtol=1e-12, atol=1e-14, err_msg=f"step {t}"
            )


def test_bad_hyperparameters_raise_and_change_nothing():
    ref = ReferenceZenFlow(initial_params(), GROUPS, dict(betas=BETAS, eps=EPS))
    before = ref.hyperparameters()
    for betas, eps, wds in [
        ((1.0, 0.999), 1e-8, None),
        ((0.9, -0.1), 1e-8, None),
        ((0.9, 0.999), -1e-8, None),
        ((0.9, 0.999), 1e-8, [0.1]),
        ((0.9, 0.999), 1e-8, [0.1, math.nan, 0.0]),
        ((0.9, 0.999), 1e-8, [0.1, -1.0, 0.0]),
    ]:
        with pytest.raises(ValueError):
            ref.set_hyperparameters(betas, eps, wds)
        assert ref.hyperparameters() == before
