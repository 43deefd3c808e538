"""The command lines of the repository's benchmarks/*.py scripts, kept as they were (CI and
the dated results call them with these flags), on top of the package's benchmarks: one
implementation, two front doors. Each `*_main` returns an exit status.

    benchmarks/bench_column_stats.py  --elements 64M --rounds 15 --threads N
    benchmarks/bench_cpu_adamw.py     --sizes 1e6,16e6 --threads 1,2 --cases plain,window,...
                                      --reps N --no-write | --defaults [...]
    benchmarks/bench_optimizer.py     --tensors 300 --rows 8 --cols 16 --dtype bfloat16 --reps N
    benchmarks/bench_engine.py        --params 50e6 --quick --device-ms auto --steps N
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import sys
from pathlib import Path

import torch

import zenflow

from . import ops as ops_bench
from . import optimizer as optimizer_bench
from ._harness import (
    Progress,
    Report,
    add_engine_setting_argument,
    command_line,
    measure_roof,
    parse_count,
)


def set_all_threads(n: int) -> None:
    """zenflow's pool, torch's intra-op threads and every OpenMP runtime loaded here (torch
    ships its own libgomp; DeepSpeed's JIT op links the system one)."""
    zenflow.set_num_threads(n)
    torch.set_num_threads(n)
    seen = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if (
                    any(name in path for name in ("libgomp", "libiomp", "libomp"))
                    and path not in seen
                ):
                    seen.add(path)
                    try:
                        ctypes.CDLL(path).omp_set_num_threads(n)
                    except (OSError, AttributeError):
                        pass
    except OSError:
        pass


def _write(report: Report, path: Path | None) -> None:
    text = report.to_markdown()
    print(text)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")


def column_stats_main(argv: list[str] | None = None, prog: str = "bench_column_stats.py") -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description="Host column_stats against torch's g.float().square().sum(0)."
    )
    parser.add_argument("--elements", default="64M")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None, help="zenflow and torch threads")
    args = parser.parse_args(argv)
    set_all_threads(args.threads or zenflow.native().host_cpu_count())
    progress = Progress()
    config = ops_bench.OpsConfig(elements=parse_count(args.elements), rounds=args.rounds)
    report = Report(
        "ops (column_stats)",
        command_line(f"python benchmarks/{prog}", argv),
        roofs={"cpu": measure_roof("cpu", progress=progress)},
    )
    for dtype, square in (
        (torch.bfloat16, True),
        (torch.float32, True),
        (torch.float16, True),
        (torch.bfloat16, False),
    ):
        report.sections.append(ops_bench.bench_column_stats(config, dtype, progress, square=square))
    report.facts["threads"] = ops_bench.threads_note()
    _write(report, None)
    return 0


_LEGACY_CASES = {"plain": "adamw", "window": "window", "accumulate": "accumulate", "skip": "skip"}


