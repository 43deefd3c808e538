"""DeepSpeed-style configurations for ZenFlowAdamW.from_config: each key of the zenflow,
optimizer, gradient_clipping and fp16 blocks read as DeepSpeed reads it (the engine table's
deepspeed_key and deepspeed_default; docs/usage.md lists the deliberate differences)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from .config import (
    _FIELD_NAMES,
    _KEYS,
    _RENAMED,
    ENGINE_DEFAULTS,
    check_hyperparameters,
    check_settings,
)

__all__ = ["check_deepspeed", "settings_from_deepspeed"]

_ZENFLOW_BLOCK = "zero_optimization.zenflow."
_DEEPSPEED_NAMES = {n: k["deepspeed_key"] or n for n, k in _KEYS.items()}


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


def check_deepspeed(hyper: dict, settings: dict, overrides: dict) -> None:
    """from_config's values (the file's, then the keyword overrides) checked as the
    constructor will check them; a refused value from the file is named by its DeepSpeed key."""
    from_file = {_RENAMED.get(k, k) for k in settings if k not in overrides}
    names = {f: _DEEPSPEED_NAMES[f] if f in from_file else _FIELD_NAMES.get(f, f) for f in _KEYS}
    keywords = {k: v for k, v in overrides.items() if k in ENGINE_DEFAULTS}
    check_settings({**ENGINE_DEFAULTS, **settings, **keywords}, names)
    if not {"lr", "betas", "eps", "weight_decay"} & overrides.keys():
        # valid stand-ins for what the file does not give (the constructor checks its own)
        stand_ins = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
        check_hyperparameters(**{**stand_ins, **hyper}, where="optimizer.params.")
