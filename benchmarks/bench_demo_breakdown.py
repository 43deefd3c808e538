"""Where the demo's step time goes on the host backend: synchronous offload against zenflow.

Two parts, one process, the demo's model (`python -m zenflow demo`, --model-size, default
large) and its pretrained weights from the demo's cache (trained there at first use):

1. The training step of each run, split into forward + backward (torch) and opt.step() (the
   engine), medians over --steps steps after 4 warm-up steps, with the engine's stall, host
   update and accumulate seconds per step. The runs are configured exactly as the demo
   configures them (sync: topk_ratio=0, update_interval=1, overlap_step=False; zenflow: the
   defaults), and torch.optim.AdamW runs beside them as the reference.
2. The engine's compute-lane ops alone, on the model's matrices, at the compute lane's thread
   count (the cores ZenFlowAdamW leaves to the caller: 1 on 2 cores): column statistics,
   top-k, the selected AdamW (10% of the columns), pack and scatter with no column selected
   (sync) and with 10% selected (zenflow), and a memcpy of the same bytes (the host
   backend's copy down), medians of --reps calls.

    python benchmarks/bench_demo_breakdown.py                  # large, about 1 minute
    python benchmarks/bench_demo_breakdown.py --model-size small --write out.md

Run it alone on the machine (nothing else compiling): every number is a wall time.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import zenflow
import zenflow.ops as ops
from zenflow import demo


def median_ms(samples: list[float]) -> float:
    return 1e3 * statistics.median(samples)


def time_call(fn, reps: int) -> float:
    fn()  # first call: page faults, plan caches
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return median_ms(samples)


def training_steps(name: str, config: demo.DemoConfig, ids: dict, start: dict, steps: int) -> dict:
    size = demo.PRESETS[config.model_size]
    torch_threads = torch.get_num_threads()
    model = demo.GPT(size)
    model.load_state_dict(start)
    opt = demo._optimizer(name, model, config)
    gen = torch.Generator().manual_seed(config.seed + 1)
    forward_backward, step, total = [], [], []
    warm_up = 4
    for s in range(warm_up + steps):
        inputs, targets = demo._batch(ids["train"], size, gen)
        t0 = time.perf_counter()
        loss = model(inputs, targets)
        loss.backward()
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        if s >= warm_up:
            forward_backward.append(t1 - t0)
            step.append(t2 - t1)
            total.append(t2 - t0)
    row = {
        "run": name,
        "torch_threads": torch.get_num_threads(),
        "forward_backward_ms": median_ms(forward_backward),
        "opt_step_ms": median_ms(step),
        "total_ms": median_ms(total),
    }
    if isinstance(opt, zenflow.ZenFlowAdamW):
        stats = opt.stats()
        per_step = 1e3 / (warm_up + steps)
        row["stall_ms"] = per_step * (
            stats["stall_seconds_window_close"]
            + stats["stall_seconds_back_pressure"]
            + stats["stall_seconds_flush"]
        )
        row["host_update_ms"] = per_step * stats["host_update_seconds"]
        row["accumulate_ms"] = per_step * stats["accumulate_seconds"]
        opt.close()
    torch.set_num_threads(torch_threads)  # ZenFlowAdamW lowered it to its reserved share
    return row


def compute_lane_ops(
    model: torch.nn.Module, threads: int, reps: int
) -> list[tuple[str, float, str]]:
    """The engine's device-side ops on the model's matrices, as the engine runs them."""
    previous = zenflow.get_num_threads()
    zenflow.set_num_threads(threads)
    try:
        generator = torch.Generator().manual_seed(0)
        shapes = [tuple(p.shape) for p in model.parameters() if p.dim() == 2]
        grads = [torch.randn(s, generator=generator) for s in shapes]
        params = [torch.randn(s, generator=generator) for s in shapes]
        elements = sum(g.numel() for g in grads)
        rows = []
        stats = ops.column_stats(grads)
        rows.append(
            (
                "column_stats",
                time_call(lambda: ops.column_stats(grads, stats.col_sq), reps),
                f"{elements / 1e6:.1f}M",
            )
        )
        ks = [ops.topk_count(s[1], 0.1) for s in shapes]
        selected = ops.select_topk_columns(stats.col_sq, ks)
        rows.append(
            (
                "select_topk (10%)",
                time_call(
                    lambda: ops.select_topk_columns(stats.col_sq, ks, out_indices=selected), reps
                ),
                f"{len(shapes)} matrices",
            )
        )
        state = [
            ops.ColumnState(
                None, torch.zeros(s[0], k), torch.zeros(s[0], k), torch.zeros(k, dtype=torch.int32)
            )
            for s, k in zip(shapes, ks)
        ]
        chosen = sum(s[0] * k for s, k in zip(shapes, ks))
        rows.append(
            (
                "adamw_selected (10%)",
                time_call(
                    lambda: ops.adamw_selected_columns_(
                        params, grads, selected, state, lr=1e-3, weight_decay=0.01
                    ),
                    reps,
                ),
                f"{chosen / 1e6:.2f}M",
            )
        )
        for label, sel in (
            ("no column selected (sync)", None),
            ("10% selected (zenflow)", selected),
        ):
            packed = ops.pack_columns(grads, sel)
            rows.append(
                (
                    f"pack, {label}",
                    time_call(
                        lambda sel=sel, packed=packed: ops.pack_columns(grads, sel, out=packed),
                        reps,
                    ),
                    f"{packed.numel() / 1e6:.1f}M",
                )
            )
            rows.append(
                (
                    f"scatter, {label}",
                    time_call(
                        lambda sel=sel, packed=packed: ops.scatter_columns(packed, params, sel),
                        reps,
                    ),
                    f"{packed.numel() / 1e6:.1f}M",
                )
            )
            copy = torch.empty_like(packed)
            rows.append(
                (
                    "memcpy of that packed buffer",
                    time_call(lambda copy=copy, packed=packed: copy.copy_(packed), reps),
                    "",
                )
            )
        return rows
    finally:
        zenflow.set_num_threads(previous)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-size", default="large", choices=sorted(demo.PRESETS))
    parser.add_argument(
        "--steps", type=int, default=20, help="timed training steps per run (default 20)"
    )
    parser.add_argument("--reps", type=int, default=7, help="calls per op in part 2 (default 7)")
    parser.add_argument("--write", type=Path, help="also write the markdown report here")
    args = parser.parse_args(argv)

    config = demo.DemoConfig(model_size=args.model_size, progress=False)
    size = demo.PRESETS[args.model_size]
    ids, info = demo.tokens(size.vocab, config.cache)
    start = demo.pretrained(config, ids, info["folder"])
    runs = [
        training_steps(name, config, ids, start, args.steps)
        for name in ("adamw", "sync", "zenflow")
    ]
    cores = zenflow._native.native().host_cpu_count()
    lane_threads = max(1, cores - zenflow.default_num_threads())
    model = demo.GPT(size)
    op_rows = compute_lane_ops(model, lane_threads, args.reps)

    lines = [
        f"# Demo step breakdown: --model-size {args.model_size} "
        f"({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters)",
        "",
        f"{platform.processor() or platform.machine()}, {cores} cores, torch {torch.__version__}, "
        f"zenflow SIMD {zenflow.simd_level()}; "
        f"medians of {args.steps} steps after 4 warm-up steps.",
        "",
        "| run | torch threads | forward + backward (ms) | opt.step() (ms) | step (ms) | stall (ms) "
        "| host update (ms, background or stall) | accumulate (ms, host lane) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        extra = [
            f"{r[key]:.1f}" if key in r else "-"
            for key in ("stall_ms", "host_update_ms", "accumulate_ms")
        ]
        lines.append(
            f"| {r['run']} | {r['torch_threads']} | {r['forward_backward_ms']:.1f} | {r['opt_step_ms']:.1f} "
            f"| {r['total_ms']:.1f} | " + " | ".join(extra) + " |"
        )
    by_name = {r["run"]: r for r in runs}
    lines += [
        "",
        f"Step time, sync / zenflow: {by_name['sync']['total_ms'] / by_name['zenflow']['total_ms']:.2f}x; "
        f"sync / zenflow's forward + backward alone (zenflow's opt.step() free): "
        f"{by_name['sync']['total_ms'] / by_name['zenflow']['forward_backward_ms']:.2f}x.",
        "",
        f"Compute-lane ops on the model's matrices at the lane's {lane_threads} thread(s):",
        "",
        "| op | ms | elements |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {ms:.2f} | {what} |" for name, ms, what in op_rows]
    report = "\n".join(lines)
    print(report)
    if args.write:
        args.write.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
