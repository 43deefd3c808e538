"""Package-level runtime facts: info, CLI, SIMD levels, threads, CUDA detection."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import zenflow


def test_info_and_cli():
    facts = zenflow.info()
    assert facts["version"] == zenflow.__version__ == facts["library_version"]
    assert facts["simd_level"] in ("scalar", "avx2", "avx512")
    assert facts["host_threads"] >= 1
    out = subprocess.run(
        [sys.executable, "-m", "zenflow", "info"], check=True, capture_output=True, text=True
    ).stdout
    for needle in ("zenflow", "SIMD level", "CUDA compiled", "GPUs", "host threads"):
        assert needle in out


def test_cuda_available_never_raises():
    assert isinstance(zenflow.cuda_available(), bool)
    if not zenflow.cuda_available():
        assert zenflow.info()["gpus"] == []


def test_simd_environment_variable_lowers_the_level():
    code = "import zenflow; print(zenflow.simd_level())"
    env = dict(os.environ, ZENFLOW_SIMD="scalar")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "scalar"


def test_set_simd_level_validates():
    with pytest.raises(ValueError, match="level"):
        zenflow.set_simd_level("sse9")
    if "avx512" not in zenflow.supported_simd_levels():
        with pytest.raises(ValueError, match="not supported"):
            zenflow.set_simd_level("avx512")


def test_thread_pool_control(restore_threads):
    zenflow.set_num_threads(3)
    assert zenflow.get_num_threads() == 3
    zenflow.set_num_threads(2, cores=[0])
    assert zenflow.get_num_threads() == 2
    with pytest.raises(ValueError, match="num_threads"):
        zenflow.set_num_threads(0)
    with pytest.raises(TypeError, match="num_threads"):
        zenflow.set_num_threads("2")
