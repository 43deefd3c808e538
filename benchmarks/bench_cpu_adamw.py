"""CPU optimizer kernels against their peers, in one process: a thin caller of
`zenflow.bench` (`python -m zenflow bench ops` runs the same cases).

Cases: the plain fp32 AdamW step (zenflow against torch.optim.AdamW(fused=True) and
(foreach=True), and DeepSpeed's DeepSpeedCPUAdam when installed), the window-close update,
`accumulate`, and the skip-columns step, each against the torch sequence doing the same work;
interleaved, beside the streaming roof measured in the same run.

    python benchmarks/bench_cpu_adamw.py                      # 1M, 16M, 128M; 1 and 2 threads
    python benchmarks/bench_cpu_adamw.py --sizes 1e6 --threads 1 --no-write

--defaults: the drop-in question: zenflow.CPUAdamW at its defaults against
torch.optim.AdamW(fused=True), fp32 and bf16 parameters, with nothing set (no environment
variable, no thread count), and CPUAdamW on zenflow's own threads with and without its OpenMP
pause.

    python benchmarks/bench_cpu_adamw.py --defaults           # writes *-cpu-adamw-defaults.md
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Several thread pools share the cores here; OpenMP workers spin after each parallel region
# and would take the cores of the next candidate in the interleaved loop. --defaults
# measures the out-of-the-box behaviour, so it sets nothing. Set before torch loads.
if "--defaults" not in sys.argv[1:]:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from zenflow.bench.scripts import cpu_adamw_main  # noqa: E402

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    sys.exit(cpu_adamw_main(prog=Path(__file__).name, results=here / "results"))
