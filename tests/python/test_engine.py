"""The engine (zenflow._C.Engine, host backend, CPU tensors) against the float64 reference
engine_reference.py, weights after every step; then determinism, checkpoints, faults and
process safety.

Tolerances (fp32 engine vs float64 reference). Per step and element, the engine rounds the
stored weight, the decoupled weight decay and the subtraction (at most ~2 ulp of |w|, i.e.
2^-22 |w|), and the Adam update lr * m_hat / (sqrt(v_hat) + eps) carries a few fp32
roundings of m, v, sqrt, the division, the gradient accumulation and the clip coefficient:
well under 64 ulp of lr (2^-18 lr). Errors do not feed back (the update's direction comes
from the gradients, not the weights), so they add up at most linearly over t steps:
    |engine - reference| <= t * (2^-22 |w| + 2^-18 lr_max).
With lr ~ 1e-2 and a few steps that is ~1e-6 |w| + 1e-7: a missing, doubled or stale update
(an error of order lr * 0.1 or more) is 10^4 times larger. Where torch has the same
computation (the exact cases), the engine's error is also held to at most twice torch's own
fp32 error against float64, plus one fp32 ulp of lr per step. bf16/fp16 weights are compared
after rounding the reference to the weight's dtype, within one ulp of that dtype (the fp32
master can sit on either side of a rounding midpoint), and their fp32 masters (from a
checkpoint, after a flush) at the fp32 tolerance. Selection and the "auto" window rule are
decisions: each case first checks, through the reference, that no decision is within 1e-4
of a tie (so fp32 cannot flip it).
"""

from __future__ import annotations

import copy
import faulthandler
import math
import multiprocessing
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from engine_reference import ReferenceZenFlow

import zenflow
from zenflow import _C

# Odd matrices (primes, 1xN, Nx1, a 3-d one viewed [3, 10]), a vector, a scalar, and a
# matrix in a dense group; two ordinary groups with their own lr / weight decay.
SHAPES = [(7, 13), (1, 17), (11, 1), (3, 5, 2), (5,), (), (4, 6)]
GROUPS = [
    {"params": [0, 1, 4], "lr": 1e-2, "weight_decay": 0.1},
    {"params": [2, 3, 5], "lr": 2e-2, "weight_decay": 0.0},
    {"params": [6], "lr": 1.5e-2, "weight_decay": 0.05, "dense": True},
]
LR_MAX = 2e-2 * 1.5
STAT_KEYS = {
    "steps",
    "windows",
    "reselections",
    "skipped_steps",
    "last_global_norm",
    "stall_seconds_window_close",
    "stall_seconds_back_pressure",
    "stall_seconds_flush",
    "host_update_seconds",
    "accumulate_seconds",
    "host_lane_wait_seconds",
    "bytes_down",
    "bytes_up",
    "selected_fraction",
    "device_state_bytes",
    "host_state_bytes",
}
COUNTERS = ("steps", "windows", "reselections", "skipped_steps", "bytes_down", "bytes_up")
EPS32 = 2.0**-24
TIE_MARGIN = 1e-4


def lrs_at(t):
    """A per-group lr that changes every step (t = 0-based call)."""
    return [g["lr"] * (1.0 + 0.05 * t) for g in GROUPS]


def make_params(dtype=torch.float32, seed=0, shapes=SHAPES):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen).to(dtype) for s in shapes]


def make_grads(t, dtype=torch.float32, rotate=False, shapes=SHAPES, scale=1.0):
    """Gradients of call t; with rotate, one column band per matrix is boosted, moving with t,
    so that successive selections pick different columns."""
    gen = torch.Generator().manual_seed(1000 + t)
    grads = []
    for s in shapes:
        g = torch.randn(s, generator=gen)
        if rotate and len(s) >= 2:
            view = g.view(s[0], -1)
            view[:, (3 * t) % view.shape[1]] *= 6.0
        grads.append((g * scale).to(dtype))
    return grads


def fp32_tolerance(want, steps, lr_max=LR_MAX):
    return steps * (4 * EPS32 * np.abs(want) + 64 * EPS32 * lr_max)


def rounded_tolerance(want, dtype, steps):
    """One ulp of `dtype` at |want| (bf16: 8 significant bits, fp16: 11), plus fp32's."""
    bits = {torch.bfloat16: 8, torch.float16: 11}[dtype]
    return 2.0 ** (1 - bits) * np.abs(want) + fp32_tolerance(want, steps) + 2.0**-24


def as64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).numpy()


