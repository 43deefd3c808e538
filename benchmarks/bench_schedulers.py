"""ZenFlowAdamW under a scheduler that changes betas (OneCycleLR's momentum cycling) and a
weight decay changed every step, against the same run at a constant lr (issue 27's target:
windows close every update_interval steps and the mean step time is within 10% of the
constant run). The engine takes each step's hyper-parameters: nothing flushes.

Rows, interleaved (one run of each per round, --rounds rounds, a fresh optimizer per run):

  constant     lr, betas, eps and weight decay fixed
  one_cycle    OneCycleLR(cycle_momentum=True) steps lr and betas; weight decay and eps
               change every step too
  flush_each   constant, with opt.flush() after every step: what a change of betas cost
               when it flushed (the contract before 2026-12-05)

The headline is the mean over the whole run (total / steps, stalls included); the median
step is beside it. Gradients are set directly (no backward), so the time is the optimizer's.

    python benchmarks/bench_schedulers.py
    python benchmarks/bench_schedulers.py --write benchmarks/results/2026-12-05-schedulers.md
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

TARGET_RATIO = 1.10
CASES = ("constant", "one_cycle", "flush_each")


def make_model(layers: int, width: int) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    params = []
    for _ in range(layers):
        params.append(torch.nn.Parameter(torch.randn(width, width, generator=gen) * 0.02))
        params.append(torch.nn.Parameter(torch.zeros(width)))
    return params


def make_grads(params: list[torch.nn.Parameter], count: int) -> list[list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [[torch.randn(p.shape, generator=gen) for p in params] for _ in range(count)]


def run(case: str, args: argparse.Namespace, grads: list[list[torch.Tensor]]) -> dict:
    params = make_model(args.layers, args.width)
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = zenflow.ZenFlowAdamW(
        groups,
        lr=1e-3,
        topk_ratio=args.topk_ratio,
        update_interval=args.update_interval,
        auto_warm_up_rounds=0,  # windows from step 1: their closes are what is counted
    )
    sched = None
    if case == "one_cycle":
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=1e-3, total_steps=args.steps + 1, cycle_momentum=True
        )
    times = []
    betas_seen = set()
    for t in range(args.steps):
        for p, g in zip(params, grads[t % len(grads)]):
            p.grad = g
        if case == "one_cycle":
            opt.param_groups[0]["weight_decay"] = 0.1 * (1.0 - t / args.steps)
            for group in opt.param_groups:
                group["eps"] = 1e-8 * (1.0 + t % 3)
            betas_seen.add(tuple(opt.param_groups[0]["betas"]))
        start = time.perf_counter()
        opt.step()
        if case == "flush_each":
            opt.flush()
        times.append(time.perf_counter() - start)
        if sched is not None:
            sched.step()
    stats = opt.stats()
    opt.close()
    return {
        "mean_ms": 1e3 * sum(times) / len(times),
        "median_ms": 1e3 * statistics.median(times),
        "windows": stats["windows"],
        "betas_seen": len(betas_seen),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--topk-ratio", type=float, default=0.1)
    parser.add_argument("--update-interval", type=int, default=4)
    parser.add_argument("--write", type=Path, default=None, help="save the markdown table here")
    args = parser.parse_args()

    grads = make_grads(make_model(args.layers, args.width), 4)
    results: dict[str, list[dict]] = {case: [] for case in CASES}
    for r in range(args.rounds):
        order = CASES if r % 2 == 0 else tuple(reversed(CASES))
        for case in order:
            results[case].append(run(case, args, grads))

    def summary(case: str) -> dict:
        runs = results[case]
        return {
            "mean_ms": statistics.median(x["mean_ms"] for x in runs),
            "median_ms": statistics.median(x["median_ms"] for x in runs),
            "windows": runs[0]["windows"],
            "betas_seen": runs[0]["betas_seen"],
        }

    rows = {case: summary(case) for case in CASES}
    base = rows["constant"]["mean_ms"]
    expected_windows = args.steps // args.update_interval
    params = args.layers * (args.width * args.width + args.width)
    lines = [
        f"# ZenFlowAdamW under OneCycleLR with momentum cycling ({datetime.date.today()})",
        "",
        f"`python benchmarks/bench_schedulers.py{' --write ...' if args.write else ''}`: "
        f"{args.layers} matrices [{args.width}, {args.width}] and their biases ({params / 1e6:.1f} M "
        f"fp32 parameters), topk_ratio {args.topk_ratio}, update_interval {args.update_interval}, "
        f"{args.steps} steps per run, {args.rounds} interleaved rounds (the median run is shown), "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
        f"{torch.__version__}, torch threads {torch.get_num_threads()}.",
        "",
        "| run | mean step (ms, total / steps) | median step (ms) | vs constant (mean) | windows "
        f"(expected {expected_windows}) | distinct betas |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for case in CASES:
        row = rows[case]
        lines.append(
            f"| {case} | {row['mean_ms']:.2f} | {row['median_ms']:.2f} | "
            f"{row['mean_ms'] / base:.2f}x | {row['windows']} | {row['betas_seen'] or '-'} |"
        )
    ratio = rows["one_cycle"]["mean_ms"] / base
    met = ratio <= TARGET_RATIO and rows["one_cycle"]["windows"] == expected_windows
    lines += [
        "",
        f"Target: one_cycle within {TARGET_RATIO:.2f}x of constant and its windows closing every "
        f"{args.update_interval} steps: **{'met' if met else 'missed'}** ({ratio:.2f}x, "
        f"{rows['one_cycle']['windows']} windows). flush_each is what a betas change cost when it "
        "flushed every step.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        args.write.write_text(text)


if __name__ == "__main__":
    main()