def cpu_adamw_main(
    argv: list[str] | None = None, prog: str = "bench_cpu_adamw.py", results: Path | None = None
) -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description="zenflow's CPU optimizer kernels against their peers, interleaved."
    )
    parser.add_argument("--sizes", default="1e6,16e6,128e6", help="elements, comma-separated")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--cases", default="plain,window,accumulate,skip")
    parser.add_argument("--no-write", action="store_true", help="print only; write no results file")
    parser.add_argument(
        "--reps", type=int, default=0, help="repetitions per case (default: by size)"
    )
    parser.add_argument("--defaults", action="store_true", help="CPUAdamW at its defaults vs fused")
    parser.add_argument(
        "--shipped-only", action="store_true", help="--defaults: CPUAdamW as shipped"
    )
    parser.add_argument("--dtypes", default="", help="--defaults: e.g. bfloat16 (default: both)")
    parser.add_argument(
        "--model-only", action="store_true", help="--defaults: the 300-tensor model"
    )
    parser.add_argument(
        "--with-overhead", action="store_true", help="--defaults: 300 tiny tensors too"
    )
    parser.add_argument("--out", default="", help="--defaults: results file name")
    args = parser.parse_args(argv)
    command = command_line(f"python benchmarks/{prog}", argv)
    progress = Progress()
    today = datetime.date.today().isoformat()
    if args.defaults:
        cases = [
            ("1 tensor of 1M", [(1024, 1024)]),
            ("1 tensor of 16M", [(4096, 4096)]),
            ("300 tensors (a small model, 19.7M)", [(256, 256)] * 300),
            ("1 tensor of 64M", [(8192, 8192)]),
        ]
        if any(a.startswith("--sizes") for a in (sys.argv[1:] if argv is None else argv)):
            cases = [(f"1 tensor of {n}", [(int(float(n)),)]) for n in args.sizes.split(",")]
        if args.model_only:
            cases = [c for c in cases if c[0].startswith("300 tensors")]
        if args.with_overhead:
            cases.insert(0, ("300 tensors of 4x4 (per-step overhead)", [(4, 4)] * 300))
        dtypes = [torch.float32, torch.bfloat16]
        if args.dtypes:
            dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
        reps = args.reps or 21
        report = Report("optimizer (CPUAdamW at its defaults)", command)
        report.roofs["cpu"] = measure_roof("cpu", progress=progress)
        report.sections += optimizer_bench.bench_defaults(
            cases, dtypes, reps, progress, shipped_only=args.shipped_only
        )
        name = args.out or f"{today}-cpu-adamw-defaults.md"
        _write(report, None if args.no_write or results is None else results / name)
        return 0

    cases = []
    for case in args.cases.split(","):
        if case not in _LEGACY_CASES:
            parser.error(f"--cases: unknown case {case!r} (expected {', '.join(_LEGACY_CASES)})")
        cases.append(_LEGACY_CASES[case])
    report = Report("ops (CPU optimizer kernels)", command)
    report.roofs["cpu"] = measure_roof("cpu", progress=progress)
    for size in args.sizes.split(","):
        n = int(float(size))
        for threads in (int(t) for t in args.threads.split(",")):
            set_all_threads(threads)
            reps = args.reps or (41 if n <= 2_000_000 else 15 if n <= 20_000_000 else 7)
            config = ops_bench.OpsConfig(
                elements=n, rounds=reps, cases=tuple(cases), deepspeed="adamw" in cases
            )
            for section in ops_bench.run(config, progress):
                section.title += f", {threads} threads"
                report.sections.append(section)
            gc.collect()
    _write(report, None if args.no_write or results is None else results / f"{today}-cpu-adamw.md")
    return 0


def optimizer_main(argv: list[str] | None = None, prog: str = "bench_optimizer.py") -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description="ZenFlowAdamW's own per-step CPU cost at 300 parameter tensors."
    )
    parser.add_argument("--tensors", type=int, default=300)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--cols", type=int, default=16)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--bucket-bytes", type=int, default=4096)
    parser.add_argument("--write", type=Path, default=None, help="save the markdown report here")
    args = parser.parse_args(argv)
    config = optimizer_bench.OptimizerConfig(
        tensors=args.tensors,
        tiny_rows=args.rows,
        tiny_cols=args.cols,
        tiny_dtype=args.dtype,
        reps=args.reps,
        bucket_bytes=args.bucket_bytes,
        cases=("overhead",),
    )
    report = Report(
        "optimizer (per-step overhead)", command_line(f"python benchmarks/{prog}", argv)
    )
    report.sections += optimizer_bench.run(config, Progress())
    _write(report, args.write)
    return 0


def engine_main(argv: list[str] | None = None, prog: str = "bench_engine.py") -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description="The engine on the host backend against synchronous offload."
    )
    parser.add_argument("--params", type=float, default=50e6, help="total parameters")
    parser.add_argument("--quick", action="store_true", help="~2M parameters, fewer steps")
    parser.add_argument(
        "--device-ms", default="auto", help="fake device time per step in ms, or 'auto'"
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps (whole windows)")
    parser.add_argument("--reserved", type=float, default=0.5, help="pt_reserved_cores_perc")
    add_engine_setting_argument(parser)
    parser.add_argument("--write", type=Path, default=None, help="save the markdown report")
    args = parser.parse_args(argv)
    from . import run_engine

    report = run_engine(
        quick=args.quick,
        params=None if args.quick else args.params,
        device_ms=None if args.device_ms == "auto" else float(args.device_ms),
        steps=args.steps,
        reserved=args.reserved,
        progress=Progress(),
        command=command_line(f"python benchmarks/{prog}", argv),
        settings=args.setting,
    )
    _write(report, args.write)
    return 0


__all__ = [
    "column_stats_main",
    "cpu_adamw_main",
    "engine_main",
    "optimizer_main",
    "set_all_threads",
]