def check_weights(params, ref, steps, what):
    for i, p in enumerate(params):
        want = ref.weights(i)
        if p.dtype == torch.float32:
            got, tol = as64(p), fp32_tolerance(want, steps)
        else:
            want = as64(torch.from_numpy(want).to(p.dtype))
            got, tol = as64(p), rounded_tolerance(want, p.dtype, steps)
        err = np.abs(got - want)
        if np.any(err > tol):
            worst = np.unravel_index(np.argmax(err - tol), err.shape) if err.ndim else ()
            pytest.fail(
                f"{what}: param {i} {tuple(p.shape)} after {steps} steps: at {worst} engine "
                f"{got[worst]!r} reference {want[worst]!r} (tolerance {tol[worst]:.3g})"
            )


def check_well_conditioned(ref):
    """No selection and no auto-window decision of this case is within TIE_MARGIN of a tie."""
    for gap in ref.selection_gaps:
        assert gap > TIE_MARGIN, f"ill-conditioned case: a top-k gap of {gap:.2g}"
    for step, index, ratio in ref.auto_ratios:
        assert abs(ratio - 1.0) > TIE_MARGIN, (
            f"ill-conditioned case: E_def/E_sel = {ratio!r} at step {step}, param {index}"
        )


def check_state(engine, ref, steps, what):
    """engine.state_dict() after a flush against the reference after its own flush."""
    ref.flush()
    engine.flush()
    state = engine.state_dict()
    assert len(state["params"]) == len(ref.params)
    assert "schedule" in state and "loss_scaler" in state
    for i, entry in enumerate(state["params"]):
        want = ref.state(i)
        assert entry["master"].dtype == torch.float32
        for key in ("master", "exp_avg", "exp_avg_sq"):
            assert tuple(entry[key].shape) == want[key].shape, f"{what}: {key} of param {i}"
            got = as64(entry[key])
            scale = max(1e-30, float(np.max(np.abs(want[key]), initial=0.0)))
            tol = fp32_tolerance(want[key], steps) + steps * 16 * EPS32 * scale
            assert np.all(np.abs(got - want[key]) <= tol), f"{what}: {key} of param {i}"
        assert entry["steps"].dtype == torch.int32
        assert entry["steps"].tolist() == want["steps"].tolist(), f"{what}: steps of param {i}"
        selected = ref.selected(i)
        if ref.params[i].matrix:
            expected = [] if selected is None else selected.tolist()
            assert entry["selected"].tolist() == expected, f"{what}: selected of param {i}"
    return state


def check_counters(engine, ref, what):
    stats = engine.stats()
    assert STAT_KEYS <= set(stats), f"missing stats keys {STAT_KEYS - set(stats)}"
    expected = ref.stats()
    for key in COUNTERS:
        assert stats[key] == expected[key], f"{what}: stats[{key!r}]"
    if expected["steps"]:
        np.testing.assert_allclose(stats["last_global_norm"], expected["last_global_norm"], 1e-5)


def run_against_reference(config, steps, dtype=torch.float32, rotate=False, scale=1.0):
    params = make_params(dtype)
    ref = ReferenceZenFlow(params, GROUPS, config)
    engine = _C.Engine(params, copy.deepcopy(GROUPS), dict(config))
    what = f"{config}"
    for t in range(steps):
        grads = make_grads(t, dtype, rotate, scale=scale)
        engine.step(grads, lrs_at(t))
        ref.step(grads, lrs_at(t))
        check_weights(params, ref, t + 1, what)
    check_well_conditioned(ref)
    check_counters(engine, ref, what)
    return engine, ref, params


# ---- the engine against the reference ----


@pytest.mark.parametrize("warm_up", [0, 2])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("interval", [1, 3, "auto"])
@pytest.mark.parametrize("ratio", [0.0, 0.3, 1.0])
def test_matches_reference(ratio, interval, overlap, warm_up):
    config = dict(
        topk_ratio=ratio,
        update_interval=interval,
        overlap_step=overlap,
        full_warm_up_rounds=warm_up,
        max_update_interval=4,
    )
    engine, ref, _ = run_against_reference(config, steps=9)
    check_state(engine, ref, 9, f"{config}")
    check_counters(engine, ref, f"{config}, after the flush")
    engine.close()


@pytest.mark.parametrize("lag", [1, 2, 6])
@pytest.mark.parametrize("interval", [3, "auto"])
def test_update_lag_matches_reference(interval, lag):
    # lag 6 is longer than any window: the result lands at the close, as "window"
    config = dict(
        topk_ratio=0.3,
        update_interval=interval,
        overlap_step=True,
        update_lag=lag,
        max_update_interval=4,
        select_strategy="step",
        select_interval=5,
    )
    engine, ref, _ = run_against_reference(config, steps=11)
    check_state(engine, ref, 11, f"{config}")
    check_counters(engine, ref, f"{config}, after the flush")
    engine.close()


