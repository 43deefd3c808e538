"""`python -m zenflow bench engine`: the engine on the host backend, stall-free overlap
against synchronous offload (benchmarks/bench_engine.py calls this).

A synthetic model of bf16 matrices and a fixed fake device time per step (a sleep standing in
for the GPU's forward and backward) drive zenflow._C.Engine with CPU tensors. Three
configurations run one after the other on the same gradients:

  * zenflow overlap:     topk_ratio 0.1, update_interval 4, overlap_step True (the defaults);
  * the same with update_lag 2 and 1 (the result lands 2 or 1 steps into the next window);
  * zenflow sync:        the same with overlap_step False;
  * plain sync offload:  topk_ratio 0, update_interval 1, overlap_step False (ZeRO-Offload's
                         schedule: every column to the host every step, and wait for it);
  * each --setting key=value,... given: zenflow overlap with those ZenFlowAdamW keywords (the
    accuracy benchmark's settings, for their stall at the same fake device time).

They run one after the other, not interleaved step by step: an overlapping engine's host
update runs in the background into the steps that follow it, which would then be another
configuration's steps, and measuring that interference is not the question here.

Reported per configuration: the step time (fake device time + the engine call), the mean over
the whole timed run (total / steps, window-close stalls included: the headline) and the
median; the engine call alone; the synchronous start the engine chose (auto_warm_up_rounds:
the first 8 steps, each synchronous, then none on these independent gradients) and the
untimed steps' stall; stall seconds per step by cause; host update and accumulate
seconds; bytes down and up per step against docs/design.md section 5's formula (bf16: down
(1 - r) * 2 bytes per parameter per step, up (1 - r) * 2 / S); and the stall reduction against
plain synchronous offload (target: at least 85% for overlap when the fake device time is at
least the host update / S). Also the engine's bookkeeping: one step call on 300 tiny tensors
(target: under 1 ms). Every engine rule is the engine's: this only drives it and reads its
statistics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

import zenflow

from ._harness import Progress, Row, Samples, Section

RATIO, INTERVAL = 0.1, 4
# Independent gradient sets, cycled: none repeats within the steps the engine's start
# detection reads (engine.h: auto_warm_up_rounds).
GRADIENT_SETS = 8
STALL_KEYS = ("stall_seconds_window_close", "stall_seconds_back_pressure", "stall_seconds_flush")
DELTA_KEYS = STALL_KEYS + ("host_update_seconds", "accumulate_seconds", "bytes_down", "bytes_up")
CONFIGS = {
    "zenflow overlap": dict(topk_ratio=RATIO, update_interval=INTERVAL, overlap_step=True),
    # The fresher landings (issue 28): stall-free only while the host update fits in the lag.
    "zenflow overlap, update_lag 2": dict(
        topk_ratio=RATIO, update_interval=INTERVAL, overlap_step=True, update_lag=2
    ),
    "zenflow overlap, update_lag 1": dict(
        topk_ratio=RATIO, update_interval=INTERVAL, overlap_step=True, update_lag=1
    ),
    "zenflow sync": dict(topk_ratio=RATIO, update_interval=INTERVAL, overlap_step=False),
    "plain sync offload": dict(topk_ratio=0.0, update_interval=1, overlap_step=False),
}
BASELINE = "plain sync offload"


@dataclass
class EngineConfig:
    params: float = 50e6
    device_ms: float | None = None  # None: 1.25 x (host update per window / S), measured
    steps: int = 6 * INTERVAL
    reserved: float = 0.5  # pt_reserved_cores_perc
    bookkeeping_reps: int = 200
    # More rows: name -> engine settings over "zenflow overlap"'s (--setting).
    settings: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def quick(cls) -> EngineConfig:
        return cls(params=2e6, steps=4 * INTERVAL, bookkeeping_reps=50)

    def whole_windows(self) -> int:
        return INTERVAL * max(1, round(self.steps / INTERVAL))


def _engine_class():
    if not hasattr(zenflow._C, "Engine"):
        raise RuntimeError("this zenflow build has no zenflow._C.Engine; rebuild zenflow to run it")
    return zenflow._C.Engine


def model_shapes(total: float) -> list[tuple[int, int]]:
    """Matrices of [rows, cols] adding up to about `total` parameters."""
    rows, cols = (1024, 4096) if total >= 16e6 else (512, 1024)
    count = max(1, round(total / (rows * cols)))
    return [(rows, cols)] * count


def _make_model(shapes, seed):
    gen = torch.Generator().manual_seed(seed)
    return [(0.02 * torch.randn(s, generator=gen)).to(torch.bfloat16) for s in shapes]


def _group_of(params, lr=1e-4):
    return [{"params": list(range(len(params))), "lr": lr, "weight_decay": 0.01}]


def _run_config(name, settings, shapes, grad_sets, device_s, timed, reserved, progress):
    Engine = _engine_class()
    params = _make_model(shapes, seed=0)
    engine = Engine(params, _group_of(params), dict(settings, pt_reserved_cores_perc=reserved))
    # Not timed: the steps the engine's start detection reads (until it has decided), then two
    # windows (selection, overlap's first upload at the second close, caches). A start that
    # goes on past the decision runs into the timed steps, where its stall shows.
    warm = 0
    while engine.stats()["synchronous_start_steps"] < 0:
        time.sleep(device_s)
        engine.step(grad_sets[warm % len(grad_sets)])
        warm += 1
    warm += 2 * INTERVAL
    progress.start(f"engine: {name}", warm + timed)
    progress.update(warm - 2 * INTERVAL)
    for t in range(warm - 2 * INTERVAL, warm):
        time.sleep(device_s)
        engine.step(grad_sets[t % len(grad_sets)])
        progress.update()
    before = engine.stats()
    steps, calls = Samples(), Samples()
    for t in range(timed):
        grads = grad_sets[(warm + t) % len(grad_sets)]
        start = time.perf_counter()
        time.sleep(device_s)  # the device's forward and backward
        call = time.perf_counter()
        engine.step(grads)
        end = time.perf_counter()
        steps.seconds.append(end - start)
        calls.seconds.append(end - call)
        progress.update()
    progress.close()
    after = engine.stats()
    engine.flush()
    engine.close()
    delta = {key: (after[key] - before[key]) / timed for key in DELTA_KEYS}
    windows = after["windows"] - before["windows"]
    delta["host_update_per_window"] = (
        (after["host_update_seconds"] - before["host_update_seconds"]) / windows if windows else 0.0
    )
    delta["stall"] = sum(delta[key] for key in STALL_KEYS)
    n_params = sum(r * c for r, c in shapes)
    ratio, interval = settings["topk_ratio"], settings["update_interval"]
    delta["down_formula"] = (1 - ratio) * 2 * n_params
    delta["up_formula"] = (1 - ratio) * 2 / interval * n_params
    delta["call_median"] = calls.median
    # The synchronous start the engine chose (untimed when it ends within the warm steps), and
    # the untimed steps' stall, the start's included.
    delta["start_steps"] = after["synchronous_start_steps"]
    delta["warm_stall"] = sum(before[key] for key in STALL_KEYS)
    delta["warm_steps"] = warm
    return steps, delta


def _calibrate(shapes, grad_sets, reserved):
    """Fake device time = 1.25 x (zenflow's host update per window / S), measured."""
    Engine = _engine_class()
    params = _make_model(shapes, seed=0)
    settings = dict(CONFIGS["zenflow sync"], pt_reserved_cores_perc=reserved, auto_warm_up_rounds=0)
    engine = Engine(params, _group_of(params), settings)
    for t in range(3 * INTERVAL):
        engine.step(grad_sets[t % len(grad_sets)])
    stats = engine.stats()
    engine.close()
    per_window = stats["host_update_seconds"] / max(1, stats["windows"])
    return 1.25 * per_window / INTERVAL


def _bookkeeping(repeats, progress):
    """One step call on 300 tiny tensors (150 [8, 16] + 150 [16])."""
    Engine = _engine_class()
    shapes = [(8, 16), (16,)] * 150
    gen = torch.Generator().manual_seed(3)
    params = [torch.randn(s, generator=gen) for s in shapes]
    grads = [torch.randn(s, generator=gen) for s in shapes]
    engine = Engine(params, _group_of(params), dict(CONFIGS["zenflow overlap"]))
    for _ in range(2 * INTERVAL):
        engine.step(grads)
    samples = Samples()
    progress.start("engine: bookkeeping, 300 tiny tensors", repeats)
    for _ in range(repeats):
        start = time.perf_counter()
        engine.step(grads)
        samples.seconds.append(time.perf_counter() - start)
        progress.update()
    progress.close()
    engine.close()
    return samples, len(shapes)


def _relative_error(got, want):
    return abs(got - want) / want if want else (0.0 if got == 0 else float("inf"))


def run(config: EngineConfig, progress: Progress) -> tuple[list[Section], list[str], dict]:
    timed = config.whole_windows()
    shapes = model_shapes(config.params)
    gen = torch.Generator().manual_seed(1)
    # Independent gradients at every step of the probe, as a trained model's stochastic
    # gradients: the start's detection reads them as noise and ends the start after the probe
    # (two sets alternating would look half consistent, as a model trained from scratch).
    grad_sets = [
        [(1e-3 * torch.randn(s, generator=gen)).to(torch.bfloat16) for s in shapes]
        for _ in range(GRADIENT_SETS)
    ]
    if config.device_ms is None:
        progress.note("calibrating the fake device time (3 windows of zenflow sync)")
        device_s = _calibrate(shapes, grad_sets, config.reserved)
    else:
        device_s = config.device_ms / 1e3
    n_params = sum(r * c for r, c in shapes)
    results = {}
    configs = dict(CONFIGS)
    for name, extra in config.settings.items():
        configs[f"zenflow overlap, {name}"] = dict(CONFIGS["zenflow overlap"], **extra)
    for name, settings in configs.items():
        results[name] = _run_config(
            name, settings, shapes, grad_sets, device_s, timed, config.reserved, progress
        )
    base_stall = results[BASELINE][1]["stall"]
    warm = results["zenflow overlap"][1]["warm_steps"]
    rows = []
    for name, (steps, d) in results.items():
        reduction = None if name == BASELINE or base_stall == 0 else 1 - d["stall"] / base_stall
        down, up = d["bytes_down"] / n_params, d["bytes_up"] / n_params
        rows.append(
            Row(
                name,
                steps,
                peer=name == BASELINE,
                extra={
                    "call_median_ms": d["call_median"] * 1e3,
                    "start_steps": d["start_steps"],
                    "warm_stall_ms": d["warm_stall"] * 1e3,
                    "stall_ms": d["stall"] * 1e3,
                    "stall_by_cause_ms": " / ".join(f"{d[k] * 1e3:.2f}" for k in STALL_KEYS),
                    "stall_reduction": None if reduction is None else f"{100 * reduction:.1f}%",
                    "host_update_ms": d["host_update_seconds"] * 1e3,
                    "accumulate_ms": d["accumulate_seconds"] * 1e3,
                    "down_bytes_per_param": down,
                    "down_formula": d["down_formula"] / n_params,
                    "up_bytes_per_param": up,
                    "up_formula": d["up_formula"] / n_params,
                },
            )
        )
    section = Section(
        title=(
            f"Engine step on the host backend, {len(shapes)} bf16 matrices of "
            f"{shapes[0][0]}x{shapes[0][1]} = {n_params / 1e6:.1f}M parameters, fake device time "
            f"{device_s * 1e3:.1f} ms per step"
        ),
        rows=rows,
        headline="mean",
        reference=BASELINE,
        note=(
            f"Step = fake device time + engine.step(): {timed} timed steps after {warm} untimed "
            f"(the first {warm - 2 * INTERVAL} read by the engine's start detection, each "
            "synchronous); "
            f"pt_reserved_cores_perc {config.reserved}. Stall by cause: window close / "
            "back-pressure / flush. Bytes per parameter per step, measured (formula)."
        ),
        columns=[
            ("call ms (median)", "call_median_ms", "{:.1f}"),
            ("synchronous start, steps", "start_steps", "{}"),
            ("untimed steps' stall, ms in all", "warm_stall_ms", "{:.0f}"),
            ("stall ms/step", "stall_ms", "{:.2f}"),
            ("by cause", "stall_by_cause_ms", "{}"),
            ("stall reduction", "stall_reduction", "{}"),
            ("host update ms/step", "host_update_ms", "{:.1f}"),
            ("down B/param (formula)", "down_bytes_per_param", "{:.4f}"),
            ("up B/param (formula)", "up_bytes_per_param", "{:.4f}"),
        ],
    )
    book, count = _bookkeeping(config.bookkeeping_reps, progress)
    overlap = results["zenflow overlap"][1]
    reduction = 1 - overlap["stall"] / base_stall if base_stall else float("nan")
    condition = device_s >= overlap["host_update_per_window"] / INTERVAL
    bytes_ok = all(
        _relative_error(d["bytes_down"], d["down_formula"]) <= 0.01
        and _relative_error(d["bytes_up"], d["up_formula"]) <= 0.01
        for _, d in results.values()
    )
    formulas = "; ".join(
        f"{name}: down {d['down_formula'] / n_params:.4f}, up {d['up_formula'] / n_params:.4f}"
        for name, (_, d) in results.items()
    )
    notes = [
        f"Formulas (B/param/step): {formulas}.",
        "Targets:",
        f"- stall reduction of overlap vs plain sync >= 85%: {100 * reduction:.1f}% "
        f"({'met' if reduction >= 0.85 else 'NOT met'}); the condition device time >= host "
        f"update / S: {device_s * 1e3:.1f} ms vs {overlap['host_update_per_window'] / INTERVAL * 1e3:.1f} ms "
        f"({'holds' if condition else 'does not hold'})",
        f"- bytes per step within 1% of the formula: {'met' if bytes_ok else 'NOT met'}",
        f"- bookkeeping, one step call on {count} tiny tensors: {book.median * 1e3:.3f} ms median, "
        f"{book.mean * 1e3:.3f} ms mean (target < 1 ms: {'met' if book.median < 1e-3 else 'NOT met'})",
    ]
    facts = {
        "fake device ms": round(device_s * 1e3, 3),
        "stall reduction (overlap vs plain sync)": round(100 * reduction, 1),
        "bookkeeping median ms": round(book.median * 1e3, 4),
    }
    return [section], notes, facts
