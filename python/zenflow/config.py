"""ZenFlowAdamW's settings: validation of the constructor's keywords, and the translation of a
DeepSpeed-style configuration (its `zenflow` block and its optimizer `params` block) into them.

Every check raises ValueError or TypeError naming the key, before anything is built.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ENGINE_DEFAULTS",
    "DEEPSPEED_ZENFLOW_DEFAULTS",
    "check_settings",
    "settings_from_deepspeed",
]

# ZenFlowAdamW's keyword defaults (the engine's, docs/design.md section 4).
ENGINE_DEFAULTS: dict[str, Any] = {
    "topk_ratio": 0.1,
    "update_interval": 4,
    "select_strategy": "auto",
    "select_interval": "auto",
    "full_warm_up_rounds": 0,
    "overlap_step": True,
    "max_grad_norm": None,
    "auto_ratio": 0.99,
    "max_update_interval": 16,
    "master_weights": "fp32",
    "selection_score": "step",
    "steps_per_epoch": None,
    "num_threads": None,
    "pt_reserved_cores_perc": 0.5,
    "loss_scaling": "auto",
    "initial_scale": 65536.0,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 2000,
    "bucket_bytes": 64 << 20,
}

# What a DeepSpeed `zenflow` block means when a key is missing (DeepSpeed's own defaults,
# which differ from ZenFlowAdamW's in update_interval and overlap_step).
DEEPSPEED_ZENFLOW_DEFAULTS: dict[str, Any] = {
    "topk_ratio": 0.1,
    "select_strategy": "auto",
    "select_interval": "auto",
    "update_interval": "auto",
    "overlap_step": False,
    "offload": False,
    "auto_ratio": 0.99,
    "full_warm_up_rounds": 0,
    "pt_reserved_cores_perc": 0.5,
    "steps_per_epoch": None,
}

_STRATEGIES = ("auto", "step", "epoch")
_MASTER = ("fp32", "none")
_SCORES = ("step", "window")
_LOSS_SCALING = ("auto", "dynamic", "none")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _real(name: str, value: Any, low: float, high: float, *, low_open: bool = False) -> float:
    if not _is_real(value):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < low or value > high or (low_open and value == low):
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise ValueError(f"{name}: must be in {bound}, got {value}")
    return value


def _int(name: str, value: Any, low: int) -> int:
    if not _is_int(value):
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name}: must be >= {low}, got {value}")
    return int(value)


def _int_or_auto(name: str, value: Any) -> int | str:
    if isinstance(value, str):
        if value != "auto":
            raise ValueError(f'{name}: expected an integer >= 1 or "auto", got {value!r}')
        return value
    return _int(name, value, 1)


def _choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    if value not in options:
        valid = ", ".join(f'"{o}"' for o in options)
        raise ValueError(f"{name}: expected one of {valid}, got {value!r}")
    return value


def check_hyperparameters(
    lr: Any, betas: Any, eps: Any, weight_decay: Any, where: str = ""
) -> None:
    """torch.optim.AdamW's checks, with the argument named."""
    _real(f"{where}lr", lr if not hasattr(lr, "item") else lr.item(), 0.0, math.inf)
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"{where}betas: expected a pair (beta1, beta2), got {betas!r}")
    _real(f"{where}betas[0]", betas[0], 0.0, 1.0)
    _real(f"{where}betas[1]", betas[1], 0.0, 1.0)
    if betas[0] == 1.0 or betas[1] == 1.0:
        raise ValueError(f"{where}betas: must be in [0, 1), got {tuple(betas)}")
    _real(f"{where}eps", eps, 0.0, math.inf)
    _real(f"{where}weight_decay", weight_decay, 0.0, math.inf)


