"""The host lane's memory traffic and throughput (issue 29): bytes per deferred parameter per
window, counted by the engine (stats host_lane_bytes_read / _written), against the formula,
and the lane's throughput against the streaming roof measured in the same run.

For each gradient dtype and window length S, an engine over --matrices matrices [rows, cols]
on the CPU (topk_ratio --topk, overlap off, so the host work of each window is timed by the
engine's own accumulate_seconds + host_update_seconds) takes a warm-up window, then
--windows windows. Reported per deferred element and window (step counts excluded):

  counted     (read + written) bytes over deferred elements and windows
  formula     (g + 8)*S + 16 + w: each accumulate up to the window's last reads g and
              writes A (4), all but the window's first also read A; the closing step is
              packed into the upload copy and fused into the update, which reads its g
              there, A (none at S = 1), master, m, v and writes master, m, v (12) and the
              upload copy (w) over it, and does not zero A (g, w: gradient and weight bytes)
  unfused     the same with the closing step accumulated and A read back by the update
              (+8: the engine before the fusion, docs/design.md "Host lane traffic")
  floor       issue 29's target, 10(S-1) + 28 for bf16
  GB/s        counted bytes / the lane's seconds, two ways: pipelined (each step follows the
              last at once, as in training) and with the device side idle (a pause of
              --settle seconds after each step, and past it until the lane has counted the
              pass's bytes, so that the lane's pass finishes before the next step's
              device-side work starts). On the host backend the
              "device" is this CPU: pipelined, the next step's packing and copies run on the
              same cores and memory as the lane's accumulates and slow them; on a GPU they
              are the GPU's and the copy engine's. The second figure is the lane's own rate.
  roof GB/s   the best of torch's copy and triad (a = b + s*c) over buffers of the same size,
              on the lane's thread count, same run (STREAM's byte counting)
  shape roof  the Adam-shaped roof: zf_host_stream_bandwidth (zenflow._C.host_stream_bandwidth)
              timed on each of the window's passes with its own streams, over as many
              elements as the lane's deferred ones, on the lane's thread count, same run: the
              first accumulate (g read, A written), the others (g read, A read and written),
              the fused update (U read and written, A read, master, m, v read and written;
              no A at S = 1). Its GB/s is the window's bytes over the sum of the passes' times
              at their roofs: what a kernel of the same streams with no arithmetic would take.
              The window update alone and the accumulates alone are also given against their
              own passes' roofs (the engine's host_update_seconds and accumulate_seconds,
              device side idle, the formula's bytes of each). In the device-side-idle run
              each step's pass is bracketed: its shape's roof is timed right before the step
              and right after its pause (one timed pass per variant), and the pass is
              compared with the mean of the two. On a shared VM the memory bandwidth moves
              between states up to 2x apart, sometimes within a tenth of a second: a window
              with a pass whose two roofs differ by more than STEADY_ROOF_SPREAD may have run
              in either state and is left out. The fractions are medians over the steady
              windows of (window's GB/s / roof's GB/s then); the fast state's column takes
              the steady windows whose roof is FAST_STATE_ROOF times the run's slowest or
              more. --per-window saves every window and its passes.
  per pass    a second table: each pass kind (a window's first accumulate, the other
              accumulates, the update) against its own roof, medians over its steady passes
              in the slow and the fast state, so that a window short of its roof names the
              pass that is (a pass is fast when its roof is FAST_STATE_ROOF times the run's
              slowest steady roof of the same shape or more).
  every pass  a third table: every window against its roof and every pass against the mean of
              its two, no steadiness filter, each median with its 95% interval (order
              statistics: distribution-free, the same data give the same interval). Where the
              memory changes state every few passes the steady filter keeps 0-2 windows of
              16; this keeps them all and says how sure the median is, the figure to hold
              against a target (give it 40 windows or more).

  --busy N    N processes spinning on the CPU through the whole run, roofs included: the
              lane sharing its cores with the training loop's threads or another job

    python benchmarks/bench_host_lane.py
    python benchmarks/bench_host_lane.py --write benchmarks/results/2026-12-05-host-lane.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from zenflow import _C
from zenflow.bench._harness import median_interval

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


PASS_KINDS = ("first accumulate", "accumulate", "update")


def window_passes(dtype_name: str, interval: int) -> list:
    """The kind and streams of each step's host pass in a window of `interval` steps, in step
    order: the first accumulate (g read, A written, without reading it), the others (g read,
    A read and written), the closing step's fused update (U read and written, A read,
    master, m, v read and written; no A at S = 1)."""
    g = ("bfloat16", "read") if dtype_name == "bfloat16" else ("float32", "read")
    u = (dtype_name, "read_write")
    state = [("float32", "read_write")] * 3  # master, m, v
    if interval == 1:
        return [("update", [u, *state])]
    first = ("first accumulate", [g, ("float32", "write")])
    middle = ("accumulate", [g, ("float32", "read_write")])
    return [first] + [middle] * (interval - 2) + [("update", [u, ("float32", "read"), *state])]


def phase_of(kind: str) -> str:
    """Which of the engine's lane timers times a pass kind: the update's or the accumulates'."""
    return "update" if kind == "update" else "accumulate"


