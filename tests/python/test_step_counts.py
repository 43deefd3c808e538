"""Step counts and counters at their limits (issue 25), through the Python layer: the engine's
int32 Adam step counts and int64 schedule counters, ZenFlowAdamW's state dicts (zenflow's and
torch.optim.AdamW's) and CPUAdamW's. A step that would take a count past its limit raises
ValueError and changes nothing; a loaded count that cannot be converted, or leaves no room for
another step, raises ValueError naming it before anything is loaded."""

from __future__ import annotations

import copy

import pytest
import torch

import zenflow
from zenflow import _C

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def _engine(topk_ratio: float = 0.25):
    torch.manual_seed(0)
    params = [torch.randn(8, 12), torch.randn(12)]
    groups = [{"params": [0, 1], "lr": 1e-2, "weight_decay": 0.01}]
    engine = _C.Engine(params, groups, {"topk_ratio": topk_ratio, "update_interval": 2})
    return params, engine


def _grads(step: int) -> list:
    generator = torch.Generator().manual_seed(100 + step)
    return [torch.randn(8, 12, generator=generator), torch.randn(12, generator=generator)]


def _with_counts(state: dict, count: int) -> dict:
    state = copy.deepcopy(state)
    for entry in state["params"]:
        entry["steps"].fill_(count)
    return state


@pytest.mark.parametrize("topk_ratio", [0.25, 1.0, 0.0])
def test_engine_refuses_the_step_past_int32_max_and_changes_nothing(topk_ratio):
    params, engine = _engine(topk_ratio)
    engine.step(_grads(1))
    fresh = engine.state_dict()
    engine.load_state_dict(_with_counts(fresh, INT32_MAX - 1))
    engine.step(_grads(2))
    before = engine.state_dict()  # flushes: every count has taken its step
    assert max(int(e["steps"].max()) for e in before["params"]) == INT32_MAX
    weights = [p.clone() for p in params]
    with pytest.raises(ValueError, match="INT32_MAX"):
        engine.step(_grads(3))
    with pytest.raises(ValueError, match="INT32_MAX"):
        engine.begin_step()
    after = engine.state_dict()
    for p, w in zip(params, weights):
        assert torch.equal(p, w)
    for a, b in zip(before["params"], after["params"]):
        for key in a:
            assert torch.equal(a[key], b[key]), key
    assert after["schedule"] == before["schedule"]
    with pytest.raises(ValueError, match="out of range"):
        engine.load_state_dict(after)  # a count at INT32_MAX leaves no room for a step
    engine.load_state_dict(fresh)
    engine.step(_grads(3))
    engine.close()


def test_engine_schedule_counters_stop_before_int64_max():
    params, engine = _engine()
    engine.step(_grads(1))
    state = engine.state_dict()
    for value, message in ((INT64_MAX, "INT64_MAX"), (2**63, "out of range"), (-1, "negative")):
        bad = copy.deepcopy(state)
        bad["schedule"]["step"] = value
        with pytest.raises(ValueError, match=message):
            engine.load_state_dict(bad)
    near = copy.deepcopy(state)
    near["schedule"]["step"] = INT64_MAX - 1
    engine.load_state_dict(near)
    engine.step(_grads(2))
    assert engine.stats()["steps"] == INT64_MAX
    weights = [p.clone() for p in params]
    with pytest.raises(ValueError, match="INT64_MAX"):
        engine.step(_grads(3))
    assert all(torch.equal(p, w) for p, w in zip(params, weights))
    engine.close()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _train(model, opt, steps: int, start: int = 0) -> None:
    for step in range(start, start + steps):
        generator = torch.Generator().manual_seed(step)
        x = torch.randn(4, 6, generator=generator)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()


def test_zenflow_adamw_refuses_the_step_past_int32_max():
    model = _model()
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2, topk_ratio=0.5, update_interval=2)
    _train(model, opt, 2)
    state = opt.state_dict()
    for entry in state["state"].values():
        entry["steps"] = torch.full_like(entry["steps"], INT32_MAX - 1)
    opt.load_state_dict(state)
    _train(model, opt, 1, start=2)
    weights = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="INT32_MAX"):
        _train(model, opt, 1, start=3)
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))


@pytest.mark.parametrize(
    "steps",
    [
        lambda like: torch.full_like(like, 2**32, dtype=torch.int64),  # wraps to 0 as int32
        lambda like: torch.full_like(like, -(2**32) + 5, dtype=torch.int64),  # wraps to 5
        lambda like: torch.full_like(like, float("nan"), dtype=torch.float32),
        lambda like: torch.full_like(like, float("inf"), dtype=torch.float64),
        lambda like: torch.full_like(like, 3e9, dtype=torch.float64),
    ],
)
def test_zenflow_adamw_state_with_unconvertible_counts_changes_nothing(steps):
    model = _model()
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2, topk_ratio=0.5)
    _train(model, opt, 2)
    before = opt.state_dict()
    bad = copy.deepcopy(before)
    bad["state"][0]["steps"] = steps(bad["state"][0]["steps"])
    with pytest.raises(ValueError, match=r"state_dict\['state'\]\[0\]\['steps'\]: step count"):
        opt.load_state_dict(bad)
    after = opt.state_dict()
    for index, entry in before["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, after["state"][index][key]), (index, key)


@pytest.mark.parametrize("step", [float("nan"), float("inf"), -1.0, 2.0**31 - 1, 2**40])
def test_torch_adamw_state_with_a_bad_step_is_refused(step):
    model = _model()
    torch_opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _train(model, torch_opt, 1)
    state = torch_opt.state_dict()
    state["state"][0]["step"] = torch.tensor(step)
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2, topk_ratio=0.5)
    with pytest.raises(ValueError, match=r"\['step'\]: .* is out of range"):
        opt.load_state_dict(state)


@pytest.mark.parametrize("step", [float("nan"), float("inf"), -3.0, 2.0**31])
def test_cpu_adamw_state_with_a_bad_step_is_refused_and_changes_nothing(step):
    model = _model()
    opt = zenflow.CPUAdamW(model.parameters(), lr=1e-2)
    _train(model, opt, 1)
    state = opt.state_dict()
    state["state"][0]["step"] = torch.tensor(step)
    weights = [p.detach().clone() for p in model.parameters()]
    opt.load_state_dict(state)
    with pytest.raises(ValueError, match="'step' is"):
        _train(model, opt, 1, start=1)
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))
