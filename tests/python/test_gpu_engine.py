"""The engine's CUDA backend against its host backend (marked `gpu`; skipped without a GPU or
without a CUDA build of zenflow; run by benchmarks/device/check.sh).

Every kernel of the CUDA backend matches its host twin bit for bit, so the same inputs give
the same weights: after EVERY step, the CUDA parameters (copied back on the engine's compute
stream) equal the CPU engine's, and after a flush the whole state_dict does. Covered: bf16,
fp32 and fp16 (dynamic loss scaling with an overflow step), top-k 0.1 with re-selections,
clipping, overlap on and off, the auto interval and window scores (the statistics read back
from the device), the split begin_step/submit/end_step form, gradient release (release_gradients: the same
weights, a lower peak of backward), a side stream, checkpoints
across the backends, ZenFlowAdamW with and without overlap_backward, a non-finite gradient
without loss scaling (found after its step, at the latest when the ring of scalar records is
full, sticky until a load), placement on a second GPU, an injected CUDA error (a subprocess:
the CUDA context dies) and short runs under compute-sanitizer memcheck and racecheck, and
(with two GPUs) one engine over parameters on both. The review findings of 2026-12-05: steps
without synchronisation (no "not ready" launch failure), a capturing stream refused with the
reason, a global capture on the training thread while the host lane waits, no context on
GPU 0 from an engine on GPU 1 (two GPUs), a library call leaving a fresh thread without a
context, and DLPack producers handed the engine's stream.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import zenflow
from zenflow import _C

pytestmark = pytest.mark.gpu
DEV = "cuda"

# Odd matrices (primes, 1xN, Nx1, a 3-d one, wide enough that top-k 0.1 keeps several
# columns), a vector, a scalar and a matrix in a dense group; three groups.
SHAPES = [(37, 61), (1, 47), (23, 1), (3, 5, 22), (64, 130), (9,), (), (4, 6)]
GROUPS = [
    {"params": [0, 1, 5], "lr": 1e-2, "weight_decay": 0.1},
    {"params": [2, 3, 4, 6], "lr": 2e-2, "weight_decay": 0.0},
    {"params": [7], "lr": 1.5e-2, "weight_decay": 0.05, "dense": True},
]
COUNTERS = ("steps", "windows", "reselections", "skipped_steps", "bytes_down", "bytes_up")
# Re-selection every 2 windows, overlap: the default path of the tests below. No clipping
# in the bitwise tests: the clip coefficient comes from the column sums of squares, which
# the kernel and its host twin may round differently in the last bit (zenflow/norms.h);
# clipping has its own test, with a tolerance of that size.
BASE = dict(
    topk_ratio=0.1,
    update_interval=2,
    select_strategy="step",
    select_interval=4,
    max_grad_norm=None,
    overlap_step=True,
)


@functools.lru_cache(maxsize=1)
def _no_cuda_engine_reason() -> str | None:
    """Why this zenflow cannot run an engine on CUDA tensors (a build without the CUDA
    backend), or None when it can."""
    try:
        engine = _C.Engine([torch.zeros(2, 3, device=DEV)], [{"params": [0], "lr": 1e-3}], None)
    except TypeError as error:  # NOT_SUPPORTED
        if "CUDA" in str(error):
            return f"no CUDA backend in this build of zenflow: {error}"
        raise
    engine.close()
    return None


@pytest.fixture(autouse=True)
def _needs_the_cuda_engine():
    reason = _no_cuda_engine_reason()
    if reason is not None:
        pytest.skip(reason)


def lrs_at(t):
    return [g["lr"] * (1.0 + 0.05 * t) for g in GROUPS]


def make_params(dtype, seed=0, shapes=SHAPES):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen).to(dtype) for s in shapes]


def make_grads(t, dtype, shapes=SHAPES, scale=1.0):
    """Gradients of call t (CPU); a boosted column band moves with t, so that successive
    selections pick different columns."""
    gen = torch.Generator().manual_seed(1000 + t)
    grads = []
    for s in shapes:
        g = torch.randn(s, generator=gen)
        if len(s) >= 2:
            view = g.view(s[0], -1)
            view[:, (5 * t) % view.shape[1]] *= 6.0
        grads.append((g * scale).to(dtype))
    return grads


def cuda_engine(params, config, groups=GROUPS):
    """An engine over CUDA `params` as ZenFlowAdamW builds one: device memory from torch's
    caching allocator, the current stream."""
    engine = _C.Engine(params, copy.deepcopy(groups), dict(config))
    device = params[0].device
    memory = torch.empty(engine.device_memory_size(), dtype=torch.uint8, device=device)
    engine.attach_device_memory(memory)
    engine.set_stream(torch.cuda.current_stream(device).cuda_stream)
    return engine


def drive(engine, grads, lrs, split):
    """One step: whole, or begin_step + submit in backward order (split = chunk sizes), or
    readiness ("ready": mark_ready in backward order, then end_step_with; "retake": every
    gradient marked first as zeros, then as itself, so the engine retakes the step whole)."""
    if split is None:
        engine.step(grads, lrs)
        return
    if split in ("ready", "retake"):
        engine.begin_step(lrs)
        if split == "retake":
            zeros = [torch.zeros_like(g) for g in grads]
            for i in reversed(range(len(grads))):
                engine.mark_ready(i, zeros[i])
        for i in reversed(range(len(grads))):
            engine.mark_ready(i, grads[i])
        engine.end_step_with(grads)
        return
    engine.begin_step(lrs)
    first = len(grads)
    for size in reversed(split):
        first -= size
        engine.submit(first, grads[first : first + size])
    assert first == 0
    engine.end_step()


def _close(got, want, exact):
    if exact:
        return torch.equal(got, want)
    if not got.is_floating_point():
        return torch.equal(got, want)
    # one ulp of the clip coefficient: fp32 state within 1e-5; a low-precision weight may
    # round the other way (one ulp of its dtype)
    rtol = 1e-5 if got.dtype == torch.float32 else 2.0**-7
    return torch.allclose(got.float(), want.float(), rtol=rtol, atol=1e-6)


def assert_same_weights(cuda_params, cpu_params, what, exact=True):
    # .cpu() runs on the current stream: the engine's compute stream in these tests.
    for i, (d, h) in enumerate(zip(cuda_params, cpu_params)):
        got = d.cpu()
        assert got.dtype == h.dtype and _close(got, h, exact), f"{what}: param {i} differs"


def assert_same_state(a, b, what, exact=True):
    for i, (ea, eb) in enumerate(zip(a["params"], b["params"])):
        assert set(ea) == set(eb), f"{what}: param {i} entries"
        for key in ea:
            assert ea[key].device.type == "cpu", f"{what}: state {i}.{key} not on the CPU"
            assert _close(ea[key], eb[key], exact), f"{what}: state {i}.{key} differs"
    assert a["schedule"] == b["schedule"], what
    assert a["loss_scaler"] == b["loss_scaler"], what


def run_pair(
    config, steps, dtype, split=None, overflow_at=None, scale=1.0, exact=True, hparams=None
):
    """The CUDA and the host engine from the same parameters and gradients, compared after
    every step, then their flushed states (hparams: t -> (betas, eps, weight decays) set on
    both before step t). Returns both engines and parameter lists."""
    cpu_params = make_params(dtype)
    cuda_params = [p.to(DEV) for p in cpu_params]
    host = _C.Engine(cpu_params, copy.deepcopy(GROUPS), dict(config))
    device = cuda_engine(cuda_params, config)
    for t in range(steps):
        assert device.loss_scale == host.loss_scale, f"loss scale at step {t + 1}"
        grads = make_grads(t, dtype, scale=scale * host.loss_scale)
        if t == overflow_at:
            grads[3].view(-1)[2] = float("inf")
        if hparams is not None:
            host.set_hyperparameters(*hparams(t))
            device.set_hyperparameters(*hparams(t))
        drive(host, grads, lrs_at(t), split)
        drive(device, [g.to(DEV) for g in grads], lrs_at(t), split)
        assert_same_weights(cuda_params, cpu_params, f"after step {t + 1}", exact)
    stats_d, stats_h = device.stats(), host.stats()
    for key in (*COUNTERS, "host_lane_bytes_read", "host_lane_bytes_written"):
        assert stats_d[key] == stats_h[key], key
    assert_same_state(device.state_dict(), host.state_dict(), "flushed state", exact)
    assert_same_weights(cuda_params, cpu_params, "after the flush", exact)
    return device, host, cuda_params, cpu_params


# ---- (a) the CUDA engine equals the host engine, bit for bit ----


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_same_weights_as_the_host_backend(dtype, overlap):
    device, host, _, _ = run_pair(dict(BASE, overlap_step=overlap), steps=11, dtype=dtype)
    assert device.stats()["reselections"] >= 1
    stats = device.stats()
    assert stats["device_bytes"] == device.device_memory_size()
    assert stats["pinned_host_bytes"] > 0
    device.close()
    host.close()


def test_the_start_detection_and_the_moments_change_equal_the_host_engine():
    """auto_warm_up_rounds on CUDA: 8 synchronous steps, the decision from the host's moments,
    the first window's change of the moments, all as the host engine, bit for bit."""
    device, host, _, _ = run_pair(dict(BASE, auto_warm_up_rounds=10), steps=16, dtype=torch.float32)
    assert device.stats()["synchronous_start_steps"] == host.stats()["synchronous_start_steps"] > 0
    device.close()
    host.close()


