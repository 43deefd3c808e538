"""Host column_stats against torch's `g.float().square().sum(0)`, side by side: a thin
caller of `zenflow.bench` (the same code as `python -m zenflow bench ops --cases column_stats`).

Both run on the same inputs, interleaved round by round, beside the streaming roof measured
in the same run. Reports medians and means, GB/s (bytes of gradient read), the ratio to
torch, and the fraction of the roof.

    python benchmarks/bench_column_stats.py [--elements 64M] [--rounds 15] [--threads N]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# torch's OpenMP workers spin after each parallel region and would take the cores of the next
# candidate in the interleaved rounds; set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from zenflow.bench.scripts import column_stats_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(column_stats_main(prog=Path(__file__).name))
