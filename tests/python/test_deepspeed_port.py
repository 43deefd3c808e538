"""DeepSpeed's ZenFlow unit tests, ported to zenflow's public API as black-box checks.

The oracle is DeepSpeed 0.19.x: tests/unit/runtime/zenflow/test_zf_config.py,
tests/unit/runtime/zenflow/test_zf.py and tests/unit/ops/adam/test_zf_torch_adam.py, read
for their expected values (DeepSpeed is not installed here). Each test names the one it
ports. Not ported, because they check DeepSpeed's internals rather than behaviour:
DeepSpeedZeroConfig's stage enum and offload_optimizer coercion (zenflow reads only the
zenflow block of zero_optimization), and ZenFlowSelectiveAdamW's attributes
(selected_grad, temp_selected_param, group_step, clear_selected_mv, bucket flushes, NVMe
swapping). TestZenFlowDistributed (two ranks) is covered by tests/python/test_data_parallel.py.
Where zenflow deliberately differs the test is a skip with the reason, which docs/usage.md
("Differences from DeepSpeed") also lists.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import zenflow

HIDDEN = 10


def simple_model(seed: int = 0) -> torch.nn.Module:
    """DeepSpeed's unit.simple_model.SimpleModel: a hidden_dim x hidden_dim linear layer."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN))


def random_batches(steps: int, batch_size: int = 4):
    gen = torch.Generator().manual_seed(7)
    return [
        (
            torch.randn(batch_size, HIDDEN, generator=gen),
            torch.randn(batch_size, HIDDEN, generator=gen),
        )
        for _ in range(steps)
    ]


def run(model: torch.nn.Module, opt: zenflow.ZenFlowAdamW, steps: int) -> list[float]:
    losses = []
    for x, y in random_batches(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    opt.flush()
    return losses


def ds_config(stage, offload, strategy, select_interval, update_interval, warm_up):
    """test_zf.py's BaseZenFlowTest.get_config_dict."""
    return {
        "train_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
        "zero_optimization": {
            "stage": stage,
            "offload_optimizer": {"device": "cpu"},
            "overlap_comm": True,
            "zenflow": {
                "topk_ratio": 0.2,
                "select_strategy": strategy,
                "select_interval": select_interval,
                "update_interval": update_interval,
                "overlap_step": False,
                "offload": offload,
                "auto_ratio": 0.99,
                "full_warm_up_rounds": warm_up,
            },
        },
        "zero_allow_untested_optimizer": True,
    }


# ---- test_zf.py: TestZenFlowSingleGPU ----


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("warm_up", [0, 3])
@pytest.mark.parametrize("offload", [True, False])
@pytest.mark.parametrize(
    "strategy, select_interval, update_interval",
    [("auto", "auto", "auto"), ("step", 10, 3), ("epoch", 1, 4)],
)
def test_zenflow_single_gpu(stage, warm_up, offload, strategy, select_interval, update_interval):
    # 20 samples in batches of 4: DeepSpeed measures 5 steps per epoch from its dataloader;
    # zenflow is told (see test_epoch_strategy_without_an_epoch_length).
    config = ds_config(stage, offload, strategy, select_interval, update_interval, warm_up)
    model = simple_model()
    before = [p.detach().clone() for p in model.parameters()]
    opt = zenflow.ZenFlowAdamW.from_config(
        model.parameters(), config, steps_per_epoch=5, num_threads=1
    )
    assert opt.param_groups[0]["lr"] == 1e-4
    losses = run(model, opt, 5)
    assert all(math.isfinite(loss) for loss in losses)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    opt.close()


# ---- test_zf_config.py ----


def test_zenflow_config_from_dict():
    # DeepSpeed's config object takes this payload, and its engine then refuses select_interval 4
    # with select_strategy "auto" (runtime/zenflow/engine.py raises); zenflow refuses it at once.
    payload = {
        "topk_ratio": 0.25,
        "select_strategy": "auto",
        "select_interval": 4,
        "update_interval": 8,
        "full_warm_up_rounds": 1,
        "overlap_step": True,
    }
    with pytest.raises(ValueError, match="select_interval"):
        zenflow.ZenFlowAdamW.from_config(simple_model().parameters(), {"zenflow": payload})
    # The same values under select_strategy "step" land key by key: the optimizer equals one
    # built with the keywords.
    payload["select_strategy"] = "step"
    payload["select_interval"] = 8
    a, b = simple_model(), simple_model()
    from_dict = zenflow.ZenFlowAdamW.from_config(
        a.parameters(), {"zenflow": payload}, num_threads=1
    )
    keywords = zenflow.ZenFlowAdamW(
        b.parameters(), lr=1e-3, weight_decay=1e-2, num_threads=1, **payload
    )
    run(a, from_dict, 12)
    run(b, keywords, 12)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    assert from_dict.stats()["windows"] == keywords.stats()["windows"] > 0


def test_invalid_zenflow_type_raises():
    with pytest.raises(TypeError, match="zenflow"):
        zenflow.ZenFlowAdamW.from_config(
            simple_model().parameters(), {"zero_optimization": {"zenflow": 123}}
        )


def test_offload_and_zenflow_combined():
    payload = {
        "stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "zenflow": {
            "topk_ratio": 0.3,
            "select_strategy": "epoch",
            "select_interval": 3,
            "update_interval": 6,
            "full_warm_up_rounds": 0,
            "overlap_step": False,
        },
    }
    model = simple_model()
    opt = zenflow.ZenFlowAdamW.from_config(
        model.parameters(), {"zero_optimization": payload}, steps_per_epoch=2, num_threads=1
    )
    run(model, opt, 6)
    assert opt.stats()["windows"] == 1  # one window of 6 steps


