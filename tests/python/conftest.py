"""Shared fixtures: SIMD levels to sweep, GPU skipping, restoring global settings, fixed
seeds for every test, and an optional per-test time limit (ZENFLOW_TEST_TIMEOUT_S, set by
benchmarks/device/check.sh)."""

from __future__ import annotations

import faulthandler
import os
import random
import signal
import sys
import threading

import numpy as np
import pytest
import torch

import zenflow

TEST_TIMEOUT_S = float(os.environ.get("ZENFLOW_TEST_TIMEOUT_S") or 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """With ZENFLOW_TEST_TIMEOUT_S: a test that runs longer fails with TimeoutError and the
    run goes on (the alarm lands when the test next runs Python code). One stuck in native
    code longer still gets every thread's stack dumped and the process ended, so the log
    says where it hung instead of the whole step being killed without a word."""
    if TEST_TIMEOUT_S <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"{item.nodeid}: still running after {TEST_TIMEOUT_S:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT_S)
    faulthandler.dump_traceback_later(TEST_TIMEOUT_S + 30, exit=True, file=sys.stderr)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(autouse=True)
def fixed_seeds():
    """Every test starts from the same seeds (torch, numpy, random), whatever ran before it or
    whether it runs alone: a test that draws random inputs without a generator of its own
    draws the same ones in every run, so CI passes or fails the same way every time."""
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)


class _EngineWithoutDetection(zenflow._C.Engine):
    """zenflow._C.Engine with auto_warm_up_rounds 0 unless the config names it."""

    def __init__(self, params, groups, config=None, *args, **kwargs):
        super().__init__(
            params, groups, {"auto_warm_up_rounds": 0, **(config or {})}, *args, **kwargs
        )


@pytest.fixture(autouse=True)
def windows_from_step_one(request, monkeypatch):
    """The tests of the window machinery count windows from step 1, so the engine's detection
    of a synchronous start (auto_warm_up_rounds, default 200: the first 8 steps run
    synchronously before it decides) is off in them, as in the C++ tests (test_config). Tests
    of what users get (the README, the integrations, the accuracy benchmark, the demo, and the
    detection's own tests) are marked `engine_defaults` and run with the engine's defaults."""
    if request.node.get_closest_marker("engine_defaults"):
        return
    import engine_reference

    monkeypatch.setitem(zenflow.ZenFlowAdamW.__init__.__kwdefaults__, "auto_warm_up_rounds", 0)
    monkeypatch.setitem(engine_reference.DEFAULT_CONFIG, "auto_warm_up_rounds", 0)
    monkeypatch.setattr(zenflow._C, "Engine", _EngineWithoutDetection)


def pytest_collection_modifyitems(config, items):
    if zenflow.cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (zenflow.cuda_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=zenflow.supported_simd_levels())
def simd_level(request):
    """Runs a test once per SIMD level this CPU supports, then restores the default."""
    previous = zenflow.simd_level()
    zenflow.set_simd_level(request.param)
    yield request.param
    zenflow.set_simd_level(previous)


@pytest.fixture
def restore_threads():
    previous = zenflow.get_num_threads()
    source = zenflow.host_threads()
    yield
    zenflow.set_host_threads(source)
    zenflow.set_num_threads(previous)
