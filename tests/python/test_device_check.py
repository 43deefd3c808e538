"""benchmarks/device/check.sh, dry-run on the CPU with a fake nvidia-smi: the shell logic and
its skip paths, not the GPU. A lent GPU is rare, so the script must not break unnoticed:

* the plan runs every step in priority order, and its estimated time fits the budget (the
  8 minutes of one device call) with every step run;
* every script, flag and pytest selection it uses exists (the dry run collects the
  selections; a renamed test must not drop out of the GPU check silently);
* a small budget skips the last steps and says so (exit 1);
* no GPU: it stops at once (exit 2);
* at most 7 files under $OUT.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "benchmarks" / "device" / "check.sh"
STEPS = [
    "build",
    "kernel benchmark",
    "GPU tests",
    "engine benchmark",
    "sanitizer: engine (memcheck, racecheck)",
    "sanitizer: kernels (memcheck)",
    "sanitizer: hazards (racecheck)",
    "sanitizer: hazards (synccheck, initcheck)",
    "demo",
]
EIGHT_MINUTES = 480


def _fake_nvidia_smi(folder: Path, gpus: bool) -> Path:
    folder.mkdir()
    script = folder / "nvidia-smi"
    if gpus:
        script.write_text(
            "#!/bin/sh\n"
            'case "$*" in\n'
            '  *-L*) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)";;\n'
            '  *compute_cap*) echo "9.0";;\n'
            '  *query-gpu*) echo "NVIDIA H200, 143771 MiB, 580.00";;\n'
            "esac\n"
        )
    else:
        script.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder


def _dry_run(tmp_path: Path, gpus: bool = True, budget: int | None = None):
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "ZENFLOW_CHECK_DRY_RUN": "1",
        "PYTHON": sys.executable,
        "PATH": f"{_fake_nvidia_smi(tmp_path / 'bin', gpus)}{os.pathsep}{os.environ['PATH']}",
    }
    if budget is not None:
        env["ZENFLOW_CHECK_BUDGET_S"] = str(budget)
    result = subprocess.run(
        ["bash", str(CHECK)], capture_output=True, text=True, env=env, timeout=240
    )
    summary = next(out.glob("*-device-check.md")).read_text()
    return result, out, summary


def _rows(summary: str) -> dict[str, list[str]]:
    rows = {}
    for line in summary.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 5 and cells[0] not in ("step", "---"):
            rows[cells[0]] = cells[1:]
    return rows


def test_the_plan_runs_every_step_in_order_within_eight_minutes(tmp_path):
    result, out, summary = _dry_run(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = _rows(summary)
    assert list(rows) == STEPS
    assert all(status == "ok" for status, *_ in rows.values()), summary
    estimate = sum(int(cells[3]) for cells in rows.values())
    assert estimate <= int(os.environ.get("ZENFLOW_CHECK_BUDGET_S", 470)) <= EIGHT_MINUTES
    log = next(out.glob("*-device-check.log")).read_text()
    # every selection collected something, every flag is known
    for selection in re.findall(r"collected (\d+):", log):
        assert int(selection) > 0, log
    assert len(re.findall(r"collected \d+:", log)) == 4
    assert "UNKNOWN FLAG" not in log and "MISSING" not in log, log
    assert len(list(out.iterdir())) <= 7


def test_a_small_budget_skips_the_last_steps_and_fails(tmp_path):
    result, _, summary = _dry_run(tmp_path, budget=200)
    assert result.returncode == 1
    rows = _rows(summary)
    assert rows["build"][0] == "ok" and rows["GPU tests"][0] == "ok"
    assert rows["demo"][0] == "SKIPPED (budget)"
    assert "FAILED: " in summary and "demo (skipped: budget)" in summary


def test_no_gpu_stops_at_once(tmp_path):
    result, out, summary = _dry_run(tmp_path, gpus=False)
    assert result.returncode == 2
    assert "no GPU visible" in result.stdout
    assert "NONE VISIBLE" in summary
    assert "build" not in _rows(summary)
