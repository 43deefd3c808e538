"""CPU optimizer benchmark: zenflow's host kernels against their peers, in one process.

This machine's memory bandwidth drifts by ~20% over minutes, so every comparison runs
interleaved step by step (A B C A B C ...) and reports medians and ratios of medians.

Peers (plain fp32 AdamW step): zenflow.CPUAdamW, torch.optim.AdamW(fused=True),
torch.optim.AdamW(foreach=True), DeepSpeed's DeepSpeedCPUAdam (when installed; its op is
JIT-built once into TORCH_EXTENSIONS_DIR), and the bandwidth roof: an Adam-shaped streaming
loop over the same arrays (benchmarks/lab/stream_roof.c, 4 reads + 3 writes per element).
Also: the window-close update, `accumulate`, and the skip-columns step, each against the
fastest torch sequence doing the same work (several are tried; all are reported).

Effective GB/s counts the bytes each operation must move: 28 per element for an fp32 step
(read p, m, v, g; write p, m, v), and the real count elsewhere (stated in each table).

    python benchmarks/bench_cpu_adamw.py                      # 1M, 16M, 128M; 1 and 2 threads
    python benchmarks/bench_cpu_adamw.py --sizes 1e6 --threads 1 --no-write

--defaults: the drop-in question instead (issue 7, item 10): zenflow.CPUAdamW at its
defaults against torch.optim.AdamW(fused=True), fp32 and bf16 parameters, with nothing set:
no environment variable (OMP_WAIT_POLICY stays unset), no thread count; interleaved in one
process. CPUAdamW is also run on zenflow's own threads (set_host_threads("zenflow")), with
and without its OpenMP pause, each variant in its own interleaved pair with fused AdamW, to
show what running on torch's OpenMP team buys.

    python benchmarks/bench_cpu_adamw.py --defaults           # writes *-cpu-adamw-defaults.md
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Several thread pools share the cores here (torch's OpenMP, DeepSpeed's OpenMP, zenflow's).
# OpenMP workers spin after each parallel region by default, which would steal the cores
# from whichever peer runs next in the interleaved loop; passive waiting keeps every peer's
# measurement its own. Must be set before the OpenMP runtimes load (before `import torch`).
# --defaults measures the out-of-the-box behaviour, so it sets nothing.
DEFAULTS_MODE = "--defaults" in sys.argv[1:]
if not DEFAULTS_MODE:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import zenflow  # noqa: E402
from zenflow import ops  # noqa: E402

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("ZENFLOW_BENCH_CACHE", Path.home() / ".cache" / "zenflow_bench"))
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(CACHE / "torch_extensions"))

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 1e-2
WINDOW = 4  # S: the window-close update applies A / S
SELECTED_SHARE = 0.10
ROWS = 4096  # m for the column-major matrices of the skip-columns case


# ---- peers that need more than torch ----


def load_roof():
    """ctypes handle to the streaming-roof loop, compiled once with the system compiler."""
    source = HERE / "lab" / "stream_roof.c"
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None, "no C compiler"
    CACHE.mkdir(parents=True, exist_ok=True)
    library = CACHE / f"stream_roof_{int(source.stat().st_mtime)}.so"
    if not library.exists():
        with tempfile.TemporaryDirectory() as tmp:
            built = Path(tmp) / "roof.so"
            cmd = [
                compiler,
                "-O3",
                "-march=native",
                "-shared",
                "-fPIC",
                "-pthread",
                str(source),
                "-o",
                str(built),
            ]
            subprocess.run(cmd, check=True)
            shutil.move(str(built), library)
    lib = ctypes.CDLL(str(library))
    lib.adam_shaped_stream.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64, ctypes.c_int]
    lib.adam_shaped_stream.restype = ctypes.c_int
    return lib, "ok"


def load_deepspeed():
    """DeepSpeedCPUAdam and a way to set its OpenMP thread count, or (None, reason)."""
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except Exception as error:  # noqa: BLE001 - any import failure means "absent"
        return None, f"not installed ({type(error).__name__}: {error})"
    # Build the op now (about two minutes the first time; cached in TORCH_EXTENSIONS_DIR).
    try:
        probe = torch.nn.Parameter(torch.zeros(16))
        probe.grad = torch.zeros(16)
        DeepSpeedCPUAdam([probe], lr=LR).step()
    except Exception as error:  # noqa: BLE001
        return None, f"its CPU Adam op failed to build or run ({type(error).__name__}: {error})"
    return DeepSpeedCPUAdam, "ok"


def openmp_setters():
    """omp_set_num_threads of every OpenMP runtime loaded in this process (torch ships its
    own libgomp; DeepSpeed's JIT op links the system one)."""
    setters = []
    seen = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if ("libgomp" in path or "libiomp" in path or "libomp" in path) and path not in seen:
                seen.add(path)
                try:
                    setters.append(ctypes.CDLL(path).omp_set_num_threads)
                except OSError:
                    pass
    return setters


def set_threads(n: int) -> None:
    zenflow.set_num_threads(n)
    torch.set_num_threads(n)
    for setter in openmp_setters():
        setter(n)


# ---- timing ----


def interleaved(candidates: dict, reps: int, warmup: int = 2) -> dict:
    """Median seconds of each callable, run in turns A B C A B C ..."""
    times = {name: [] for name in candidates}
    for rep in range(reps + warmup):
        for name, fn in candidates.items():
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
            if rep >= warmup:
                times[name].append(elapsed)
    return {name: statistics.median(t) for name, t in times.items()}


REPS_OVERRIDE: list[int] = []  # --reps


def reps_for(n: int) -> int:
    if REPS_OVERRIDE:
        return REPS_OVERRIDE[0]
    return 41 if n <= 2_000_000 else 15 if n <= 20_000_000 else 7


def gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9


def fp32_state(n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen), torch.zeros(n), torch.zeros(n)


# ---- the four cases ----


def bench_plain_step(n: int, threads: int, roof, deepspeed_cls) -> list:
    grad = torch.randn(n, generator=torch.Generator().manual_seed(0))
    candidates = {}
    keep = []

    p, _, _ = fp32_state(n, 1)
    zp = torch.nn.Parameter(p)
    zp.grad = grad
    z_opt = zenflow.CPUAdamW([zp], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    candidates["zenflow CPUAdamW"] = z_opt.step

    for name, kwargs in (
        ("torch AdamW(fused=True)", {"fused": True}),
        ("torch AdamW(foreach=True)", {"foreach": True}),
    ):
        tp = torch.nn.Parameter(fp32_state(n, 1)[0])
        tp.grad = grad
        opt = torch.optim.AdamW([tp], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, **kwargs)
        candidates[name] = opt.step
        keep.append(tp)

    if deepspeed_cls is not None:
        dp = torch.nn.Parameter(fp32_state(n, 1)[0])
        dp.grad = grad
        ds_opt = deepspeed_cls([dp], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, adamw_mode=True)
        candidates["DeepSpeedCPUAdam"] = ds_opt.step
        keep.append(dp)

    if roof is not None:
        rp, rm, rv = fp32_state(n, 2)
        ptrs = [t.data_ptr() for t in (rp, rm, rv, grad)]
        candidates["roof: Adam-shaped stream"] = lambda: roof.adam_shaped_stream(*ptrs, n, threads)
        keep.extend([rp, rm, rv])

    medians = interleaved(candidates, reps_for(n))
    rows = []
    roof_time = medians.get("roof: Adam-shaped stream")
    for name, seconds in medians.items():
        rows.append(
            {
                "case": "fp32 AdamW step",
                "n": n,
                "threads": threads,
                "impl": name,
                "ms": seconds * 1e3,
                "GB/s": gbps(28 * n, seconds),
                "zenflow speed-up": seconds / medians["zenflow CPUAdamW"],
                "% of roof": (roof_time / seconds * 100) if roof_time else float("nan"),
            }
        )
    return rows


def bench_window_close(n: int, threads: int) -> list:
    """fp32 accumulator A (scaled by 1/S), fp32 master + m + v, bf16 model weights:
    update the master, write the bf16 copy, zero A."""
    gen = torch.Generator().manual_seed(3)
    acc_z = torch.randn(n, generator=gen)
    master_z, m_z, v_z = fp32_state(n, 4)
    weights_z = master_z.to(torch.bfloat16)
    step_z = [0]

    def zenflow_close():
        step_z[0] += 1
        ops.cpu_adamw_step(
            master_z,
            m_z,
            v_z,
            acc_z,
            step=step_z[0],
            lr=LR,
            betas=BETAS,
            eps=EPS,
            weight_decay=WD,
            grad_scale=1.0 / WINDOW,
            out_params=weights_z,
            zero_grad=True,
        )

    # torch, variant a: scale A, fused step on the master, cast into the bf16 weights, zero A.
    acc_a = torch.randn(n, generator=gen)
    master_a = torch.nn.Parameter(fp32_state(n, 4)[0])
    master_a.grad = acc_a
    weights_a = master_a.detach().to(torch.bfloat16)
    opt_a = torch.optim.AdamW([master_a], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True)

    def torch_scale_then_fused():
        acc_a.mul_(1.0 / WINDOW)
        opt_a.step()
        weights_a.copy_(master_a.detach())
        acc_a.zero_()

    # torch, variant b: the fused kernel unscales the gradient itself (GradScaler's hook).
    acc_b = torch.randn(n, generator=gen)
    master_b = torch.nn.Parameter(fp32_state(n, 4)[0])
    master_b.grad = acc_b
    weights_b = master_b.detach().to(torch.bfloat16)
    opt_b = torch.optim.AdamW([master_b], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True)
    opt_b.grad_scale = torch.tensor(float(WINDOW))
    opt_b.found_inf = torch.tensor(0.0)

    def torch_fused_unscale():
        opt_b.step()
        weights_b.copy_(master_b.detach())
        acc_b.zero_()

    medians = interleaved(
        {
            "zenflow cpu_adamw_step (scale, bf16 copy, zero A in one pass)": zenflow_close,
            "torch: A.mul_(1/S); AdamW(fused); w.copy_(master); A.zero_()": torch_scale_then_fused,
            "torch: AdamW(fused, grad_scale=S); w.copy_(master); A.zero_()": torch_fused_unscale,
        },
        reps_for(n),
    )
    return ratio_rows("window-close update", n, threads, medians, 34 * n)


def bench_accumulate(n: int, threads: int) -> list:
    gen = torch.Generator().manual_seed(5)
    acc_z, acc_t = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    block = torch.randn(n, generator=gen).to(torch.bfloat16)
    medians = interleaved(
        {
            "zenflow cpu_accumulate (bf16 -> fp32)": lambda: ops.cpu_accumulate(
                acc_z, block, scale=0.5
            ),
            "torch: A.add_(G, alpha=s)": lambda: acc_t.add_(block, alpha=0.5),
        },
        reps_for(n),
    )
    return ratio_rows("accumulate bf16 into fp32", n, threads, medians, 10 * n)


def bench_skip_columns(n_elements: int, threads: int) -> list:
    rows = min(ROWS, n_elements // 10)
    cols = n_elements // rows
    n = cols * rows  # within a column of n_elements; rows are grouped under n_elements
    gen = torch.Generator().manual_seed(6)
    k = int(SELECTED_SHARE * cols)
    selected = torch.randperm(cols, generator=gen)[:k].sort().values
    mask = torch.ones(cols, dtype=torch.bool)
    mask[selected] = False
    unselected = mask.nonzero().flatten()
    grad = torch.randn(cols, rows, generator=gen)

    p_z, m_z, v_z = (t.view(cols, rows) for t in fp32_state(n, 7))
    selected_i32 = selected.to(torch.int32)
    state_z = ops.ColumnState(p_z, m_z, v_z, torch.zeros(cols, dtype=torch.int32))

    def zenflow_skip():
        ops.cpu_adamw_step_skip_columns(
            [state_z],
            [selected_i32],
            grads=[grad],
            increment_steps=True,
            lr=LR,
            betas=BETAS,
            eps=EPS,
            weight_decay=WD,
        )

    def fused_state(seed):
        p, m, v = (t.view(cols, rows) for t in fp32_state(n, seed))
        return p, m, v

    def fused_adamw(params, grads, exp_avgs, exp_avg_sqs, steps):
        for s in steps:
            s += 1
        torch._fused_adamw_(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            [],
            steps,
            lr=LR,
            beta1=BETAS[0],
            beta2=BETAS[1],
            weight_decay=WD,
            eps=EPS,
            amsgrad=False,
            maximize=False,
        )

    # a) gather the unselected columns, fused step on the compact copies, scatter back.
    p_a, m_a, v_a = fused_state(8)
    steps_a = [torch.tensor(0.0)]

    def torch_gather_step_scatter():
        p, m, v, g = (t.index_select(0, unselected) for t in (p_a, m_a, v_a, grad))
        fused_adamw([p], [g], [m], [v], steps_a)
        for dst, src in ((p_a, p), (m_a, m), (v_a, v)):
            dst.index_copy_(0, unselected, src)

    # b) one fused multi-tensor call over views of the contiguous runs of unselected columns.
    p_b, m_b, v_b = fused_state(9)
    bounds = [-1, *selected.tolist(), cols]
    runs = [(a + 1, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a + 1]
    views = [[t[a:b] for a, b in runs] for t in (p_b, grad, m_b, v_b)]
    steps_b = [torch.tensor(0.0) for _ in runs]

    def torch_fused_over_runs():
        fused_adamw(views[0], views[1], views[2], views[3], steps_b)

    # c) update everything, then put the selected columns back.
    p_c, m_c, v_c = fused_state(10)
    steps_c = [torch.tensor(0.0)]

    def torch_full_step_then_restore():
        saved = [t.index_select(0, selected) for t in (p_c, m_c, v_c)]
        fused_adamw([p_c], [grad], [m_c], [v_c], steps_c)
        for dst, src in zip((p_c, m_c, v_c), saved):
            dst.index_copy_(0, selected, src)

    medians = interleaved(
        {
            "zenflow cpu_adamw_step_skip_columns": zenflow_skip,
            "torch: index_select, _fused_adamw_, index_copy_": torch_gather_step_scatter,
            f"torch: _fused_adamw_ over the {len(runs)} runs (views)": torch_fused_over_runs,
            "torch: _fused_adamw_ on all, restore selected": torch_full_step_then_restore,
        },
        reps_for(n),
    )
    useful = 28 * rows * len(unselected)
    case = f"skip-columns step, [{cols} columns x {rows} rows], 10% of columns selected"
    return ratio_rows(case, n_elements, threads, medians, useful)


def ratio_rows(case: str, n: int, threads: int, medians: dict, nbytes: float) -> list:
    ours = next(v for k, v in medians.items() if k.startswith("zenflow"))
    return [
        {
            "case": case,
            "n": n,
            "threads": threads,
            "impl": name,
            "ms": seconds * 1e3,
            "GB/s": gbps(nbytes, seconds),
            "zenflow speed-up": seconds / ours,
            "% of roof": float("nan"),
        }
        for name, seconds in medians.items()
    ]


# ---- --defaults: the drop-in at its defaults, nothing set ----


def _model(shapes: list, dtype: torch.dtype, seed: int) -> list:
    gen = torch.Generator().manual_seed(seed)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.randn(shape, generator=gen).to(dtype))
        p.grad = torch.randn(shape, generator=gen).to(dtype)
        params.append(p)
    return params


# Bytes one step must move per element: CPUAdamW reads and writes its fp32 master (or fp32
# parameter), m and v and reads the gradient; with bf16 parameters it also writes the rounded
# weights. Fused AdamW keeps p, m and v in the parameter's dtype.
def step_bytes(dtype: torch.dtype) -> dict:
    if dtype == torch.float32:
        return {"zenflow": 28, "fused": 28}
    return {"zenflow": 12 + 12 + 2 + 2, "fused": 6 + 6 + 2}


def bench_defaults(cases: list, dtypes: list, reps: int, shipped_only: bool = False) -> list:
    """CPUAdamW() against AdamW(fused=True), both at their defaults (lr aside), on the same
    model shapes. Separate interleaved pairs, each against its own fused run (a pause of
    torch's OpenMP workers also costs torch's next parallel region, so variants must not
    share a loop): CPUAdamW as shipped (its regions on torch's OpenMP team), and on zenflow's
    own threads (the previous default) with the OpenMP pause from 8M elements, and off."""
    from zenflow import _omp

    shipped_source = zenflow.host_threads()
    variants = (
        (f"zenflow.CPUAdamW() as shipped (host_threads={shipped_source!r})", shipped_source, True),
        ("zenflow's own threads, OpenMP pause from 8M elements", "zenflow", True),
        ("zenflow's own threads, OpenMP pause off", "zenflow", False),
    )
    if shipped_only:
        variants = variants[:1]
    # The machine's bandwidth in the same loop: the Adam-shaped streaming roof (4 fp32 reads,
    # 3 fp32 writes per element, 28 bytes) over n elements on the pool's thread count.
    roof, _ = load_roof()
    rows = []
    for label, shapes in cases:
        n = sum(int(torch.Size(s).numel()) for s in shapes)
        gen = torch.Generator().manual_seed(4)
        roof_arrays = [torch.randn(n, generator=gen) for _ in range(4)] if roof is not None else []
        threads = zenflow.get_num_threads()

        def roof_step(arrays=roof_arrays, n=n, threads=threads):
            roof.adam_shaped_stream(*(a.data_ptr() for a in arrays), n, threads)

        for dtype in dtypes:
            ours = zenflow.CPUAdamW(_model(shapes, dtype, 1), lr=LR)
            fused = torch.optim.AdamW(_model(shapes, dtype, 1), lr=LR, fused=True)
            # The roof in a loop of its own, each run after torch's OpenMP team was sent to
            # sleep (that entry is timed apart and not reported): both optimizers leave the
            # team spinning on the cores the roof's own threads need.
            roof_median = float("nan")
            if roof is not None:
                roof_median = interleaved(
                    {"_pause": _omp.pause_openmp_workers, "roof": roof_step}, reps
                )["roof"]
            for index, (name, source, pause) in enumerate(variants):
                zenflow.set_host_threads(source)
                _omp.set_enabled(pause)
                try:
                    medians = interleaved({name: ours.step, "fused": fused.step}, reps)
                finally:
                    zenflow.set_host_threads(shipped_source)
                    _omp.set_enabled(True)
                if index == 0:
                    medians["roof"] = roof_median
                per_element = step_bytes(dtype)
                roof_gbps = gbps(28 * n, medians["roof"]) if "roof" in medians else float("nan")
                rows.append(
                    {
                        "case": label,
                        "dtype": str(dtype).replace("torch.", ""),
                        "n": n,
                        "impl": name,
                        "ms": medians[name] * 1e3,
                        "fused_ms": medians["fused"] * 1e3,
                        "ratio": medians["fused"] / medians[name],
                        "gbps": gbps(per_element["zenflow"] * n, medians[name]),
                        "fused_gbps": gbps(per_element["fused"] * n, medians["fused"]),
                        "roof_gbps": roof_gbps,
                        "load": os.getloadavg()[0],
                    }
                )
            del ours, fused
            gc.collect()
        roof_arrays.clear()
        gc.collect()
    return rows


def defaults_markdown(rows: list, reps: int) -> str:
    out = [
        f"# zenflow.CPUAdamW at its defaults vs torch.optim.AdamW(fused=True), "
        f"{datetime.date.today().isoformat()}",
        "",
        f"Command: `{' '.join(['python', 'benchmarks/bench_cpu_adamw.py', *sys.argv[1:]])}`",
        f"Machine: {cpu_model()}, {zenflow.native().host_cpu_count()} logical CPUs usable, "
        f"SIMD level {zenflow.simd_level()}; torch {torch.__version__} "
        f"({torch.get_num_threads()} intra-op threads), zenflow pool {zenflow.get_num_threads()} threads.",
        "Nothing set: OMP_WAIT_POLICY="
        f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}, ZENFLOW_SIMD="
        f"{os.environ.get('ZENFLOW_SIMD', 'unset')}, no set_num_threads call. Each table row "
        f"is one interleaved pair (A B A B ...), median of {reps} steps. "
        "'vs fused' = fused AdamW's median / this median (above 1: faster than fused).",
        "bf16: CPUAdamW keeps an fp32 master, m and v and writes the rounded bf16 weights; "
        "torch's fused AdamW keeps bf16 m and v (less memory traffic, less precision).",
        "GB/s: the bytes each step must move (CPUAdamW 28 per element, fp32 or bf16; fused "
        "AdamW 28 for fp32, 14 for bf16) over its median; roof: the Adam-shaped streaming loop "
        "(benchmarks/lab/stream_roof.c, 28 bytes per element), measured in its own loop right "
        "before the pairs, each run after torch's OpenMP team was sent to sleep; '% roof' = GB/s / roof GB/s. load: the 1-minute load average after "
        "the pair.",
        "",
        "| case | params dtype | elements | zenflow variant | zenflow ms | fused ms (same run) "
        "| vs fused | zenflow GB/s (% roof) | fused GB/s (% roof) | roof GB/s | load |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        roof = r["roof_gbps"]
        has_roof = roof == roof
        ours = f"{r['gbps']:.1f}" + (f" ({100 * r['gbps'] / roof:.0f}%)" if has_roof else "")
        fused = f"{r['fused_gbps']:.1f}" + (
            f" ({100 * r['fused_gbps'] / roof:.0f}%)" if has_roof else ""
        )
        out.append(
            f"| {r['case']} | {r['dtype']} | {fmt_n(r['n'])} | {r['impl']} | {r['ms']:.2f} | "
            f"{r['fused_ms']:.2f} | {r['ratio']:.2f}x | {ours} | {fused} | "
            f"{roof:.1f} | {r['load']:.1f} |"
        )
    return "\n".join(out)


def defaults_main(args) -> None:
    cases = [
        ("1 tensor of 1M", [(1024, 1024)]),
        ("1 tensor of 16M", [(4096, 4096)]),
        ("300 tensors (a small model, 19.7M)", [(256, 256)] * 300),
        ("1 tensor of 64M", [(8192, 8192)]),
    ]
    if args.sizes_given:
        cases = [(f"1 tensor of {fmt_n(n)}", [(n,)]) for n in parse_sizes(args.sizes)]
    if args.model_only:
        cases = [c for c in cases if c[0].startswith("300 tensors")]
    if args.with_overhead:
        # 300 tensors of 16 elements: the step is all per-tensor work (Python, conversions,
        # dispatch), nothing of it memory traffic.
        cases.insert(0, ("300 tensors of 4x4 (per-step overhead)", [(4, 4)] * 300))
    reps = args.reps or 21
    dtypes = [torch.float32, torch.bfloat16]
    if args.dtypes:
        dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
    rows = bench_defaults(cases, dtypes, reps, shipped_only=args.shipped_only)
    report = defaults_markdown(rows, reps) + "\n"
    print(report)
    if not args.no_write:
        name = args.out or f"{datetime.date.today().isoformat()}-cpu-adamw-defaults.md"
        path = HERE / "results" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(report)
        print(f"wrote {path}")


# ---- report ----


def fmt_n(n: int) -> str:
    return (
        f"{n / 2**20:.0f}Mi"
        if n >= 2**20 and n % 2**20 == 0
        else f"{n / 1e6:.0f}M"
        if n >= 1e6
        else str(n)
    )


def markdown(rows: list) -> str:
    out = []
    case = None
    for r in rows:
        if r["case"] != case:
            case = r["case"]
            roof_col = " % of roof |" if case == "fp32 AdamW step" else ""
            out += [
                "",
                f"### {case}",
                "",
                f"| n | threads | implementation | median ms | GB/s | zenflow speed-up |{roof_col}",
            ]
            out.append("|---:|---:|---|---:|---:|---:|" + ("---:|" if roof_col else ""))
        roof = f" {r['% of roof']:.0f}% |" if r["case"] == "fp32 AdamW step" else ""
        out.append(
            f"| {fmt_n(r['n'])} | {r['threads']} | {r['impl']} | {r['ms']:.2f} | {r['GB/s']:.1f} |"
            f" {r['zenflow speed-up']:.2f}x |{roof}"
        )
    return "\n".join(out)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def parse_sizes(text: str) -> list[int]:
    return [int(float(s)) for s in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1e6,16e6,128e6", help="elements, comma-separated")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--cases", default="plain,window,accumulate,skip")
    parser.add_argument(
        "--no-write", action="store_true", help="print only; do not write benchmarks/results/"
    )
    parser.add_argument(
        "--reps", type=int, default=0, help="repetitions per case (default: by size)"
    )
    parser.add_argument(
        "--defaults",
        action="store_true",
        help="CPUAdamW at its defaults vs AdamW(fused=True), nothing set (see above)",
    )
    parser.add_argument(
        "--shipped-only",
        action="store_true",
        help="--defaults: only CPUAdamW as shipped (not the own-threads variants)",
    )
    parser.add_argument("--dtypes", default="", help="--defaults: e.g. bfloat16 (default: both)")
    parser.add_argument(
        "--model-only", action="store_true", help="--defaults: only the 300-tensor model"
    )
    parser.add_argument(
        "--with-overhead",
        action="store_true",
        help="--defaults: also 300 tensors of 4x4 elements (the per-step overhead)",
    )
    parser.add_argument("--out", default="", help="--defaults: results file name")
    args = parser.parse_args()
    args.sizes_given = any(a.startswith("--sizes") for a in sys.argv[1:])
    if args.defaults:
        defaults_main(args)
        return
    if args.reps > 0:
        REPS_OVERRIDE.append(args.reps)
    sizes = parse_sizes(args.sizes)
    thread_counts = [int(t) for t in args.threads.split(",")]
    cases = args.cases.split(",")

    roof, roof_status = load_roof()
    deepspeed_cls, ds_status = load_deepspeed() if "plain" in cases else (None, "not run")
    print(f"roof: {roof_status}; DeepSpeed: {ds_status}", flush=True)

    rows = []
    for n in sizes:
        for threads in thread_counts:
            set_threads(threads)
            if "plain" in cases:
                rows += bench_plain_step(n, threads, roof, deepspeed_cls)
            if "window" in cases:
                rows += bench_window_close(n, threads)
            if "accumulate" in cases:
                rows += bench_accumulate(n, threads)
            if "skip" in cases:
                rows += bench_skip_columns(n, threads)
            gc.collect()
            print(
                markdown([r for r in rows if r["n"] == n and r["threads"] == threads]), flush=True
            )

    rows.sort(
        key=lambda r: (
            ["fp32", "window", "accum", "skip"].index(
                next(k for k in ["fp32", "window", "accum", "skip"] if r["case"].startswith(k))
            ),
            r["n"],
            r["threads"],
        )
    )
    header = [
        f"# CPU optimizer benchmark, {datetime.date.today().isoformat()}",
        "",
        f"Command: `{' '.join(['python', 'benchmarks/bench_cpu_adamw.py', *sys.argv[1:]])}`",
        f"Machine: {cpu_model()}, {zenflow.native().host_cpu_count()} logical CPUs, "
        f"SIMD level {zenflow.simd_level()}; torch {torch.__version__}; DeepSpeed: {ds_status}; roof: {roof_status};"
        f" OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}.",
        "Every table is one interleaved run (A B C A B C ...); medians over the repetitions; "
        "'zenflow speed-up' = peer's median / zenflow's median.",
        "Bytes counted: fp32 step 28 B/element; window close 34 B/element (read master, m, v, A; write master,"
        " m, v, bf16 copy, zeroed A); accumulate 10 B/element (read A, bf16 G; write A); skip-columns 28 B per"
        " unselected element.",
    ]
    report = "\n".join(header) + "\n" + markdown(rows) + "\n"
    if not args.no_write:
        path = HERE / "results" / f"{datetime.date.today().isoformat()}-cpu-adamw.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(report)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
