"""ZenFlowAdamW's own per-step CPU cost (issue 9's target: under 1 ms at 300 parameter
tensors, not counting the math): a thin caller of `zenflow.bench` (the "overhead" case of
`python -m zenflow bench optimizer`).

    python benchmarks/bench_optimizer.py
    python benchmarks/bench_optimizer.py --write benchmarks/results/2026-12-03-optimizer-overhead.md
"""

import sys
from pathlib import Path

from zenflow.bench.scripts import optimizer_main

if __name__ == "__main__":
    sys.exit(optimizer_main(prog=Path(__file__).name))