def check_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Validates ZenFlowAdamW's zenflow keywords (all of ENGINE_DEFAULTS' keys present)."""
    s = dict(settings)
    s["topk_ratio"] = _real("topk_ratio", s["topk_ratio"], 0.0, 1.0)
    s["update_interval"] = _int_or_auto("update_interval", s["update_interval"])
    s["select_strategy"] = _choice("select_strategy", s["select_strategy"], _STRATEGIES)
    s["select_interval"] = _int_or_auto("select_interval", s["select_interval"])
    if isinstance(s["select_interval"], int) and isinstance(s["update_interval"], int):
        if s["select_strategy"] != "epoch" and s["select_interval"] < s["update_interval"]:
            raise ValueError(
                f"select_interval: {s['select_interval']} steps is shorter than update_interval "
                f"({s['update_interval']}): a selection lasts at least one window"
            )
    s["full_warm_up_rounds"] = _int("full_warm_up_rounds", s["full_warm_up_rounds"], 0)
    if not isinstance(s["overlap_step"], bool):
        raise TypeError(f"overlap_step: expected a bool, got {type(s['overlap_step']).__name__}")
    if s["max_grad_norm"] is not None:
        s["max_grad_norm"] = _real(
            "max_grad_norm", s["max_grad_norm"], 0.0, math.inf, low_open=True
        )
    s["auto_ratio"] = _real("auto_ratio", s["auto_ratio"], 0.0, 1.0, low_open=True)
    s["max_update_interval"] = _int("max_update_interval", s["max_update_interval"], 1)
    s["master_weights"] = _choice("master_weights", s["master_weights"], _MASTER)
    s["selection_score"] = _choice("selection_score", s["selection_score"], _SCORES)
    if s["steps_per_epoch"] is not None:
        s["steps_per_epoch"] = _int("steps_per_epoch", s["steps_per_epoch"], 1)
    if s["select_strategy"] == "epoch" and s["steps_per_epoch"] is None:
        raise ValueError(
            'steps_per_epoch: select_strategy "epoch" needs the number of steps per epoch'
        )
    if s["num_threads"] is not None:
        s["num_threads"] = _int("num_threads", s["num_threads"], 1)
    s["pt_reserved_cores_perc"] = _real(
        "pt_reserved_cores_perc", s["pt_reserved_cores_perc"], 0.0, 1.0
    )
    s["loss_scaling"] = _choice("loss_scaling", s["loss_scaling"], _LOSS_SCALING)
    s["initial_scale"] = _real("initial_scale", s["initial_scale"], 0.0, math.inf, low_open=True)
    s["growth_factor"] = _real("growth_factor", s["growth_factor"], 1.0, math.inf, low_open=True)
    s["backoff_factor"] = _real("backoff_factor", s["backoff_factor"], 0.0, 1.0, low_open=True)
    if s["backoff_factor"] == 1.0:
        raise ValueError("backoff_factor: must be in (0, 1), got 1.0")
    s["growth_interval"] = _int("growth_interval", s["growth_interval"], 1)
    s["bucket_bytes"] = _int("bucket_bytes", s["bucket_bytes"], 1)
    return s


def engine_config(
    settings: dict[str, Any], betas: tuple[float, float], eps: float, loss_scaling: str
) -> dict:
    """The engine's config dict (zenflow._C.Engine) for checked settings."""
    return {
        "topk_ratio": settings["topk_ratio"],
        "update_interval": settings["update_interval"],
        "select_strategy": settings["select_strategy"],
        "select_interval": settings["select_interval"],
        "full_warm_up_rounds": settings["full_warm_up_rounds"],
        "overlap_step": settings["overlap_step"],
        "max_grad_norm": settings["max_grad_norm"],
        "auto_ratio": settings["auto_ratio"],
        "max_update_interval": settings["max_update_interval"],
        "master_weights": settings["master_weights"],
        "selection_score": settings["selection_score"],
        "steps_per_epoch": settings["steps_per_epoch"] or 0,
        "host_threads": settings["num_threads"] or 0,
        "pt_reserved_cores_perc": settings["pt_reserved_cores_perc"],
        "betas": tuple(betas),
        "eps": eps,
        "loss_scaling": loss_scaling,
        "initial_scale": settings["initial_scale"],
        "growth_factor": settings["growth_factor"],
        "backoff_factor": settings["backoff_factor"],
        "growth_interval": settings["growth_interval"],
        "bucket_bytes": settings["bucket_bytes"],
    }


# ---- DeepSpeed-style configuration ----

_OPTIMIZER_TYPES = ("adam", "adamw")
_PARAMS_KEYS = (
    "lr",
    "betas",
    "eps",
    "weight_decay",
    "adam_w_mode",
    "torch_adam",
    "bias_correction",
    "amsgrad",
)
_FP16_KEYS = (
    "enabled",
    "auto_cast",
    "loss_scale",
    "initial_scale_power",
    "loss_scale_window",
    "hysteresis",
    "consecutive_hysteresis",
    "min_loss_scale",
)


def _mapping(name: str, value: Any) -> Mapping:
    if not isinstance(value, Mapping):
        raise TypeError(f"{name}: expected a dict, got {type(value).__name__}")
    return value


def _no_auto(name: str, value: Any) -> Any:
    if value == "auto":
        raise ValueError(
            f'{name}: "auto" is resolved by the DeepSpeed/HuggingFace launcher; give a value'
        )
    return value


def load_config(config: Any) -> Mapping:
    """A dict, or the path of a JSON file holding one."""
    if isinstance(config, (str, os.PathLike)):
        with open(config, encoding="utf-8") as f:
            config = json.load(f)
    return _mapping("config", config)


