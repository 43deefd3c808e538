"""ZenFlowAdamW's settings, translation only: every rule of a setting (default, type, range,
meaning, DeepSpeed key and default, difference from DeepSpeed) lives in the engine's table
(engine.h: zf_engine_config_key; zenflow._C.config_keys()), which also checks every value
(zenflow._C.check_config). Here: keyword names, None sentinels, DeepSpeed configurations."""

from __future__ import annotations

import json
import numbers
import os
import re
from collections.abc import Mapping
from typing import Any

from ._native import native

__all__ = ["ENGINE_DEFAULTS", "check_settings", "describe", "settings_from_deepspeed"]

_KEYS = {k["name"]: k for k in native().config_keys()}
# ZenFlowAdamW keyword -> engine field; the keyword writes the field's "auto" as None.
_RENAMED = {"num_threads": "host_threads"}
_FIELD_NAMES = {field: keyword for keyword, field in _RENAMED.items()}
# Fields the optimizer sets itself: betas and eps come from the param groups, ranks_per_host
# from the process group; the last two are tuning knobs of the C API only.
_NOT_KEYWORDS = ("beta1", "beta2", "eps", "ranks_per_host", "compute_threads", "staging_slots")
# loss_scaling "auto" is ZenFlowAdamW's: "dynamic" when a parameter is float16, else "none".
_PYTHON_DEFAULTS = {"loss_scaling": "auto", "num_threads": None}
ENGINE_DEFAULTS: dict[str, Any] = {
    _FIELD_NAMES.get(n, n): _PYTHON_DEFAULTS.get(_FIELD_NAMES.get(n, n), k["default"])
    for n, k in _KEYS.items()
    if n not in _NOT_KEYWORDS
}
_ZENFLOW_BLOCK = "zero_optimization.zenflow."


def _engine_check(config: dict, where: str = "", names: dict = _FIELD_NAMES) -> dict:
    """The engine's check (DeepSpeed's rules on); its message names the keyword."""
    try:
        return native().check_config(config, True)
    except (TypeError, ValueError) as error:
        text = re.sub(r'config\["(\w+)"\]|config\.(\w+)', lambda m: m[1] or m[2], str(error))
        for field, keyword in names.items():
            text = text.replace(field, keyword)
        raise type(error)(where + text) from None


def check_hyperparameters(
    lr: Any, betas: Any, eps: Any, weight_decay: Any, where: str = ""
) -> None:
    """torch.optim.AdamW's checks, with the argument named; betas and eps are the engine's."""
    for name, value in (("lr", lr), ("weight_decay", weight_decay)):
        value = value.item() if hasattr(value, "item") else value
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{where}{name}: expected a number, got {type(value).__name__}")
        if not 0.0 <= value < float("inf"):
            raise ValueError(f"{where}{name}: must be finite and >= 0, got {value}")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"{where}betas: expected a pair (beta1, beta2), got {betas!r}")
    names = {"beta1": "betas[0]", "beta2": "betas[1]"}
    _engine_check({"beta1": betas[0], "beta2": betas[1], "eps": eps}, where, names)


def check_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """ZenFlowAdamW's zenflow keywords (all of ENGINE_DEFAULTS' keys), checked by the engine."""
    engine = engine_config(settings, (0.9, 0.999), 1e-8, "none")
    if settings["loss_scaling"] not in ("auto", *_KEYS["loss_scaling"]["choices"]):
        engine["loss_scaling"] = settings["loss_scaling"]  # the engine names the bad value
    checked = _engine_check(engine)
    out = {key: checked[_RENAMED.get(key, key)] for key in ENGINE_DEFAULTS}
    out.update({key: None for key in _RENAMED if out[key] == "auto"})
    return {**out, "loss_scaling": settings["loss_scaling"]}


def engine_config(
    settings: dict[str, Any], betas: tuple[float, float], eps: float, loss_scaling: str
) -> dict:
    """The engine's config dict (zenflow._C.Engine) for checked settings."""
    config = {_RENAMED.get(key, key): settings[key] for key in ENGINE_DEFAULTS}
    config.update({field: "auto" for key, field in _RENAMED.items() if settings[key] is None})
    config.update(beta1=betas[0], beta2=betas[1], eps=eps, loss_scaling=loss_scaling)
    return config


def describe() -> str:
    """The table of ZenFlowAdamW's zenflow keywords, generated from the engine's table."""
    lines = ["Settings (engine.h: zf_engine_config_key; keyword = default; valid values: meaning):"]
    for keyword, default in ENGINE_DEFAULTS.items():
        key = _KEYS[_RENAMED.get(keyword, keyword)]
        lines.append(f"  {keyword} = {default!r}; {key['range_text']}: {key['meaning']}.")
        if key["deepspeed_key"]:
            lines.append(f"      DeepSpeed: {key['deepspeed_key']}.")
        if key["deepspeed_difference"]:
            lines.append(f"      Differs from DeepSpeed: {key['deepspeed_difference']}.")
    return "\n".join(lines) + "\n"


# ---- DeepSpeed-style configuration ----

_PARAMS = "lr betas eps weight_decay adam_w_mode torch_adam amsgrad bias_correction".split()


def _mapping(name: str, value: Any) -> Mapping:
    if not isinstance(value, Mapping):
        raise TypeError(f"{name}: expected a dict, got {type(value).__name__}")
    return value


def _no_auto(name: str, value: Any) -> Any:
    if isinstance(value, str) and value == "auto":
        raise ValueError(f'{name}: "auto" is for the DeepSpeed/HuggingFace launcher; give a value')
    return value


