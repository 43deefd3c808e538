"""The one config table (engine.h: zf_engine_config_key) as Python sees it: the defaults, the
binding's parser, the generated docstring, and from_config's DeepSpeed translation (issue 27:
each translation bug has a test that failed on the old code)."""

from __future__ import annotations

import math

import pytest
import torch

import zenflow
from zenflow import _C
from zenflow.config import ENGINE_DEFAULTS, describe

KEYS = {k["name"]: k for k in _C.config_keys()}


def params():
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(4, 6)), torch.nn.Parameter(torch.randn(6))]


def test_python_defaults_are_the_engines():
    # check_config({}) is zf_engine_config_default() read back field by field
    assert _C.check_config({}) == {name: key["default"] for name, key in KEYS.items()}
    for keyword, default in ENGINE_DEFAULTS.items():
        field = {"num_threads": "host_threads"}.get(keyword, keyword)
        if keyword == "loss_scaling":
            assert default == "auto"  # ZenFlowAdamW's own: dynamic for float16 parameters
        elif keyword == "num_threads":
            assert default is None and KEYS[field]["default"] == "auto"
        else:
            assert default == KEYS[field]["default"], keyword
    # the documented values (engine.h), so that a table edit shows here
    assert (ENGINE_DEFAULTS["topk_ratio"], ENGINE_DEFAULTS["update_interval"]) == (0.1, 4)
    assert ENGINE_DEFAULTS["select_interval"] == "auto" and ENGINE_DEFAULTS["max_grad_norm"] is None
    assert (ENGINE_DEFAULTS["hysteresis"], ENGINE_DEFAULTS["min_loss_scale"]) == (1, None)


def test_the_docstring_table_is_generated_from_the_engines():
    text = describe()
    assert zenflow.ZenFlowAdamW.__doc__.endswith(text)
    for keyword in ENGINE_DEFAULTS:
        key = KEYS[{"num_threads": "host_threads"}.get(keyword, keyword)]
        assert (
            f"  {keyword} = {ENGINE_DEFAULTS[keyword]!r}; {key['range_text']}: {key['meaning']}."
            in text
        )
        if key["deepspeed_difference"]:
            assert key["deepspeed_difference"] in text


def bad_values(key):
    """(value, error) pairs the engine refuses for this key."""
    out = [([1], TypeError)]  # a list is no value of any type
    if key["type"] == "choice":
        out.append(("bogus", ValueError))
    elif key["type"] == "bool":
        out.append((1, TypeError))
    else:
        out.append((-1, ValueError))  # every minimum is >= 0
        if key["type"] == "float":
            out.append((float("nan"), ValueError))
        if key["maximum"] < 1e15:
            top = key["maximum"] + (0 if key["maximum_open"] else 1)
            out.append((int(top) if key["type"] == "int" else top, ValueError))
        if key["zero_means"] in ("auto", "none"):
            out.append((0, ValueError))  # in Python the sentinel is written as its word
    return out


@pytest.mark.parametrize("name", list(KEYS))
def test_every_key_is_refused_naming_it(name):
    for value, error in bad_values(KEYS[name]):
        with pytest.raises(error, match=name):
            _C.check_config({name: value})
        with pytest.raises(error, match=name):
            _C.Engine([torch.zeros(3, 3)], [{"params": [0], "lr": 0.1}], {name: value})


def test_unknown_keys_and_words():
    with pytest.raises(ValueError, match='unknown key "topk"'):
        _C.check_config({"topk": 0.1})
    assert (
        _C.check_config({"update_interval": "auto", "max_grad_norm": None})["update_interval"]
        == "auto"
    )
    with pytest.raises(ValueError, match="update_interval"):
        _C.check_config({"update_interval": "none"})


@pytest.mark.parametrize(
    "keyword",
    [k for k in ENGINE_DEFAULTS if k != "loss_scaling"],
)
def test_every_keyword_is_refused_naming_it_and_changes_nothing(keyword):
    field = {"num_threads": "host_threads"}.get(keyword, keyword)
    ps = params()
    before = [p.detach().clone() for p in ps]
    for value, error in bad_values(KEYS[field]):
        if keyword == "num_threads" and value == 0:
            continue  # None is num_threads' word; 0 is refused below
        with pytest.raises(error, match=keyword):
            zenflow.ZenFlowAdamW(ps, **{keyword: value})
    assert all(torch.equal(a, b) for a, b in zip(before, ps))


# ---- from_config: DeepSpeed's semantics key by key (the four translation bugs) ----


@pytest.mark.parametrize(
    "optimizer, weight_decay",
    [
        ({"type": "Adam", "params": {"lr": 1e-3}}, 0.0),  # DeepSpeedCPUAdam / FusedAdam: 0
        ({"type": "AdamW", "params": {"lr": 1e-3}}, 0.0),
        ({"type": "AdamW", "params": {"torch_adam": True}}, 0.01),  # torch.optim.AdamW: 0.01
        ({"type": "AdamW", "params": {"weight_decay": 0.1}}, 0.1),
    ],
)
def test_a_missing_weight_decay_is_deepspeeds(optimizer, weight_decay):
    opt = zenflow.ZenFlowAdamW.from_config(params(), {"zenflow": {}, "optimizer": optimizer})
    assert opt.param_groups[0]["weight_decay"] == weight_decay