@pytest.mark.parametrize("score", ["step", "window"])
def test_reselection_mid_run_moves_columns(score):
    config = dict(
        topk_ratio=0.3,
        update_interval=3,
        select_strategy="step",
        select_interval=3,
        selection_score=score,
    )
    params = make_params()
    ref = ReferenceZenFlow(params, GROUPS, config)
    engine = _C.Engine(params, copy.deepcopy(GROUPS), dict(config))
    history = []
    for t in range(10):
        grads = make_grads(t, rotate=True)
        engine.step(grads, lrs_at(t))
        ref.step(grads, lrs_at(t))
        check_weights(params, ref, t + 1, f"reselection ({score})")
        history.append(ref.selected(0).tolist())
    assert ref.selection_steps == [1, 4, 7, 10]
    assert len({tuple(h) for h in history}) > 1, "the column set never changed"
    check_well_conditioned(ref)
    check_counters(engine, ref, "reselection")
    check_state(engine, ref, 10, "reselection")


def hparams_at(t):
    """Betas (momentum cycling as OneCycleLR's), eps and weight decays (per group) of call t."""
    phase = (t % 5) / 5.0
    betas = (0.85 + 0.1 * phase, 0.99 + 0.009 * phase)
    return betas, 1e-8 * (1 + t), [g["weight_decay"] * (1.0 + 0.3 * t) for g in GROUPS]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("interval", [3, "auto"])
def test_per_step_hyperparameters_match_reference(interval, overlap):
    """Betas, eps and weight decay changed before every step (and a re-selection inside the
    run): the selected columns and dense parameters take the step's values, a window's
    host update those of its last step, as the float64 reference does; no flush (the
    windows close on schedule)."""
    config = dict(
        topk_ratio=0.3,
        update_interval=interval,
        max_update_interval=4,
        overlap_step=overlap,
        select_strategy="step",
        select_interval=4,
    )
    params = make_params()
    ref = ReferenceZenFlow(params, GROUPS, config)
    engine = _C.Engine(params, copy.deepcopy(GROUPS), dict(config))
    what = f"per-step hyper-parameters, {config}"
    for t in range(11):
        betas, eps, wds = hparams_at(t)
        engine.set_hyperparameters(betas, eps, wds)
        ref.set_hyperparameters(betas, eps, wds)
        grads = make_grads(t, rotate=True)
        engine.step(grads, lrs_at(t))
        ref.step(grads, lrs_at(t))
        check_weights(params, ref, t + 1, what)
    assert ref.stats()["windows"] >= 3
    assert ref.steps_accumulated > 0, "the flush below must find an open window"
    check_well_conditioned(ref)
    check_counters(engine, ref, what)
    # Values set after the window's last step do not reach its host update (the flush).
    engine.set_hyperparameters((0.5, 0.6), 1e-3, [1.0, 2.0, 3.0])
    ref.set_hyperparameters((0.5, 0.6), 1e-3, [1.0, 2.0, 3.0])
    check_state(engine, ref, 11, what)
    engine.close()


def test_bad_hyperparameters_raise_naming_the_value_and_change_nothing():
    config = dict(topk_ratio=0.3, update_interval=3, select_strategy="step", select_interval=3)
    runs = []
    for bad in [None, *range(7)]:
        params = make_params()
        engine = _C.Engine(params, copy.deepcopy(GROUPS), dict(config))
        engine.step(make_grads(0), lrs_at(0))
        if bad is not None:
            args, error, match = [
                (((1.0, 0.999), 1e-8, None), ValueError, "beta"),
                (((0.9, math.nan), 1e-8, None), ValueError, "beta"),
                (((0.9, 0.999), -1e-8, None), ValueError, "eps"),
                (((0.9, 0.999), 1e-8, [0.1, 0.0]), ValueError, "weight_decays"),
                (((0.9, 0.999), 1e-8, [0.1, -1.0, 0.0]), ValueError, r"weight_decays\[1\]"),
                (((0.9, 0.999, 0.5), 1e-8, None), ValueError, "betas"),
                (((0.9, 0.999), "x", None), TypeError, "eps"),
            ][bad]
            with pytest.raises(error, match=match):
                engine.set_hyperparameters(*args)
        for t in range(1, 5):
            engine.step(make_grads(t), lrs_at(t))
        runs.append([p.clone() for p in params])
        engine.close()
    for bad, run in enumerate(runs[1:]):
        assert_bitwise([runs[0]], [run], f"bad hyper-parameters {bad}")


@pytest.mark.parametrize("overlap", [False, True])
def test_max_grad_norm(overlap):
    config = dict(topk_ratio=0.3, update_interval=3, overlap_step=overlap, max_grad_norm=1.0)
    engine, ref, _ = run_against_reference(config, steps=7)
    assert ref.stats()["last_global_norm"] > 1.0  # clipping was active
    check_state(engine, ref, 7, "max_grad_norm")


