"""Package-level runtime facts: info, CLI, SIMD levels, threads, CUDA detection."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import zenflow
import zenflow._omp


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


def test_a_build_without_cuda_says_why():
    facts = zenflow.info()
    out = subprocess.run(
        [sys.executable, "-m", "zenflow", "info"], check=True, capture_output=True, text=True
    ).stdout
    if facts["cuda_compiled"]:
        assert facts["cuda_build_note"] == ""
        assert "CUDA compiled:   yes" in out
    else:
        assert facts["cuda_build_note"]
        assert f"CUDA compiled:   NO: {facts['cuda_build_note']}" in out


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
    zenflow.set_host_threads("zenflow")  # pinning needs zenflow's own threads
    zenflow.set_num_threads(3)
    assert zenflow.get_num_threads() == 3
    zenflow.set_num_threads(2, cores=[0])
    assert zenflow.get_num_threads() == 2
    with pytest.raises(ValueError, match="num_threads"):
        zenflow.set_num_threads(0)
    with pytest.raises(TypeError, match="num_threads"):
        zenflow.set_num_threads("2")


# ---- where the synchronous ops run: torch's OpenMP team or zenflow's own threads ----

HAS_OPENMP_TEAM = zenflow._omp.openmp_runtime_functions() is not None


@pytest.mark.skipif(not HAS_OPENMP_TEAM, reason="torch loaded no OpenMP runtime here")
def test_host_threads_default_to_torchs_openmp_team():
    assert zenflow.host_threads() == "framework"
    assert zenflow.info()["host_threads_source"] == "framework"
    code = "import zenflow; print(zenflow.host_threads())"
    for value, expected in (("zenflow", "zenflow"), ("framework", "framework"), ("", "framework")):
        env = dict(os.environ, ZENFLOW_HOST_THREADS=value)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.stdout.strip() == expected, out.stderr
    env = dict(os.environ, ZENFLOW_HOST_THREADS="bogus")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "framework"
    assert "ZENFLOW_HOST_THREADS='bogus'" in out.stderr


def _adamw_and_stats(n: int) -> list:
    gen = torch.Generator().manual_seed(5)
    params = [torch.randn(n, generator=gen), torch.randn(509, 1031, generator=gen).bfloat16()]
    opt = zenflow.CPUAdamW(params, lr=1e-2)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)
        opt.step()
    stats = zenflow.ops.column_stats([params[1].grad])
    return [*params, *stats.col_sq, stats.total_sq, stats.nonfinite]


@pytest.mark.skipif(not HAS_OPENMP_TEAM, reason="torch loaded no OpenMP runtime here")
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_either_threads_give_the_same_bits(restore_threads, threads):
    zenflow.set_num_threads(threads)
    results = {}
    for source in ("zenflow", "framework"):
        zenflow.set_host_threads(source)
        assert zenflow.host_threads() == source
        assert zenflow.get_num_threads() == threads  # the size survives the switch
        results[source] = _adamw_and_stats(1_000_003)
    for ours, theirs in zip(results["zenflow"], results["framework"]):
        assert torch.equal(ours, theirs)


@pytest.mark.skipif(not HAS_OPENMP_TEAM, reason="torch loaded no OpenMP runtime here")
def test_ops_inside_torchs_parallel_region_users_and_torch_keep_working(restore_threads):
    """Torch ops between zenflow's regions on the same team: both keep their results."""
    zenflow.set_host_threads("framework")
    a = torch.randn(1 << 20)
    expected = (a.double() * 3).float()
    for _ in range(3):
        _adamw_and_stats(300_007)
        assert torch.equal(a * 3, expected)


def test_set_host_threads_validates(restore_threads):
    with pytest.raises(ValueError, match="source"):
        zenflow.set_host_threads("openmp")
    if HAS_OPENMP_TEAM:
        zenflow.set_host_threads("framework")
        before = zenflow.get_num_threads()
        with pytest.raises(ValueError, match="cores"):
            zenflow.set_num_threads(2, cores=[0])
        assert zenflow.get_num_threads() == before  # refused: nothing changed
        assert zenflow.host_threads() == "framework"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_runs_ops_on_zenflows_own_threads(restore_threads):
    """A DataLoader-style fork after ops ran on torch's team: the child's ops run (on zenflow's
    own threads) and give the parent's bits. As a DataLoader worker does, the child first
    sets torch to one thread: torch's own parallel ops hang in a child forked after its
    OpenMP team started (libgomp's threads do not survive a fork), with or without zenflow."""
    zenflow.set_num_threads(2)
    expected = _adamw_and_stats(100_003)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through its exit code
        code = 1
        try:
            os.close(read)
            torch.set_num_threads(1)
            same = all(torch.equal(a, b) for a, b in zip(_adamw_and_stats(100_003), expected))
            code = 0 if same and zenflow.host_threads() == "zenflow" else 2
        finally:
            os.write(write, bytes([code]))
            os._exit(code)
    os.close(write)
    import select

    ready, _, _ = select.select([read], [], [], 60)
    if not ready:
        os.kill(child, 9)
        os.waitpid(child, 0)
        pytest.fail("the forked child hung")
    _, status = os.waitpid(child, 0)
    os.close(read)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert zenflow.host_threads() == ("framework" if HAS_OPENMP_TEAM else "zenflow")


def test_host_stream_bandwidth_measures_and_validates():
    from zenflow._native import native

    shape = [("bfloat16", "read"), ("float32", "read_write"), ("float32", "write")]
    assert native().host_stream_bandwidth(shape, 10_007, 1, 2) > 0.0
    for streams, elements, threads, match in [
        ([], 100, 1, "streams: NULL"),
        ([("int32", "read"), ("float32", "write")], 100, 1, r"streams\[0\]"),
        ([("float32", "read"), ("float32", "in place")], 100, 1, r"streams\[1\]: access"),
        ([("float32", "read"), ("float32", "read")], 100, 1, "one stream read and one written"),
        (shape, 0, 1, "elements"),
        (shape, 100, 0, "threads"),
    ]:
        with pytest.raises(ValueError, match=match):
            native().host_stream_bandwidth(streams, elements, threads, 1)
