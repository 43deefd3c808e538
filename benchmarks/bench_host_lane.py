"""The host lane's memory traffic and throughput (issue 29): bytes per deferred parameter per
window, counted by the engine (stats host_lane_bytes_read / _written), against the formula,
and the lane's throughput against the streaming roof measured in the same run.

For each gradient dtype and window length S, an engine over --matrices matrices [rows, cols]
on the CPU (topk_ratio --topk, overlap off, so the host work of each window is timed by the
engine's own accumulate_seconds + host_update_seconds) takes a warm-up window, then
--windows windows. Reported per deferred element and window (step counts excluded):

  counted     (read + written) bytes over deferred elements and windows
  formula     (g + 8)*S + 16 + w: each accumulate up to the window's last reads g and
              writes A (4), all but the window's first also read A; the closing step is
              packed into the upload copy and fused into the update, which reads its g
              there, A (none at S = 1), master, m, v and writes master, m, v (12) and the
              upload copy (w) over it, and does not zero A (g, w: gradient and weight bytes)
  unfused     the same with the closing step accumulated and A read back by the update
              (+8: the engine before the fusion, docs/design.md "Host lane traffic")
  floor       issue 29's target, 10(S-1) + 28 for bf16
  GB/s        counted bytes / the lane's seconds, two ways: pipelined (each step follows the
              last at once, as in training) and with the device side idle (a pause of
              --settle seconds after each step, so that the lane's accumulates finish
              before the next step's device-side work starts). On the host backend the
              "device" is this CPU: pipelined, the next step's packing and copies run on the
              same cores and memory as the lane's accumulates and slow them; on a GPU they
              are the GPU's and the copy engine's. The second figure is the lane's own rate.
  roof GB/s   the best of torch's copy and triad (a = b + s*c) over buffers of the same size,
              on the lane's thread count, same run (STREAM's byte counting)

    python benchmarks/bench_host_lane.py
    python benchmarks/bench_host_lane.py --write benchmarks/results/2026-12-05-host-lane.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from zenflow import _C

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def roof_gbs(elements: int, threads: int, reps: int) -> float:
    """Best of copy (2 arrays) and triad (3 arrays) in GB/s, torch on `threads` threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    a, b, c = (torch.rand(elements) for _ in range(3))
    best = 0.0
    for _ in range(reps):
        start = time.perf_counter()
        a.copy_(b)
        best = max(best, 8 * elements / (time.perf_counter() - start) / 1e9)
        start = time.perf_counter()
        torch.add(b, c, alpha=0.5, out=a)
        best = max(best, 12 * elements / (time.perf_counter() - start) / 1e9)
    torch.set_num_threads(before)
    return best


def run(dtype: torch.dtype, interval: int, args: argparse.Namespace, settle: float) -> dict:
    shapes = [(args.rows, args.cols)] * args.matrices
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    grads = [[torch.randn(s, generator=gen).to(dtype) for s in shapes] for _ in range(2)]
    config = {
        "topk_ratio": args.topk,
        "update_interval": interval,
        "overlap_step": False,
        "host_threads": args.threads,
        "compute_threads": args.threads,
    }
    engine = _C.Engine(params, [{"params": list(range(len(shapes))), "lr": 1e-4}], config)
    for t in range(interval):  # the first window selects and warms the buffers
        engine.step(grads[t % 2], None)
    before = engine.stats()
    for t in range(args.windows * interval):
        engine.step(grads[t % 2], None)
        if settle > 0:
            time.sleep(settle)
    after = engine.stats()
    engine.close()
    k = max(1, int(args.topk * args.cols))
    deferred = args.matrices * args.rows * (args.cols - k)
    step_count_bytes = 8 * args.matrices * (args.cols - k) * args.windows
    moved = (
        after["host_lane_bytes_read"]
        + after["host_lane_bytes_written"]
        - before["host_lane_bytes_read"]
        - before["host_lane_bytes_written"]
    )
    seconds = (
        after["accumulate_seconds"]
        + after["host_update_seconds"]
        - before["accumulate_seconds"]
        - before["host_update_seconds"]
    )
    g = w = torch.tensor([], dtype=dtype).element_size()
    formula = (g + 8) * interval + 16 + w
    return {
        "counted": (moved - step_count_bytes) / (deferred * args.windows),
        "formula": formula,
        "unfused": formula + 8,
        "floor": 10 * (interval - 1) + 28 if g == 2 else None,
        "gbs": moved / seconds / 1e9,
        "deferred": deferred,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrices", type=int, default=8)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--cols", type=int, default=2048)
    parser.add_argument("--topk", type=float, default=0.1)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--intervals", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument(
        "--settle",
        type=float,
        default=0.25,
        help="seconds of pause after each step for the device-side-idle figure",
    )
    parser.add_argument("--write", type=Path, default=None, help="save the markdown table here")
    args = parser.parse_args()

    elements = args.matrices * args.rows * args.cols
    rows = []
    for name, dtype in DTYPES.items():
        for interval in args.intervals:
            result = run(dtype, interval, args, 0.0)
            idle = run(dtype, interval, args, args.settle)
            roof = roof_gbs(elements, args.threads, 5)  # the same run, right after
            rows.append((name, interval, result, idle, roof))
    lines = [
        f"# Host lane traffic and throughput ({datetime.date.today()})",
        "",
        f"`python benchmarks/bench_host_lane.py`: {args.matrices} matrices [{args.rows}, {args.cols}], "
        f"topk_ratio {args.topk}, {args.windows} windows after a warm-up window, overlap off, "
        f"{args.threads} host-lane threads, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}. Bytes per deferred element per window "
        "(step counts excluded); the roof is torch's best of copy and triad on as many threads, "
        "measured right after each row. Lane GB/s pipelined: each step right after the last; "
        f"device side idle: a {args.settle} s pause after each step (the bench's docstring).",
        "",
        "| gradient and weights | S | counted B | formula B | unfused B | issue 29 floor B "
        "| roof GB/s | lane GB/s, pipelined | of roof | lane GB/s, device side idle | of roof |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, interval, r, idle, roof in rows:
        floor = "-" if r["floor"] is None else f"{r['floor']}"
        lines.append(
            f"| {name} | {interval} | {r['counted']:.1f} | {r['formula']} | {r['unfused']} | {floor} "
            f"| {roof:.1f} | {r['gbs']:.1f} | {r['gbs'] / roof:.0%} "
            f"| {idle['gbs']:.1f} | {idle['gbs'] / roof:.0%} |"
        )
    for label, index in (("pipelined", 2), ("device side idle", 3)):
        ratios = [row[index]["gbs"] / row[4] for row in rows]
        lines.append(
            f"\nLane throughput, {label}: {min(ratios):.0%} to {max(ratios):.0%} of the roof "
            f"(median {statistics.median(ratios):.0%})."
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        args.write.write_text(text)
    # The engine's count must be the formula's, exactly (the CI smoke run checks it too).
    wrong = [
        f"{name} S={interval}: counted {result['counted']} B, formula {result['formula']} B"
        for name, interval, pipelined, idle, _ in rows
        for result in (pipelined, idle)
        if result["counted"] != result["formula"]
    ]
    if wrong:
        raise SystemExit("host-lane bytes differ from the formula: " + "; ".join(wrong))


if __name__ == "__main__":
    main()
