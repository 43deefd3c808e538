"""Shared fixtures: SIMD levels to sweep, GPU skipping, restoring global settings, and fixed
seeds for every test."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import zenflow


@pytest.fixture(autouse=True)
def fixed_seeds():
    """Every test starts from the same seeds (torch, numpy, random), whatever ran before it or
    whether it runs alone: a test that draws random inputs without a generator of its own
    draws the same ones in every run, so CI passes or fails the same way every time."""
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)


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
