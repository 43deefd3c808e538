"""The accuracy benchmark's from-scratch runs with the engine's float64 reference model
(tests/python/engine_reference.py) as the optimizer: a setting, or a candidate rule not in
the engine, measured in seconds per run before anything is built.

The reference is the model every engine test checks the engine against; driven here by the
same models, batches, clipping and schedule as `zenflow.bench.accuracy.train_scratch`, it
reproduces the engine's held-out loss (2026-12-06, 600 steps at lr 1e-3: the same per-seed
percentages to two decimals on both model families; at 3e-3, where runs are chaotic, within
0.6 points). A run of a tiny model takes about 7 s on one core.

Candidate rules (lab-only; each one was measured and not adopted, see
benchmarks/results/2026-12-06-staleness-compensation.md):

* ``lab_compensation=C``: a delay-compensated window gradient. The gradients a window took
  before the previous window's update landed (the first `update_lag` steps of the window)
  are corrected to the weights the update lands on, with Adam's own curvature model
  (an update -lr m/sqrt(v) is a Newton step for the diagonal curvature sqrt(v)/lr):
  g + C * sqrt(v_hat) * dw_prev / lr_prev for each such gradient.
* ``lab_ramp=N``: the window update's lr factor rising linearly from 1 to sqrt(S) over the
  first N steps (window_scaling "sqrt" warmed up).
* ``lab_early_windows=N``: windows of one step for the first N steps, then the configured
  ones.

    python benchmarks/lab/simulate_accuracy.py --arch gpt2,llama --lr 3e-3 --seeds 0,1,2 \\
        --setting defaults --setting lab_compensation=1
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))

import engine_reference  # noqa: E402
from engine_reference import ReferenceZenFlow  # noqa: E402
from reference_training import train_scratch_with_reference  # noqa: E402

from zenflow.bench import accuracy  # noqa: E402

LAB_KEYS = ("lab_compensation", "lab_ramp", "lab_early_windows", "lab_consistency")


class CandidateZenFlow(ReferenceZenFlow):
    """The reference with the lab's candidate rules (all off by default: the reference
    itself)."""

    def __init__(
        self, params, groups, config, compensation=0.0, ramp=0, early_windows=0, consistency=False
    ):
        super().__init__(params, groups, config)
        self.consistency = consistency
        # Per matrix, per column: the sum over the open window of each step's sum of squares
        # (of the gradient as used: clipped), for lab_consistency.
        self.step_energy = [None] * len(self.params)
        self.column_factor = None
        self.compensation = compensation
        self.ramp = ramp
        self.early_windows = early_windows
        self.landed_after = 0  # gradients of the open window taken before the last landing
        self.last_update: dict[int, tuple[np.ndarray, float]] = {}

    def _window_closes(self):
        return self.t <= self.early_windows or super()._window_closes()

    def _windowed_step(self, raw, used, grad_sizes, lrs):
        for i, (p, g) in enumerate(zip(self.params, used)):
            if p.matrix:
                e = np.sum(g * g, axis=0)
                self.step_energy[i] = e if self.step_energy[i] is None else self.step_energy[i] + e
        super()._windowed_step(raw, used, grad_sizes, lrs)

    def _adamw_columns(self, p, cols, g, lr, hparams=None, span=1):
        if span > 1 and self.column_factor is not None:
            # lr * S / sqrt(rho): rho = a step's mean energy / the window mean's energy, 1 for
            # a gradient the same at every step (lr * S, AdamW's S steps), S for noise (lr *
            # sqrt(S)), more where the steps cancel.
            (b1, b2), eps, wds = hparams if hparams is not None else self.hyperparameters()
            master, m, v = p.master[:, cols], p.exp_avg[:, cols], p.exp_avg_sq[:, cols]
            p.steps[cols] += span
            step_lr = lr * self.column_factor
            engine_reference.adamw_(
                master, m, v, g, p.steps[cols], lr, wds[p.group], b1, b2, eps, span, step_lr
            )
            p.master[:, cols], p.exp_avg[:, cols], p.exp_avg_sq[:, cols] = master, m, v
            return
        if span > 1 and self.ramp:
            target = math.sqrt(span)
            lr *= (1.0 + (target - 1.0) * min(1.0, self.t / self.ramp)) / target
        super()._adamw_columns(p, cols, g, lr, hparams, span)

    def _write(self, results):
        super()._write(results)
        self.landed_after = self.steps_in_window

    def _host_update(self):
        stale, self.landed_after = self.landed_after, 0
        if self.compensation and stale:
            (_, b2), _, _ = self.hyperparameters()
            for index, p in enumerate(self.params):
                if not p.matrix or index not in self.last_update:
                    continue
                dw, lr_prev = self.last_update[index]
                cols = p.deferred()
                v_hat = p.exp_avg_sq[:, cols] / (1.0 - b2 ** p.steps[cols].astype(np.float64))
                p.accum[:, cols] += (
                    stale * self.compensation * np.sqrt(v_hat) * dw[:, cols] / lr_prev
                )
        before = {i: p.master.copy() for i, p in enumerate(self.params) if p.matrix}
        if self.consistency:
            results = self._host_update_by_consistency()
        else:
            results = super()._host_update()
        self.step_energy = [None] * len(self.params)
        for i, master in before.items():
            p = self.params[i]
            self.last_update[i] = (p.master - master, self.last_accumulated_lrs[p.group])
        return results

    def _host_update_by_consistency(self):
        results = []
        steps = self.steps_accumulated
        for i, p in enumerate(self.params):
            if not p.matrix:
                continue
            cols = p.deferred()
            if len(cols) == 0:
                continue
            g = p.accum[:, cols] / steps
            mean_energy = np.sum(g * g, axis=0)
            step_energy = self.step_energy[i][cols] / steps
            rho = np.where(mean_energy > 0, step_energy / np.maximum(mean_energy, 1e-300), 1.0)
            self.column_factor = steps / np.sqrt(np.maximum(rho, 1.0))
            lr = self.last_accumulated_lrs[p.group]
            self._adamw_columns(p, cols, g, lr, self.last_accumulated_hparams, steps)
            self.column_factor = None
            p.accum[:, cols] = 0.0
            results.append((p, cols, p.master[:, cols].copy()))
        self.steps_accumulated = 0
        return results


def train(arch: str, lr: float, seed: int, setting: dict | None, steps: int) -> float:
    """Held-out loss of one run: torch AdamW (setting None, the benchmark's own run) or the
    reference with `setting` (engine config keys and the lab's keys)."""
    size = accuracy.SCRATCH_SIZES["tiny"]
    if setting is None:
        return accuracy.train_scratch(arch, size, "adamw", None, steps, lr, seed)["held_out"]
    config = {k: v for k, v in setting.items() if k not in LAB_KEYS}

    def make_reference(params, groups, engine_config):
        return CandidateZenFlow(
            params,
            groups,
            engine_config,
            compensation=float(setting.get("lab_compensation", 0.0)),
            ramp=int(setting.get("lab_ramp", 0)),
            early_windows=int(setting.get("lab_early_windows", 0)),
            consistency=bool(setting.get("lab_consistency", False)),
        )

    return train_scratch_with_reference(arch, size, config, steps, lr, seed, make_reference)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="gpt2,llama")
    parser.add_argument("--lr", default="1e-3,3e-3")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--setting", action="append", default=[])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    settings = [accuracy.parse_setting(s) for s in (args.setting or ["defaults"])]
    print("| model | lr | setting | vs AdamW, mean | per seed |\n|---|---:|---|---:|---|")
    for arch in args.arch.split(","):
        for lr in (float(x) for x in args.lr.split(",")):
            base = [train(arch, lr, s, None, args.steps) for s in seeds]
            for label, setting in settings:
                held = [train(arch, lr, s, setting, args.steps) for s in seeds]
                rel = [100.0 * (h / b - 1.0) for h, b in zip(held, base)]
                per_seed = ", ".join(f"{r:+.2f}%" for r in rel)
                print(
                    f"| {arch} | {lr:g} | {label} | {statistics.fmean(rel):+.2f}% | {per_seed} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