@pytest.mark.skip(
    reason='deliberate difference: select_strategy "epoch" without an epoch length never reselects in '
    "DeepSpeed (select_interval becomes 0); zenflow has no dataloader to measure the epoch and refuses "
    "it, naming steps_per_epoch (docs/usage.md, Differences from DeepSpeed)"
)
def test_epoch_strategy_without_an_epoch_length():
    payload = {"zenflow": {"select_strategy": "epoch", "select_interval": 1, "update_interval": 1}}
    zenflow.ZenFlowAdamW.from_config(simple_model().parameters(), payload)


def test_epoch_strategy_without_an_epoch_length_is_refused():
    payload = {"zenflow": {"select_strategy": "epoch", "select_interval": 1, "update_interval": 1}}
    with pytest.raises(ValueError, match="steps_per_epoch"):
        zenflow.ZenFlowAdamW.from_config(simple_model().parameters(), payload)


@pytest.mark.parametrize(
    "block, key",
    [
        ({"select_strategy": "step", "select_interval": "auto"}, "select_interval"),
        ({"select_strategy": "bogus"}, "select_strategy"),
        ({"select_interval": "sometimes"}, "select_interval"),
        ({"update_interval": "sometimes"}, "update_interval"),
        ({"topk_ratio": 1.5}, "topk_ratio"),
        ({"auto_ratio": 1.5}, "auto_ratio"),
        ({"pt_reserved_cores_perc": -0.5}, "pt_reserved_cores_perc"),
        (
            {"select_strategy": "step", "select_interval": 2, "update_interval": 4},
            "select_interval",
        ),
    ],
)
def test_deepspeed_refusals(block, key):
    """ZenFlowConfig.validate_fields and configure_zenflow's ValueErrors."""
    with pytest.raises(ValueError, match=key):
        zenflow.ZenFlowAdamW.from_config(simple_model().parameters(), {"zenflow": block})


