"""The engine on the host backend: stall-free overlap against synchronous offload. A thin
caller of `zenflow.bench` (`python -m zenflow bench engine` runs the same code; its module
docstring, zenflow/bench/engine.py, describes the method).

    python benchmarks/bench_engine.py                          # ~50M parameters
    python benchmarks/bench_engine.py --quick                  # ~2M, a CI smoke run
    python benchmarks/bench_engine.py --params 2e7 --device-ms 80 --write out.md
"""

import sys
from pathlib import Path

from zenflow.bench.scripts import engine_main

if __name__ == "__main__":
    sys.exit(engine_main(prog=Path(__file__).name))