def test_split_submit_form():
    run_pair(BASE, steps=9, dtype=torch.bfloat16, split=[1, 2, 2, 3])


@pytest.mark.parametrize("form", ["ready", "retake"])
def test_readiness_and_a_retaken_step_equal_the_host_engine(form):
    """mark_ready / end_step_with on the CUDA backend: runs submitted during the step
    (staging slots packed and copied down), and a step retaken whole after every gradient
    grew past its submit, equal the host engine bit for bit."""
    run_pair(dict(BASE, bucket_bytes=64), steps=9, dtype=torch.bfloat16, split=form)


@pytest.mark.parametrize("lag", [1, 2, "window"])
def test_update_lag_lands_where_the_host_engine_lands_it(lag):
    """update_lag on the CUDA backend: a result landing between window closes (an upload
    and scatter at a step that closes nothing) equals the host engine bit for bit."""
    run_pair(dict(BASE, update_lag=lag), steps=11, dtype=torch.bfloat16)


def test_per_step_hyperparameters_equal_the_host_engine():
    def hparams(t):
        phase = (t % 5) / 5.0
        return (0.85 + 0.1 * phase, 0.99 + 0.009 * phase), 1e-8 * (1 + t), [0.1 * t, 0.0, 0.01]

    run_pair(BASE, steps=9, dtype=torch.bfloat16, hparams=hparams)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_clipping_within_the_last_bit_of_the_column_sums(dtype):
    config = dict(BASE, max_grad_norm=1.0)
    device, host, _, _ = run_pair(config, steps=9, dtype=dtype, split=[1, 2, 2, 3], exact=False)
    norm_d, norm_h = device.stats()["last_global_norm"], host.stats()["last_global_norm"]
    assert abs(norm_d - norm_h) <= 1e-6 * norm_h