@pytest.mark.parametrize(
    "key, value", [("full_warm_up_rounds", 1.5), ("pt_reserved_cores_perc", "half")]
)
def test_deepspeed_type_refusals(key, value):
    """ZenFlowConfig.validate_fields: full_warm_up_rounds an int, pt_reserved_cores_perc a float."""
    with pytest.raises(TypeError, match=key):
        zenflow.ZenFlowAdamW.from_config(simple_model().parameters(), {"zenflow": {key: value}})


# ---- test_zf.py: test_split_affinity, on this machine's cores ----


def _deepspeed_split(cores: int, perc: float) -> tuple[int, int]:
    """(zenflow's cores, torch's cores) by DeepSpeed's _split_affinity."""
    reserved = math.ceil(perc * cores)
    return (cores - reserved, reserved) if 0 < reserved < cores else (cores, cores)


@pytest.mark.parametrize("perc", [0.25, 0.1, 0.5, 0.75])
def test_split_affinity(perc):
    plan = zenflow._C.engine_thread_plan({"pt_reserved_cores_perc": perc})
    cores = plan["cores"]
    host, framework = _deepspeed_split(cores, perc)
    if cores == 1 or framework == cores:
        pytest.skip("one core, or a reserve of every core: see test_split_affinity_edges")
    assert (plan["host_threads"], plan["framework_threads"]) == (host, framework)
    assert plan["host_threads"] + plan["framework_threads"] == cores  # never oversubscribed


@pytest.mark.skip(
    reason="deliberate difference: a reserve that rounds to 0 or to every core gives both sides every "
    "core in DeepSpeed; zenflow keeps the host lane at >= 1 core and the framework at cores - host lane "
    "(>= 1), because spinning OpenMP workers beside the background host update stall both "
    "(docs/usage.md, Differences from DeepSpeed)"
)
@pytest.mark.parametrize("perc", [0.0, 1.0])
def test_split_affinity_edges(perc):
    plan = zenflow._C.engine_thread_plan({"pt_reserved_cores_perc": perc})
    assert (plan["host_threads"], plan["framework_threads"]) == (plan["cores"], plan["cores"])


# ---- test_zf_torch_adam.py, through the optimizer ----


def test_against_torch_adamw():
    """Every column selected (topk_ratio 1): 10 steps equal torch.optim.AdamW (atol 1e-4)."""
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(2, 4))
    twin = torch.nn.Parameter(param.detach().clone())
    opt = zenflow.ZenFlowAdamW([param], lr=1e-3, topk_ratio=1.0, num_threads=1)
    reference = torch.optim.AdamW([twin], lr=1e-3)
    for _ in range(10):
        grad = torch.randn_like(param)
        param.grad, twin.grad = grad.clone(), grad.clone()
        opt.step()
        reference.step()
    opt.flush()
    torch.testing.assert_close(param.detach(), twin.detach(), atol=1e-4, rtol=0)


def test_step_without_offload():
    """One step updates the selected columns (k of n) and, mid-window, nothing else."""
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(4, 6))
    before = param.detach().clone()
    opt = zenflow.ZenFlowAdamW([param], lr=1e-3, topk_ratio=0.5, update_interval=4, num_threads=1)
    param.grad = torch.randn_like(param)
    opt.step()
    changed = (param.detach() != before).any(dim=0)
    assert int(changed.sum()) == 3  # k = floor(0.5 * 6)


def test_1d_param_support():
    param = torch.nn.Parameter(torch.randn(10))
    before = param.detach().clone()
    opt = zenflow.ZenFlowAdamW([param], lr=1e-3, num_threads=1)
    param.grad = torch.randn_like(param)
    opt.step()
    assert (param.detach() != before).all()


def test_state_increment():
    param = torch.nn.Parameter(torch.randn(2, 4))
    opt = zenflow.ZenFlowAdamW([param], lr=1e-3, topk_ratio=1.0, num_threads=1)
    steps = []
    for _ in range(2):
        param.grad = torch.randn_like(param)
        opt.step()
        steps.append(float(copy.deepcopy(opt.state_dict())["state"][0]["step"]))
    assert steps[1] == steps[0] + 1