def pass_bytes(streams: list, deferred: int) -> int:
    size = {"float32": 4, "bfloat16": 2}
    return deferred * sum(size[d] * (2 if a == "read_write" else 1) for d, a in streams)


def lane_bytes(stats: dict) -> int:
    """The bytes the engine's host lane has read and written so far."""
    return stats["host_lane_bytes_read"] + stats["host_lane_bytes_written"]


def stats_after_pass(engine, before: dict, moved_bytes: int, timeout: float = 60.0) -> dict:
    """The engine's stats once its lane has counted `moved_bytes` since `before`: a pass that
    outlasts the pause (a busy machine, --busy) is then timed whole, not split across two
    steps (the update's chunks each add their time as they end)."""
    deadline = time.monotonic() + timeout
    while True:
        now = engine.stats()
        moved = lane_bytes(now) - lane_bytes(before)
        if moved >= moved_bytes:
            return now
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the host lane counted {moved} of a pass's {moved_bytes} bytes in {timeout} s"
            )
        time.sleep(0.002)


def stream_roof_gbs(streams: list, deferred: int, threads: int) -> float:
    """One pass shape's roof in GB/s: zf_host_stream_bandwidth, the best of its variants."""
    return _C.host_stream_bandwidth(streams, deferred, threads, 1) / 1e9


# Two roofs around a pass at most this far apart (the larger over the smaller): the memory
# stayed in one state through the pass. The VM's two states are 1.5-1.9x apart; one state's
# passes vary by a few percent.
STEADY_ROOF_SPREAD = 1.10
FAST_STATE_ROOF = 1.25


def roofs_agree(before: float, after: float) -> bool:
    """The memory stayed in one state through a pass: its two roofs within STEADY_ROOF_SPREAD."""
    return max(before, after) / min(before, after) <= STEADY_ROOF_SPREAD


def fractions_of_roof(windows: list) -> dict:
    """Medians over `windows` of each fraction of its roof (None where there is none)."""
    result = {}
    for key, field in (
        ("window", "of_roof"),
        ("update", "update_of_roof"),
        ("accumulate", "accumulate_of_roof"),
    ):
        values = [w[field] for w in windows if w[field] is not None]
        result[key] = statistics.median(values) if values else None
    return result


