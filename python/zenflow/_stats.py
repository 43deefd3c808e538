"""One-line summaries of ZenFlowAdamW.stats() for logs."""

from __future__ import annotations

from typing import Any

__all__ = ["format_stats", "stall_seconds"]


def stall_seconds(stats: dict[str, Any]) -> float:
    """The training thread's total wait inside the engine (ZenFlowAdamW.stats()): window
    closes, staging back-pressure, flushes and, on CUDA, statistics read back from the
    device (dynamic loss scaling, the auto interval, window scores)."""
    return (
        stats.get("stall_seconds_window_close", 0.0)
        + stats.get("stall_seconds_back_pressure", 0.0)
        + stats.get("stall_seconds_flush", 0.0)
        + stats.get("stall_seconds_readback", 0.0)
    )


def format_stats(stats: dict[str, Any]) -> str:
    """A one-line summary of ZenFlowAdamW.stats() (or zenflow._C.Engine.stats()) for logs."""
    stall = stall_seconds(stats)

    def size(count: float) -> str:
        for unit in ("B", "KiB", "MiB", "GiB"):
            if abs(count) < 1024 or unit == "GiB":
                return f"{count:.1f} {unit}" if unit != "B" else f"{int(count)} B"
            count /= 1024
        return f"{count:.1f} GiB"

    parts = [
        f"step {stats.get('steps', 0)}",
        f"windows {stats.get('windows', 0)}",
        "synchronous start "
        + (
            "deciding"
            if stats.get("synchronous_start_steps", 0) < 0
            else f"{stats.get('synchronous_start_steps', 0)} steps"
        ),
        f"reselections {stats.get('reselections', 0)}",
        f"skipped {stats.get('skipped_steps', 0)}",
        f"grad norm {stats.get('last_global_norm', 0.0):.4g}",
        f"selected {100.0 * stats.get('selected_fraction', 0.0):.1f}%",
        f"stall {1e3 * stall:.1f} ms (close {1e3 * stats.get('stall_seconds_window_close', 0.0):.1f}, "
        f"back-pressure {1e3 * stats.get('stall_seconds_back_pressure', 0.0):.1f}, "
        f"flush {1e3 * stats.get('stall_seconds_flush', 0.0):.1f}, "
        f"readback {1e3 * stats.get('stall_seconds_readback', 0.0):.1f})",
        f"host update {stats.get('host_update_seconds', 0.0):.2f} s"
        # The lane's jobs waiting for copies (CUDA: transfers still in flight), apart from
        # the passes' time; the host backend's copies are done when issued.
        + (
            f" (waiting for copies {stats['host_lane_wait_seconds']:.2f} s)"
            if stats.get("host_lane_wait_seconds", 0.0) >= 0.005
            else ""
        ),
        f"down {size(stats.get('bytes_down', 0))} up {size(stats.get('bytes_up', 0))}",
        f"state device {size(stats.get('device_state_bytes', 0))} host {size(stats.get('host_state_bytes', 0))}",
    ]
    if stats.get("pinned_host_bytes"):  # the CUDA backend
        parts.append(
            f"device memory {size(stats.get('device_bytes', 0))} "
            f"pinned {size(stats.get('pinned_host_bytes', 0))}"
        )
    collective = sum(
        stats.get(f"collective_bytes_{kind}", 0) for kind in ("statistics", "gradients", "upload")
    )
    if collective:  # data parallel
        parts.append(
            f"collectives {size(collective)} (statistics "
            f"{size(stats.get('collective_bytes_statistics', 0))}, gradients "
            f"{size(stats.get('collective_bytes_gradients', 0))}, upload "
            f"{size(stats.get('collective_bytes_upload', 0))})"
        )
    if "loss_scale" in stats:
        parts.append(f"loss scale {stats['loss_scale']:g}")
    return " | ".join(parts)
