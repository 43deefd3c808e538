"""Per-call overhead of zenflow's ops on many small matrices (issue 7's targets): a thin
caller of `zenflow.bench` (`python -m zenflow bench overhead` runs the same code).

With --cpp-build-dir pointing at a CMake build configured with -DZENFLOW_BUILD_TESTS=ON, also
runs zenflow_bench_plan_overhead and zenflow_bench_lane_latency.

    python benchmarks/bench_overhead.py
    python benchmarks/bench_overhead.py --cpp-build-dir build-dev --write
"""

import sys
from pathlib import Path

from zenflow.bench.overhead import main

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    sys.exit(
        main(
            prog="python benchmarks/bench_overhead.py",
            default_result=here / "results" / "2026-12-03-overhead.md",
        )
    )