def test_no_master_weights():
    config = dict(BASE, master_weights="none")
    run_pair(config, steps=7, dtype=torch.bfloat16)


def test_auto_interval_and_window_scores_read_back():
    config = dict(BASE, update_interval="auto", max_update_interval=3, selection_score="window")
    device, _, _, _ = run_pair(config, steps=10, dtype=torch.bfloat16)
    assert device.stats()["stall_seconds_readback"] >= 0.0


def test_fp16_dynamic_loss_scaling_with_an_overflow_step():
    config = dict(BASE, loss_scaling="dynamic", initial_scale=1024.0, growth_interval=3)
    device, host, _, _ = run_pair(config, steps=9, dtype=torch.float16, overflow_at=4, scale=0.01)
    assert device.stats()["skipped_steps"] == host.stats()["skipped_steps"] == 1
    assert device.loss_scale == host.loss_scale


def test_side_stream():
    """The engine on a stream that is not the default: gradients made there, weights read
    there."""
    dtype = torch.bfloat16
    cpu_params = make_params(dtype)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        cuda_params = [p.to(DEV) for p in cpu_params]
        device = cuda_engine(cuda_params, BASE)
    host = _C.Engine(cpu_params, copy.deepcopy(GROUPS), dict(BASE))
    for t in range(9):
        grads = make_grads(t, dtype)
        host.step(grads, lrs_at(t))
        with torch.cuda.stream(stream):
            device.step([g.to(DEV) for g in grads], lrs_at(t))
            assert_same_weights(cuda_params, cpu_params, f"side stream, step {t + 1}")
    with torch.cuda.stream(stream):
        assert_same_state(device.state_dict(), host.state_dict(), "side stream")


# ---- (b) checkpoints across the backends ----


@pytest.mark.parametrize("saved_on", ["cuda", "cpu"])
def test_checkpoint_loads_across_backends_and_continues_bitwise(saved_on):
    dtype = torch.bfloat16
    params = make_params(dtype)
    if saved_on == "cuda":
        params = [p.to(DEV) for p in params]
        first = cuda_engine(params, BASE)
    else:
        first = _C.Engine(params, copy.deepcopy(GROUPS), dict(BASE))
    for t in range(7):
        first.step([g.to(params[0].device) for g in make_grads(t, dtype)], lrs_at(t))
    state = copy.deepcopy(first.state_dict())  # flushes; CPU tensors
    for entry in state["params"]:
        assert all(value.device.type == "cpu" for value in entry.values())
    if saved_on == "cuda":
        other = [p.cpu() for p in params]
        second = _C.Engine(other, copy.deepcopy(GROUPS), dict(BASE))
    else:
        other = [p.to(DEV) for p in params]
        second = cuda_engine(other, BASE)
    second.load_state_dict(state)
    for t in range(7, 15):
        grads = make_grads(t, dtype)
        first.step([g.to(params[0].device) for g in grads], lrs_at(t))
        second.step([g.to(other[0].device) for g in grads], lrs_at(t))
        for i, (a, b) in enumerate(zip(params, other)):
            assert torch.equal(a.cpu(), b.cpu()), f"param {i} differs after step {t + 1}"
    assert_same_state(first.state_dict(), second.state_dict(), "after the checkpoint")


# ---- ZenFlowAdamW on CUDA ----


class Linearish(torch.nn.Module):
    """Parameters whose gradients are the same bits on the CPU and the GPU: the loss is
    sum(p * c) with constants c, so backward hands each parameter exactly c (times the loss
    scale), through the post-accumulate-grad hooks of overlap_backward."""

    def __init__(self, dtype):
        super().__init__()
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(p) for p in make_params(dtype, seed=5)
        )

    def loss(self, coefficients):
        # Weights may sit on several devices (the "split" placement): each term is moved to
        # the first weight's device, and backward carries its gradient back.
        home = self.weights[0].device
        return sum(
            (p * c.to(p.device)).sum().float().to(home) for p, c in zip(self.weights, coefficients)
        )

    def split_over_two_gpus(self):
        """Weight i on cuda:(i % 2): every group and every run of parameters spans both."""
        with torch.no_grad():
            for i, p in enumerate(self.weights):
                p.data = p.data.to(f"cuda:{i % 2}")
        return self