def roof_gbs(elements: int, threads: int, reps: int) -> float:
    """Best of copy (2 arrays) and triad (3 arrays) in GB/s, torch on `threads` threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    a, b, c = (torch.rand(elements) for _ in range(3))
    best = 0.0
    for _ in range(reps):
        start = time.perf_counter()
        a.copy_(b)
        best = max(best, 8 * elements / (time.perf_counter() - start) / 1e9)
        start = time.perf_counter()
        torch.add(b, c, alpha=0.5, out=a)
        best = max(best, 12 * elements / (time.perf_counter() - start) / 1e9)
    torch.set_num_threads(before)
    return best


def run(dtype_name: str, interval: int, args: argparse.Namespace, settle: float) -> dict:
    dtype = DTYPES[dtype_name]
    shapes = [(args.rows, args.cols)] * args.matrices
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    grads = [[torch.randn(s, generator=gen).to(dtype) for s in shapes] for _ in range(2)]
    config = {
        "topk_ratio": args.topk,
        "update_interval": interval,
        "overlap_step": False,
        "host_threads": args.threads,
        "compute_threads": args.threads,
        # Windows from step 1: this measures the window's passes (the start's detection
        # would make the first 8 steps synchronous).
        "auto_warm_up_rounds": 0,
    }
    if args.bucket_bytes:
        config["bucket_bytes"] = args.bucket_bytes
    engine = _C.Engine(params, [{"params": list(range(len(shapes))), "lr": 1e-4}], config)
    for t in range(interval):  # the first window selects and warms the buffers
        engine.step(grads[t % 2], None)
    k = max(1, int(args.topk * args.cols))
    deferred = args.matrices * args.rows * (args.cols - k)
    before = engine.stats()
    # Device side idle: each step's host pass is bracketed by its shape's roof, timed right
    # before the step and right after its pause: the VM's memory bandwidth moves between two
    # states (measured 55 and 95 GB/s for one pass shape), sometimes within a tenth of a
    # second, so a pass is compared with the roof of its own moment, and only a window whose
    # every pass had its two roofs agree (within STEADY_ROOF_SPREAD) says how near its roof
    # the lane is: the others may have run in either state. (Brackets around a whole window
    # let a state change inside a window of 2-8 steps pass for steady.)
    passes = window_passes(dtype_name, interval)
    windows, steps = [], []
    last = before
    measured = None  # (streams, GB/s) of the last roof timed, reused for the next bracket
    for t in range(args.windows * interval):
        kind, streams = passes[t % interval]
        phase = phase_of(kind)
        if settle > 0:
            if measured is None or measured[0] != streams:
                measured = (streams, stream_roof_gbs(streams, deferred, args.threads))
            roof_before = measured[1]
        engine.step(grads[t % 2], None)
        if settle <= 0:
            continue
        time.sleep(settle)
        moved_bytes = pass_bytes(streams, deferred)
        now = stats_after_pass(engine, last, moved_bytes)
        key = "host_update_seconds" if phase == "update" else "accumulate_seconds"
        roof_after = stream_roof_gbs(streams, deferred, args.threads)
        measured = (streams, roof_after)
        steps.append(
            {
                "phase": phase,
                "pass": kind,
                "bytes": moved_bytes,
                "seconds": now[key] - last[key],
                "roof_before": roof_before,
                "roof_after": roof_after,
            }
        )
        last = now
        if (t + 1) % interval == 0:
            windows.append(steps)
            steps = []
    after = engine.stats()
    engine.close()
    step_count_bytes = 8 * args.matrices * (args.cols - k) * args.windows
    moved = lane_bytes(after) - lane_bytes(before)
    seconds = (
        after["accumulate_seconds"]
        + after["host_update_seconds"]
        - before["accumulate_seconds"]
        - before["host_update_seconds"]
    )
    g = w = torch.tensor([], dtype=dtype).element_size()
    formula = (g + 8) * interval + 16 + w
    accumulate_seconds = after["accumulate_seconds"] - before["accumulate_seconds"]
    update_seconds = after["host_update_seconds"] - before["host_update_seconds"]
    # The formula's bytes by phase: the accumulates, then the (fused) window update.
    update_bytes = g + w + (28 if interval > 1 else 24)
    accumulate_bytes = formula - update_bytes
    # Per window: the lane's GB/s over the roof's GB/s of the same moments (window as a
    # whole, update alone, accumulates alone): each pass's roof is the mean of the two timed
    # around it, and a set of passes' roof is their bytes over their times at their roofs.
    per_window, steady_roofs = [], []
    for window_steps in windows:
        fraction, roof = {}, {}
        for key, phases in (
            ("window", ("accumulate", "update")),
            ("update", ("update",)),
            ("accumulate", ("accumulate",)),
        ):
            chosen = [p for p in window_steps if p["phase"] in phases]
            if not chosen:
                fraction[key] = roof[key] = None
                continue
            at_roof = sum(
                p["bytes"] / ((p["roof_before"] + p["roof_after"]) / 2 * 1e9) for p in chosen
            )
            roof[key] = sum(p["bytes"] for p in chosen) / at_roof / 1e9
            fraction[key] = at_roof / sum(p["seconds"] for p in chosen)
        is_steady = all(roofs_agree(p["roof_before"], p["roof_after"]) for p in window_steps)
        if is_steady:
            steady_roofs.append(roof)
        per_window.append(
            {
                "roof_gbs": roof["window"],
                "steady": is_steady,
                "of_roof": fraction["window"],
                "update_of_roof": fraction["update"],
                "accumulate_of_roof": fraction["accumulate"],
                "passes": [
                    {
                        "phase": p["phase"],
                        "pass": p["pass"],
                        "gbs": p["bytes"] / p["seconds"] / 1e9,
                        "roof_before_gbs": p["roof_before"],
                        "roof_after_gbs": p["roof_after"],
                    }
                    for p in window_steps
                ],
            }
        )
    steady = [w_ for w_ in per_window if w_["steady"]]
    return {
        "per_window": per_window,
        "steady_windows": len(steady),
        "of_roof": fractions_of_roof(steady),
        # The shape roofs (GB/s), medians over the steady windows.
        "roof_gbs": {
            key: (
                statistics.median(r[key] for r in steady_roofs)
                if steady_roofs and steady_roofs[0][key]
                else None
            )
            for key in ("window", "update", "accumulate")
        },
        "accumulate_gbs": (
            accumulate_bytes * deferred * args.windows / accumulate_seconds / 1e9
            if accumulate_bytes
            else None
        ),
        "update_gbs": update_bytes * deferred * args.windows / update_seconds / 1e9,
        "counted": (moved - step_count_bytes) / (deferred * args.windows),
        "formula": formula,
        "unfused": formula + 8,
        "floor": 10 * (interval - 1) + 28 if g == 2 else None,
        "gbs": moved / seconds / 1e9,
        "deferred": deferred,
    }


def bracket_roof(saved_pass: dict) -> float:
    """A saved pass's roof (per_window's "passes"): the mean of the two timed around it."""
    return (saved_pass["roof_before_gbs"] + saved_pass["roof_after_gbs"]) / 2


def pass_fractions(rows: list) -> list:
    """Per row, per pass kind, the fractions of their own roof of the steady passes (two roofs
    within STEADY_ROOF_SPREAD), in the slow and the fast state. A pass is fast when its roof
    is at least FAST_STATE_ROOF times the slowest steady roof of the same pass shape in the
    run (shapes differ in roof: the first accumulate's is the lowest)."""
    steady = []  # (row, kind, shape, roof, fraction)
    for row, (name, interval, _, idle, _) in enumerate(rows):
        for window in idle["per_window"]:
            for p in window["passes"]:
                if not roofs_agree(p["roof_before_gbs"], p["roof_after_gbs"]):
                    continue
                roof = bracket_roof(p)
                shape = (name, p["pass"], interval == 1)  # S = 1's update has no A
                steady.append((row, p["pass"], shape, roof, p["gbs"] / roof))
    slowest = {}
    for _, _, shape, roof, _ in steady:
        slowest[shape] = min(roof, slowest.get(shape, roof))
    result = [{kind: ([], []) for kind in PASS_KINDS} for _ in rows]
    for row, kind, shape, roof, fraction in steady:
        result[row][kind][roof >= FAST_STATE_ROOF * slowest[shape]].append(fraction)
    return result


def all_pass_fractions(per_window: list) -> dict:
    """Every window's fraction of its roof and every pass's against the mean of its own two
    roofs, no steadiness filter, by kind ("window" and PASS_KINDS): on a VM whose memory
    changes state within a pass's bracket, this takes every sample and lets the median's
    interval (median_interval) say how sure it is, where the steady filter keeps few."""
    result = {"window": [w["of_roof"] for w in per_window]}
    for kind in PASS_KINDS:
        result[kind] = [
            p["gbs"] / bracket_roof(p) for w in per_window for p in w["passes"] if p["pass"] == kind
        ]
    return result


def interval_text(fractions: list) -> str:
    """A median of fractions with its 95% interval and count: "93% [88-97%] (24)"."""
    median, low, high = median_interval(fractions)
    if median is None:
        return "-"
    spread = "" if low is None else f" [{low:.0%}-{high:.0%}]"
    return f"{median:.0%}{spread} ({len(fractions)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrices", type=int, default=8)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--cols", type=int, default=2048)
    parser.add_argument("--topk", type=float, default=0.1)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--intervals", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument(
        "--settle",
        type=float,
        default=0.25,
        help="seconds of pause after each step for the device-side-idle figure",
    )
    parser.add_argument(
        "--bucket-bytes",
        type=int,
        default=None,
        help="the engine's bucket_bytes (default: the engine's): one bucket for the whole model "
        "keeps the next bucket's packing, on the host backend the same cores' work, out of the "
        "accumulates' time (on a GPU the packing is the GPU's)",
    )
    parser.add_argument("--write", type=Path, default=None, help="save the markdown table here")
    parser.add_argument(
        "--per-window",
        type=Path,
        default=None,
        help="save every device-side-idle window (its roof in GB/s, whether it is steady, the "
        "window's, the update's and the accumulates' fractions of their roofs, and each pass's "
        "GB/s with the roofs timed before and after it) here, as JSON: the memory's state per "
        "pass",
    )
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        help="processes spinning on the CPU for the whole run (roofs included): the training "
        "loop's own threads, or another job, on the lane's cores",
    )
    args = parser.parse_args()

    elements = args.matrices * args.rows * args.cols
    rows = []
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        for name in args.dtypes:
            for interval in args.intervals:
                result = run(name, interval, args, 0.0)
                idle = run(name, interval, args, args.settle)
                roof = roof_gbs(elements, args.threads, 5)  # the same run, right after
                rows.append((name, interval, result, idle, roof))
    finally:
        for process in busy:
            process.kill()
            process.wait()
    # The memory's fast state, where there is one: steady windows whose roof is at least
    # FAST_STATE_ROOF times the slowest steady window's of the run (the states are 1.5-1.9x
    # apart on the VM that showed two; a machine with one state has no fast windows).
    steady_roofs = [
        w["roof_gbs"] for *_, idle, _ in rows for w in idle["per_window"] if w["steady"]
    ]
    fast_from = FAST_STATE_ROOF * min(steady_roofs) if steady_roofs else float("inf")
    lines = [
        f"# Host lane traffic and throughput ({datetime.date.today()})",
        "",
        f"`python benchmarks/bench_host_lane.py`: {args.matrices} matrices [{args.rows}, {args.cols}], "
        f"topk_ratio {args.topk}, {args.windows} windows after a warm-up window, overlap off, "
        f"{args.threads} host-lane threads, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}"
        + (f", {args.busy} busy processes beside" if args.busy else "")
        + ". Bytes per deferred element per window "
        "(step counts excluded); the roof is torch's best of copy and triad on as many threads, "
        "measured right after each row; in the device-side-idle run each step's pass is "
        "bracketed by its shape's roof, timed right before the step and right after its pause, "
        "and a window is *steady* when the two roofs of each of its passes agree within "
        f"{STEADY_ROOF_SPREAD - 1:.0%}. Shape roof GB/s and the fractions of it: medians over the "
        "steady windows of the window's GB/s over its roof (each pass at the mean of its two); "
        "the fast state's "
        f"windows are the steady ones whose roof is at least {FAST_STATE_ROOF}x the run's slowest "
        f"({fast_from:.1f} GB/s here). Lane GB/s pipelined: each step right after the last; "
        f"device side idle: a {args.settle} s pause after each step (the bench's docstring).",
        "",
        "| gradient and weights | S | counted B | formula B | unfused B | issue 29 floor B "
        "| roof GB/s | lane GB/s, pipelined | of roof | lane GB/s, device side idle | of roof "
        "| steady windows (fast) | shape roof GB/s | idle lane of shape roof "
        "| update GB/s (idle), of its roof | accumulates GB/s (idle), of their roof "
        "| fast state: window (update, accumulates) of roof |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def of(value, ratio):
        return "-" if value is None or ratio is None else f"{value:.1f}, {ratio:.0%}"

    def percent(ratio):
        return "-" if ratio is None else f"{ratio:.0%}"

    for name, interval, r, idle, roof in rows:
        floor = "-" if r["floor"] is None else f"{r['floor']}"
        fast = [w for w in idle["per_window"] if w["steady"] and w["roof_gbs"] >= fast_from]
        idle["fast_of_roof"] = fractions_of_roof(fast)
        fast_text = "-"
        if fast:
            f = idle["fast_of_roof"]
            fast_text = (
                f"{percent(f['window'])} ({percent(f['update'])}, {percent(f['accumulate'])})"
            )
        shape_roof = idle["roof_gbs"]["window"]
        lines.append(
            f"| {name} | {interval} | {r['counted']:.1f} | {r['formula']} | {r['unfused']} | {floor} "
            f"| {roof:.1f} | {r['gbs']:.1f} | {r['gbs'] / roof:.0%} "
            f"| {idle['gbs']:.1f} | {idle['gbs'] / roof:.0%} "
            f"| {idle['steady_windows']} of {len(idle['per_window'])} ({len(fast)}) "
            f"| {'-' if shape_roof is None else f'{shape_roof:.1f}'} "
            f"| {percent(idle['of_roof']['window'])} | {of(idle['update_gbs'], idle['of_roof']['update'])} "
            f"| {of(idle['accumulate_gbs'], idle['of_roof']['accumulate'])} | {fast_text} |"
        )
    ratio_sets = (
        ("pipelined, of the copy/triad roof", [r[2]["gbs"] / r[4] for r in rows]),
        ("device side idle, of the copy/triad roof", [r[3]["gbs"] / r[4] for r in rows]),
        ("device side idle, of the shape roof", [r[3]["of_roof"]["window"] for r in rows]),
        ("window update alone, of its shape roof", [r[3]["of_roof"]["update"] for r in rows]),
        ("accumulates alone, of their shape roof", [r[3]["of_roof"]["accumulate"] for r in rows]),
        (
            "device side idle, fast state, of the shape roof",
            [r[3]["fast_of_roof"]["window"] for r in rows],
        ),
    )
    for label, ratios in ratio_sets:
        ratios = [ratio for ratio in ratios if ratio is not None]  # no accumulates at S = 1
        if not ratios:
            continue
        lines.append(
            f"\nLane throughput, {label}: {min(ratios):.0%} to {max(ratios):.0%} "
            f"(median {statistics.median(ratios):.0%})."
        )
    # Where a window falls short, which pass: each against its own roof, by memory state.
    lines += [
        "",
        "Each pass of the device-side-idle run against its own roof: medians over the passes "
        f"whose two roofs agree within {STEADY_ROOF_SPREAD - 1:.0%} (their count), slow / fast "
        f"state (a pass is fast when its roof is at least {FAST_STATE_ROOF}x the slowest steady "
        "roof of its shape in the run).",
        "",
        "| gradient and weights | S | "
        + " | ".join(f"{kind}: slow / fast" for kind in PASS_KINDS)
        + " |",
        "|---|---:|" + "---|" * len(PASS_KINDS),
    ]

    def median_of(fractions):
        if not fractions:
            return "-"
        return f"{statistics.median(fractions):.0%} ({len(fractions)})"

    for (name, interval, *_), kinds in zip(rows, pass_fractions(rows)):
        cells = [f"{median_of(slow)} / {median_of(fast)}" for slow, fast in kinds.values()]
        lines.append(f"| {name} | {interval} | " + " | ".join(cells) + " |")
    # Every sample, with how sure the median is: the figure to hold against a target.
    lines += [
        "",
        "Every window and every pass of the device-side-idle run against its roof, no "
        "steadiness filter (a pass against the mean of its two roofs, a window against its "
        "passes' roofs): medians, the 95% interval of the median in brackets (order "
        "statistics, distribution-free; none under 6 samples), the count.",
        "",
        "| gradient and weights | S | window | " + " | ".join(PASS_KINDS) + " |",
        "|---|---:|" + "---|" * (1 + len(PASS_KINDS)),
    ]
    for name, interval, _, idle, _ in rows:
        fractions = all_pass_fractions(idle["per_window"])
        cells = [interval_text(fractions[key]) for key in ("window", *PASS_KINDS)]
        lines.append(f"| {name} | {interval} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        args.write.write_text(text)
    if args.per_window:
        windows = [
            {"dtype": name, "interval": interval, **window}
            for name, interval, _, idle, _ in rows
            for window in idle["per_window"]
        ]
        args.per_window.write_text(json.dumps(windows, indent=1) + "\n")
    # The engine's count must be the formula's, exactly (the CI smoke run checks it too).
    wrong = [
        f"{name} S={interval}: counted {result['counted']} B, formula {result['formula']} B"
        for name, interval, pipelined, idle, _ in rows
        for result in (pipelined, idle)
        if result["counted"] != result["formula"]
    ]
    if wrong:
        raise SystemExit("host-lane bytes differ from the formula: " + "; ".join(wrong))


if __name__ == "__main__":
    main()
