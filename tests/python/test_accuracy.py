"""Accuracy against torch.optim.AdamW in both regimes, on the tiny models (issue 28); the full
comparison is benchmarks/bench_accuracy.py (results: benchmarks/results/*-accuracy.md).

Every run is deterministic (fixed seeds, one torch thread, the engine's landing steps follow
the step count alone), so these bounds are regression bounds: each is the value measured when
it was set plus a margin for other SIMD levels and torch builds, not a target.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from reference_training import train_scratch_with_reference

import zenflow
from zenflow.bench import accuracy

# What users get: the engine's defaults, its synchronous start detection included.
pytestmark = pytest.mark.engine_defaults

TINY = accuracy.SCRATCH_SIZES["tiny"]
STEPS, LR, SEED = 200, 3e-3, 0
SYNC_OFFLOAD = dict(topk_ratio=0.0, update_interval=1, overlap_step=False)


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def held_out(arch, options):
    optimizer = "adamw" if options is None else "zenflow"
    return accuracy.train_scratch(arch, TINY, optimizer, options, STEPS, LR, SEED)["held_out"]


# From scratch the engine's detection starts synchronously (auto_warm_up_rounds, default 200:
# the whole of these 200-step runs); DETECTED is that start scaled to the run (200 of the
# benchmark's 600 steps, 100 of 200 here) and NO_START the defaults without it.
DETECTED = dict(auto_warm_up_rounds=100)
NO_START = dict(auto_warm_up_rounds=0)
# Measured 2026-12-06 (AVX-512, torch 2.13.0+cpu), held-out loss / AdamW's - 1 after 200
# steps at lr 3e-3: the detected start GPT-2 +0.46%, Llama +0.80% (+0.75% and +1.28% before
# the moments went over to windows' at the first window); without a start (the defaults
# before the detection, window_scaling sqrt, update_lag 1) +10.52% and +12.05%; update_lag
# "window" +18.03% and +26.87%; a 50-step start +1.52% and +3.59% (detected or fixed: the
# same bits); synchronous offload 0.000% for both.
DETECTED_BOUND = {"gpt2": 0.01, "llama": 0.015}
NO_START_BOUND = {"gpt2": 0.125, "llama": 0.145}
WARM_START = dict(full_warm_up_rounds=50, **NO_START)
WARM_START_BOUND = {"gpt2": 0.025, "llama": 0.05}
# The README's from-scratch setting within 2% (full_warm_up_rounds=300, update_interval=2 in
# 600 steps; here the synchronous start is the same half of the run, 100 of 200 steps),
# measured 2026-12-06 (AVX-512, torch 2.13.0+cpu): GPT-2 +0.33%, Llama +0.76% (+0.48% and
# +0.93% before the moments' change of regime).
SCRATCH_SETTING = dict(update_interval=2, full_warm_up_rounds=100, **NO_START)
SCRATCH_SETTING_BOUND = {"gpt2": 0.01, "llama": 0.015}


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_from_scratch_against_adamw(arch):
    adamw = held_out(arch, None)
    # Synchronous offload is AdamW (the engine is exact; the rest is the algorithm's).
    assert abs(held_out(arch, SYNC_OFFLOAD) / adamw - 1) < 2e-3
    # At the defaults the engine takes the run for one from scratch: a 200-step start.
    run = accuracy.train_scratch(arch, TINY, "zenflow", {}, STEPS, LR, SEED)
    assert run["stats"]["synchronous_start_steps"] == 200
    detected = held_out(arch, DETECTED) / adamw - 1
    no_start = held_out(arch, NO_START) / adamw - 1
    window = held_out(arch, dict(NO_START, update_lag="window")) / adamw - 1
    assert detected < DETECTED_BOUND[arch], (
        f"{arch}: the detected start {100 * detected:+.2f}% of AdamW's held-out loss"
    )
    assert no_start < NO_START_BOUND[arch], (
        f"{arch}: without a start {100 * no_start:+.2f}% of AdamW's held-out loss"
    )
    # The detected start is what brings the defaults close; and landing one step into the
    # next window (the default) beats landing at its close.
    assert detected < no_start, (
        f"{arch}: detected {100 * detected:+.2f}%, none {100 * no_start:+.2f}%"
    )
    assert no_start < window, (
        f"{arch}: update_lag 1 {100 * no_start:+.2f}%, window {100 * window:+.2f}%"
    )
    warm = held_out(arch, WARM_START) / adamw - 1
    assert warm < WARM_START_BOUND[arch], (
        f"{arch}: the defaults with a synchronous start {100 * warm:+.2f}%"
    )
    setting = held_out(arch, SCRATCH_SETTING) / adamw - 1
    assert setting < SCRATCH_SETTING_BOUND[arch], (
        f"{arch}: the from-scratch setting {100 * setting:+.2f}% of AdamW's held-out loss"
    )


# The engine's training run against the float64 reference model driving the same run (same
# weights, batches, clipping, schedule): measured 2026-12-06 (AVX-512), held-out losses equal
# to 4e-9 to 3e-7 relative (fp32 arithmetic against float64 over 100 to 200 steps of real
# training). A bound 30x the largest leaves room for other SIMD levels; a wrong rule (a
# scaling, a landing step, a window close) moves the loss by 1e-3 or more.
FOLLOWS_REFERENCE = [
    (100, 1e-3, {}),  # detected from scratch: synchronous throughout
    (100, 3e-3, {"auto_warm_up_rounds": 40}),  # detected: a 40-step start, then windows
    (200, 3e-3, dict(NO_START)),
    (100, 1e-3, dict(NO_START, update_interval="auto")),
    (100, 1e-3, dict(NO_START, window_scaling="none", update_lag="window")),
    (100, 1e-3, dict(NO_START, full_warm_up_rounds=30, overlap_step=False, topk_ratio=0.2)),
]


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("steps, lr, options", FOLLOWS_REFERENCE)
def test_the_engines_training_run_follows_the_float64_reference(arch, steps, lr, options):
    engine = accuracy.train_scratch(arch, TINY, "zenflow", dict(options), steps, lr, SEED)
    reference = train_scratch_with_reference(arch, TINY, dict(options), steps, lr, SEED)
    assert abs(engine["held_out"] / reference - 1) < 1e-5, (
        f"{arch} {options}: engine {engine['held_out']:.9f}, reference {reference:.9f}"
    )


# Measured 2026-12-06, seed 0: +0.68% at the defaults (the 8-step detection, window_scaling
# sqrt; +0.59% without the detection); without the detection, +2.58% with window_scaling
# "none" and +0.04% with update_interval=1, topk_ratio=0.3 (the test runs them with it).
FINETUNE_BOUND = 0.01
FINETUNE_SETTING = dict(update_interval=1, topk_ratio=0.3)
FINETUNE_SETTING_BOUND = 0.005


def test_fine_tuning_the_readme_job_against_adamw():
    # The README's main job: the demo's tiny model, 120 steps of fine-tuning.
    adamw = accuracy.finetune("tiny", None, 120, 0)["held_out"]
    run = accuracy.finetune("tiny", {}, 120, 0)
    # The start's detection reads the first 8 steps and takes them for fine-tuning: no longer
    # start.
    assert run["stats"]["synchronous_start_steps"] == 8
    zenflow = run["held_out"]
    assert zenflow / adamw - 1 < FINETUNE_BOUND, f"{100 * (zenflow / adamw - 1):+.2f}%"
    # A window's update standing for its steps is what brings the defaults there.
    plain = accuracy.finetune("tiny", {"window_scaling": "none"}, 120, 0)["held_out"]
    assert zenflow < plain, f"sqrt {zenflow:.4f}, none {plain:.4f}"
    setting = accuracy.finetune("tiny", FINETUNE_SETTING, 120, 0)["held_out"] / adamw - 1
    assert setting < FINETUNE_SETTING_BOUND, f"the fine-tuning setting {100 * setting:+.2f}%"


def test_the_benchmark_command_reports_every_setting(capsys, tmp_path):
    rows_file = tmp_path / "rows.json"
    status = accuracy.main(
        [
            "--arch",
            "llama",
            "--steps",
            "12",
            "--lr",
            "1e-3",
            "--seeds",
            "0",
            "--setting",
            "defaults",
        ]
        + ["--setting", "update_lag=window,topk_ratio=0.2", "--json", str(rows_file)]
    )
    assert status == 0
    table = capsys.readouterr().out
    assert "| scratch | llama tiny | 12 | 0.001 | defaults |" in table
    assert "update_lag=window,topk_ratio=0.2" in table
    assert rows_file.read_text().count('"setting"') == 2
    with pytest.raises(ValueError, match="--setting"):
        accuracy.parse_setting("update_lag")


def test_the_lab_simulation_runs_every_candidate_rule():
    # benchmarks/lab/simulate_accuracy.py (results:
    # benchmarks/results/2026-12-06-staleness-compensation.md), a few steps of each rule.
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "lab" / "simulate_accuracy.py"
    env = dict(os.environ, PYTHONPATH=str(Path(zenflow.__file__).resolve().parents[1]))
    settings = [
        "defaults",
        "lab_compensation=1,lab_ramp=10",
        "lab_early_windows=4",
        "lab_consistency=true",
    ]
    done = subprocess.run(
        [sys.executable, str(script), "--arch", "gpt2", "--lr", "1e-3", "--seeds", "0"]
        + ["--steps", "12"]
        + [arg for s in settings for arg in ("--setting", s)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| gpt2 | 0.001 |")]
    assert [row.split(" | ")[2] for row in rows] == settings
