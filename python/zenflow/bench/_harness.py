"""What every benchmark of `python -m zenflow bench` shares: interleaved timing, the streaming
roof of the machine measured in the same run, a progress indicator, and the report (a
markdown table for people, JSON for machines).

Interleaving: this kind of machine's memory bandwidth drifts by tens of percent over
minutes, so every candidate and its peers run in turns (A B C A B C ...) and are compared
on the same rounds. Each candidate keeps every sample: the median (robust to a stray slow
round) and the mean over the whole run (which keeps the slow rounds, such as a window
close that waits: the headline for step times) are both reported.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

# ---- timing ----


@dataclass
class Samples:
    """Every timed run of one candidate, in seconds."""

    seconds: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")

    @property
    def mean(self) -> float:
        return sum(self.seconds) / len(self.seconds) if self.seconds else float("nan")


def median_interval(
    values: Sequence[float], confidence: float = 0.95
) -> tuple[float | None, float | None, float | None]:
    """The median of `values` and a distribution-free interval that holds the population's
    median with at least `confidence`: the order statistics x(j) and x(n + 1 - j) for the
    largest j with P(Binomial(n, 1/2) < j) <= (1 - confidence) / 2 (exact, no resampling, so
    the same data always give the same interval). (median, low, high), low and high None where
    n is too small for any such interval (n < 6 at 95%)."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return None, None, None
    tail, cumulative, j = (1 - confidence) / 2, 0.0, 0
    while j < n // 2:
        cumulative += math.comb(n, j) / 2**n  # P(B = j): now P(B < j + 1)
        if cumulative > tail:
            break
        j += 1
    median = statistics.median(ordered)
    if j == 0:
        return median, None, None
    return median, ordered[j - 1], ordered[n - j]


def synchronizer(device: str) -> Callable[[], None] | None:
    """What makes a timing honest on `device`: CUDA work is asynchronous, so the clock is
    read only after the device has finished."""
    if device.startswith("cuda"):
        return torch.cuda.synchronize
    return None


def interleave(
    candidates: dict[str, Callable[[], Any]],
    rounds: int,
    warmup: int = 2,
    progress: Progress | None = None,
    sync: Callable[[], None] | None = None,
) -> dict[str, Samples]:
    """Runs the candidates in turns for warmup + rounds rounds; returns the timed samples."""
    samples = {name: Samples() for name in candidates}
    for round_index in range(warmup + rounds):
        for name, fn in candidates.items():
            if sync is not None:
                sync()
            start = time.perf_counter()
            fn()
            if sync is not None:
                sync()
            elapsed = time.perf_counter() - start
            if round_index >= warmup:
                samples[name].seconds.append(elapsed)
        if progress is not None and round_index >= warmup:
            progress.update()
    return samples


# ---- progress ----


