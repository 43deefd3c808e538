"""Gradient release on the host backend (issue 29 item 1): the gradient bytes alive during
backward and the step time, with release_gradients off and on, in the same run.

A stack of --layers bf16 nn.Linear(--width, --width) layers (CPU parameters: the host
backend) trains with overlap_backward, bucket_bytes --bucket-mib. Per configuration, over
--steps timed steps after --warmup:

  live peak      the most gradient bytes alive at once during a backward, seen by a hook
                 that runs before the optimizer's (so before any release in that hook):
                 the maximum over steps that are not selection steps, and at a selection
                 step (every gradient is held until step() there)
  engine held    stats()["held_gradient_bytes_peak"] of the last non-selection step
  step ms        mean over the whole timed run (total / steps: backward and step, every
                 stall included), median beside it
  engine bytes   stats()["device_bytes"]: the engine's own memory (host memory here), which
                 grows by the compact copies of the selected columns and a staging slot per
                 bucket when releasing

The bound the issue sets for a step that is not a selection step: one bucket of gradients
plus the dense parameters' (the biases here).

    python benchmarks/bench_gradient_release.py
    python benchmarks/bench_gradient_release.py --write benchmarks/results/2026-12-05-gradient-release.md
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

import zenflow


def model_of(args) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *(torch.nn.Linear(args.width, args.width, dtype=torch.bfloat16) for _ in range(args.layers))
    )
    with torch.no_grad():
        for layer in model:
            layer.weight.normal_(0.0, args.width**-0.5)
    return model


def run(args, release: bool) -> dict:
    model = model_of(args)
    params = list(model.parameters())
    peaks: list[int] = []

    def seen(_param):
        live = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
        peaks[-1] = max(peaks[-1], live)

    for p in params:
        p.register_post_accumulate_grad_hook(seen)
    opt = zenflow.ZenFlowAdamW(
        params,
        lr=1e-4,
        bucket_bytes=args.bucket_mib << 20,
        release_gradients=release,
        num_threads=args.host_threads,
        auto_warm_up_rounds=0,  # windows from step 1: the steps measured are windowed ones
    )
    opt.overlap_backward(model)
    x = torch.randn(args.batch, args.width, dtype=torch.bfloat16)
    times, selected, held = [], [], 0
    started = None
    for t in range(args.warmup + args.steps):
        if t == args.warmup:
            started = time.perf_counter()
        peaks.append(0)
        begin = time.perf_counter()
        model(x).float().square().mean().backward()
        before = opt.stats()["reselections"]
        opt.step()
        opt.zero_grad()
        stats = opt.stats()
        is_selection = t == 0 or stats["reselections"] > before
        if t >= args.warmup:
            times.append(time.perf_counter() - begin)
        selected.append(is_selection)
        if not is_selection:
            held = stats["held_gradient_bytes_peak"]
    total = time.perf_counter() - started
    stats = opt.stats()
    opt.close()
    sizes = [p.numel() * p.element_size() for p in params]
    return {
        "release": release,
        "live_peak": max(p for p, s in zip(peaks, selected) if not s),
        "live_peak_selection": max(p for p, s in zip(peaks, selected) if s),
        "held": held,
        "step_ms_mean": 1e3 * total / args.steps,
        "step_ms_median": 1e3 * statistics.median(times),
        "engine_bytes": stats["device_bytes"],
        "all_gradients": sum(sizes),
        "dense": sum(s for p, s in zip(params, sizes) if p.dim() < 2),
        "bucket": max(s for p, s in zip(params, sizes) if p.dim() >= 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--bucket-mib", type=int, default=2, help="bucket_bytes in MiB")
    parser.add_argument("--host-threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--write", type=Path, default=None, help="save the markdown table here")
    args = parser.parse_args()

    rows = [run(args, False), run(args, True)]
    mib = 1 / (1 << 20)
    bucket = max(args.bucket_mib << 20, rows[0]["bucket"])  # a larger matrix is its own bucket
    lines = [
        "| release_gradients | live gradients, peak MiB | at a selection step MiB | engine held MiB "
        "| bound (bucket + dense) MiB | step ms (mean) | median | engine bytes MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {'on' if r['release'] else 'off'} | {r['live_peak'] * mib:.1f} "
            f"| {r['live_peak_selection'] * mib:.1f} | {r['held'] * mib:.1f} "
            f"| {(bucket + r['dense']) * mib:.1f} | {r['step_ms_mean']:.1f} | {r['step_ms_median']:.1f} "
            f"| {r['engine_bytes'] * mib:.1f} |"
        )
    off, on = rows
    lines += [
        "",
        f"All gradients: {off['all_gradients'] * mib:.1f} MiB. Live peak with release: "
        f"{100 * on['live_peak'] / on['all_gradients']:.0f}% of them; step time "
        f"{on['step_ms_mean'] / off['step_ms_mean']:.2f}x of keeping them (mean).",
    ]
    head = (
        f"# Gradient release on the host backend ({datetime.date.today()})\n\n"
        f"`python benchmarks/bench_gradient_release.py` (--layers {args.layers} --width {args.width} "
        f"--batch {args.batch} --bucket-mib {args.bucket_mib}): bf16 nn.Linear layers, overlap_backward, "
        f"{args.steps} timed steps after {args.warmup}; {platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}.\n\n"
    )
    text = head + "\n".join(lines) + "\n"
    print(text)
    if args.write:
        args.write.write_text(text)


if __name__ == "__main__":
    main()
