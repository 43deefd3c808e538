"""Data parallel with a real backward: where the gradient reductions run (host backend, gloo).

A model of --layers nn.Linear(--width, --width) + tanh (fp32), a batch of --batch rows per
rank, mean-squared error. Per step, each rank times its backward and its opt.step(), the
time after backward that the issue calls the step's stall on the reductions:

  plain     loss.backward(), then opt.step(): the engine reduces every gradient in step()
            (the data-parallel step before in-backward reductions)
  overlap   opt.overlap_backward(model): each bucket is reduced as soon as its gradients are
            all in (in a fixed order every rank follows), during backward; step() reduces the
            dense gradients (biases), exchanges the statistics with the ranks' agreement folded
            in, and steps
  peer      torch DistributedDataParallel (gloo, its reducer's buckets of --bucket-mib) and
            torch.optim.AdamW(foreach=True): DDP's own in-backward reductions

The headline is the mean over the timed steps (total / steps), with the median beside it.
On the host backend a collective runs on the training thread, so moving it into backward
moves its time there: compare the iteration (backward + step) as well as the step. On CUDA
the in-backward reductions run on a stream of their own beside the backward's kernels (not
measured here: no GPU on this machine).

    python benchmarks/bench_data_parallel_backward.py
    flock /work/measure.lock python benchmarks/bench_data_parallel_backward.py \\
        --write benchmarks/results/2026-12-05-data-parallel-backward.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import zenflow

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_data_parallel import run  # noqa: E402  (the spawned gloo ranks)

FORMS = ("plain", "overlap", "peer")


def _model(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def _form_main(rank: int, world_size: int, args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)
    model = _model(args)
    if args.form == "peer":
        ddp = (
            torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mib)
            if world_size > 1
            else model
        )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        forward = ddp
    else:
        opt = zenflow.ZenFlowAdamW(
            model.parameters(),
            lr=1e-3,
            topk_ratio=args.topk_ratio,
            update_interval=args.update_interval,
            num_threads=args.host_threads,
            limit_torch_threads=False,
            auto_warm_up_rounds=0,  # windows from step 1 (no synchronous start)
            bucket_bytes=args.bucket_mib << 20,
        )
        if args.form == "overlap":
            opt.overlap_backward(model)
        forward = model
    gen = torch.Generator().manual_seed(1000 + rank)
    rows = []
    for step in range(args.warmup + args.steps):
        x = torch.randn(args.batch, args.width, generator=gen)
        y = torch.randn(args.batch, args.width, generator=gen)
        loss = torch.nn.functional.mse_loss(forward(x), y)
        start = time.perf_counter()
        loss.backward()
        backward = time.perf_counter() - start
        start = time.perf_counter()
        opt.step()
        after = time.perf_counter() - start
        opt.zero_grad()
        if step >= args.warmup:
            rows.append({"backward": backward, "step": after})
    if args.form != "peer":
        opt.close()
    return {"rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--topk-ratio", type=float, default=0.1)
    parser.add_argument("--update-interval", type=int, default=4)
    parser.add_argument("--host-threads", type=int, default=1)
    parser.add_argument("--bucket-mib", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--write", type=Path, default=None, help="save the markdown table here")
    args = parser.parse_args()

    results: dict[tuple[int, str], list[dict]] = {}
    for world_size in args.world_sizes:
        for form in FORMS:
            started = time.perf_counter()
            results[world_size, form] = run(
                world_size, argparse.Namespace(**vars(args), form=form), _form_main
            )
            print(
                f"{world_size} ranks, {form}: {time.perf_counter() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    def per_rank(ranks: list[dict], key: str, reduce) -> float:
        # the slowest rank's figure: a step ends when every rank's does
        return max(reduce([row[key] for row in r["rows"]]) for r in ranks)

    lines = [
        "| ranks | form | after backward: opt.step() ms, mean (median) | backward ms, mean (median) "
        "| iteration ms, mean | step vs plain | iteration vs plain |",
        "|---|---|---|---|---|---|---|",
    ]
    for world_size in args.world_sizes:
        plain = results[world_size, "plain"]
        plain_step = per_rank(plain, "step", statistics.fmean)
        plain_iter = plain_step + per_rank(plain, "backward", statistics.fmean)
        for form in FORMS:
            ranks = results[world_size, form]
            step = per_rank(ranks, "step", statistics.fmean)
            backward = per_rank(ranks, "backward", statistics.fmean)
            lines.append(
                f"| {world_size} | {form} | {1e3 * step:.1f} ({1e3 * per_rank(ranks, 'step', statistics.median):.1f}) "
                f"| {1e3 * backward:.1f} ({1e3 * per_rank(ranks, 'backward', statistics.median):.1f}) "
                f"| {1e3 * (step + backward):.1f} | {step / plain_step:.2f}x "
                f"| {(step + backward) / plain_iter:.2f}x |"
            )
    params = args.layers * (args.width * args.width + args.width)
    header = [
        f"Data parallel with a real backward (host backend), {datetime.date.today()}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"zenflow {zenflow.__version__}: {args.layers} x Linear({args.width}, {args.width}) + tanh, fp32, "
        f"{params / 1e6:.1f}M parameters, batch {args.batch} per rank, topk_ratio {args.topk_ratio}, "
        f"update_interval {args.update_interval}, bucket_bytes {args.bucket_mib} MiB (DDP: bucket_cap_mb the "
        f"same), {args.host_threads} host thread(s) per rank, 1 torch thread, {args.warmup} warm-up + "
        f"{args.steps} timed steps, gloo. Per form, the slowest rank's mean (and median).",
        "",
    ]
    table = "\n".join(header + lines)
    print(table)
    if args.write:
        args.write.write_text(table + "\n")


if __name__ == "__main__":
    main()
