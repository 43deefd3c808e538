"""`python -m zenflow bench`: runs from the installed package in a directory with no checkout
beside it, and reports every zenflow candidate against a peer measured in the same run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import zenflow
from zenflow.bench._harness import (
    Progress,
    Report,
    Roof,
    Row,
    Samples,
    Section,
    interleave,
    median_interval,
)


def run_bench(tmp_path: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`python -m zenflow bench ...` in a fresh process whose working directory is an empty
    temporary one: only the package zenflow was imported from is on its path (site-packages
    when installed, the source tree's python/ in a development run), no benchmarks/."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(zenflow.__file__).resolve().parents[1])
    return subprocess.run(
        [sys.executable, "-m", "zenflow", "bench", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ratios_of(report: dict) -> list[tuple[str, float]]:
    out = []
    for section in report["sections"]:
        assert section["reference"], f"{section['title']}: no peer"
        for row in section["rows"]:
            if row["speedup_vs_reference"] is not None:
                out.append((row["name"], row["speedup_vs_reference"]))
    return out


def test_ops_quick_json_from_an_empty_directory(tmp_path):
    done = run_bench(tmp_path, "ops", "--quick", "--json", "--device", "cpu")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["benchmark"] == "ops"
    roof = report["roofs"]["cpu"]
    assert roof["copy_gbs"] > 0 and roof["triad_gbs"] > 0
    titles = " ".join(s["title"] for s in report["sections"])
    for op in ("column_stats", "select_topk_columns", "pack_columns", "accumulate", "AdamW step"):
        assert op in titles
    ratios = ratios_of(report)
    assert any(name.startswith("zenflow") for name, _ in ratios)
    assert all(r > 0 for _, r in ratios)
    for section in report["sections"]:
        for row in section["rows"]:
            assert row["median_ms"] > 0 and row["mean_ms"] > 0 and row["samples"] >= 1
    assert not list(tmp_path.iterdir()), "the benchmark wrote into the working directory"


def test_optimizer_quick_markdown(tmp_path):
    done = run_bench(tmp_path, "optimizer", "--quick", "--device", "cpu", "--no-progress")
    assert done.returncode == 0, done.stderr[-2000:]
    text = done.stdout
    assert text.startswith("# zenflow bench optimizer")
    assert "Streaming roof, same run" in text
    for name in ("zenflow.CPUAdamW().step()", "zenflow.ZenFlowAdamW().step()", "AdamW(fused=True)"):
        assert name in text
    assert "**mean ms**" in text  # step times: the mean over the whole run is the headline
    assert "x |" in text  # a ratio column with values
    assert done.stderr == ""  # --no-progress


def test_engine_quick_with_progress_on_stderr(tmp_path):
    done = run_bench(
        tmp_path,
        "engine",
        "--quick",
        "--out",
        "engine.json",
        "--setting",
        "update_interval=1,topk_ratio=0.3",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "plain sync offload" in done.stdout and "stall reduction" in done.stdout
    assert "engine:" in done.stderr  # the progress indicator (tqdm or plain lines)
    report = json.loads((tmp_path / "engine.json").read_text())
    (section,) = report["sections"]
    assert section["reference"] == "plain sync offload"
    rows = {row["name"]: row for row in section["rows"]}
    assert rows["zenflow overlap"]["down_bytes_per_param"] == pytest.approx(1.8, rel=0.01)
    assert rows["plain sync offload"]["up_bytes_per_param"] == pytest.approx(2.0, rel=0.01)
    # a --setting row: zenflow overlap with those settings (every step, 70% of the columns)
    extra = rows["zenflow overlap, update_interval=1,topk_ratio=0.3"]
    assert extra["down_bytes_per_param"] == pytest.approx(1.4, rel=0.01)
    assert extra["up_bytes_per_param"] == pytest.approx(1.4, rel=0.01)


def test_bad_arguments_are_named(tmp_path):
    done = run_bench(tmp_path, "ops", "--cases", "nonsense", "--quick", timeout=60)
    assert done.returncode != 0
    assert "cases" in done.stderr and "nonsense" in done.stderr
    done = run_bench(tmp_path, "nothing", timeout=60)
    assert done.returncode == 2 and "invalid choice" in done.stderr


def test_cuda_is_refused_by_name_without_a_gpu(tmp_path):
    if zenflow.cuda_available():
        pytest.skip("a GPU is usable here")
    done = run_bench(tmp_path, "ops", "--quick", "--device", "cuda", timeout=60)
    assert done.returncode == 2 and "device" in done.stderr


def test_report_ratios_and_headline():
    """The ratio is the reference's time over the row's, on the headline statistic."""
    fast, slow = Samples([1.0, 1.0, 4.0]), Samples([2.0, 2.0, 2.0])
    section = Section("t", [Row("zenflow", fast), Row("peer", slow, peer=True)], headline="median")
    assert section.ratio(section.rows[0]) == pytest.approx(2.0)
    section.headline = "mean"  # a stall every third step shows in the mean only
    assert section.ratio(section.rows[0]) == pytest.approx(1.0)
    report = Report(
        "x", "cmd", roofs={"cpu": Roof(10.0, 12.0, 1, "cpu", 1, 11.0)}, sections=[section]
    )
    section.rows[0].bytes_moved = 6e9  # 6 GB in 2 s (mean) = 3 GB/s = 25% of the 12 GB/s roof
    data = report.as_dict()
    row = data["sections"][0]["rows"][0]
    assert row["gbs"] == pytest.approx(3.0) and row["fraction_of_roof"] == pytest.approx(0.25)
    assert "| zenflow |" in report.to_markdown()


def test_interleave_runs_in_turns():
    order = []
    samples = interleave(
        {"a": lambda: order.append("a"), "b": lambda: order.append("b")},
        rounds=3,
        warmup=1,
        progress=Progress(enabled=False),
    )
    assert order == ["a", "b"] * 4
    assert len(samples["a"].seconds) == 3 and len(samples["b"].seconds) == 3


def test_median_interval_is_the_binomial_order_statistics():
    """At 95%, j is the largest with P(Binomial(n, 1/2) < j) <= 2.5%: n = 6 gives x(1) and
    x(6) (P(B = 0) = 1/64), n = 20 gives x(6) and x(15) (P(B <= 5) = 2.07%, P(B <= 6) =
    5.77%); under 6 samples no interval reaches 95% (n = 5: P(B = 0) = 1/32)."""
    values = [float(v) for v in range(20, 0, -1)]  # unsorted on purpose
    assert median_interval(values) == (10.5, 6.0, 15.0)
    assert median_interval(values[:6]) == (17.5, 15.0, 20.0)
    assert median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (3.0, None, None)
    assert median_interval([]) == (None, None, None)
    # A lower confidence narrows it: at 50% for n = 20, P(B <= 7) = 13.2% <= 25% < P(B <= 8)
    # = 25.2%, so j = 8: x(8) and x(13).
    assert median_interval(values, confidence=0.5) == (10.5, 8.0, 13.0)
