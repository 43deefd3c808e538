"""How much of each matrix's gradient the top 10% of its columns hold, in the accuracy
benchmark's runs under torch AdamW (issue 28): the premise of column selection is that a few
columns carry most of the gradient.

Per training step (not the fine-tuning demo's pretraining), averaged over the 2-D weight
matrices with at least 10 columns: the energy share (sum of squares) of the step's own top
10% of columns, and of the columns that were top 10% at the first step (the engine's default
selects once, at its first window, unless an epoch length is given). Random columns hold
0.10. Also the global gradient norm before clipping (from scratch only).

    python benchmarks/gradient_concentration.py scratch gpt2 1e-3
    python benchmarks/gradient_concentration.py finetune tiny 120
"""

from __future__ import annotations

import argparse

import torch

import zenflow.demo as demo
from zenflow.bench import accuracy

STEPS_SHOWN = (1, 5, 10, 20, 50, 100, 200, 300, 400, 600)


class _Recorder:
    def __init__(self) -> None:
        self.on = False
        self.norms: list[float] = []
        self.shares: list[tuple[float, float]] = []
        self.first: dict[int, torch.Tensor] = {}

    def record(self, param_groups) -> None:
        now, fixed = [], []
        for group in param_groups:
            for p in group["params"]:
                if p.grad is None or p.grad.dim() != 2 or p.grad.shape[1] < 10:
                    continue
                energy = p.grad.float().pow(2).sum(0)
                top = torch.topk(energy, max(1, int(0.1 * energy.numel()))).indices
                first = self.first.setdefault(id(p), top)
                total = float(energy.sum()) or 1.0
                now.append(float(energy[top].sum()) / total)
                fixed.append(float(energy[first].sum()) / total)
        self.shares.append((sum(now) / len(now), sum(fixed) / len(fixed)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("regime", choices=["scratch", "finetune"])
    parser.add_argument("model", help="scratch: gpt2 or llama; finetune: a demo size")
    parser.add_argument("value", help="scratch: the learning rate; finetune: the steps")
    args = parser.parse_args()
    torch.set_num_threads(1)
    recorder = _Recorder()

    class RecordingAdamW(torch.optim.AdamW):
        def step(self, closure=None):
            if recorder.on:
                recorder.record(self.param_groups)
            return super().step(closure)

    clip = torch.nn.utils.clip_grad_norm_

    def recording_clip(params, *rest, **keywords):
        norm = clip(params, *rest, **keywords)
        if recorder.on:
            recorder.norms.append(float(norm))
        return norm

    # The runs build torch.optim.AdamW and clip through torch.nn.utils: both are looked up
    # at call time, so the recording versions stand in for them.
    torch.optim.AdamW = RecordingAdamW
    torch.nn.utils.clip_grad_norm_ = recording_clip
    if args.regime == "scratch":
        recorder.on = True
        size = accuracy.SCRATCH_SIZES["tiny"]
        accuracy.train_scratch(args.model, size, "adamw", None, 600, float(args.value), 0)
    else:
        run_one = demo.run_one

        def training_only(*rest, **keywords):  # the pretraining before it is not recorded
            recorder.on = True
            return run_one(*rest, **keywords)

        demo.run_one = training_only
        accuracy.finetune(args.model, None, int(args.value), 0)
    print(f"## {args.regime} {args.model} {args.value}\n")
    print("| step | pre-clip norm | top 10% share | first selection's share |")
    print("|---:|---:|---:|---:|")
    for step in STEPS_SHOWN:
        if step > len(recorder.shares):
            break
        now, fixed = recorder.shares[step - 1]
        norm = f"{recorder.norms[step - 1]:.2f}" if step <= len(recorder.norms) else "-"
        print(f"| {step} | {norm} | {now:.2f} | {fixed:.2f} |")


if __name__ == "__main__":
    main()
