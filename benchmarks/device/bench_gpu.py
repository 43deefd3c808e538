"""GPU benchmark of zenflow's device kernels against torch peers measured in the same run.

Shapes: a 7B-class transformer (32 layers of q, k, v, o [4096, 4096], gate and up
[11008, 4096], down [4096, 11008]), bf16, k = 10% of the columns of every matrix.
--lm-head adds the [128256, 4096] output projection (Llama-3 vocabulary), --dtype float16
takes fp16 gradients and parameters, --ratio 0.01 keeps 1% of the columns.
Bandwidth is counted in the 32-byte sectors each kernel must touch (docs/design.md section 5)
and compared with a device-to-device copy measured here. Prints one table; with --out
also writes it (markdown) there.

    python benchmarks/device/bench_gpu.py [--layers 32] [--reps 10] [--ratio 0.1]
        [--dtype bfloat16|float16] [--lm-head] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import statistics

import torch

import zenflow
from zenflow import ops

SECTOR = 32


def timed(fn, reps: int) -> float:
    """Median milliseconds of fn() over reps runs (after one warm-up), CUDA events."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def sectors_touched(rows: int, cols: torch.Tensor, elem_bytes: int) -> int:
    """Bytes of the distinct 32-byte sectors that hold the given columns, over all rows."""
    per_sector = SECTOR // elem_bytes
    return rows * int(torch.unique(cols // per_sector).numel()) * SECTOR


def copy_bandwidth(dev: torch.device, reps: int) -> float:
    """Device-to-device copy bandwidth in GB/s, counting read + write bytes."""
    src = torch.empty(2 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    return 2 * src.numel() / timed(lambda: dst.copy_(src), reps) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--ratio", type=float, default=0.1)
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--lm-head", action="store_true", help="add a [128256, 4096] matrix")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    assert zenflow.cuda_available(), "needs a GPU"
    dev = torch.device("cuda")
    torch.manual_seed(0)
    h, f = 4096, 11008
    shapes = ([(h, h)] * 4 + [(f, h)] * 2 + [(h, f)]) * args.layers
    if args.lm_head:
        shapes.append((128256, h))
    dtype = getattr(torch, args.dtype)
    grads = [torch.randn(m, n, device=dev, dtype=dtype) for m, n in shapes]
    params = [torch.randn(m, n, device=dev, dtype=dtype) for m, n in shapes]
    ks = [ops.topk_count(n, args.ratio) for _, n in shapes]
    grad_bytes = sum(g.numel() * 2 for g in grads)

    copy_bw = copy_bandwidth(dev, args.reps)
    rows = []

    def row(name, ours_ms, peer_ms, peer_name, touched, target):
        bw = touched / ours_ms / 1e6 if touched else float("nan")
        rows.append(
            (
                name,
                ours_ms,
                peer_name,
                peer_ms,
                peer_ms / ours_ms,
                touched / 1e9,
                bw,
                bw / copy_bw,
                target,
            )
        )

    # 1. column_stats: one read of every gradient.
    stats = ops.column_stats(grads)
    ours = timed(lambda: ops.column_stats(grads, stats.col_sq), args.reps)
    peer = timed(lambda: [g.float().square().sum(0) for g in grads], args.reps)
    row(
        "column_stats",
        ours,
        peer,
        "loop g.float().square().sum(0)",
        grad_bytes,
        ">= 80% copy BW, >= 2x peer",
    )

    # 1b. column_stats of one [4096, 4096] matrix alone: too few 1024-row tiles to fill the
    # GPU, so the launcher splits its rows finer (cuda/norms/column_stats_kernel.cuh).
    lone = grads[0]
    lone_stats = ops.column_stats([lone])
    ours = timed(lambda: ops.column_stats([lone], lone_stats.col_sq), args.reps)
    peer = timed(lambda: lone.float().square().sum(0), args.reps)
    row(
        f"column_stats, one {list(lone.shape)}",
        ours,
        peer,
        "g.float().square().sum(0)",
        lone.numel() * lone.element_size(),
        ">= 80% copy BW",
    )

    # 2. segmented top-k over every matrix at once.
    scores = stats.col_sq
    selected = ops.select_topk_columns(scores, ks)
    ours = timed(lambda: ops.select_topk_columns(scores, ks, out_indices=selected), args.reps)
    peer = timed(lambda: [torch.topk(s, k).indices for s, k in zip(scores, ks)], args.reps)
    row("select_topk_columns", ours, peer, "loop torch.topk", 0, ">= 3x peer")

    # 3. AdamW on the selected columns + pack of the rest (one step's device work).
    def state(m, k):
        z = torch.zeros(m, k, device=dev)
        return ops.ColumnState(
            z.clone(), z.clone(), z.clone(), torch.zeros(k, dtype=torch.int32, device=dev)
        )

    states = [state(m, k) for (m, _), k in zip(shapes, ks)]
    for st, p, s in zip(states, params, selected):
        st.master.copy_(p[:, s.long()].float())
    packed = ops.pack_columns(grads, selected)

    def ours_step():
        ops.adamw_selected_columns_(params, grads, selected, states, lr=1e-4, weight_decay=0.01)
        ops.pack_columns(grads, selected, out=packed)

    ours = timed(ours_step, args.reps)
    unselected = []
    touched = pack_touched = 0
    for (m, n), s in zip(shapes, selected):
        mask = torch.ones(n, dtype=torch.bool, device=dev)
        mask[s.long()] = False
        rest = torch.nonzero(mask).flatten()
        unselected.append(rest)
        k = s.numel()
        touched += sectors_touched(m, s, 2) * 3  # G read, W read + write
        touched += m * k * 4 * 6  # master, m, v read + write
        pack_touched += sectors_touched(m, rest, 2) + m * rest.numel() * 2  # G read, packed write
    touched += pack_touched
    peer_master = [st.master.clone() for st in states]
    peer_opt = torch.optim.AdamW(peer_master, lr=1e-4, weight_decay=0.01, fused=True)
    long_sel = [s.long() for s in selected]

    def peer_step():
        for pm, g, s in zip(peer_master, grads, long_sel):
            pm.grad = g.index_select(1, s).float()  # gather
        peer_opt.step()  # fused torch AdamW
        for p, pm, s in zip(params, peer_master, long_sel):
            p.index_copy_(1, s, pm.to(p.dtype))  # scatter
        return [g.index_select(1, r).t().contiguous() for g, r in zip(grads, unselected)]  # pack

    peer = timed(peer_step, args.reps)
    row(
        "adamw_selected_columns_ + pack_columns",
        ours,
        peer,
        "gather + fused AdamW + scatter + pack",
        touched,
        ">= 60% copy BW (sectors), >= 5x peer",
    )

    # 3b. pack_columns alone: its share of the copy bandwidth.
    ours = timed(lambda: ops.pack_columns(grads, selected, out=packed), args.reps)
    peer = timed(
        lambda: [g.index_select(1, r).t().contiguous() for g, r in zip(grads, unselected)],
        args.reps,
    )
    row(
        "pack_columns",
        ours,
        peer,
        "index_select + transpose",
        pack_touched,
        ">= 80% copy BW (sectors)",
    )

    # Table.
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [
        f"# zenflow GPU kernels, {stamp}, {torch.cuda.get_device_name()}, torch {torch.__version__}",
        f"{args.layers} layers{' + lm_head [128256, 4096]' if args.lm_head else ''}, {args.dtype},"
        f" k = {args.ratio:.0%}; D2D copy {copy_bw:.0f} GB/s; medians of {args.reps}",
        "",
        "| kernel | ours ms | peer | peer ms | speedup | GB touched | GB/s | of copy BW | target |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, o, pn, p, sp, gb, bw, frac, target in rows:
        bw_s = "-" if gb == 0 else f"{bw:.0f}"
        frac_s = "-" if gb == 0 else f"{frac:.0%}"
        lines.append(
            f"| {name} | {o:.3f} | {pn} | {p:.3f} | {sp:.1f}x | {gb:.2f} | {bw_s} | {frac_s} | {target} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
