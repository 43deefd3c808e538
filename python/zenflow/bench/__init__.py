"""Microbenchmarks of the installed zenflow, each against its peer in the same process:

    python -m zenflow bench ops        [--quick] [--json] [--device auto|cpu|cuda] [--out FILE]
    python -m zenflow bench optimizer  [--quick] [--json] [--device auto|cpu|cuda] [--out FILE]
    python -m zenflow bench engine     [--quick] [--json] [--out FILE]
    python -m zenflow bench overhead   [--quick] [--cpp-build-dir DIR] [--write FILE]
    python -m zenflow bench accuracy   [--regime scratch|finetune] [--arch ...] [--steps N] ...

`ops`: column statistics, top-k, pack, accumulate and the host AdamW steps against the torch
code doing the same work; `optimizer`: CPUAdamW and ZenFlowAdamW against
torch.optim.AdamW(fused=True); `engine`: the engine's stall and bytes against synchronous
offload. Every comparison runs interleaved (A B A B ...), reports medians and the mean over
the whole run, the ratio to the peer, and the machine's streaming roof measured in the same
run. A markdown report goes to stdout (--json: JSON), progress to stderr. With a GPU visible
(and zenflow built with CUDA), `--device auto` (the default) adds the CUDA variants.
The scripts in the repository's benchmarks/ call this same code.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ._harness import (
    Progress,
    Report,
    add_engine_setting_argument,
    command_line,
    devices,
    measure_roof,
    parse_count,
)

__all__ = ["main", "run_ops", "run_optimizer", "run_engine"]


def _roofs(device_list: list[str], quick: bool, progress: Progress) -> dict:
    elements = (8 << 20) if quick else (32 << 20)
    return {
        d: measure_roof(d, elements, rounds=5 if quick else 9, progress=progress)
        for d in device_list
    }


def run_ops(
    quick: bool = False,
    device: str = "auto",
    elements: int | None = None,
    rounds: int | None = None,
    cases: list[str] | None = None,
    progress: Progress | None = None,
    command: str = "python -m zenflow bench ops",
) -> Report:
    """The `ops` benchmark as a Report (see the module docstring)."""
    from . import ops

    progress = progress or Progress(enabled=False)
    device_list = devices(device)
    report = Report("ops", command, roofs=_roofs(device_list, quick, progress))
    for d in device_list:
        config = ops.OpsConfig.quick(d) if quick else ops.OpsConfig(device=d)
        if elements is not None:
            config.elements = elements
        if rounds is not None:
            config.rounds = rounds
        if cases is not None:
            config.cases = tuple(cases)
        report.sections += ops.run(config, progress)
    report.facts["threads"] = ops.threads_note()
    return report


def run_optimizer(
    quick: bool = False,
    device: str = "auto",
    dtype: str | None = None,
    steps: int | None = None,
    cases: list[str] | None = None,
    progress: Progress | None = None,
    command: str = "python -m zenflow bench optimizer",
) -> Report:
    """The `optimizer` benchmark as a Report."""
    from . import optimizer

    progress = progress or Progress(enabled=False)
    device_list = devices(device)
    report = Report("optimizer", command, roofs=_roofs(device_list, quick, progress))
    for d in device_list:
        config = (
            optimizer.OptimizerConfig.quick(d) if quick else optimizer.OptimizerConfig(device=d)
        )
        if dtype is not None:
            config.dtype = dtype
        if steps is not None:
            config.steps = steps
        if cases is not None:
            config.cases = tuple(cases)
        if d != "cpu" and dtype is None:
            config.dtype = "bfloat16"  # what a GPU trains in
        report.sections += optimizer.run(config, progress)
    return report


def run_engine(
    quick: bool = False,
    params: float | None = None,
    device_ms: float | None = None,
    steps: int | None = None,
    reserved: float | None = None,
    progress: Progress | None = None,
    command: str = "python -m zenflow bench engine",
    settings: list[str] | None = None,
) -> Report:
    """The `engine` benchmark (host backend) as a Report. settings: more rows, each
    "key=value,..." of engine settings over zenflow overlap's."""
    from . import engine

    progress = progress or Progress(enabled=False)
    config = engine.EngineConfig.quick() if quick else engine.EngineConfig()
    if params is not None:
        config.params = params
    if device_ms is not None:
        config.device_ms = device_ms
    if steps is not None:
        config.steps = steps
    if reserved is not None:
        config.reserved = reserved
    if settings:
        from .accuracy import parse_setting  # the accuracy benchmark's key=value parsing

        config.settings.update(parse_setting(text) for text in settings)
    report = Report("engine", command, roofs=_roofs(["cpu"], quick, progress), interleaved=False)
    sections, notes, facts = engine.run(config, progress)
    report.sections += sections
    report.notes += notes
    report.facts.update(facts)
    report.notes.append(
        "The engine's CUDA backend has its own GPU benchmark (benchmarks/device/bench_engine_gpu.py "
        "in the repository); it has not run on a GPU yet."
    )
    return report