class Progress:
    """A tqdm bar on stderr when tqdm is installed, else one plain line per case on stderr
    (so a redirected stdout keeps only the report)."""

    def __init__(self, enabled: bool = True, prefix: str = "zenflow bench"):
        self.enabled = enabled
        self.prefix = prefix
        self._bar = None
        self._tqdm = None
        if enabled:
            try:
                from tqdm import tqdm

                self._tqdm = tqdm
            except ImportError:
                self._tqdm = None

    def start(self, label: str, total: int) -> Progress:
        self.close()
        if not self.enabled:
            return self
        if self._tqdm is not None:
            self._bar = self._tqdm(
                total=total,
                desc=label,
                unit="round",
                leave=False,
                file=sys.stderr,
                dynamic_ncols=True,
            )
        else:
            print(f"{self.prefix}: {label} ({total} rounds)", file=sys.stderr, flush=True)
        return self

    def update(self, count: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(count)

    def note(self, text: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(f"{self.prefix}: {text}", file=sys.stderr)
        else:
            print(f"{self.prefix}: {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


# ---- the streaming roof ----


@dataclass
class Roof:
    """The machine's streaming bandwidth in this run, GB/s: copy (dst = src, 2 arrays) and
    triad (a = b + s * c, 3 arrays) as STREAM counts them (bytes read + written: the
    read-for-ownership of the destination is not counted, so they understate the traffic),
    and read (the sum of one array), torch's own kernels on `device` over arrays larger than
    the caches. The best of the three is the roof."""

    copy_gbs: float
    triad_gbs: float
    elements: int
    device: str
    threads: int
    read_gbs: float = 0.0

    @property
    def best_gbs(self) -> float:
        return max(self.copy_gbs, self.triad_gbs, self.read_gbs)

    def fraction(self, gbs: float) -> float:
        return gbs / self.best_gbs if self.best_gbs > 0 else float("nan")

    def as_dict(self) -> dict:
        return {
            "copy_gbs": self.copy_gbs,
            "triad_gbs": self.triad_gbs,
            "read_gbs": self.read_gbs,
            "elements": self.elements,
            "device": self.device,
            "torch_threads": self.threads,
        }


def measure_roof(
    device: str = "cpu", elements: int = 32 << 20, rounds: int = 7, progress: Progress | None = None
) -> Roof:
    a = torch.empty(elements, dtype=torch.float32, device=device)
    b = torch.rand(elements, dtype=torch.float32, device=device)
    c = torch.rand(elements, dtype=torch.float32, device=device)
    if progress is not None:
        progress.start("streaming roof (copy, triad, read)", rounds)
    samples = interleave(
        {
            "copy": lambda: a.copy_(b),
            "triad": lambda: torch.add(b, c, alpha=3.0, out=a),
            "read": lambda: torch.sum(c),
        },
        rounds,
        warmup=2,
        progress=progress,
        sync=synchronizer(device),
    )
    if progress is not None:
        progress.close()
    bytes_per = 4 * elements
    return Roof(
        copy_gbs=2 * bytes_per / samples["copy"].median / 1e9,
        triad_gbs=3 * bytes_per / samples["triad"].median / 1e9,
        read_gbs=bytes_per / samples["read"].median / 1e9,
        elements=elements,
        device=device,
        threads=torch.get_num_threads(),
    )


# ---- results ----


@dataclass
class Row:
    """One candidate of a comparison."""

    name: str
    samples: Samples
    bytes_moved: float | None = None  # per call: for GB/s and the fraction of the roof
    peer: bool = False  # a peer (torch, a plain C loop), not zenflow
    compare: bool = True  # False: a part of another row's time, not compared with the peer
    extra: dict[str, Any] = field(default_factory=dict)

    def gbs(self, by: str = "median") -> float | None:
        if not self.bytes_moved:
            return None
        seconds = self.samples.median if by == "median" else self.samples.mean
        return self.bytes_moved / seconds / 1e9


@dataclass
class Section:
    """A comparison: zenflow's candidates and their peers, run interleaved."""

    title: str
    rows: list[Row]
    headline: str = "median"  # "median" for op calls, "mean" for step times
    note: str = ""
    reference: str | None = None  # the row ratios are taken against (default: first peer)
    device: str = "cpu"  # whose streaming roof the GB/s are compared with
    # more columns from each row's `extra`: (header, key, format such as "{:.2f}")
    columns: list[tuple[str, str, str]] = field(default_factory=list)

    def reference_row(self) -> Row | None:
        if self.reference is not None:
            return next((r for r in self.rows if r.name == self.reference), None)
        return next((r for r in self.rows if r.peer), None)

    def ratio(self, row: Row) -> float | None:
        """Speed-up of `row` over the reference: reference time / row time (above 1: faster)."""
        ref = self.reference_row()
        if ref is None or not row.compare:
            return None
        pick = (lambda s: s.median) if self.headline == "median" else (lambda s: s.mean)
        return pick(ref.samples) / pick(row.samples)


@dataclass
class Report:
    benchmark: str
    command: str
    roofs: dict[str, Roof] = field(default_factory=dict)  # by device
    sections: list[Section] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    interleaved: bool = True

    def as_dict(self) -> dict:
        sections = []
        for s in self.sections:
            ref = s.reference_row()
            roof = self.roofs.get(s.device)
            rows = []
            for r in s.rows:
                gbs = r.gbs(s.headline)
                rows.append(
                    {
                        "name": r.name,
                        "peer": r.peer,
                        "median_ms": r.samples.median * 1e3,
                        "mean_ms": r.samples.mean * 1e3,
                        "samples": len(r.samples.seconds),
                        "speedup_vs_reference": s.ratio(r),
                        "gbs": gbs,
                        "fraction_of_roof": (
                            roof.fraction(gbs) if (roof and gbs is not None) else None
                        ),
                        "bytes_per_call": r.bytes_moved,
                        **r.extra,
                    }
                )
            sections.append(
                {
                    "title": s.title,
                    "headline": s.headline,
                    "device": s.device,
                    "reference": ref.name if ref else None,
                    "note": s.note,
                    "rows": rows,
                }
            )
        return {
            "benchmark": self.benchmark,
            "command": self.command,
            "machine": machine_facts(),
            "roofs": {device: roof.as_dict() for device, roof in self.roofs.items()},
            "facts": self.facts,
            "notes": self.notes,
            "sections": sections,
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, default=_json_default)

    def to_markdown(self) -> str:
        facts = machine_facts()
        lines = [
            f"# zenflow bench {self.benchmark}, {facts['date']}",
            "",
            f"Command: `{self.command}`",
            f"Machine: {facts['cpu']}, {facts['cpus']} CPUs usable, load average "
            f"{facts['load']:.1f}; zenflow {facts['zenflow']} (SIMD {facts['simd']}, "
            f"{facts['zenflow_threads']} host threads), torch {facts['torch']} "
            f"({facts['torch_threads']} threads); GPU: {facts['gpu'] or 'none'}.",
        ]
        for roof in self.roofs.values():
            lines.append(
                f"Streaming roof, same run ({roof.device}, {roof.elements / 2**20:.0f}Mi fp32 per "
                f"array, torch kernels, {roof.threads} threads): copy {roof.copy_gbs:.1f} GB/s, triad "
                f"{roof.triad_gbs:.1f} GB/s (STREAM's count), read {roof.read_gbs:.1f} GB/s; "
                "'% roof' is against the best of the three."
            )
        for key, value in self.facts.items():
            lines.append(f"{key}: {value}")
        lines.append(
            (
                "Every table is one interleaved run (A B C A B C ...). "
                if self.interleaved
                else "The rows of a table run one after the other on the same inputs. "
            )
            + "'vs' = the reference's time / this time (above 1: faster), on the column in bold "
            "(the median for single calls, the mean over the whole run for step times)."
        )
        for s in self.sections:
            ref = s.reference_row()
            mean_head = "**mean ms**" if s.headline == "mean" else "mean ms"
            median_head = "**median ms**" if s.headline == "median" else "median ms"
            lines += [
                "",
                f"## {s.title}",
                "",
            ]
            if s.note:
                lines += [s.note, ""]
            extra_heads = "".join(f" {header} |" for header, _, _ in s.columns)
            lines += [
                f"| implementation | {median_head} | {mean_head} | vs {ref.name if ref else 'peer'} "
                f"| GB/s | % roof |{extra_heads}",
                "|---|---:|---:|---:|---:|---:|" + "---:|" * len(s.columns),
            ]
            device_roof = self.roofs.get(s.device)
            for r in s.rows:
                ratio = s.ratio(r)
                gbs = r.gbs(s.headline)
                roof = device_roof.fraction(gbs) if (device_roof and gbs is not None) else None
                extra = "".join(f" {_fmt(r.extra.get(key), fmt)} |" for _, key, fmt in s.columns)
                lines.append(
                    f"| {r.name} | {r.samples.median * 1e3:.3f} | {r.samples.mean * 1e3:.3f} | "
                    f"{_fmt(ratio, '{:.2f}x')} | {_fmt(gbs, '{:.1f}')} | "
                    f"{_fmt(None if roof is None else 100 * roof, '{:.0f}%')} |{extra}"
                )
        over = [
            s.title
            for s in self.sections
            if any(
                (g := r.gbs(s.headline)) is not None
                and s.device in self.roofs
                and self.roofs[s.device].fraction(g) > 1.0
                for r in s.rows
            )
        ]
        if over:
            lines += [
                "",
                "Above 100% of the roof: either the working set fits in the caches (smaller "
                "sizes, --quick), or the case streams memory faster than torch's own copy, triad "
                "and sum kernels do here: the roof is what those reach, not the hardware's peak.",
            ]
        if self.notes:
            lines += ["", *self.notes]
        return "\n".join(lines) + "\n"


def _fmt(value: Any, pattern: str) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, str):
        return value
    return pattern.format(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, float):
        return None
    return str(value)


# ---- the machine ----


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_facts() -> dict:
    import zenflow

    gpu = ""
    if torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(0)
    return {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "cpus": zenflow.native().host_cpu_count(),
        "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "zenflow": zenflow.__version__,
        "simd": zenflow.simd_level(),
        "zenflow_threads": zenflow.get_num_threads(),
        "zenflow_cuda": zenflow.cuda_available(),
        "gpu": gpu,
    }


def devices(requested: str) -> list[str]:
    """'cpu', 'cuda' or 'auto' (the CPU, and CUDA too when zenflow can use a GPU)."""
    import zenflow

    if requested == "auto":
        return ["cpu", "cuda"] if zenflow.cuda_available() else ["cpu"]
    if requested == "cuda" and not zenflow.cuda_available():
        raise ValueError(
            "device: 'cuda' needs a GPU and a zenflow built with CUDA (python -m zenflow info)"
        )
    if requested not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu', 'cuda' or 'auto', got {requested!r}")
    return [requested]


def command_line(prog: str, argv: Sequence[str] | None) -> str:
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join([prog, *args])


def add_engine_setting_argument(parser) -> None:
    """The engine benchmark's --setting (both of its command lines): more rows of zenflow
    overlap with other engine settings."""
    parser.add_argument(
        "--setting",
        action="append",
        default=None,
        help="another row: key=value,... engine settings over zenflow overlap's (repeatable)",
    )


def parse_count(text: str) -> int:
    """'1M', '64M', '1e6', '4096' -> an element count (K, M, G are powers of 1024)."""
    text = str(text).strip()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1] in scale:
        return int(float(text[:-1]) * scale[text[-1]])
    return int(float(text))