def _optimizer_run(device, dtype, overlap, steps, options, checkpoint_at=None, resume=None):
    """Trains `steps` steps; with checkpoint_at, returns (state_dict, weights) right after
    step checkpoint_at (the state_dict flushes); with resume = such a pair, starts there.
    Returns (weights after every step, final state_dict, stats, checkpoint)."""
    model = Linearish(dtype)
    model = model.split_over_two_gpus() if device == "split" else model.to(device)
    if device == "split":
        device = "cpu"  # the coefficients: the loss moves each to its weight's device
    if resume is not None:
        with torch.no_grad():
            for p, saved in zip(model.weights, resume[1]):
                p.copy_(saved)
    groups = [
        {"params": [model.weights[i] for i in (0, 1, 5)], "weight_decay": 0.1},
        {"params": [model.weights[i] for i in (2, 3, 4, 6)], "lr": 2e-2, "weight_decay": 0.0},
        {"params": [model.weights[7]], "weight_decay": 0.05, "zenflow": False},
    ]
    opt = zenflow.ZenFlowAdamW(groups, lr=1e-2, **options)
    if resume is not None:
        opt.load_state_dict(resume[0])
    if overlap:
        opt.overlap_backward(model)
    history = []
    saved = None
    start = 0 if resume is None else checkpoint_at
    for t in range(start, steps):
        coefficients = [g.to(device) for g in make_grads(t, dtype, scale=0.1)]
        if dtype == torch.float16 and t == 4:  # dynamic loss scaling: an overflow step
            coefficients[3].view(-1)[2] = float("inf")
        loss = model.loss(coefficients)
        opt.scale_loss(loss).backward()
        opt.step()
        opt.zero_grad()
        history.append([p.detach().cpu() for p in model.weights])
        if checkpoint_at is not None and resume is None and t + 1 == checkpoint_at:
            saved = (copy.deepcopy(opt.state_dict()), [p.detach().cpu() for p in model.weights])
    final = opt.state_dict()
    stats = opt.stats()
    opt.close()
    return history, final, stats, saved


OPTIONS = [
    pytest.param(torch.bfloat16, dict(topk_ratio=0.1, update_interval=2), id="bf16"),
    pytest.param(torch.float32, dict(topk_ratio=0.1, overlap_step=False), id="fp32"),
    pytest.param(
        torch.float16,
        dict(topk_ratio=0.1, update_interval=2, initial_scale=256.0, growth_interval=3),
        id="fp16-dynamic",
    ),
]


@pytest.mark.parametrize(
    ("overlap", "release"),
    [(False, False), (True, False), (True, True)],
    ids=["step", "overlap_backward", "release_gradients"],
)
@pytest.mark.parametrize(("dtype", "options"), OPTIONS)
def test_zenflow_adamw_on_cuda_equals_cpu(dtype, options, overlap, release):
    """release_gradients (issue 29): the CUDA engine reads the compact copy of each released
    bucket's selected columns, as the host engine does."""
    options = dict(options, select_strategy="step", select_interval=4)
    if release:
        options.update(release_gradients=True, bucket_bytes=1)
    on_cpu = _optimizer_run("cpu", dtype, overlap, 9, options)
    on_cuda = _optimizer_run(DEV, dtype, overlap, 9, options)
    for t, (a, b) in enumerate(zip(on_cpu[0], on_cuda[0])):
        for i, (x, y) in enumerate(zip(a, b)):
            assert torch.equal(x, y), f"param {i} differs after step {t + 1}"
    for key in ("skipped_steps", "held_gradient_bytes_peak"):
        assert on_cpu[2][key] == on_cuda[2][key], key
    assert on_cuda[2]["skipped_steps"] == (1 if dtype == torch.float16 else 0)
    for index, entry in on_cpu[1]["state"].items():
        for key, value in entry.items():
            other = on_cuda[1]["state"][index][key]
            assert other.device.type == "cpu" and torch.equal(value, other), (index, key)
    assert on_cpu[1]["zenflow"] == on_cuda[1]["zenflow"]


def test_released_gradients_lower_the_peak_gpu_memory_of_backward():
    """Eight bf16 [1024, 1024] layers (16 MiB of gradients): with release_gradients the
    peak of a backward that is not a selection step holds about one layer's gradient instead
    of all eight."""

    def backward_peak(release):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            *(
                torch.nn.Linear(1024, 1024, bias=False, device=DEV, dtype=torch.bfloat16)
                for _ in range(8)
            )
        )
        opt = zenflow.ZenFlowAdamW(
            model.parameters(), lr=1e-3, release_gradients=release, bucket_bytes=1
        )
        opt.overlap_backward(model)
        x = torch.randn(16, 1024, device=DEV, dtype=torch.bfloat16)
        peak = 0
        for _ in range(3):  # the first step selects (it holds every gradient)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            model(x).float().square().mean().backward()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
            opt.step()
            opt.zero_grad()
        opt.close()
        return peak

    kept, released = backward_peak(False), backward_peak(True)
    gradients = 8 * 1024 * 1024 * 2
    assert released <= kept - gradients // 2, (kept, released)


def test_zenflow_adamw_attaches_device_memory_from_torch():
    model = Linearish(torch.bfloat16).to(DEV)
    before = torch.cuda.memory_allocated()
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2)
    grown = torch.cuda.memory_allocated() - before
    assert grown >= opt._engine.device_memory_size() > 0
    assert opt.stats()["device_bytes"] == opt._engine.device_memory_size()
    opt.close()


def test_zenflow_adamw_checkpoint_across_cpu_and_cuda():
    options = dict(topk_ratio=0.1, update_interval=2, select_strategy="step", select_interval=4)
    whole = _optimizer_run(DEV, torch.bfloat16, True, 10, options, checkpoint_at=5)
    # The uninterrupted run also flushed at step 5 (its state_dict): the loads continue it.
    saved = whole[3]
    assert all(
        value.device.type == "cpu" for e in saved[0]["state"].values() for value in e.values()
    )
    cpu_rest = _optimizer_run("cpu", torch.bfloat16, False, 10, options, 5, saved)
    cuda_rest = _optimizer_run(DEV, torch.bfloat16, True, 10, options, 5, saved)
    for rest in (cpu_rest, cuda_rest):
        for t, (a, b) in enumerate(zip(whole[0][5:], rest[0])):
            for i, (x, y) in enumerate(zip(a, b)):
                assert torch.equal(x, y), f"param {i} differs after step {t + 6}"