def test_bf16_parameters():
    config = dict(topk_ratio=0.3, update_interval=3, master_weights="fp32")
    engine, ref, _ = run_against_reference(config, steps=7, dtype=torch.bfloat16)
    # bytes in the bf16 gradient / parameter dtype: checked in check_counters.
    check_state(engine, ref, 7, "bf16")


def test_fp16_dynamic_loss_scaling_with_an_overflow_step():
    config = dict(
        topk_ratio=0.3,
        update_interval=3,
        loss_scaling="dynamic",
        initial_scale=1024.0,
        growth_interval=3,
        max_grad_norm=1.0,
    )
    params = make_params(torch.float16)
    ref = ReferenceZenFlow(params, GROUPS, config)
    engine = _C.Engine(params, copy.deepcopy(GROUPS), dict(config))
    scales = []
    for t in range(9):
        assert engine.loss_scale == ref.loss_scale
        scales.append(engine.loss_scale)
        grads = make_grads(t, torch.float16, scale=0.01 * engine.loss_scale)
        if t == 4:
            grads[3].view(-1)[2] = float("inf")
        before = [p.clone() for p in params]
        engine.step(grads, lrs_at(t))
        ref.step(grads, lrs_at(t))
        if t == 4:
            assert all(torch.equal(a, b) for a, b in zip(before, params)), "overflow wrote"
        check_weights(params, ref, t + 1, "fp16")
    assert scales == [1024.0, 1024.0, 1024.0, 2048.0, 2048.0, 1024.0, 1024.0, 1024.0, 2048.0]
    check_counters(engine, ref, "fp16")
    assert engine.stats()["skipped_steps"] == 1
    check_state(engine, ref, 9, "fp16")


@pytest.mark.parametrize(
    "scaler, overflows, expected",
    [
        # min_loss_scale: three overflows from 512 stop at 128 (the old engine reached 64)
        (dict(min_loss_scale=128.0), (1, 2, 3), [512, 512, 256, 128, 128, 128]),
        # hysteresis 2: the first overflow is skipped at the same scale, the second backs off,
        # and (no refill yet) so does every later one
        (dict(hysteresis=2), (1, 3, 4), [512, 512, 512, 512, 256, 128]),
        # consecutive_hysteresis: the good step between two overflows refills the hysteresis
        (
            dict(hysteresis=2, consecutive_hysteresis=True),
            (1, 3, 4),
            [512, 512, 512, 512, 512, 256],
        ),
        # growth refills it too: the overflow after the growth is absorbed again
        (dict(hysteresis=2, growth_interval=2), (0, 3), [512, 512, 512, 1024, 1024, 1024]),
    ],
    ids=["min_loss_scale", "hysteresis", "consecutive_hysteresis", "growth_refills"],
)
def test_deepspeed_loss_scaler_rules_follow_the_reference(scaler, overflows, expected):
    config = dict(
        topk_ratio=0.3,
        update_interval=2,
        loss_scaling="dynamic",
        initial_scale=512.0,
        growth_interval=100,
        **{k: v for k, v in scaler.items() if k != "growth_interval"},
    )
    if "growth_interval" in scaler:
        config["growth_interval"] = scaler["growth_interval"]
    params = make_params(torch.float16)
    ref = ReferenceZenFlow(params, GROUPS, config)
    engine = _C.Engine(params, copy.deepcopy(GROUPS), dict(config))
    scales = []
    for t in range(len(expected)):
        assert engine.loss_scale == ref.loss_scale, t
        scales.append(engine.loss_scale)
        grads = make_grads(t, torch.float16, scale=0.01 * engine.loss_scale)
        if t in overflows:
            grads[1].view(-1)[0] = float("inf")
        engine.step(grads, lrs_at(t))
        ref.step(grads, lrs_at(t))
        check_weights(params, ref, t + 1, "fp16")
    assert scales == expected
    assert engine.stats()["skipped_steps"] == len(overflows)
    check_counters(engine, ref, "fp16")