def _emit(report: Report, args: argparse.Namespace) -> None:
    text = report.to_json() if args.json else report.to_markdown()
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `... | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if args.out is not None:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report.to_json() if out.suffix == ".json" else report.to_markdown())


def _common(parser: argparse.ArgumentParser, device: bool = True) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds (seconds)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of markdown")
    parser.add_argument("--out", default=None, help="also write the report here (.json: JSON)")
    parser.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    if device:
        parser.add_argument(
            "--device",
            default="auto",
            choices=("auto", "cpu", "cuda"),
            help="auto: the CPU, and CUDA too when a GPU is usable",
        )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m zenflow bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="benchmark", required=True)
    p_ops = sub.add_parser("ops", help="column stats, top-k, pack, host AdamW vs torch")
    _common(p_ops)
    p_ops.add_argument("--elements", default=None, help="elements per case, e.g. 16M (quick: 1M)")
    p_ops.add_argument("--rounds", type=int, default=None, help="interleaved rounds per case")
    p_ops.add_argument("--cases", default=None, help="comma-separated, e.g. column_stats,adamw")
    p_opt = sub.add_parser("optimizer", help="CPUAdamW, ZenFlowAdamW vs AdamW(fused=True)")
    _common(p_opt)
    p_opt.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"))
    p_opt.add_argument("--steps", type=int, default=None, help="timed steps per optimizer")
    p_opt.add_argument("--cases", default=None, help="step,overhead")
    p_eng = sub.add_parser("engine", help="stall and bytes against synchronous offload")
    _common(p_eng, device=False)
    p_eng.add_argument("--params", type=float, default=None, help="model size (default 50e6)")
    p_eng.add_argument("--device-ms", type=float, default=None, help="fake device time per step")
    p_eng.add_argument("--steps", type=int, default=None, help="timed steps (whole windows)")
    p_eng.add_argument("--reserved", type=float, default=None, help="pt_reserved_cores_perc")
    add_engine_setting_argument(p_eng)
    sub.add_parser("overhead", help="per-call overhead of the ops at 300 matrices", add_help=False)
    sub.add_parser(
        "accuracy", help="held-out loss against AdamW, from scratch and fine-tuning", add_help=False
    )
    args, rest = parser.parse_known_args(argv)
    if args.benchmark == "overhead":
        from .overhead import main as overhead_main

        return overhead_main(rest)
    if args.benchmark == "accuracy":
        from .accuracy import main as accuracy_main

        return accuracy_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    progress = Progress(enabled=not args.no_progress)
    command = command_line("python -m zenflow bench", argv)
    try:
        if args.benchmark == "ops":
            report = run_ops(
                args.quick,
                args.device,
                None if args.elements is None else parse_count(args.elements),
                args.rounds,
                None if args.cases is None else args.cases.split(","),
                progress,
                command,
            )
        elif args.benchmark == "optimizer":
            report = run_optimizer(
                args.quick,
                args.device,
                args.dtype,
                args.steps,
                None if args.cases is None else args.cases.split(","),
                progress,
                command,
            )
        else:
            report = run_engine(
                args.quick,
                args.params,
                args.device_ms,
                args.steps,
                args.reserved,
                progress,
                command,
                args.setting,
            )
    except ValueError as error:
        parser.error(str(error))
    finally:
        progress.close()
    _emit(report, args)
    return 0