# ---- a non-finite gradient without loss scaling: found after its step, sticky ----
# The contract (engine.h, docs/design.md section 8): the step writes nothing; the first
# call that finds its scalars copied raises, the next call once the device has finished the
# step, at the latest the 8th step call after it, or any flush; steps between run as usual;
# the error is sticky until a load.

SCALAR_RECORDS = (
    8  # the engine's ring of step-scalar records (scalar_readback.hpp: ScalarReadback::kRecords)
)


def _nan_grads(t, dtype):
    bad = [g.to(DEV) for g in make_grads(t, dtype)]
    bad[4].view(-1)[11] = float("nan")
    return bad


def test_nan_gradient_without_loss_scaling_writes_nothing_and_the_next_call_raises_once_it_is_done():
    dtype = torch.bfloat16
    params = [p.to(DEV) for p in make_params(dtype)]
    engine = cuda_engine(params, BASE)
    for t in range(3):
        engine.step([g.to(DEV) for g in make_grads(t, dtype)], lrs_at(t))
    state = copy.deepcopy(engine.state_dict())
    torch.cuda.synchronize()
    before = [p.cpu() for p in params]
    engine.step(_nan_grads(3, dtype), lrs_at(3))  # returns: the device has not looked yet
    torch.cuda.synchronize()
    assert_same_weights(params, before, "the NaN step wrote")
    good = [g.to(DEV) for g in make_grads(4, dtype)]
    for _ in range(2):  # found by the next call (the step is done), then sticky
        with pytest.raises(ValueError, match="non-finite gradient"):
            engine.step(good, lrs_at(4))
    with pytest.raises(ValueError, match="non-finite gradient"):
        engine.flush()
    torch.cuda.synchronize()
    assert_same_weights(params, before, "a refused call wrote")
    engine.load_state_dict(state)
    host_params = [p.clone() for p in before]
    host = _C.Engine(host_params, copy.deepcopy(GROUPS), dict(BASE))
    host.load_state_dict(state)
    for t in range(4, 8):
        grads = make_grads(t, dtype)
        engine.step([g.to(DEV) for g in grads], lrs_at(t))
        host.step(grads, lrs_at(t))
        assert_same_weights(params, host_params, f"after the load, step {t + 1}")


def test_nan_gradient_without_loss_scaling_is_raised_within_the_ring_even_when_the_device_lags():
    """No synchronisation: the device is kept busy behind a sleep, so the NaN step's
    scalars are not copied when the next calls come; the error must still come, at the
    latest when the ring of records is full."""
    dtype = torch.bfloat16
    params = [p.to(DEV) for p in make_params(dtype)]
    engine = cuda_engine(params, BASE)
    engine.step([g.to(DEV) for g in make_grads(0, dtype)], lrs_at(0))
    torch.cuda._sleep(200_000_000)  # ~0.1 s or more of device time before the NaN step
    engine.step(_nan_grads(1, dtype), lrs_at(1))
    calls = 0
    with pytest.raises(ValueError, match="non-finite gradient"):
        for t in range(2, 2 + SCALAR_RECORDS + 1):
            calls += 1
            engine.step([g.to(DEV) for g in make_grads(t, dtype)], lrs_at(t))
    assert 1 <= calls <= SCALAR_RECORDS
    with pytest.raises(ValueError, match="non-finite gradient"):
        engine.step([g.to(DEV) for g in make_grads(20, dtype)], lrs_at(20))
    engine.close()


# ---- the review findings of 2026-12-05 (issue 24) ----


def test_steps_without_synchronisation_never_fail_on_a_not_ready_query():
    """The previous step's scalar copy is usually not done when the next step starts: the
    engine's query must not leave "not ready" behind for the next launch check."""
    dtype = torch.bfloat16
    params = [p.to(DEV) for p in make_params(dtype)]
    engine = cuda_engine(params, BASE)
    grads = [[g.to(DEV) for g in make_grads(t, dtype)] for t in range(6)]
    for t in range(60):
        if t % 7 == 0:
            torch.cuda._sleep(20_000_000)  # keep the device behind the host now and then
        engine.step(grads[t % 6], lrs_at(t))
    engine.flush()
    engine.close()


def test_a_capturing_stream_is_refused_with_the_reason():
    dtype = torch.bfloat16
    params = [p.to(DEV) for p in make_params(dtype)]
    engine = cuda_engine(params, BASE)
    grads = [g.to(DEV) for g in make_grads(0, dtype)]
    engine.step(grads, lrs_at(0))
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(BaseException) as info:  # noqa: B017 (torch may raise at capture_end too)
        with torch.cuda.graph(graph, stream=side):
            engine.set_stream(torch.cuda.current_stream().cuda_stream)
    chain, error = [], info.value
    while error is not None:
        chain.append(str(error))
        error = error.__context__ or error.__cause__
    assert any("capturing a CUDA graph" in text for text in chain), chain
    # ZenFlowAdamW: opt.step() inside a capture says so too, and nothing changed.
    model = torch.nn.Linear(64, 32).to(DEV)
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2, topk_ratio=0.1)
    model(torch.randn(8, 64, device=DEV)).sum().backward()
    opt.step()
    torch.cuda.synchronize()
    weights = model.weight.detach().clone()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(BaseException) as info:  # noqa: B017
        with torch.cuda.graph(graph, stream=side):
            opt.step()
    chain, error = [], info.value
    while error is not None:
        chain.append(str(error))
        error = error.__context__ or error.__cause__
    assert any("capturing a CUDA graph" in text for text in chain), chain
    torch.cuda.synchronize()
    assert torch.equal(model.weight.detach(), weights)
    engine.step(grads, lrs_at(1))  # the engines still work
    opt.step()
    opt.close()
    engine.close()