def test_the_hysteresis_count_is_part_of_the_checkpoint_and_old_states_load():
    config = dict(topk_ratio=0.3, update_interval=2, loss_scaling="dynamic", initial_scale=512.0)
    config.update(hysteresis=3, growth_interval=100)
    params = make_params(torch.float16)
    engine = _C.Engine(params, copy.deepcopy(GROUPS), dict(config))
    for t in range(2):  # two overflows absorbed: the next one backs off
        grads = make_grads(t, torch.float16)
        grads[0].view(-1)[0] = float("inf")
        engine.step(grads, lrs_at(t))
    state = engine.state_dict()
    assert state["loss_scaler"]["hysteresis"] == 2 and engine.loss_scale == 512.0
    overflow = make_grads(5, torch.float16)
    overflow[0].view(-1)[0] = float("inf")
    resumed = _C.Engine(make_params(torch.float16), copy.deepcopy(GROUPS), dict(config))
    resumed.load_state_dict(copy.deepcopy(state))
    resumed.step([g.clone() for g in overflow], lrs_at(5))
    assert resumed.loss_scale == 256.0
    # a state saved before the counter existed: no overflow absorbed yet
    del state["loss_scaler"]["hysteresis"]
    old = _C.Engine(make_params(torch.float16), copy.deepcopy(GROUPS), dict(config))
    old.load_state_dict(state)
    old.step([g.clone() for g in overflow], lrs_at(5))
    assert old.loss_scale == 512.0
    # into an engine whose hysteresis cannot hold the count: refused, naming the counter
    state["loss_scaler"]["hysteresis"] = 2
    small = _C.Engine(make_params(torch.float16), copy.deepcopy(GROUPS), dict(config, hysteresis=2))
    with pytest.raises(ValueError, match="hysteresis"):
        small.load_state_dict(state)


# ---- exact cases: at most twice torch's own fp32 error ----


def torch_trajectories(steps):
    """torch.optim.AdamW in fp32 and in float64 on the same gradients and lrs."""
    out = {}
    for dtype in (torch.float32, torch.float64):
        tp = [p.to(dtype).requires_grad_() for p in make_params()]
        groups = [
            {
                "params": [tp[i] for i in g["params"]],
                "lr": g["lr"],
                "weight_decay": g["weight_decay"],
            }
            for g in GROUPS
        ]
        opt = torch.optim.AdamW(groups, foreach=False)
        out[dtype] = []
        for t in range(steps):
            for p, g in zip(tp, make_grads(t)):
                p.grad = g.to(dtype)
            for group, lr in zip(opt.param_groups, lrs_at(t)):
                group["lr"] = lr
            opt.step()
            out[dtype].append([as64(p) for p in tp])
    return out


@pytest.mark.parametrize(
    "config",
    [
        dict(topk_ratio=1.0, update_interval=3),
        dict(topk_ratio=0.0, update_interval=1, overlap_step=False),
        dict(topk_ratio=0.3, update_interval="auto", full_warm_up_rounds=8),
    ],
)
def test_exact_cases_within_twice_torch_fp32_error(config):
    steps = 8
    torch_runs = torch_trajectories(steps)
    params = make_params()
    engine = _C.Engine(params, copy.deepcopy(GROUPS), dict(config))
    for t in range(steps):
        engine.step(make_grads(t), lrs_at(t))
        for i, p in enumerate(params):
            exact = torch_runs[torch.float64][t][i]
            torch_err = np.max(np.abs(torch_runs[torch.float32][t][i] - exact), initial=0.0)
            err = np.max(np.abs(as64(p) - exact), initial=0.0)
            assert err <= 2 * torch_err + (t + 1) * EPS32 * LR_MAX, (
                f"{config}: param {i} step {t + 1}: error {err:.3g}, torch fp32 {torch_err:.3g}"
            )


# ---- determinism ----


def trajectory(config, steps=8, split=None, shapes=None):
    """Weights (bytes) after every step; split = chunk sizes for begin/submit/end_step."""
    shapes = shapes or SHAPES + [(67, 129), (129,)]
    groups = copy.deepcopy(GROUPS)
    groups[0]["params"] = groups[0]["params"] + [7, 8]
    params = make_params(shapes=shapes)
    engine = _C.Engine(params, groups, dict(config))
    out = []
    for t in range(steps):
        grads = make_grads(t, rotate=True, shapes=shapes)
        if split is None:
            engine.step(grads, lrs_at(t))
        else:
            engine.begin_step(lrs_at(t))
            starts = np.cumsum([0] + split[:-1]).tolist()
            for first, size in reversed(list(zip(starts, split))):  # backward order
                engine.submit(first, grads[first : first + size])
            engine.end_step()
        out.append([p.clone() for p in params])
    engine.flush()
    out.append([p.clone() for p in params])
    engine.close()
    return out


DET_CONFIG = dict(
    topk_ratio=0.3,
    update_interval=3,
    overlap_step=True,
    select_strategy="step",
    select_interval=3,
    max_grad_norm=1.0,
)


def assert_bitwise(a, b, what):
    for t, (wa, wb) in enumerate(zip(a, b)):
        for i, (x, y) in enumerate(zip(wa, wb)):
            assert torch.equal(x, y), f"{what}: param {i} differs after step {t + 1}"


def test_bitwise_across_runs():
    assert_bitwise(trajectory(DET_CONFIG), trajectory(DET_CONFIG), "two runs")


