"""Accuracy of zenflow against plain AdamW on the demo's fine-tuning task, at a larger size and
over several zenflow settings (issue 10's longer run).

Runs the demo's model (zenflow/demo.py: a GPT pretrained on the Python Language Reference,
fine-tuned on the standard library's docstrings) once with torch.optim.AdamW and once per
zenflow setting (update_interval 4 and "auto", topk_ratio 0.05 and 0.1), all from the same
pretrained weights and the same batches, and reports the held-out loss of each against
AdamW's.

    python benchmarks/bench_demo_accuracy.py --model-size medium --steps 400 \
        --write benchmarks/results/2026-12-03-demo-accuracy.md
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import time
from pathlib import Path

import torch

import zenflow
from zenflow import demo

SETTINGS = [
    {"topk_ratio": 0.1, "update_interval": 4},
    {"topk_ratio": 0.05, "update_interval": 4},
    {"topk_ratio": 0.1, "update_interval": "auto"},
    {"topk_ratio": 0.05, "update_interval": "auto"},
    {"topk_ratio": 0.1, "update_interval": 2},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-size", default="medium", choices=sorted(demo.PRESETS))
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    config = demo.DemoConfig(
        model_size=args.model_size,
        steps=args.steps,
        lr=args.lr,
        eval_every=args.steps // 4,
        progress=True,
    )
    size = demo.PRESETS[args.model_size]
    ids, info = demo.tokens(size.vocab, config.cache)
    start = demo.pretrained(config, ids, info.pop("folder"))
    bandwidth = demo.memcpy_bandwidth()
    threads = torch.get_num_threads()
    base = demo.run_one("adamw", config, ids, start, bandwidth)
    rows = []
    for setting in SETTINGS:
        torch.set_num_threads(threads)
        record = demo.run_one(
            "zenflow", dataclasses.replace(config, zenflow_options=setting), ids, start, bandwidth
        )
        rows.append((setting, record))
    adamw = base["final_held_out_loss"]
    lines = [
        f"# zenflow vs AdamW: held-out loss on the demo's fine-tuning task, {datetime.date.today().isoformat()}",
        "",
        f"Command: `python benchmarks/bench_demo_accuracy.py --model-size {args.model_size} --steps {args.steps}`",
        f"Model: the demo's {args.model_size} GPT ({base['parameters'] / 1e6:.2f}M parameters, {size.layers} layers, "
        f"d_model {size.d_model}, vocab {size.vocab}), pretrained {size.pretrain_steps} steps on the Python Language "
        f"Reference, fine-tuned {args.steps} steps of {size.batch} x {size.context} tokens on the standard library's "
        f"docstrings (lr {args.lr}, warm-up then cosine, weight decay 0.01 on matrices); held-out: every tenth "
        f"docstring, {config.eval_batches} fixed batches.",
        f"Machine: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), torch {torch.__version__}, "
        f"zenflow SIMD {zenflow.simd_level()}. Total {time.perf_counter() - started:.0f} s.",
        "",
        f"Pretrained start: held-out loss {base['held_out'][0][1]:.4f}. AdamW after fine-tuning: {adamw:.4f}.",
        "",
        "| zenflow setting | held-out loss | vs AdamW | train loss (last 10%) | windows | host updates |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for setting, record in rows:
        stats = record["engine_stats"]
        loss = record["final_held_out_loss"]
        lines.append(
            f"| topk_ratio {setting['topk_ratio']}, update_interval {setting['update_interval']} | {loss:.4f} | "
            f"{100 * (loss / adamw - 1):+.2f}% | {record['final_train_loss']:.4f} | {stats['windows']} | "
            f"{stats['steps'] / max(1, stats['windows']):.1f} steps each |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write is not None:
        args.write.write_text(text)


if __name__ == "__main__":
    main()
