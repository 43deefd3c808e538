"""ZenFlowAdamW's settings, translation only: every rule of a setting (default, type, range,
meaning, DeepSpeed key and default, difference from DeepSpeed) lives in the engine's table
(engine.h: zf_engine_config_key; zenflow._C.config_keys()), which also checks every value
(zenflow._C.check_config). Here: keyword names and None sentinels; DeepSpeed configurations
are read in _deepspeed.py."""

from __future__ import annotations

import numbers
import re
from typing import Any

from ._native import native

__all__ = ["ENGINE_DEFAULTS", "check_settings", "describe"]

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


def _engine_check(config: dict, where: str = "", names: dict = _FIELD_NAMES) -> dict:
    """The engine's check (DeepSpeed's rules on); its message names the keyword."""
    try:
        return native().check_config(config, True)
    except (TypeError, ValueError) as error:
        text = re.sub(r'config\["(\w+)"\]|config\.(\w+)', lambda m: m[1] or m[2], str(error))
        text = re.sub(r"\b\w+\b", lambda m: names.get(m[0], m[0]), text)  # whole words only
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


def check_settings(settings: dict[str, Any], names: dict = _FIELD_NAMES) -> dict[str, Any]:
    """ZenFlowAdamW's zenflow keywords (all of ENGINE_DEFAULTS' keys), checked by the engine;
    a refused field is named by `names` (engine field -> name; default: the keyword)."""
    engine = engine_config(settings, (0.9, 0.999), 1e-8, "none")
    if settings["loss_scaling"] not in ("auto", *_KEYS["loss_scaling"]["choices"]):
        engine["loss_scaling"] = settings["loss_scaling"]  # the engine names the bad value
    checked = _engine_check(engine, names=names)
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
