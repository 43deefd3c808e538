"""The accuracy benchmark's from-scratch run (zenflow.bench.accuracy.train_scratch) with the
float64 reference model (engine_reference.py) as the optimizer: the same model, initial
weights, batches, global-norm clipping, weight decay groups and lr schedule, the reference
stepping in float64 and its weights copied into the model after every step.

Used by test_accuracy.py (the engine's training run follows the reference's) and by
benchmarks/lab/simulate_accuracy.py (candidate rules measured on the reference before they
are built)."""

from __future__ import annotations

import torch
from engine_reference import ReferenceZenFlow

from zenflow import demo
from zenflow.bench import accuracy

CLIP, WEIGHT_DECAY, EVAL_BATCHES = 1.0, 0.01, 16


def train_scratch_with_reference(
    arch: str,
    size: accuracy.ScratchSize,
    config: dict,
    steps: int,
    lr: float,
    seed: int,
    make_reference=ReferenceZenFlow,
) -> float:
    """Held-out loss after `steps` steps of the reference with engine `config` (clipping at
    CLIP is added); make_reference(params, groups, config) builds the optimizer model."""
    train_ids, held = accuracy.scratch_text()
    model = accuracy.build(arch, size, seed)
    groups = demo.param_groups(model, WEIGHT_DECAY)
    params = [p for g in groups for p in g["params"]]
    ranges, start = [], 0
    for g in groups:
        ranges.append(
            {
                "lr": lr,
                "weight_decay": g["weight_decay"],
                "params": list(range(start, start + len(g["params"]))),
            }
        )
        start += len(g["params"])
    reference = make_reference(
        [p.detach().double().numpy() for p in params], ranges, dict(config, max_grad_norm=CLIP)
    )
    # Carries the schedule's lr; it never has gradients, so its step changes nothing (it is
    # called to keep the scheduler's expected call order).
    schedule_carrier = torch.optim.SGD(params, lr=lr)
    schedule = accuracy._schedule(schedule_carrier, steps, warm_up=max(1, min(20, steps // 10)))
    gen = torch.Generator().manual_seed(seed + 1)

    def copy_back():
        with torch.no_grad():
            for i, p in enumerate(params):
                p.copy_(torch.from_numpy(reference.weights(i).reshape(p.shape)))

    for _ in range(steps):
        starts = torch.randint(
            0, train_ids.numel() - size.context - 1, (size.batch,), generator=gen
        )
        window = torch.stack([train_ids[s : s + size.context + 1] for s in starts.tolist()])
        model(window[:, :-1], window[:, 1:]).backward()
        lr_now = schedule_carrier.param_groups[0]["lr"]
        reference.step([p.grad.double().numpy() for p in params], [lr_now] * len(ranges))
        copy_back()
        schedule_carrier.zero_grad(set_to_none=True)
        schedule_carrier.step()
        schedule.step()
    reference.flush()
    copy_back()
    return accuracy._held_out(model, held, size, EVAL_BATCHES)