def _block(prefix: str, block: Mapping, extra: tuple = ()) -> dict[str, Any]:
    """The keywords of a DeepSpeed block by the table's DeepSpeed keys; a missing key takes
    DeepSpeed's default (the table's deepspeed_default) where it differs from zenflow's."""
    known = {k["deepspeed_key"]: _FIELD_NAMES.get(n, n) for n, k in _KEYS.items()}
    for key in block:
        if prefix + key not in known and key not in extra:
            raise ValueError(f"{prefix}{key}: unknown key")
    settings = {}
    for key in (k for k in _KEYS.values() if k["deepspeed_key"].startswith(prefix)):
        suffix = key["deepspeed_key"][len(prefix) :]
        if suffix in block:  # "auto" is a zenflow value, elsewhere the launcher's placeholder
            value = block[suffix]
            value = value if "zenflow" in prefix else _no_auto(prefix + suffix, value)
            settings[known[key["deepspeed_key"]]] = value
        elif key["deepspeed_default"]:
            settings[known[key["deepspeed_key"]]] = json.loads(key["deepspeed_default"])
    return settings


def settings_from_deepspeed(config: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(optimizer hyper-parameters, zenflow settings) of a DeepSpeed configuration, full or
    short ({"zenflow": ..., "optimizer": ...}). Each key means what it means to DeepSpeed (the
    table's deepspeed_key; docs/usage.md lists the differences); DeepSpeed's other keys are
    ignored, `offload` too (the backend places the state). Unknown keys in the zenflow,
    optimizer, params and fp16 blocks raise."""
    if isinstance(config, (str, os.PathLike)):  # the path of a JSON file
        with open(config, encoding="utf-8") as f:
            config = json.load(f)
    config = _mapping("config", config)
    zero = _mapping("zero_optimization", config.get("zero_optimization", {}))
    block = zero.get("zenflow") if "zero_optimization" in config else config.get("zenflow")
    if block is None:
        raise ValueError(f"{_ZENFLOW_BLOCK[:-1]}: missing (the config has no zenflow block)")
    block = _mapping(_ZENFLOW_BLOCK[:-1], block)
    settings = _block(_ZENFLOW_BLOCK, block, extra=("offload",))
    if not isinstance(block.get("offload", False), bool):
        raise TypeError(f"{_ZENFLOW_BLOCK}offload: expected a bool")
    if isinstance(settings.get("pt_reserved_cores_perc"), int):  # pydantic's float coercion
        settings["pt_reserved_cores_perc"] = float(settings["pt_reserved_cores_perc"])

    hyper: dict[str, Any] = {}
    optimizer = config.get("optimizer")
    if optimizer is not None:
        optimizer = _mapping("optimizer", optimizer)
        for key in optimizer:
            if key not in ("type", "params"):
                raise ValueError(f"optimizer.{key}: unknown key (expected type, params)")
        kind = optimizer.get("type", "AdamW")
        if not isinstance(kind, str) or kind.lower() not in ("adam", "adamw"):
            raise ValueError(f"optimizer.type: ZenFlowAdamW is AdamW, got {kind!r}")
        params = _mapping("optimizer.params", optimizer.get("params", {}))
        for key, value in params.items():
            if key not in _PARAMS:
                raise ValueError(f"optimizer.params.{key}: unknown key")
            _no_auto(f"optimizer.params.{key}", value)
        # DeepSpeed: type AdamW is AdamW whatever adam_w_mode says; Adam is AdamW unless
        # adam_w_mode is false (then Adam with L2 decay, which zenflow does not implement).
        if kind.lower() == "adam" and params.get("adam_w_mode", True) is not True:
            raise ValueError("optimizer.params.adam_w_mode: false is Adam with L2 decay, not AdamW")
        if params.get("bias_correction", True) is not True:
            raise ValueError("optimizer.params.bias_correction: must be true (AdamW's)")
        if params.get("amsgrad", False) is not False:
            raise ValueError("optimizer.params.amsgrad: not supported")
        hyper = {key: params[key] for key in ("lr", "eps") if key in params}
        if "betas" in params:
            betas = params["betas"]
            hyper["betas"] = tuple(betas) if isinstance(betas, (list, tuple)) else betas
        # A missing weight_decay is that of the optimizer DeepSpeed builds: torch.optim.AdamW's
        # 0.01 with torch_adam, else DeepSpeedCPUAdam's / FusedAdam's 0.
        hyper["weight_decay"] = params.get("weight_decay", 0.01 * bool(params.get("torch_adam")))

    if "gradient_clipping" in config:
        clip = _no_auto("gradient_clipping", config["gradient_clipping"])
        settings["max_grad_norm"] = None if clip == 0 and not isinstance(clip, bool) else clip

    fp16 = _mapping("fp16", config.get("fp16", {}))
    settings_fp16 = _block("fp16.", fp16, extra=("enabled", "auto_cast", "loss_scale"))
    if _no_auto("fp16.enabled", fp16.get("enabled", False)):
        if fp16.get("loss_scale", 0) != 0:
            raise ValueError("fp16.loss_scale: a static loss scale is not supported (0 = dynamic)")
        power = settings_fp16.pop("initial_scale")
        if isinstance(power, bool) or not isinstance(power, int):
            raise TypeError(f"fp16.initial_scale_power: expected an integer, got {power!r}")
        settings.update(settings_fp16, loss_scaling="dynamic", initial_scale=2.0**power)
    return hyper, settings