def test_adam_w_mode_is_read_as_deepspeed_reads_it():
    # type AdamW is AdamW whatever adam_w_mode says; Adam with adam_w_mode false is L2 Adam
    config = {"zenflow": {}, "optimizer": {"type": "AdamW", "params": {"adam_w_mode": False}}}
    zenflow.ZenFlowAdamW.from_config(params(), config)
    config["optimizer"]["type"] = "Adam"
    with pytest.raises(ValueError, match="adam_w_mode"):
        zenflow.ZenFlowAdamW.from_config(params(), config)


def test_auto_select_strategy_refuses_an_integer_interval():
    with pytest.raises(ValueError, match="select_interval"):
        zenflow.ZenFlowAdamW.from_config(
            params(), {"zenflow": {"select_strategy": "auto", "select_interval": 5}}
        )


def test_reserved_cores_round_up():
    plan = _C.engine_thread_plan({"pt_reserved_cores_perc": 0.25, "overlap_step": True})
    cores = plan["cores"]
    reserved = math.ceil(0.25 * cores)
    assert plan["host_threads"] == max(1, cores - reserved)
    assert plan["host_threads"] + plan["framework_threads"] <= max(cores, 2)


def fp16_overflow_steps(opt, ps, overflows):
    scales = []
    for t in range(overflows + 1):
        scales.append(opt.loss_scale)
        loss = sum((p.float() ** 2).sum() for p in ps)
        opt.scale_loss(loss).backward()
        if t < overflows:
            ps[0].grad.view(-1)[0] = float("inf")
        opt.step()
        opt.zero_grad()
    return scales


def test_fp16_min_loss_scale_and_hysteresis_are_implemented():
    fp16 = {"enabled": True, "initial_scale_power": 9, "min_loss_scale": 128, "hysteresis": 1}
    ps = [torch.nn.Parameter(torch.randn(4, 6).half())]
    opt = zenflow.ZenFlowAdamW.from_config(ps, {"zenflow": {}, "fp16": fp16})
    assert fp16_overflow_steps(opt, ps, 3) == [512.0, 256.0, 128.0, 128.0]
    assert opt.loss_scale == 128.0  # the old translation ignored the minimum: 64
    # DeepSpeed's default hysteresis 2: the first overflow keeps the scale
    ps = [torch.nn.Parameter(torch.randn(4, 6).half())]
    opt = zenflow.ZenFlowAdamW.from_config(ps, {"zenflow": {}, "fp16": {"enabled": True}})
    assert fp16_overflow_steps(opt, ps, 2) == [65536.0, 65536.0, 32768.0]
    # consecutive_hysteresis: a good step between two overflows refills it
    fp16 = {"enabled": True, "initial_scale_power": 9, "consecutive_hysteresis": True}
    ps = [torch.nn.Parameter(torch.randn(4, 6).half())]
    opt = zenflow.ZenFlowAdamW.from_config(ps, {"zenflow": {}, "fp16": fp16})
    for _ in range(3):
        fp16_overflow_steps(opt, ps, 1)
    assert opt.loss_scale == 512.0


@pytest.mark.parametrize(
    "fp16, key",
    [
        ({"enabled": True, "hysteresis": 0}, "hysteresis"),
        ({"enabled": True, "min_loss_scale": -1}, "min_loss_scale"),
        ({"enabled": True, "loss_scale_window": 0}, r"fp16\.loss_scale_window"),
        ({"enabled": True, "loss_scale": 128}, "loss_scale"),
        ({"enabled": True, "bogus": 1}, "bogus"),
    ],
)
def test_fp16_refusals(fp16, key):
    with pytest.raises(ValueError, match=key):
        zenflow.ZenFlowAdamW.from_config(params(), {"zenflow": {}, "fp16": fp16})


@pytest.mark.parametrize(
    "config, overrides, message",
    [
        ({"topk_ratio": 2}, {}, r"^zero_optimization\.zenflow\.topk_ratio: must be \[0, 1\]"),
        ({"update_interval": 0}, {}, r"^zero_optimization\.zenflow\.update_interval: "),
        ({}, {"topk_ratio": 2}, r"^topk_ratio: must be"),  # an override is named as a keyword
        ({}, {"num_threads": 0}, r"^num_threads: "),
    ],
)
def test_from_config_names_the_refused_key_as_it_was_given(config, overrides, message):
    params = [torch.nn.Parameter(torch.zeros(4, 8))]
    with pytest.raises(ValueError, match=message):
        zenflow.ZenFlowAdamW.from_config(
            params, {"zero_optimization": {"zenflow": config}}, **overrides
        )


def test_from_config_names_optimizer_params_and_clipping_by_their_keys():
    params = [torch.nn.Parameter(torch.zeros(4, 8))]
    block = {"zero_optimization": {"zenflow": {}}}
    with pytest.raises(ValueError, match=r"^optimizer\.params\.lr: "):
        zenflow.ZenFlowAdamW.from_config(params, {**block, "optimizer": {"params": {"lr": -1}}})
    with pytest.raises(ValueError, match=r"^optimizer\.params\.betas\[1\]: "):
        zenflow.ZenFlowAdamW.from_config(
            params, {**block, "optimizer": {"params": {"betas": [0.9, 1.5]}}}
        )
    with pytest.raises(ValueError, match=r"^gradient_clipping: "):
        zenflow.ZenFlowAdamW.from_config(params, {**block, "gradient_clipping": -1})
    # a file value that an override replaces is not checked
    opt = zenflow.ZenFlowAdamW.from_config(
        params, {"zero_optimization": {"zenflow": {"topk_ratio": 2}}}, topk_ratio=0.5
    )
    opt.close()
