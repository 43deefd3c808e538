"""Data-parallel ZenFlowAdamW on the host backend: 1, 2 and 3 ranks (gloo, spawned processes).

A model of --layers nn.Linear weights [--rows, --cols] (fp32; one bias each), where the host
update matters. Every rank gets its own random gradients each step (drawn outside the timed
region) and calls step(); per rank and per timed step (medians over --steps after --warmup):

  step ms        the wall time of opt.step() (statistics, selection, selected update, the
                 gradient collectives, packing, the window's host update in the background)
  collectives ms the part of step ms spent inside the engine's collectives (gloo)
  peer           one all-reduce of the whole fp32 gradient (what DDP pays for its reduction),
                 timed in the same processes after the steps
  stall ms       the training thread's waits inside the engine (zenflow.stall_seconds)
  host update ms the host lane's window update time (stats host_update_seconds)
  accumulate ms  the host lane's accumulate time (stats accumulate_seconds)
  down / up      bytes copied to / from the host (on the host backend: memcpy)
  collectives    payload bytes this rank gave to collectives: statistics (column sums,
                 flags), gradients (all-reduce / reduce-scatter), upload (all-gather)

Memory, per rank: the resident set (VmRSS) with the model and its gradients (the framework's
baseline) and after the timed steps with the optimizer, beside stats()["host_state_bytes"];
the target is that the optimizer's part of a rank's RSS drops by N: RSS(N) within 10% of
baseline + (RSS(1) - baseline(1)) / N.

1 rank is the peer: a plain single-process optimizer. The "one float per column" selection
exchange is compared with an all-gather of the gradients that a selection would otherwise
need (ratio = rows). On a 2-core machine, 3 ranks oversubscribe the cores (each rank has a
training thread and a host thread): read the 3-rank times as an upper bound.

    python benchmarks/bench_data_parallel.py
    flock /work/measure.lock python benchmarks/bench_data_parallel.py \\
        --write benchmarks/results/2026-12-03-data-parallel.md
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.multiprocessing as mp

import zenflow
import zenflow.distributed as zf_distributed
from zenflow.optimizer import stall_seconds

JOIN_TIMEOUT_S = 600


def _settings(args: argparse.Namespace) -> dict:
    if getattr(args, "sync", False):  # the peer: synchronous offload, data parallel too
        return dict(
            lr=1e-3,
            topk_ratio=0.0,
            update_interval=1,
            overlap_step=False,
            num_threads=args.host_threads,
            limit_torch_threads=False,
        )
    return dict(
        lr=1e-3,
        topk_ratio=args.topk_ratio,
        update_interval=args.update_interval,
        overlap_step=True,
        auto_warm_up_rounds=0,  # the windows' steady state from step 1 (no synchronous start)
        num_threads=args.host_threads,
        limit_torch_threads=False,
        bucket_bytes=args.bucket_mib << 20,
    )


class _CollectiveClock:
    """Time spent inside the collectives the engine calls (zenflow.distributed's
    torch.distributed calls), wrapped for the timed steps only."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._saved: list[tuple] = []

    def _timed(self, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return wrapper

    def __enter__(self):
        for owner, name in (
            (zf_distributed, "_reduce_scatter_tensor"),
            (zf_distributed, "_all_gather_tensor"),
            (torch.distributed, "all_reduce"),
        ):
            self._saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, self._timed(getattr(owner, name)))
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, fn in self._saved:
            setattr(owner, name, fn)
        self._saved = []