def test_the_host_lane_does_not_disturb_a_global_capture_on_the_training_thread():
    """The host lane waits for its copies (cudaEventSynchronize) while the caller captures
    its forward pass in global mode: the lane's thread-local capture mode keeps the capture
    valid, and the replay gives the eager result."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).to(DEV)
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-3, topk_ratio=0.1, update_interval=1)
    static_in = torch.randn(64, 1024, device=DEV)
    capture_model = torch.nn.Linear(256, 256).to(DEV)
    capture_in = torch.randn(32, 256, device=DEV)
    capture_model(capture_in)  # warm-up outside the capture (cuBLAS's handle and workspace)
    for _ in range(6):
        model(static_in).square().mean().backward()
        opt.step()  # a window closes each step: the host lane has work in flight
        opt.zero_grad()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side, capture_error_mode="global"):
            out = capture_model(capture_in)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, capture_model(capture_in))
    opt.close()


def _subprocess(code: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_an_engine_on_gpu_one_creates_no_context_on_gpu_zero():
    """Every rank of an 8-GPU node would otherwise hold ~0.5 GB on GPU 0: the host lane's
    waits and the device scopes' restores must not create a context there."""
    result = _subprocess(
        """
        import ctypes, torch, zenflow
        cuda = ctypes.CDLL("libcuda.so.1")
        def active(ordinal):
            device, flags, state = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
            assert cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0
            assert cuda.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(state)) == 0
            return bool(state.value)
        torch.cuda.set_device(1)
        model = torch.nn.Linear(512, 512).to("cuda:1")
        opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-3, topk_ratio=0.1, update_interval=2)
        for _ in range(8):
            model(torch.randn(16, 512, device="cuda:1")).sum().backward()
            opt.step()
            opt.zero_grad()
        opt.flush()
        torch.cuda.synchronize(1)
        print("GPU0_CONTEXT", active(0), "GPU1_CONTEXT", active(1))
        """
    )
    assert result.returncode == 0, result.stderr
    assert "GPU0_CONTEXT False GPU1_CONTEXT True" in result.stdout, result.stdout


def test_a_library_call_on_a_fresh_thread_leaves_it_without_a_context():
    """A thread with no CUDA context calls an op: afterwards the thread has none again (the
    scope puts back exactly what it found)."""
    result = _subprocess(
        """
        import ctypes, threading, torch
        from zenflow import ops
        cuda = ctypes.CDLL("libcuda.so.1")
        grads = [torch.randn(64, 48, device="cuda")]
        torch.cuda.synchronize()
        seen = {}
        def worker():
            ctx = ctypes.c_void_p()
            cuda.cuCtxGetCurrent(ctypes.byref(ctx)); seen["before"] = ctx.value
            stats = ops.column_stats(grads)
            torch.cuda.synchronize()
            cuda.cuCtxGetCurrent(ctypes.byref(ctx)); seen["after"] = ctx.value
        t = threading.Thread(target=worker); t.start(); t.join()
        print("BEFORE", seen["before"], "AFTER", seen["after"])
        """
    )
    assert result.returncode == 0, result.stderr
    assert "BEFORE None AFTER None" in result.stdout, result.stdout


def test_dlpack_producers_are_handed_the_engine_stream():
    """A non-torch producer (here a wrapper that records what it is asked) gets the engine's
    compute stream, not the legacy default stream, so its pending work is ordered first."""
    dtype = torch.float32
    params = [p.to(DEV) for p in make_params(dtype)]
    engine = cuda_engine(params, BASE)
    side = torch.cuda.Stream()
    engine.set_stream(side.cuda_stream)
    asked = []

    class Producer:
        def __init__(self, tensor):
            self.tensor = tensor

        def __dlpack_device__(self):
            return self.tensor.__dlpack_device__()

        def __dlpack__(self, **kwargs):
            asked.append(kwargs.get("stream"))
            kwargs.pop("max_version", None)
            return self.tensor.__dlpack__(**kwargs)

    grads = [Producer(g.to(DEV)) for g in make_grads(0, dtype)]
    engine.step(grads, lrs_at(0))
    torch.cuda.synchronize()
    assert asked and all(stream == side.cuda_stream for stream in asked), asked
    engine.close()


# ---- (c) placement on a second GPU ----

two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
)


@two_gpus
def test_parameters_on_the_second_gpu_with_the_first_current():
    dtype = torch.bfloat16
    torch.cuda.set_device(0)
    cpu_params = make_params(dtype)
    params = [p.to("cuda:1") for p in cpu_params]
    host = _C.Engine(cpu_params, copy.deepcopy(GROUPS), dict(BASE))
    engine = cuda_engine(params, BASE)
    assert torch.cuda.current_device() == 0
    for t in range(7):
        grads = make_grads(t, dtype)
        host.step(grads, lrs_at(t))
        engine.set_stream(torch.cuda.current_stream(1).cuda_stream)
        engine.step([g.to("cuda:1") for g in grads], lrs_at(t))
        assert torch.cuda.current_device() == 0, "the engine left cuda:1 current"
        with torch.cuda.device(1):
            assert_same_weights(params, cpu_params, f"cuda:1, step {t + 1}")
    engine.flush()
    assert torch.cuda.current_device() == 0
    with pytest.raises((ValueError, TypeError), match=r"grads\[0\]|cuda|device"):
        engine.step([g.to("cuda:0") for g in make_grads(8, dtype)], lrs_at(8))
    assert torch.cuda.current_device() == 0


