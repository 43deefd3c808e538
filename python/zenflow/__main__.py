"""Command line: `python -m zenflow info`, `python -m zenflow demo [options]` and
`python -m zenflow bench {ops,optimizer,engine,overhead} [options]`."""

from __future__ import annotations

import argparse
import sys

from . import info


def _print_info() -> int:
    facts = info()
    archs = facts["cuda_architectures"] or "-"
    gpus = ", ".join(facts["gpus"]) if facts["gpus"] else "none visible"
    print(f"zenflow {facts['version']} (libzenflow {facts['library_version']})")
    simd = f"{facts['simd_level']} (CPU supports up to {facts['simd_supported']})"
    print(f"  SIMD level:      {simd}")
    if facts["cuda_compiled"]:
        print(f"  CUDA compiled:   yes (architectures: {archs})")
    else:
        print(f"  CUDA compiled:   NO: {facts['cuda_build_note']}")
    print(f"  GPUs:            {gpus}")
    print(f"  host threads:    {facts['host_threads']} of {facts['host_cpus']} CPUs")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zenflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="version, SIMD level, CUDA build and GPUs, host threads")
    sub.add_parser(
        "demo",
        help="train a small GPT three ways (AdamW, synchronous offload, zenflow)",
        add_help=False,
    )
    sub.add_parser(
        "bench",
        help="microbenchmarks against their peers: ops, optimizer, engine (--quick, --json)",
        add_help=False,
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        from .bench import main as bench_main

        return bench_main(rest)
    if args.command == "demo":
        from .demo import main as demo_main

        return demo_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "info":
        return _print_info()
    return 2


if __name__ == "__main__":
    sys.exit(main())
