"""ZenFlowAdamW's checkpoint does not change the run, bit for bit (issue 27):

* a run that calls state_dict() after any step equals the run that does not;
* a run resumed from (model.state_dict(), opt.state_dict()) taken after any step, in a new
  model and a new optimizer, with the model's parameters loaded before or after the
  optimizer (Hugging Face Trainer's order is model first), equals the uninterrupted run;

at every position inside a window (windows of 3, 10 steps), over: overlap on and off, fixed
and "auto" windows, a re-selection inside the run, fp16 with dynamic loss scaling and an
overflow step, bf16, fp32, clipping, and overlap_backward's split steps. The state still
loads into another topk_ratio (the first step re-selects), and a torch.optim.AdamW state
still loads. Data parallel (2 gloo ranks) is in test_data_parallel.py.
"""

from __future__ import annotations

import copy

import pytest
import torch

import zenflow

STEPS = 10


class Model(torch.nn.Module):
    """Two matrices wide enough for top-k, a bias and a 3-d weight; dense and zenflow groups."""

    def __init__(self, dtype: torch.dtype, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.a = torch.nn.Parameter(torch.randn(24, 40, generator=gen).to(dtype))
        self.b = torch.nn.Parameter(torch.randn(8, 3, 10, generator=gen).to(dtype))
        self.bias = torch.nn.Parameter(torch.randn(40, generator=gen).to(dtype))
        self.c = torch.nn.Parameter(torch.randn(16, 24, generator=gen).to(dtype))

    def loss(self, step: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(100 + step)
        x = torch.randn(6, 16, generator=gen).to(self.a.dtype)
        h = torch.tanh(x @ self.c @ self.a + self.bias)  # [6, 40]
        y = (h[:, :30].reshape(6, 3, 10) * self.b.float().mean(0)).sum()
        boost = 1.0 + 3.0 * (
            (step // 4) % 2
        )  # the gradients' column mix moves: re-selections differ
        return (y.float() * boost + h.float().square().mean()) / 4


def groups(model: Model) -> list[dict]:
    return [
        {"params": [model.a, model.b], "weight_decay": 0.1},
        {"params": [model.c], "lr": 2e-2},
        {"params": [model.bias], "zenflow": False},
    ]


def make(dtype: torch.dtype, options: dict, overlap: bool, seed: int = 0):
    model = Model(dtype, seed)
    opt = zenflow.ZenFlowAdamW(groups(model), lr=1e-2, **options)
    if overlap:
        opt.overlap_backward(model)
    return model, opt


def train_step(model: Model, opt, step: int, dtype: torch.dtype) -> None:
    loss = model.loss(step)
    if dtype == torch.float16:
        if step == 5:  # an overflow step: dynamic loss scaling skips it and backs off
            loss = loss * float("inf")
        loss = opt.scale_loss(loss)
    loss.backward()
    opt.step()
    opt.zero_grad()


def weights(model: Model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def run(dtype, options, overlap, save_at=None, resume_at=None, model_first=True):
    """Weights after every step; a state_dict() call after step save_at, or a resume from
    one taken after step resume_at (a new model and optimizer)."""
    model, opt = make(dtype, options, overlap)
    trajectory = []
    for step in range(STEPS):
        train_step(model, opt, step, dtype)
        if step + 1 == save_at:
            opt.state_dict()
        if step + 1 == resume_at:
            saved_model = copy.deepcopy(model.state_dict())
            saved_opt = copy.deepcopy(opt.state_dict())
            opt.close()
            model, opt = make(dtype, options, overlap, seed=7)  # other values: all must load
            if model_first:
                model.load_state_dict(saved_model)
                opt.load_state_dict(saved_opt)
            else:
                opt.load_state_dict(saved_opt)
                model.load_state_dict(saved_model)
        trajectory.append(weights(model))
    opt.flush()
    trajectory.append(weights(model))
    opt.close()
    return trajectory


def assert_same(want, got, what):
    assert len(want) == len(got), what
    for step, (a, b) in enumerate(zip(want, got)):
        for i, (x, y) in enumerate(zip(a, b)):
            assert torch.equal(x, y), f"{what}: param {i} after step {step + 1}"


CASES = [
    pytest.param(torch.float32, dict(topk_ratio=0.2, update_interval=3), False, id="fp32-overlap"),
    pytest.param(
        torch.float32,
        dict(topk_ratio=0.2, update_interval=3, overlap_step=False),
        False,
        id="fp32-serial",
    ),
    pytest.param(
        torch.bfloat16,
        dict(topk_ratio=0.2, update_interval=3, select_strategy="step", select_interval=4),
        False,
        id="bf16-reselect",
    ),
    pytest.param(
        torch.float32,
        dict(topk_ratio=0.2, update_interval=4, update_lag=2),
        False,
        id="fp32-lag",  # saved between a close and its landing: the landing step is restored
    ),
    pytest.param(
        torch.bfloat16,
        dict(topk_ratio=0.2, update_interval="auto", max_update_interval=4, max_grad_norm=0.05),
        False,
        id="bf16-auto-clip",
    ),
    pytest.param(
        torch.float16,
        dict(topk_ratio=0.2, update_interval=3, initial_scale=256.0, growth_interval=3),
        False,
        id="fp16-overflow",
    ),
    pytest.param(
        torch.float32,
        dict(
            topk_ratio=0.2,
            update_interval=3,
            select_strategy="step",
            select_interval=4,
            max_grad_norm=0.05,
        ),
        True,
        id="fp32-split-reselect-clip",
    ),
    pytest.param(
        torch.float32,
        # The start's detection: saved during its 8 synchronous steps, at its decision
        # (after step 8) and after it.
        dict(topk_ratio=0.2, update_interval=2, auto_warm_up_rounds=9),
        False,
        id="fp32-detected-start",
    ),
]


@pytest.mark.parametrize("dtype, options, overlap", CASES)
def test_a_checkpoint_changes_nothing_and_resumes_bit_for_bit(dtype, options, overlap):
    reference = run(dtype, options, overlap)
    for at in range(1, STEPS):
        assert_same(
            reference, run(dtype, options, overlap, save_at=at), f"state_dict() after step {at}"
        )
        assert_same(
            reference,
            run(dtype, options, overlap, resume_at=at, model_first=at % 2 == 1),
            f"resumed after step {at} ({'model' if at % 2 else 'optimizer'} loaded first)",
        )


@pytest.mark.engine_defaults
def test_a_torch_adamw_state_decides_the_start_from_its_moments():
    """A state without a decision (torch's) loaded past the probe: the next step is
    synchronous, then the engine decides from the loaded moments (noise here: the start ends
    at that step); the decision is in the state's schedule."""
    model = Model(torch.float32)
    adamw = torch.optim.AdamW(groups(model)[:2] + [{"params": [model.bias]}], lr=1e-2)
    for step in range(12):
        model.loss(step).backward()
        adamw.step()
        adamw.zero_grad()
    opt = zenflow.ZenFlowAdamW(groups(model), lr=1e-2)
    opt.load_state_dict(adamw.state_dict())
    assert opt.stats()["synchronous_start_steps"] == -1
    assert opt.state_dict()["zenflow"]["schedule"]["warm_up_end"] == -1
    model.loss(12).backward()
    opt.step()
    opt.zero_grad()
    assert opt.stats()["synchronous_start_steps"] == 13
    assert opt.state_dict()["zenflow"]["schedule"]["warm_up_end"] == 13
    opt.close()


def test_the_state_still_loads_into_another_topk_ratio_and_from_torch_adamw():
    options = dict(topk_ratio=0.2, update_interval=3, update_lag="window")
    model, opt = make(torch.float32, options, False)
    for step in range(4):  # mid-window: a pending result and accumulators in the state
        train_step(model, opt, step, torch.float32)
    saved = copy.deepcopy(opt.state_dict())
    assert saved["zenflow"]["schedule"]["steps_accumulated"] == 1
    assert saved["zenflow"]["schedule"]["update_pending"] == 1
    assert any(
        bool(entry["accumulator"].any())
        for entry in saved["state"].values()
        if "accumulator" in entry
    )
    other_model, other = make(torch.float32, dict(topk_ratio=0.5, update_interval=2), False)
    other_model.load_state_dict(model.state_dict())
    other.load_state_dict(saved)
    for step in range(4, 7):
        train_step(other_model, other, step, torch.float32)
    assert other.stats()["reselections"] >= 0 and all(
        torch.isfinite(p).all() for p in other_model.parameters()
    )
    # torch.optim.AdamW's state: its moments and step
    torch_model = Model(torch.float32)
    adamw = torch.optim.AdamW(groups(torch_model), lr=1e-2)
    for step in range(3):
        torch_model.loss(step).backward()
        adamw.step()
        adamw.zero_grad()
    model2, opt2 = make(torch.float32, options, False)
    model2.load_state_dict(torch_model.state_dict())
    opt2.load_state_dict(adamw.state_dict())
    train_step(model2, opt2, 3, torch.float32)
    assert opt2.stats()["steps"] == 4
    for closing in (opt, other, opt2):
        closing.close()


def test_an_old_flushed_state_without_the_window_entries_still_loads():
    """A state saved before the accumulators were part of it was saved flushed: missing
    entries mean an empty window and no pending result."""
    options = dict(topk_ratio=0.2, update_interval=3)
    model, opt = make(torch.float32, options, False)
    for step in range(4):
        train_step(model, opt, step, torch.float32)
    opt.flush()
    saved = copy.deepcopy(opt.state_dict())
    assert saved["zenflow"]["schedule"]["update_pending"] == 0
    old = copy.deepcopy(saved)
    for entry in old["state"].values():
        entry.pop("accumulator", None)
    for key in ("steps_accumulated", "update_pending"):
        del old["zenflow"]["schedule"][key]
    model_a, opt_a = make(torch.float32, options, False)
    model_b, opt_b = make(torch.float32, options, False)
    for m, o, state in ((model_a, opt_a, saved), (model_b, opt_b, old)):
        m.load_state_dict(model.state_dict())
        o.load_state_dict(state)
        for step in range(4, 8):
            train_step(m, o, step, torch.float32)
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(a, b)
    for closing in (opt, opt_a, opt_b):
        closing.close()
