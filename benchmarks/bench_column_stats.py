"""Host column_stats against torch's `g.float().square().sum(0)`, side by side.

Both run on the same inputs, interleaved round by round (this machine's bandwidth
drifts), with a memory-copy bandwidth roof measured in the same run. Reports medians,
GB/s (bytes of gradient read), the ratio to torch, and the fraction of copy bandwidth.

    python benchmarks/bench_column_stats.py [--elements 64M] [--rounds 15] [--threads N]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time

# torch's OpenMP workers spin after each parallel region and would steal the cores of
# zenflow's pool in the interleaved rounds (README, "Threads"); set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import zenflow
from zenflow import ops


def parse_count(text: str) -> int:
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * scale[text[-1]]) if text[-1] in scale else int(text)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def make_case(name: str, dtype: torch.dtype, elements: int, gen: torch.Generator):
    if name == "square":
        side = int(elements**0.5)
        shapes = [(side, elements // side)]
    else:  # one 7B-class layer's matrices, repeated up to the element budget
        layer = [(4096, 4096)] * 4 + [(11008, 4096)] * 2 + [(4096, 11008)]
        shapes, total = [], 0
        while total < elements:
            for m, n in layer:
                rows = max(1, min(m, (elements - total) // n))
                shapes.append((rows, n))
                total += rows * n
                if total >= elements:
                    break
    return [torch.randn(m, n, generator=gen).to(dtype) for m, n in shapes]


def bench(case: str, dtype: torch.dtype, elements: int, rounds: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    grads = make_case(case, dtype, elements, gen)
    n_elem = sum(g.numel() for g in grads)
    grad_bytes = sum(g.numel() * g.element_size() for g in grads)
    outs = [torch.empty(g.shape[1]) for g in grads]
    copy_src = torch.randn(grad_bytes // 4, generator=gen)
    copy_dst = torch.empty_like(copy_src)

    def run_zenflow():
        ops.column_stats(grads, outs)

    def run_torch():
        for g in grads:
            g.float().square().sum(0)

    def run_copy():
        copy_dst.copy_(copy_src)

    def run_read():
        copy_src.sum()

    runners = {"zenflow": run_zenflow, "torch": run_torch, "copy": run_copy, "read": run_read}
    for fn in runners.values():
        fn()
    times = {name: [] for name in runners}
    for _ in range(rounds):
        for name, fn in runners.items():
            times[name].append(timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    copy_gbs = 2 * grad_bytes / med["copy"] / 1e9  # read + write, as STREAM counts it
    read_gbs = grad_bytes / med["read"] / 1e9
    zf_gbs = grad_bytes / med["zenflow"] / 1e9
    torch_gbs = grad_bytes / med["torch"] / 1e9
    # Sanity: both compute the same thing.
    want = grads[0].double().square().sum(0)
    assert torch.allclose(outs[0].double(), want, rtol=1e-6), "zenflow result is wrong"
    return {
        "case": f"{case} {str(dtype).replace('torch.', '')} {n_elem / 2**20:.0f}M ({len(grads)} mats)",
        "zenflow_ms": med["zenflow"] * 1e3,
        "torch_ms": med["torch"] * 1e3,
        "zenflow_gbs": zf_gbs,
        "torch_gbs": torch_gbs,
        "copy_gbs": copy_gbs,
        "read_gbs": read_gbs,
        "speedup": med["torch"] / med["zenflow"],
        "of_copy": zf_gbs / copy_gbs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", default="64M")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None, help="zenflow and torch threads")
    args = parser.parse_args()
    threads = args.threads or zenflow.native().host_cpu_count()
    zenflow.set_num_threads(threads)
    torch.set_num_threads(threads)
    elements = parse_count(args.elements)
    rows = []
    for case, dtype in [
        ("square", torch.bfloat16),
        ("square", torch.float32),
        ("square", torch.float16),
        ("7B-layer", torch.bfloat16),
    ]:
        rows.append(bench(case, dtype, elements, args.rounds))
    print(
        f"# column_stats, host ({datetime.date.today()}, {platform.processor() or platform.machine()}, "
        f"{threads} threads, SIMD {zenflow.simd_level()}, torch {torch.__version__}, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
        f"median of {args.rounds} interleaved rounds)\n"
    )
    print(
        "| case | zenflow ms | torch ms | zenflow GB/s | torch GB/s | copy GB/s | read GB/s "
        "| speedup vs torch | zenflow / copy | zenflow / read |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['case']} | {r['zenflow_ms']:.1f} | {r['torch_ms']:.1f} | {r['zenflow_gbs']:.1f} "
            f"| {r['torch_gbs']:.1f} | {r['copy_gbs']:.1f} | {r['read_gbs']:.1f} | {r['speedup']:.2f}x "
            f"| {r['of_copy']:.0%} | {r['zenflow_gbs'] / r['read_gbs']:.0%} |"
        )
    print(
        "\nGB/s counts gradient bytes read once. copy GB/s counts read + write of "
        "`dst.copy_(src)` over the same byte volume (STREAM's convention); read GB/s is "
        "torch's `x.sum()` over it, a read-only roof. Targets (bf16, 64M): speedup >= 1.5x, "
        "zenflow / copy >= 60%."
    )


if __name__ == "__main__":
    main()