def two_gpu_engine(params, config):
    """An engine over parameters on several GPUs, as ZenFlowAdamW builds one: each device's
    memory from torch's caching allocator and its current stream."""
    engine = _C.Engine(params, copy.deepcopy(GROUPS), dict(config))
    for index, name in enumerate(engine.devices()):
        memory = torch.empty(engine.device_memory_size(index), dtype=torch.uint8, device=name)
        engine.attach_device_memory(memory, index)
        engine.set_stream(torch.cuda.current_stream(name).cuda_stream, index)
    return engine


@two_gpus
@pytest.mark.parametrize(
    ("overlap", "split", "clip"),
    [(True, None, False), (False, None, False), (True, [3, 2, 3], False), (True, None, True)],
    ids=["overlap", "no-overlap", "split-submit", "clipping"],
)
def test_an_engine_over_two_gpus_equals_the_host_engine(overlap, split, clip):
    """Parameters alternate between cuda:0 and cuda:1 (every group and every submitted range
    spans both): one engine drives both devices, with one norm and one schedule, and its
    weights equal the host engine's after every step (bit for bit without clipping: the
    devices' sums of squares are added in another order than the host's, so the clip
    coefficient may differ in its last bit)."""
    dtype = torch.bfloat16
    torch.cuda.set_device(0)
    config = dict(BASE, overlap_step=overlap, max_grad_norm=0.5 if clip else None)
    cpu_params = make_params(dtype)
    params = [p.to(f"cuda:{i % 2}") for i, p in enumerate(cpu_params)]
    host = _C.Engine(cpu_params, copy.deepcopy(GROUPS), dict(config))
    engine = two_gpu_engine(params, config)
    assert engine.devices() == ["cuda:0", "cuda:1"]
    with pytest.raises(ValueError, match="index"):
        engine.device_memory_size()  # two devices: which one must be said
    for t in range(9):
        grads = make_grads(t, dtype)
        drive(host, grads, lrs_at(t), split)
        drive(engine, [g.to(p.device) for g, p in zip(grads, params)], lrs_at(t), split)
        assert torch.cuda.current_device() == 0, "the engine left another device current"
        for i, (d, h) in enumerate(zip(params, cpu_params)):
            with torch.cuda.device(d.device):
                got = d.cpu()
            assert _close(got, h, not clip), f"param {i} ({d.device}) differs after step {t + 1}"
    stats_d, stats_h = engine.stats(), host.stats()
    for key in COUNTERS:
        assert stats_d[key] == stats_h[key], key
    assert_same_state(engine.state_dict(), host.state_dict(), "flushed state", not clip)


@two_gpus
def test_zenflow_adamw_over_two_gpus_equals_cpu():
    """A model split over two GPUs, with overlap_backward (autograd hands each device's
    gradients from a thread of its own): the weights equal the CPU run's after every step,
    and a checkpoint moves between the placements."""
    torch.cuda.set_device(0)
    options = dict(topk_ratio=0.1, update_interval=2, select_strategy="step", select_interval=4)
    for overlap in (False, True):
        on_cpu = _optimizer_run("cpu", torch.bfloat16, overlap, 8, options)
        split = _optimizer_run("split", torch.bfloat16, overlap, 8, options, checkpoint_at=4)
        for t, (a, b) in enumerate(zip(on_cpu[0], split[0])):
            for i, (x, y) in enumerate(zip(a, b)):
                assert torch.equal(x, y), (
                    f"param {i} differs after step {t + 1} (overlap {overlap})"
                )
        rest = _optimizer_run("cpu", torch.bfloat16, False, 8, options, 4, split[3])
        for t, (a, b) in enumerate(zip(split[0][4:], rest[0])):
            assert all(torch.equal(x, y) for x, y in zip(a, b)), f"resumed on the CPU, step {t + 5}"
    with pytest.raises(ValueError, match="all on the CPU or all on CUDA"):
        zenflow.ZenFlowAdamW(
            [
                torch.nn.Parameter(torch.zeros(3, device="cuda:1")),
                torch.nn.Parameter(torch.zeros(3)),
            ]
        )