def resident_bytes() -> int:
    """This process's resident set (VmRSS), in bytes, of live memory: freed heap is returned
    to the system first (glibc's malloc_trim), so that what the allocator keeps of earlier
    temporaries (a randn, a collective's buffers) does not count as anyone's."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _rank_main(rank: int, world_size: int, args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    params = []
    for _ in range(args.layers):
        params.append(torch.nn.Parameter(torch.randn(args.rows, args.cols, generator=gen) * 0.02))
        params.append(torch.nn.Parameter(torch.zeros(args.rows)))
    grad_gen = torch.Generator().manual_seed(100 + rank)
    for p in params:  # the gradients belong to the framework's baseline
        p.grad = torch.randn(p.shape, generator=grad_gen)
    rss_baseline = resident_bytes()
    opt = zenflow.ZenFlowAdamW(params, **_settings(args))
    rows: list[dict] = []
    keys = (
        "bytes_down",
        "bytes_up",
        "host_update_seconds",
        "accumulate_seconds",
        "collective_bytes_statistics",
        "collective_bytes_gradients",
        "collective_bytes_upload",
    )
    before = opt.stats()
    for step in range(args.warmup + args.steps):
        for p in params:
            p.grad.normal_(generator=grad_gen)  # in place: the baseline's buffers
        with _CollectiveClock() as clock:
            start = time.perf_counter()
            opt.step()
            elapsed = time.perf_counter() - start
        after = opt.stats()
        if step >= args.warmup:
            row = {key: after.get(key, 0) - before.get(key, 0) for key in keys}
            row["step_seconds"] = elapsed
            row["collective_seconds"] = clock.seconds
            row["stall_seconds"] = stall_seconds(after) - stall_seconds(before)
            rows.append(row)
        before = after
    start = time.perf_counter()
    opt.flush()
    flush = time.perf_counter() - start
    final = opt.stats()
    rss_optimizer = resident_bytes()
    opt.close()
    # The peer: what DDP pays for its gradient reduction alone, one all-reduce of the whole
    # gradient (fp32, the same bytes), timed in the same processes.
    peer = []
    if world_size > 1:
        flat = torch.randn(sum(p.numel() for p in params), generator=grad_gen)
        for rep in range(args.warmup + args.steps):
            start = time.perf_counter()
            torch.distributed.all_reduce(flat)
            if rep >= args.warmup:
                peer.append(time.perf_counter() - start)
    return {
        "peer_all_reduce_seconds": statistics.median(peer) if peer else 0.0,
        "rows": rows,
        "flush_seconds": flush,
        "host_state_bytes": final["host_state_bytes"],
        "device_bytes": final["device_bytes"],
        "rss_baseline": rss_baseline,
        "rss_optimizer": rss_optimizer,
        "windows": final["windows"],
    }


def _child(
    rank: int, world_size: int, port: int, out: str, args: argparse.Namespace, rank_main=None
) -> None:
    code = 0
    try:
        if world_size > 1:
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(port)
            torch.distributed.init_process_group(
                "gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=300)
            )
        result = (rank_main or _rank_main)(rank, world_size, args)
        torch.save(result, os.path.join(out, f"rank{rank}.pt"))
        if world_size > 1:
            # Every rank done before any tears its process group down (without it, 3 runs of
            # about 60 ended in "terminate called without an active exception" from a child
            # at teardown, after every step had completed).
            torch.distributed.barrier()
    except BaseException:
        Path(out, f"rank{rank}.error").write_text(traceback.format_exc())
        code = 1
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    # The result is on disk; the interpreter's finalization, where torch's distributed
    # teardown now and then still aborted a child, is skipped.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(world_size: int, args: argparse.Namespace, rank_main=None) -> list[dict]:
    """Runs rank_main(rank, world_size, args) (default: this benchmark's) in world_size
    spawned processes over gloo; returns each rank's result."""
    with tempfile.TemporaryDirectory() as out, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        context = mp.get_context("spawn")
        processes = [
            context.Process(target=_child, args=(r, world_size, port, out, args, rank_main))
            for r in range(world_size)
        ]
        for p in processes:
            p.start()
        for p in processes:
            p.join(JOIN_TIMEOUT_S)
            if p.is_alive():
                p.kill()
                p.join()
        errors = [Path(out, f"rank{r}.error") for r in range(world_size)]
        failed = [e.read_text() for e in errors if e.exists()]
        if failed or any(p.exitcode != 0 for p in processes):
            raise RuntimeError(f"{world_size} ranks failed:\n" + "\n".join(failed))
        return [torch.load(Path(out, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]


def median(rows: list[dict], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def mean(rows: list[dict], key: str) -> float:
    return statistics.fmean(row[key] for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--cols", type=int, default=512)
    parser.add_argument("--topk-ratio", type=float, default=0.1)
    parser.add_argument("--update-interval", type=int, default=4)
    parser.add_argument("--host-threads", type=int, default=1)
    parser.add_argument(
        "--bucket-mib", type=int, default=64, help="bucket_bytes in MiB (the engine's default: 64)"
    )
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument(
        "--no-sync-peer",
        action="store_true",
        help="skip the peer run (synchronous offload on the same ranks)",
    )
    parser.add_argument(
        "--malloc-mmap-threshold",
        type=int,
        default=None,
        help="set glibc's MALLOC_MMAP_THRESHOLD_ (bytes) for the ranks: a fixed threshold, so freed "
        "temporaries of the communication library go back to the system (RSS then shows what is in use)",
    )
    parser.add_argument("--write", type=Path, default=None, help="save the markdown table here")
    args = parser.parse_args()
    if args.malloc_mmap_threshold is not None:
        # Read by glibc when a process starts: the spawned ranks inherit it.
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(args.malloc_mmap_threshold)

    results, sync_results = {}, {}
    for world_size in args.world_sizes:
        started = time.perf_counter()
        results[world_size] = run(world_size, args)
        if not args.no_sync_peer:
            sync_results[world_size] = run(world_size, argparse.Namespace(**vars(args), sync=True))
        print(
            f"{world_size} rank(s): {time.perf_counter() - started:.0f} s",
            file=sys.stderr,
            flush=True,
        )

    mib = 1 / (1 << 20)
    lines = [
        "| ranks | rank | step ms (median) | of which in collectives ms | peer: all-reduce of the gradient ms | stall ms/step | host update ms/step | host accumulate ms/step | down MiB/step "
        "| up MiB/step | coll. statistics KiB/step | coll. gradients MiB/step | coll. upload MiB/step "
        "| host state MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    # Bytes and host time per step are means over the timed steps (a window's update lands in
    # one step of every update_interval); step times are medians.
    for world_size, ranks in results.items():
        for rank, result in enumerate(ranks):
            rows = result["rows"]
            lines.append(
                f"| {world_size} | {rank} | {1e3 * median(rows, 'step_seconds'):.1f} "
                f"| {1e3 * median(rows, 'collective_seconds'):.1f} "
                f"| {1e3 * result['peer_all_reduce_seconds']:.1f} "
                f"| {1e3 * mean(rows, 'stall_seconds'):.2f} "
                f"| {1e3 * mean(rows, 'host_update_seconds'):.1f} "
                f"| {1e3 * mean(rows, 'accumulate_seconds'):.1f} "
                f"| {mean(rows, 'bytes_down') * mib:.2f} | {mean(rows, 'bytes_up') * mib:.2f} "
                f"| {mean(rows, 'collective_bytes_statistics') / 1024:.1f} "
                f"| {mean(rows, 'collective_bytes_gradients') * mib:.2f} "
                f"| {mean(rows, 'collective_bytes_upload') * mib:.2f} "
                f"| {result['host_state_bytes'] * mib:.1f} |"
            )
    summary = [
        "",
        "| ranks | step ms (median of rank medians) | host update ms/step per rank (mean) "
        "| down MiB/step per rank | vs 1 rank: host update | vs 1 rank: down |",
        "|---|---|---|---|---|---|",
    ]
    base = results.get(1)
    for world_size, ranks in results.items():
        step = statistics.median(median(r["rows"], "step_seconds") for r in ranks)
        host = statistics.fmean(mean(r["rows"], "host_update_seconds") for r in ranks)
        down = statistics.fmean(mean(r["rows"], "bytes_down") for r in ranks)
        if base:
            base_host = mean(base[0]["rows"], "host_update_seconds")
            base_down = mean(base[0]["rows"], "bytes_down")
            ratio_host = f"{host / base_host:.2f}x" if base_host else "-"
            ratio_down = f"{down / base_down:.2f}x" if base_down else "-"
        else:
            ratio_host = ratio_down = "-"
        summary.append(
            f"| {world_size} | {1e3 * step:.1f} | {1e3 * host:.1f} | {down * mib:.2f} | {ratio_host} | {ratio_down} |"
        )
    if sync_results:
        summary += [
            "",
            "The peer, in the same run: synchronous offload (topk_ratio 0, update_interval 1, "
            "overlap off) on the same ranks, data parallel too.",
            "",
            "| ranks | zenflow step ms | sync offload step ms | step time vs sync offload "
            "| zenflow stall ms/step | sync offload stall ms/step |",
            "|---|---|---|---|---|---|",
        ]
        for world_size, ranks in results.items():
            peer = sync_results.get(world_size)
            if peer is None:
                continue
            step = statistics.median(median(r["rows"], "step_seconds") for r in ranks)
            sync = statistics.median(median(r["rows"], "step_seconds") for r in peer)
            stall = statistics.fmean(mean(r["rows"], "stall_seconds") for r in ranks)
            sync_stall = statistics.fmean(mean(r["rows"], "stall_seconds") for r in peer)
            summary.append(
                f"| {world_size} | {1e3 * step:.1f} | {1e3 * sync:.1f} | {sync / step:.2f}x "
                f"| {1e3 * stall:.2f} | {1e3 * sync_stall:.2f} |"
            )
    if 1 in results:
        one = results[1][0]
        share_one = one["rss_optimizer"] - one["rss_baseline"]
        summary += [
            "",
            "Memory per rank (VmRSS after the timed steps, with the optimizer; the baseline is the "
            "model and its gradients before it). Target: RSS within 10% of baseline + "
            "(1-rank RSS - 1-rank baseline) / N."
            + (
                f" glibc's mmap threshold fixed at {args.malloc_mmap_threshold} bytes."
                if args.malloc_mmap_threshold is not None
                else ""
            ),
            "",
            "| ranks | rank | baseline MiB | RSS MiB | optimizer's part MiB | host_state_bytes MiB "
            "| engine 'device' memory MiB | target MiB | RSS vs target |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for world_size, ranks in results.items():
            for rank, r in enumerate(ranks):
                target = r["rss_baseline"] + share_one / world_size
                summary.append(
                    f"| {world_size} | {rank} | {r['rss_baseline'] * mib:.0f} | {r['rss_optimizer'] * mib:.0f} "
                    f"| {(r['rss_optimizer'] - r['rss_baseline']) * mib:.0f} | {r['host_state_bytes'] * mib:.0f} "
                    f"| {r['device_bytes'] * mib:.0f} | {target * mib:.0f} "
                    f"| {100 * (r['rss_optimizer'] / target - 1):+.1f}% |"
                )
    columns = args.layers * args.cols
    values = args.layers * args.rows * args.cols
    selection = [
        "",
        f"What the ranks exchange to select alike, per step: the matrices' column sums, one float "
        f"per column: {columns} floats = {4 * columns / 1024:.0f} KiB per rank; an all-gather of "
        f"the gradients instead: {values} floats = {4 * values * mib:.2f} MiB per rank (ratio "
        f"{values // columns} = rows).",
    ]
    header = [
        f"Data parallel on the host backend, {datetime.date.today()}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}, zenflow {zenflow.__version__}: "
        f"{args.layers} fp32 matrices [{args.rows}, {args.cols}] + biases, topk_ratio {args.topk_ratio}, "
        f"update_interval {args.update_interval}, bucket_bytes {args.bucket_mib} MiB, overlap_step, "
        f"{args.host_threads} host thread(s) per rank, "
        f"1 torch thread, {args.warmup} warm-up + {args.steps} timed steps, gloo.",
        "",
    ]
    table = "\n".join(header + lines + summary + selection)
    print(table)
    if args.write:
        args.write.write_text(table + "\n")


if __name__ == "__main__":
    main()
