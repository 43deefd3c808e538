"""ZenFlowAdamW's own per-step CPU cost (issue 9's target: under 1 ms at 300 parameter tensors,
not counting the math).

A model of --tensors small parameters (matrices [rows, cols] and, every third, a bias
vector) keeps the arithmetic negligible. Measured, interleaved, median of --reps steps each:

  optimizer   ZenFlowAdamW.step() (collect the .grad tensors, check the groups, one engine call)
  engine      zenflow._C.Engine.step() with the same gradients, on an engine of the same
              configuration: the math, the engine's bookkeeping and the binding's conversion
  overhead    optimizer - engine: what the torch optimizer layer adds
  hooks       overlap_backward: the post-accumulate-grad hooks of one backward pass, called
              directly (one per parameter; buckets of --bucket-bytes)
  peer        torch.optim.AdamW(fused=True).step() on the same model (the math included)

    python benchmarks/bench_optimizer.py
    python benchmarks/bench_optimizer.py --write benchmarks/results/2026-12-03-optimizer-overhead.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from pathlib import Path

import torch

import zenflow
from zenflow.config import ENGINE_DEFAULTS, engine_config

TARGET_MS = 1.0


def make_params(count: int, rows: int, cols: int, dtype: torch.dtype) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(count):
        shape = (rows,) if i % 3 == 2 else (rows, cols)
        out.append(torch.nn.Parameter(torch.randn(shape, generator=gen).to(dtype)))
    return out


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, default=300)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--cols", type=int, default=16)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--bucket-bytes", type=int, default=4096)
    parser.add_argument("--write", type=Path, default=None, help="save the markdown table here")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)

    params = make_params(args.tensors, args.rows, args.cols, dtype)
    opt = zenflow.ZenFlowAdamW(params, lr=1e-3, bucket_bytes=args.bucket_bytes)
    twins = [p.detach().clone() for p in params]
    settings = dict(ENGINE_DEFAULTS, bucket_bytes=args.bucket_bytes)
    engine = zenflow._C.Engine(
        twins,
        [{"params": list(range(len(twins))), "lr": 1e-3, "weight_decay": 1e-2}],
        engine_config(settings, (0.9, 0.999), 1e-8, "none"),
    )
    peer_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    peer = torch.optim.AdamW(peer_params, lr=1e-3, fused=True)
    hooked_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    hooked = zenflow.ZenFlowAdamW(hooked_params, lr=1e-3, bucket_bytes=args.bucket_bytes)
    hooked.overlap_backward()

    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(p.shape, generator=gen).to(dtype) for p in params]
    for p, q, h, g in zip(params, peer_params, hooked_params, grads):
        p.grad, q.grad, h.grad = g, g.clone(), g.clone()
    lrs = [1e-3]

    def hooks_then_step():
        hook = hooked._on_gradient
        start = time.perf_counter()
        for h in reversed(hooked_params):  # backward order
            hook(h)
        elapsed = (time.perf_counter() - start) * 1e3
        hooked.step()
        return elapsed

    samples = {"optimizer": [], "engine": [], "hooks": [], "peer": []}
    for _ in range(10):  # warm-up
        opt.step()
        engine.step(grads, lrs)
        peer.step()
        hooks_then_step()
    for _ in range(args.reps):
        samples["optimizer"].append(timed(opt.step))
        samples["engine"].append(timed(lambda: engine.step(grads, lrs)))
        samples["peer"].append(timed(peer.step))
        samples["hooks"].append(hooks_then_step())
    med = {key: statistics.median(values) for key, values in samples.items()}
    overhead = med["optimizer"] - med["engine"]
    per_step_total = med["optimizer"] + med["hooks"]

    rows = [
        ("ZenFlowAdamW.step()", med["optimizer"]),
        ("zenflow._C.Engine.step() (same gradients)", med["engine"]),
        ("**optimizer layer overhead** (step - engine)", overhead),
        ("overlap_backward hooks of one backward pass", med["hooks"]),
        ("torch.optim.AdamW(fused=True).step() (peer, math included)", med["peer"]),
    ]
    verdict = "met" if overhead < TARGET_MS else "MISSED"
    lines = [
        f"# ZenFlowAdamW per-step overhead, {datetime.date.today().isoformat()}",
        "",
        f"Command: `python benchmarks/bench_optimizer.py --tensors {args.tensors} --rows {args.rows} "
        f"--cols {args.cols} --dtype {args.dtype}`",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs, "
        f"load average {os.getloadavg()[0]:.1f}; torch {torch.__version__}; zenflow SIMD "
        f"{zenflow.simd_level()}. Median of {args.reps} interleaved steps.",
        "",
        f"{args.tensors} parameter tensors ({args.dtype}; [{args.rows}, {args.cols}] matrices, every third "
        f"a [{args.rows}] bias): the math is negligible, so the times are bookkeeping and conversion.",
        "",
        "| what | median ms per step |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {value:.3f} |" for name, value in rows]
    lines += [
        "",
        f"Target: the optimizer layer's own cost under {TARGET_MS:.0f} ms at 300 tensors: "
        f"**{overhead:.3f} ms, {verdict}**. With overlap_backward the hooks add "
        f"{med['hooks']:.3f} ms spread over the backward pass (total Python work per step "
        f"{per_step_total:.3f} ms including the engine call). Ratio to the peer's whole step: "
        f"{med['peer'] / med['optimizer']:.2f}x (peer / ZenFlowAdamW; the peer's time includes its math).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write is not None:
        args.write.write_text(text)


if __name__ == "__main__":
    main()