@two_gpus
def test_zenflow_adamw_on_the_second_gpu():
    torch.cuda.set_device(0)
    options = dict(topk_ratio=0.1, update_interval=2)
    on_cpu = _optimizer_run("cpu", torch.bfloat16, True, 6, options)
    on_gpu1 = _optimizer_run("cuda:1", torch.bfloat16, True, 6, options)
    assert torch.cuda.current_device() == 0
    for a, b in zip(on_cpu[0], on_gpu1[0]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


# ---- (d) an injected CUDA error: a clear error from the next engine call, no hang ----

# A bad write on the engine's stream between two steps: with cupy, a kernel that stores to
# an unmapped address (an illegal address); without, a torch indexing kernel out of bounds
# (a device-side assert). Either error is sticky: the CUDA context is gone, so this runs in
# a subprocess. The next engine calls must raise (not hang), and so must destroying it not.
INJECTED_ERROR = """
    import sys, time, torch
    from zenflow import _C
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(256, 1031, generator=gen).to(dev, torch.bfloat16),
              torch.randn(1031, generator=gen).to(dev, torch.bfloat16)]
    engine = _C.Engine(params, [{"params": [0, 1], "lr": 1e-3}],
                       {"topk_ratio": 0.1, "update_interval": 2, "overlap_step": True})
    memory = torch.empty(engine.device_memory_size(), dtype=torch.uint8, device=dev)
    engine.attach_device_memory(memory)
    engine.set_stream(torch.cuda.current_stream().cuda_stream)
    grads = [torch.randn(p.shape, generator=gen).to(dev, p.dtype) for p in params]
    for _ in range(3):
        engine.step(grads)
    torch.cuda.synchronize()
    try:
        import cupy
        kernel = cupy.RawKernel(
            'extern "C" __global__ void bad(float* p) { p[threadIdx.x] = 1.0f; }', "bad")
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            kernel((1,), (32,), (cupy.uint64(16),))
        print("injected: illegal address (cupy)", flush=True)
    except ImportError:
        target = torch.zeros(8, device=dev)
        target[torch.tensor([1 << 30], device=dev)] = 1.0
        print("injected: out-of-bounds index (torch)", flush=True)
    time.sleep(0.5)  # let the fault happen on the device before the next engine call
    raised = None
    for call in range(4):
        try:
            if call < 3:
                engine.step(grads)
            else:
                engine.flush()
        except Exception as error:
            raised = call
            print("raised-call:", call, flush=True)
            print("raised-type:", type(error).__name__, flush=True)
            print("raised-message:", " ".join(str(error).split()), flush=True)
            break
    if raised is not None:
        try:
            engine.step(grads)
            print("sticky: no", flush=True)
        except Exception as error:
            print("sticky: yes", type(error).__name__, flush=True)
    engine.close()
    print("closed", flush=True)
    sys.stdout.flush()
    import os
    os._exit(0)  # torch's own teardown in a dead context is not under test
"""


def _run_python(code: str, timeout: float, env: dict | None = None, prefix=()):
    return subprocess.run(
        [*prefix, sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def test_injected_cuda_error_is_a_clear_error_without_a_hang():
    result = _run_python(INJECTED_ERROR, timeout=120)
    out = result.stdout
    assert "injected:" in out, result.stderr[-3000:]
    call = re.search(r"^raised-call: (\d+)$", out, re.MULTILINE)
    assert call, f"no engine call raised after the fault:\n{out}\n{result.stderr[-3000:]}"
    assert call.group(1) == "0", f"the first call after the fault did not raise:\n{out}"
    message = re.search(r"^raised-message: (.*)$", out, re.MULTILINE).group(1)
    assert re.search(r"cuda|illegal|assert|memory", message, re.IGNORECASE), message
    assert "sticky: yes" in out, out
    assert "closed" in out, out


# ---- (e) a short run under compute-sanitizer ----

# Every engine path in a few steps: bf16, re-selection, clipping, overlap, the split form,
# fp16 with an overflow, a flush and a state_dict. Small sizes: the tools are slow.
SHORT_RUN = """
    import torch
    from zenflow import _C
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    shapes = [(37, 61), (1, 47), (23, 1), (64, 130), (9,)]
    for dtype, extra in ((torch.bfloat16, {"max_grad_norm": 1.0}),
                         (torch.float16, {"loss_scaling": "dynamic", "initial_scale": 1024.0})):
        params = [torch.randn(s, generator=gen).to(dev, dtype) for s in shapes]
        config = {"topk_ratio": 0.1, "update_interval": 2, "overlap_step": True,
                  "select_strategy": "step", "select_interval": 2, "bucket_bytes": 4096,
                  "staging_slots": 2, **extra}
        engine = _C.Engine(params, [{"params": list(range(len(shapes))), "lr": 1e-3}], config)
        memory = torch.empty(engine.device_memory_size(), dtype=torch.uint8, device=dev)
        engine.attach_device_memory(memory)
        engine.set_stream(torch.cuda.current_stream().cuda_stream)
        for t in range(7):
            grads = [torch.randn(s, generator=gen).to(dev, dtype) for s in shapes]
            if dtype == torch.float16 and t == 3:
                grads[0][0, 0] = float("inf")
            if t % 2:
                engine.begin_step()
                engine.submit(2, grads[2:])
                engine.submit(0, grads[:2])
                engine.end_step()
            else:
                engine.step(grads)
        engine.flush()
        engine.state_dict()
        engine.close()
    torch.cuda.synchronize()
    print("short run done")
"""


def _sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    candidate = os.path.join(
        os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "compute-sanitizer"
    )
    return candidate if os.access(candidate, os.X_OK) else None


@pytest.mark.parametrize(
    "tool",
    [["memcheck"], ["racecheck", "--racecheck-report", "hazard"]],
    ids=["memcheck", "racecheck"],
)
def test_short_run_under_compute_sanitizer(tool):
    sanitizer = _sanitizer()
    if sanitizer is None:
        pytest.skip("compute-sanitizer not found")
    result = _run_python(
        SHORT_RUN,
        timeout=float(os.environ.get("ZENFLOW_SANITIZER_TIMEOUT_S", "240")),
        # memcheck sees torch's real allocations only without its caching allocator
        env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
        prefix=(sanitizer, "--tool", *tool, "--error-exitcode", "1"),
    )
    output = result.stdout + result.stderr
    assert "short run done" in result.stdout, output[-4000:]
    assert result.returncode == 0, output[-4000:]
    assert re.search(r"ERROR SUMMARY: 0 errors", output), output[-4000:]