def test_bitwise_across_thread_counts(restore_threads):
    zenflow.set_num_threads(1)
    one = trajectory(dict(DET_CONFIG, pt_reserved_cores_perc=0.25))
    zenflow.set_num_threads(max(2, zenflow.default_num_threads()))
    many = trajectory(dict(DET_CONFIG, pt_reserved_cores_perc=0.75))
    assert_bitwise(one, many, "thread counts")


def test_split_step_equals_step():
    whole = trajectory(DET_CONFIG)
    split = trajectory(DET_CONFIG, split=[2, 1, 3, 3])
    assert_bitwise(whole, split, "begin_step/submit/end_step")


# ---- checkpoints ----


@pytest.mark.parametrize("interval", [3, "auto"])
def test_checkpoint_at_step_7_continues_bitwise(interval):
    config = dict(DET_CONFIG, update_interval=interval, max_update_interval=4)
    params = make_params()
    ref = ReferenceZenFlow(params, GROUPS, config)
    engine = _C.Engine(params, copy.deepcopy(GROUPS), dict(config))
    for t in range(7):
        grads = make_grads(t, rotate=True)
        engine.step(grads, lrs_at(t))
        ref.step(grads, lrs_at(t))
    state = copy.deepcopy(check_state(engine, ref, 7, "checkpoint"))  # flushes both
    resumed_params = [p.clone() for p in params]
    resumed = _C.Engine(
        resumed_params, copy.deepcopy(GROUPS), dict(config, pt_reserved_cores_perc=0.75)
    )
    resumed.load_state_dict(state)
    for t in range(7, 14):
        grads = make_grads(t, rotate=True)
        engine.step(grads, lrs_at(t))
        resumed.step([g.clone() for g in grads], lrs_at(t))
        ref.step(grads, lrs_at(t))
        for i, (a, b) in enumerate(zip(params, resumed_params)):
            assert torch.equal(a, b), f"param {i} differs after step {t + 1}"
        check_weights(params, ref, t + 1, "after the checkpoint")
    assert engine.stats()["steps"] == resumed.stats()["steps"] == 14
    assert engine.loss_scale == resumed.loss_scale


@pytest.mark.parametrize("change", ["shape", "count"])
def test_loading_another_models_state_fails_and_changes_nothing(change):
    source = _C.Engine(make_params(), copy.deepcopy(GROUPS), dict(DET_CONFIG))
    for t in range(4):
        source.step(make_grads(t, rotate=True), lrs_at(t))
    state = source.state_dict()
    shapes = list(SHAPES)
    groups = copy.deepcopy(GROUPS)
    if change == "shape":
        shapes[0] = (13, 7)
    else:
        shapes.append((3, 3))
        groups[1]["params"].append(len(shapes) - 1)

    def run(load):
        params = make_params(shapes=shapes)
        engine = _C.Engine(params, copy.deepcopy(groups), dict(DET_CONFIG))
        out = []
        for t in range(5):
            if t == 2 and load:
                before = [p.clone() for p in params]
                with pytest.raises(ValueError):
                    engine.load_state_dict(state)
                assert all(torch.equal(a, b) for a, b in zip(before, params))
            engine.step(make_grads(t, rotate=True, shapes=shapes), lrs_at(t))
            out.append([p.clone() for p in params])
        return out, engine.stats()

    tried, tried_stats = run(load=True)
    plain, plain_stats = run(load=False)
    assert_bitwise(tried, plain, "after a refused load")
    for key in COUNTERS:
        assert tried_stats[key] == plain_stats[key]


# ---- faults ----


def test_nan_gradient_raises_naming_the_parameter_and_changes_nothing():
    config = dict(topk_ratio=0.3, update_interval=3, overlap_step=True)
    params = make_params()
    ref = ReferenceZenFlow(params, GROUPS, config)
    engine = _C.Engine(params, copy.deepcopy(GROUPS), dict(config))
    for t in range(4):  # window 1 closed (its update in flight), window 2 open
        grads = make_grads(t)
        engine.step(grads, lrs_at(t))
        ref.step(grads, lrs_at(t))
    bad = make_grads(4)
    bad[3].view(-1)[7] = float("nan")
    before = [p.clone() for p in params]
    stats = engine.stats()
    with pytest.raises(ValueError) as info:
        engine.step(bad, lrs_at(4))
    assert re.search(r"(?<![\d.])3(?![\d.])", str(info.value)), str(info.value)
    with pytest.raises(ValueError):
        ref.step(bad, lrs_at(4))
    assert all(torch.equal(a, b) for a, b in zip(before, params)), "a NaN step wrote"
    for key in COUNTERS:
        assert engine.stats()[key] == stats[key]
    for t in range(4, 8):  # not sticky: the next steps work and match
        grads = make_grads(t)
        engine.step(grads, lrs_at(t))
        ref.step(grads, lrs_at(t))
        check_weights(params, ref, t + 1, "after a NaN step")
    check_counters(engine, ref, "after a NaN step")


