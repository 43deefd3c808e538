"""The engine on the host backend: stall-free overlap against synchronous offload.

A synthetic model of bf16 matrices (about 50M parameters by default) and a fixed fake device
time per step (a sleep standing in for the GPU's forward and backward) drive zenflow._C.Engine
with CPU tensors. Three configurations run side by side in one process, one after the other
on the same gradients:

  * zenflow, overlap on:  topk_ratio 0.1, update_interval 4, overlap_step True;
  * zenflow, synchronous: the same with overlap_step False;
  * plain synchronous offload: topk_ratio 0, update_interval 1, overlap_step False.

Reported per configuration (per-step means of the engine's counters over whole windows):
step time, the mean over the whole timed run (total / steps, the window-close stalls
included; the headline) with the median beside it, the engine call's own time (median), stall seconds per step by cause
(window close, back-pressure, flush: from engine.stats()), host update and accumulate
seconds, bytes down and up per step beside the PCIe formula of docs/design.md section 5
(bf16: down (1 - r) * 2 bytes per parameter per step, up (1 - r) * 2 / S) with the relative
error, and the stall reduction of each configuration against plain synchronous offload
(target: at least 85% for overlap when the fake device time is at least the host update
time / S). Also the engine's bookkeeping: the wall time of one step call on a model of 300
tiny tensors, where the per-element work is negligible (target: under 1 ms).

    python benchmarks/bench_engine.py                          # ~50M parameters
    python benchmarks/bench_engine.py --quick                  # ~2M, a CI smoke run
    python benchmarks/bench_engine.py --params 2e7 --device-ms 80 --write out.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

RATIO, INTERVAL = 0.1, 4
STALL_KEYS = ("stall_seconds_window_close", "stall_seconds_back_pressure", "stall_seconds_flush")
DELTA_KEYS = STALL_KEYS + ("host_update_seconds", "accumulate_seconds", "bytes_down", "bytes_up")
CONFIGS = {
    "zenflow overlap": dict(topk_ratio=RATIO, update_interval=INTERVAL, overlap_step=True),
    "zenflow sync": dict(topk_ratio=RATIO, update_interval=INTERVAL, overlap_step=False),
    "plain sync offload": dict(topk_ratio=0.0, update_interval=1, overlap_step=False),
}
BASELINE = "plain sync offload"


def load_engine():
    try:
        import zenflow
        from zenflow import _C
    except ImportError as exc:
        sys.exit(f"bench_engine.py: zenflow is not importable ({exc}); build and install it first")
    if not hasattr(_C, "Engine"):
        sys.exit(
            "bench_engine.py: this zenflow build has no zenflow._C.Engine (the engine's Python "
            "binding); rebuild zenflow with the engine to run this benchmark"
        )
    return zenflow, _C.Engine


def model_shapes(total: float) -> list[tuple[int, int]]:
    """Matrices of [rows, cols] adding up to about `total` parameters."""
    rows, cols = (1024, 4096) if total >= 16e6 else (512, 1024)
    count = max(1, round(total / (rows * cols)))
    return [(rows, cols)] * count


def make_model(shapes, seed):
    gen = torch.Generator().manual_seed(seed)
    return [(0.02 * torch.randn(s, generator=gen)).to(torch.bfloat16) for s in shapes]


def group_of(params, lr=1e-4):
    return [{"params": list(range(len(params))), "lr": lr, "weight_decay": 0.01}]


def run_config(Engine, name, config, shapes, grad_sets, device_s, warm_steps, timed_steps, args):
    params = make_model(shapes, seed=0)
    engine = Engine(params, group_of(params), dict(config, pt_reserved_cores_perc=args.reserved))
    for t in range(warm_steps):  # selection, the first window(s), caches: not timed
        time.sleep(device_s)
        engine.step(grad_sets[t % len(grad_sets)])
    before = engine.stats()
    step_times, call_times = [], []
    run_started = time.perf_counter()
    for t in range(timed_steps):
        grads = grad_sets[(warm_steps + t) % len(grad_sets)]
        start = time.perf_counter()
        time.sleep(device_s)  # the device's forward and backward
        call = time.perf_counter()
        engine.step(grads)
        end = time.perf_counter()
        step_times.append(end - start)
        call_times.append(end - call)
    run_seconds = time.perf_counter() - run_started
    after = engine.stats()
    engine.flush()
    engine.close()
    delta = {key: (after[key] - before[key]) / timed_steps for key in DELTA_KEYS}
    delta["step_mean"] = run_seconds / timed_steps
    windows = after["windows"] - before["windows"]
    delta["host_update_per_window"] = (
        (after["host_update_seconds"] - before["host_update_seconds"]) / windows if windows else 0.0
    )
    delta["stall"] = sum(delta[key] for key in STALL_KEYS)
    delta["step_median"] = statistics.median(step_times)
    delta["call_median"] = statistics.median(call_times)
    delta["device_s"] = device_s
    ratio, interval = config["topk_ratio"], config["update_interval"]
    n_params = sum(r * c for r, c in shapes)
    delta["down_formula"] = (1 - ratio) * 2 * n_params
    delta["up_formula"] = (1 - ratio) * 2 / interval * n_params
    print(
        f"  {name}: step {delta['step_mean'] * 1e3:.1f} ms (mean; median "
        f"{delta['step_median'] * 1e3:.1f})",
        file=sys.stderr,
    )
    return delta


def calibrate_device_time(Engine, shapes, grad_sets, args):
    """Fake device time = 1.25 x (zenflow's host update per window / S), measured."""
    params = make_model(shapes, seed=0)
    engine = Engine(
        params,
        group_of(params),
        dict(CONFIGS["zenflow sync"], pt_reserved_cores_perc=args.reserved),
    )
    for t in range(3 * INTERVAL):
        engine.step(grad_sets[t % len(grad_sets)])
    stats = engine.stats()
    engine.close()
    per_window = stats["host_update_seconds"] / max(1, stats["windows"])
    return 1.25 * per_window / INTERVAL


def bookkeeping(Engine, repeats):
    """Median wall time of one step call on 300 tiny tensors (150 [8, 16] + 150 [16])."""
    shapes = [(8, 16), (16,)] * 150
    gen = torch.Generator().manual_seed(3)
    params = [torch.randn(s, generator=gen) for s in shapes]
    grads = [torch.randn(s, generator=gen) for s in shapes]
    engine = Engine(params, group_of(params), dict(CONFIGS["zenflow overlap"]))
    for _ in range(2 * INTERVAL):
        engine.step(grads)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.step(grads)
        times.append(time.perf_counter() - start)
    engine.close()
    return statistics.median(times), len(shapes)


def relative_error(got, want):
    return abs(got - want) / want if want else (0.0 if got == 0 else float("inf"))


def report(results, shapes, device_s, book, args, zenflow):
    n_params = sum(r * c for r, c in shapes)
    base_stall = results[BASELINE]["stall"]
    lines = [
        f"# Engine benchmark (host backend), {datetime.date.today().isoformat()}",
        "",
        f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"zenflow {zenflow.__version__}, SIMD {zenflow.simd_level()}",
        f"- model: {len(shapes)} bf16 matrices of {shapes[0][0]}x{shapes[0][1]} = "
        f"{n_params / 1e6:.1f}M parameters; bf16 gradients",
        f"- fake device time per step: {device_s * 1e3:.1f} ms; {args.steps} timed steps after "
        f"{args.warm_steps} untimed; pt_reserved_cores_perc {args.reserved}",
        "- step = fake device time + engine.step() call: the mean over the whole timed run "
        "(total / steps), median beside it; call = the engine.step() call (median); stall and "
        "seconds are per-step means of engine.stats() over the timed steps",
        "",
        "| configuration | step ms (mean) | step ms (median) | call ms | stall ms/step (close / back-pressure / flush)"
        " | stall reduction vs plain | host update ms/step | accumulate ms/step "
        "| down B/param/step (formula, err) | up B/param/step (formula, err) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        stalls = " / ".join(f"{r[key] * 1e3:.2f}" for key in STALL_KEYS)
        reduction = (
            "-"
            if name == BASELINE or base_stall == 0
            else f"{100 * (1 - r['stall'] / base_stall):.1f}%"
        )
        down, up = r["bytes_down"] / n_params, r["bytes_up"] / n_params
        down_f, up_f = r["down_formula"] / n_params, r["up_formula"] / n_params
        lines.append(
            f"| {name} | {r['step_mean'] * 1e3:.1f} | {r['step_median'] * 1e3:.1f} "
            f"| {r['call_median'] * 1e3:.1f} "
            f"| {r['stall'] * 1e3:.2f} ({stalls}) | {reduction} "
            f"| {r['host_update_seconds'] * 1e3:.1f} | {r['accumulate_seconds'] * 1e3:.1f} "
            f"| {down:.4f} ({down_f:.4f}, {100 * relative_error(down, down_f):.2f}%) "
            f"| {up:.4f} ({up_f:.4f}, {100 * relative_error(up, up_f):.2f}%) |"
        )
    overlap = results["zenflow overlap"]
    condition = device_s >= overlap["host_update_per_window"] / INTERVAL
    reduction = 1 - overlap["stall"] / base_stall if base_stall else float("nan")
    bytes_ok = all(
        relative_error(r["bytes_down"], r["down_formula"]) <= 0.01
        and relative_error(r["bytes_up"], r["up_formula"]) <= 0.01
        for r in results.values()
    )
    lines += [
        "",
        "Targets:",
        f"- stall reduction of overlap vs plain sync >= 85%: {100 * reduction:.1f}% "
        f"({'met' if reduction >= 0.85 else 'NOT met'}); the condition "
        f"device time >= host update / S: {device_s * 1e3:.1f} ms vs "
        f"{overlap['host_update_per_window'] / INTERVAL * 1e3:.1f} ms "
        f"({'holds' if condition else 'does not hold'})",
        f"- bytes per step within 1% of the formula: {'met' if bytes_ok else 'NOT met'}",
        f"- bookkeeping, one step call on {book[1]} tiny tensors: {book[0] * 1e3:.3f} ms "
        f"(target < 1 ms: {'met' if book[0] < 1e-3 else 'NOT met'})",
    ]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=float, default=50e6, help="total parameters")
    parser.add_argument("--quick", action="store_true", help="~2M parameters, fewer steps")
    parser.add_argument(
        "--device-ms",
        default="auto",
        help="fake device time per step in ms, or 'auto': 1.25 x host update per window / S",
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps (whole windows)")
    parser.add_argument("--reserved", type=float, default=0.5, help="pt_reserved_cores_perc")
    parser.add_argument("--write", type=Path, default=None, help="save the markdown table")
    args = parser.parse_args()
    zenflow, Engine = load_engine()

    total = 2e6 if args.quick else args.params
    args.steps = args.steps or (4 * INTERVAL if args.quick else 6 * INTERVAL)
    args.steps = INTERVAL * max(1, round(args.steps / INTERVAL))  # whole windows
    args.warm_steps = 2 * INTERVAL  # overlap's first upload happens at the second close
    shapes = model_shapes(total)
    gen = torch.Generator().manual_seed(1)
    grad_sets = [
        [(1e-3 * torch.randn(s, generator=gen)).to(torch.bfloat16) for s in shapes]
        for _ in range(2)
    ]
    if args.device_ms == "auto":
        device_s = calibrate_device_time(Engine, shapes, grad_sets, args)
    else:
        device_s = float(args.device_ms) / 1e3
    print(f"bench_engine: {len(shapes)} matrices, device {device_s * 1e3:.1f} ms", file=sys.stderr)

    results = {
        name: run_config(
            Engine, name, config, shapes, grad_sets, device_s, args.warm_steps, args.steps, args
        )
        for name, config in CONFIGS.items()
    }
    book = bookkeeping(Engine, repeats=50 if args.quick else 200)
    text = report(results, shapes, device_s, book, args, zenflow)
    print(text)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(text)


if __name__ == "__main__":
    main()