def settings_from_deepspeed(config: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(optimizer hyper-parameters, zenflow settings) of a DeepSpeed-style configuration.

    Accepted shapes: a full DeepSpeed config (`zero_optimization.zenflow`, `optimizer`,
    `gradient_clipping`, `fp16`; DeepSpeed's other keys are DeepSpeed's business and are
    ignored), or the short form {"zenflow": {...}, "optimizer": {"params": {...}}}. A
    `zenflow` block's keys and values load unchanged; a missing key takes DeepSpeed's default
    (update_interval "auto", overlap_step false). `offload` is accepted: where the selected
    columns' state lives is the backend's choice (on the host backend everything is on the
    host). Unknown keys in the zenflow, optimizer, params and fp16 blocks raise ValueError.
    """
    config = load_config(config)
    if "zero_optimization" in config:
        zero = _mapping("zero_optimization", config["zero_optimization"])
        block_name = "zero_optimization.zenflow"
        block = zero.get("zenflow")
    else:
        block_name = "zenflow"
        block = config.get("zenflow")
    if block is None:
        raise ValueError(f"{block_name}: missing (a DeepSpeed config with a zenflow block)")
    block = _mapping(block_name, block)

    settings: dict[str, Any] = {}
    for key in block:
        if key not in DEEPSPEED_ZENFLOW_DEFAULTS:
            raise ValueError(f"{block_name}.{key}: unknown zenflow key")
    merged = {**DEEPSPEED_ZENFLOW_DEFAULTS, **block}
    if not isinstance(merged["offload"], bool):
        raise TypeError(
            f"{block_name}.offload: expected a bool, got {type(merged['offload']).__name__}"
        )
    for key, value in merged.items():
        if key != "offload":
            settings[key] = value
    if _is_int(settings.get("pt_reserved_cores_perc")):
        settings["pt_reserved_cores_perc"] = float(settings["pt_reserved_cores_perc"])

    hyper: dict[str, Any] = {}
    optimizer = config.get("optimizer")
    if optimizer is not None:
        optimizer = _mapping("optimizer", optimizer)
        for key in optimizer:
            if key not in ("type", "params"):
                raise ValueError(f"optimizer.{key}: unknown key (expected type, params)")
        kind = optimizer.get("type", "AdamW")
        if not isinstance(kind, str) or kind.lower() not in _OPTIMIZER_TYPES:
            raise ValueError(f"optimizer.type: ZenFlowAdamW is AdamW, got {kind!r}")
        params = _mapping("optimizer.params", optimizer.get("params", {}))
        for key, value in params.items():
            if key not in _PARAMS_KEYS:
                raise ValueError(f"optimizer.params.{key}: unknown key")
            _no_auto(f"optimizer.params.{key}", value)
        if params.get("adam_w_mode", True) is not True:
            raise ValueError(
                "optimizer.params.adam_w_mode: ZenFlowAdamW is AdamW (decoupled weight decay)"
            )
        if params.get("bias_correction", True) is not True:
            raise ValueError(
                "optimizer.params.bias_correction: must be true (AdamW's bias correction)"
            )
        if params.get("amsgrad", False) is not False:
            raise ValueError("optimizer.params.amsgrad: not supported")
        for key in ("lr", "eps", "weight_decay"):
            if key in params:
                hyper[key] = params[key]
        if "betas" in params:
            hyper["betas"] = (
                tuple(params["betas"])
                if isinstance(params["betas"], (list, tuple))
                else params["betas"]
            )

    if "gradient_clipping" in config:
        clip = _no_auto("gradient_clipping", config["gradient_clipping"])
        if not _is_real(clip) or clip < 0:
            raise ValueError(f"gradient_clipping: expected a number >= 0, got {clip!r}")
        settings["max_grad_norm"] = float(clip) if clip > 0 else None

    fp16 = config.get("fp16")
    if fp16 is not None:
        fp16 = _mapping("fp16", fp16)
        for key in fp16:
            if key not in _FP16_KEYS:
                raise ValueError(f"fp16.{key}: unknown key")
        if _no_auto("fp16.enabled", fp16.get("enabled", False)):
            if fp16.get("loss_scale", 0) not in (0, 0.0):
                raise ValueError(
                    "fp16.loss_scale: a static loss scale is not supported (0 = dynamic)"
                )
            settings["loss_scaling"] = "dynamic"
            power = fp16.get("initial_scale_power", 16)
            settings["initial_scale"] = 2.0 ** _int("fp16.initial_scale_power", power, 0)
            settings["growth_interval"] = _int(
                "fp16.loss_scale_window", fp16.get("loss_scale_window", 1000), 1
            )
    return hyper, settings