def test_wrong_shape_gradient_at_step_57():
    config = dict(topk_ratio=0.3, update_interval=3, overlap_step=True)
    params = make_params()
    ref = ReferenceZenFlow(params, GROUPS, config)
    engine = _C.Engine(params, copy.deepcopy(GROUPS), dict(config))
    for t in range(56):
        grads = make_grads(t)
        engine.step(grads, lrs_at(0))
        ref.step(grads, lrs_at(0))
    check_weights(params, ref, 56, "before step 57")
    bad = make_grads(56)
    bad[0] = bad[0].t().contiguous()  # [13, 7] for a [7, 13] parameter
    before = [p.clone() for p in params]
    with pytest.raises(ValueError):
        engine.step(bad, lrs_at(0))
    assert all(torch.equal(a, b) for a, b in zip(before, params))
    assert engine.stats()["steps"] == 56
    grads = make_grads(56)
    engine.step(grads, lrs_at(0))
    ref.step(grads, lrs_at(0))
    check_weights(params, ref, 57, "after the refused step")
    check_counters(engine, ref, "step 57")


def run_python(code, timeout=120):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# A model large enough that a window's host update is still running when the script ends
# or closes the engine: window 1 closes at step 4 and (overlap) runs in the background.
MID_WINDOW = """
    import torch
    from zenflow import _C
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(256, 2003, generator=gen), torch.randn(2003, generator=gen)]
    engine = _C.Engine(params, [{"params": [0, 1], "lr": 1e-3, "weight_decay": 0.0}],
                       {"topk_ratio": 0.1, "update_interval": 4, "overlap_step": True})
    for t in range(6):
        engine.step([torch.randn(p.shape, generator=gen) for p in params])
"""


def test_close_mid_window_does_not_hang():
    result = run_python(
        MID_WINDOW
        + """
    engine.close()
    try:
        engine.step([torch.zeros_like(p) for p in params])
    except Exception as exc:  # refused after close: fine, as long as nothing crashes
        print("refused:", type(exc).__name__)
    del engine
    print("closed")
    """
    )
    assert result.returncode == 0, result.stderr
    assert "closed" in result.stdout


def test_garbage_collection_mid_window_does_not_hang():
    result = run_python(
        MID_WINDOW + "\n    del engine\n    import gc; gc.collect()\n    print('gc')\n"
    )
    assert result.returncode == 0, result.stderr
    assert "gc" in result.stdout


def test_interpreter_exit_mid_window_does_not_hang():
    result = run_python(MID_WINDOW + "\n    print('exiting')\n")
    assert result.returncode == 0, result.stderr
    assert "exiting" in result.stdout


def child_trajectory(conn):
    faulthandler.dump_traceback_later(60, exit=True)  # a hang shows where, then ends the child
    # GNU OpenMP's thread team (torch's intra-op pool) does not survive a fork: a child that
    # enters a torch parallel region can hang there, whatever zenflow does. torch's DataLoader
    # workers run with one intra-op thread for that reason; so does this child.
    torch.set_num_threads(1)
    try:
        conn.send(("ok", [[as64(p) for p in ws] for ws in trajectory(DET_CONFIG, steps=5)]))
    except BaseException as exc:  # noqa: BLE001 - report anything to the parent
        conn.send(("error", repr(exc)))
    finally:
        conn.close()


def test_fork_then_an_engine_in_the_child():
    # The parent has a live engine mid-window (its host lane running) when it forks.
    parent = _C.Engine(make_params(), copy.deepcopy(GROUPS), dict(DET_CONFIG))
    for t in range(4):
        parent.step(make_grads(t, rotate=True), lrs_at(t))
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=child_trajectory, args=(sender,))
    child.start()
    sender.close()
    try:
        assert receiver.poll(120), "the forked child hung"
        status, payload = receiver.recv()
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
            child.join()
    assert status == "ok", payload
    assert child.exitcode == 0
    parent.step(make_grads(4, rotate=True), lrs_at(4))  # the parent's engine still works
    parent.close()
    expected = trajectory(DET_CONFIG, steps=5)
    for t, (got, want) in enumerate(zip(payload, expected)):
        for i, (g, w) in enumerate(zip(got, want)):
            assert np.array_equal(g, as64(w)), f"child: param {i} after step {t + 1}"


def test_stats_keys_and_values():
    engine = _C.Engine(make_params(), copy.deepcopy(GROUPS), dict(DET_CONFIG))
    assert STAT_KEYS <= set(engine.stats())
    for t in range(5):
        engine.step(make_grads(t), lrs_at(t))
    stats = engine.stats()
    assert stats["steps"] == 5 and stats["skipped_steps"] == 0
    for key in STAT_KEYS:
        assert stats[key] >= 0, key
    assert 0.0 < stats["selected_fraction"] <= 1.0
    assert stats["host_state_bytes"] > 0


# ---- the host lane's traffic ----


@pytest.mark.parametrize(
    "schedule",
    [
        {"overlap_step": False},
        {"overlap_step": True},  # landing a step in; windows of one step: two upload copies
        {"overlap_step": True, "update_lag": "window"},  # two upload copies
    ],
    ids=["sync", "overlap", "overlap-lag-window"],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("interval", [1, 2, 4, 8])
def test_host_lane_bytes_follow_the_formula(interval, dtype, schedule):
    """Per deferred element and window of S steps, with g the gradient's bytes and w the
    weights' (here both the parameter dtype): a window's first accumulate reads g and writes
    the fp32 accumulator A (4), the next ones up to the window's last read g and A and write A
    (g + 8 each); the closing step is packed into the upload copy and fused into the update,
    which reads its g there, A (unless S = 1: nothing was accumulated), master, m, v, and
    writes master, m, v (12) and the upload copy (w) over it; A is not zeroed. Per deferred
    column, its int32 step count is read and written. Issue 29's floor, 10 (S - 1) + 28 for
    bf16: 58 B at S = 4 (74 B with A read at the first step and zeroed, 66 B unfused).
    Overlapped, every closing step is fused too (with a second upload copy where the last
    result can still be owed at the closing step); the flush lands the last window's."""
    shapes = [(16, 40), (8, 24), (5, 13)]
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    config = {"topk_ratio": 0.25, "update_interval": interval, **schedule}
    engine = _C.Engine(params, [{"params": [0, 1, 2], "lr": 1e-3}], config)
    windows = 3
    for _ in range(windows * interval):
        engine.step([torch.randn(s, generator=gen).to(dtype) for s in shapes], None)
    engine.flush()
    stats = engine.stats()
    engine.close()
    assert stats["windows"] == windows
    size = torch.tensor([], dtype=dtype).element_size()
    deferred = sum(r * (c - max(1, c // 4)) for r, c in shapes)
    columns = sum(c - max(1, c // 4) for r, c in shapes)
    read = deferred * (size * interval + 4 * (interval - 1) + 12) + 4 * columns
    written = deferred * (4 * (interval - 1) + 12 + size) + 4 * columns
    assert stats["host_lane_bytes_read"] == windows * read
    assert stats["host_lane_bytes_written"] == windows * written
    per_window = (read + written - 8 * columns) / deferred
    assert per_window == (size + 8) * interval + 16 + size
    if dtype == torch.bfloat16:
        assert per_window == 10 * (interval - 1) + 28


# ---- the stream passed with each call ----


def test_each_call_takes_its_stream_and_a_bad_one_changes_nothing():
    """The calls that run work take `stream` (None, an integer for every device, or one per
    device). On the host backend only 0 exists: another value, or a list of the wrong length,
    is a ValueError naming the stream, raised before the call changes anything; with stream=0
    the run is bit for bit the run that passes none."""
    config = {"topk_ratio": 0.3, "update_interval": 2}
    plain_params, streamed_params = make_params(), make_params()
    plain = _C.Engine(plain_params, copy.deepcopy(GROUPS), dict(config))
    streamed = _C.Engine(streamed_params, copy.deepcopy(GROUPS), dict(config))
    for t in range(5):
        grads = make_grads(t)
        plain.step(grads, lrs_at(t))
        before = [p.clone() for p in streamed_params]
        for bad, message in [(5, "stream"), ([0, 0], "stream"), ("0", "stream")]:
            with pytest.raises((ValueError, TypeError), match=message):
                streamed.step(grads, lrs_at(t), stream=bad)
            assert all(torch.equal(a, b) for a, b in zip(streamed_params, before))
        streamed.step(grads, lrs_at(t), stream=[0] if t % 2 else 0)
    plain.flush()
    streamed.flush(stream=0)
    for a, b in zip(plain_params, streamed_params):
        assert torch.equal(a, b)
    assert streamed.state_dict(stream=None).keys() == plain.state_dict().keys()
    streamed.load_state_dict(plain.state_dict(), stream=0)
    streamed.set_streams(None)
    # The split form: begin_step, submit and end_step take it too.
    streamed.begin_step(lrs_at(5), stream=0)
    streamed.submit(0, make_grads(5), stream=0)
    streamed.end_step(stream=0)
    streamed.close()
    plain.close()
