"""`python -m zenflow bench ops`: zenflow's low-level ops against the torch code a user would
write instead, on the same inputs, interleaved round by round.

Cases (each with the bytes it must move, so that GB/s and the fraction of the streaming roof
measured in the same run say how close to the machine each one is):

  column_stats   per-column sums of squares of gradients (bf16, fp32) vs g.float().square().sum(0)
  topk           the top 10% columns of every score vector (sorted) vs torch.topk + sort
  pack           G[:, unselected] into one column-major buffer vs index_select + t() + cat
  accumulate     bf16 packed gradients into fp32 accumulators vs A.add_(G, alpha=s)
  adamw          one plain fp32 AdamW step vs torch.optim.AdamW(fused=True) and (foreach=True)
  window         the window-close update (scale, step, bf16 copy, zeroed accumulator) vs the
                 fused torch sequence doing the same work
  skip           the host step over the unselected columns vs torch's fused step over the runs
                 of unselected columns (views)

The same code runs on CUDA tensors when a GPU is visible (column_stats, topk, pack: the
kernels against torch's CUDA ops); the host-only cases (accumulate, adamw, window, skip) run
on the CPU only.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass

import torch

import zenflow
from zenflow import ops

from ._harness import Progress, Row, Section, interleave, synchronizer

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 1e-2
WINDOW = 4  # the window-close update applies the accumulator / S
SELECTED_SHARE = 0.10

CPU_CASES = ("column_stats", "topk", "pack", "accumulate", "adamw", "window", "skip")
CUDA_CASES = ("column_stats", "topk", "pack")


@dataclass
class OpsConfig:
    elements: int = 16 << 20  # per case
    rounds: int = 15
    cases: tuple[str, ...] = CPU_CASES
    device: str = "cpu"
    deepspeed: bool = False  # also DeepSpeedCPUAdam in the adamw case (JIT-builds its op)

    @classmethod
    def quick(cls, device: str = "cpu") -> OpsConfig:
        return cls(elements=4 << 20, rounds=5, device=device)


def _layer_shapes(elements: int) -> list[tuple[int, int]]:
    """Matrices of a 7B-class layer, scaled down to about `elements` (rows trimmed, column
    counts kept: the op's per-column work stays realistic)."""
    layer = [(4096, 4096)] * 4 + [(11008, 4096)] * 2 + [(4096, 11008)]
    shapes, total = [], 0
    while total < elements:
        for m, n in layer:
            rows = max(1, min(m, (elements - total) // n))
            shapes.append((rows, n))
            total += rows * n
            if total >= elements:
                break
    return shapes


def _selected(n: int, gen: torch.Generator, device: str) -> torch.Tensor:
    k = max(1, int(SELECTED_SHARE * n))
    return torch.randperm(n, generator=gen)[:k].sort().values.to(torch.int32).to(device)


def _unselected(n: int, selected: torch.Tensor) -> torch.Tensor:
    mask = torch.ones(n, dtype=torch.bool, device=selected.device)
    mask[selected.long()] = False
    return mask.nonzero().flatten()


def _run(
    title: str,
    rows: dict[str, tuple[Callable, float | None, bool]],
    config: OpsConfig,
    progress: Progress,
    note: str = "",
) -> Section:
    progress.start(title, config.rounds)
    samples = interleave(
        {name: fn for name, (fn, _, _) in rows.items()},
        config.rounds,
        progress=progress,
        sync=synchronizer(config.device),
    )
    progress.close()
    return Section(
        title=title,
        rows=[
            Row(name, samples[name], bytes_moved=nbytes, peer=peer)
            for name, (_, nbytes, peer) in rows.items()
        ],
        headline="median",
        note=note,
        device=config.device,
    )


def bench_column_stats(
    config: OpsConfig, dtype: torch.dtype, progress: Progress, square: bool = False
) -> Section:
    gen = torch.Generator().manual_seed(0)
    if square:
        side = int(config.elements**0.5)
        shapes = [(side, config.elements // side)]
    else:
        shapes = _layer_shapes(config.elements)
    grads = [torch.randn(s, generator=gen).to(dtype).to(config.device) for s in shapes]
    outs = [torch.empty(g.shape[1], device=config.device) for g in grads]
    nbytes = sum(g.numel() * g.element_size() for g in grads)

    def zenflow_call():
        ops.column_stats(grads, outs)

    def torch_call():
        for g in grads:
            g.float().square().sum(0)

    zenflow_call()
    want = grads[0].double().square().sum(0)
    if not torch.allclose(outs[0].double(), want, rtol=1e-5):
        raise RuntimeError(
            "column_stats: zenflow's result differs from torch's (benchmark aborted)"
        )
    name = str(dtype).replace("torch.", "")
    what = f"one [{shapes[0][0]}, {shapes[0][1]}] matrix" if square else "a 7B-class layer"
    return _run(
        f"column_stats, {name} gradients of {what}, {_fmt_n(config.elements)} elements "
        f"({len(grads)} matrices), {config.device}",
        {
            "zenflow ops.column_stats": (zenflow_call, nbytes, False),
            "torch g.float().square().sum(0) per matrix": (torch_call, nbytes, True),
        },
        config,
        progress,
        note="Bytes: the gradients, read once. zenflow also returns the total and a non-finite flag.",
    )


def bench_topk(config: OpsConfig, progress: Progress) -> Section:
    gen = torch.Generator().manual_seed(1)
    n = 11008
    count = max(1, config.elements // (64 * n))  # a score vector per matrix of ~64 rows
    scores = [torch.rand(n, generator=gen).to(config.device) for _ in range(count)]
    k = int(SELECTED_SHARE * n)
    outs = [torch.empty(k, dtype=torch.int32, device=config.device) for _ in scores]

    def zenflow_call():
        ops.select_topk_columns(scores, k, out_indices=outs)

    def torch_call():
        for s in scores:
            torch.topk(s, k, sorted=False).indices.sort()

    zenflow_call()
    expected = torch.topk(scores[0], k).indices.sort().values
    if not torch.equal(outs[0].long().cpu(), expected.cpu()):
        raise RuntimeError("select_topk_columns: zenflow's result differs from torch's")
    return _run(
        f"select_topk_columns, {count} score vectors of {n}, k = {k}, {config.device}",
        {
            "zenflow ops.select_topk_columns": (zenflow_call, 4 * n * count, False),
            "torch topk + sort per vector": (torch_call, 4 * n * count, True),
        },
        config,
        progress,
        note="Bytes: the scores, read once. Both return the indices in ascending order.",
    )


def bench_pack(config: OpsConfig, progress: Progress) -> Section:
    gen = torch.Generator().manual_seed(2)
    shapes = _layer_shapes(config.elements)
    grads = [torch.randn(s, generator=gen).to(torch.bfloat16).to(config.device) for s in shapes]
    selected = [_selected(g.shape[1], gen, config.device) for g in grads]
    unselected = [_unselected(g.shape[1], s) for g, s in zip(grads, selected)]
    total = sum(g.shape[0] * len(u) for g, u in zip(grads, unselected))
    packed = torch.empty(total, dtype=torch.bfloat16, device=config.device)
    peer_out = torch.empty_like(packed)

    def zenflow_call():
        ops.pack_columns(grads, selected, out=packed)

    def torch_call():
        torch.cat(
            [g.index_select(1, u).t().reshape(-1) for g, u in zip(grads, unselected)], out=peer_out
        )

    zenflow_call()
    torch_call()
    if not torch.equal(packed, peer_out):
        raise RuntimeError("pack_columns: zenflow's packed buffer differs from torch's")
    moved = 2 * 2 * total  # bf16 read + written
    return _run(
        f"pack_columns, bf16 gradients, {_fmt_n(config.elements)} elements, 10% of columns "
        f"selected, {config.device}",
        {
            "zenflow ops.pack_columns": (zenflow_call, moved, False),
            "torch index_select + t() + cat": (torch_call, moved, True),
        },
        config,
        progress,
        note="Bytes: the unselected columns, read and written once.",
    )


def bench_accumulate(config: OpsConfig, progress: Progress) -> Section:
    gen = torch.Generator().manual_seed(5)
    n = config.elements
    acc_z, acc_t = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    block = torch.randn(n, generator=gen).to(torch.bfloat16)
    return _run(
        f"accumulate, bf16 packed gradients into fp32, {_fmt_n(n)} elements",
        {
            "zenflow ops.cpu_accumulate": (
                lambda: ops.cpu_accumulate(acc_z, block, scale=0.5),
                10 * n,
                False,
            ),
            "torch A.add_(G, alpha=s)": (lambda: acc_t.add_(block, alpha=0.5), 10 * n, True),
        },
        config,
        progress,
        note="Bytes: 10 per element (read A and the bf16 G, write A).",
    )


def _fp32_state(n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen), torch.zeros(n), torch.zeros(n)


def _load_deepspeed():
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except Exception as error:  # noqa: BLE001 - any import failure means "absent"
        return None, f"not installed ({type(error).__name__})"
    try:
        probe = torch.nn.Parameter(torch.zeros(16))
        probe.grad = torch.zeros(16)
        DeepSpeedCPUAdam([probe], lr=LR).step()
    except Exception as error:  # noqa: BLE001
        return None, f"its CPU Adam op failed to build or run ({type(error).__name__}: {error})"
    return DeepSpeedCPUAdam, "ok"


def bench_adamw(config: OpsConfig, progress: Progress) -> Section:
    n = config.elements
    grad = torch.randn(n, generator=torch.Generator().manual_seed(0))
    rows: dict[str, tuple[Callable, float | None, bool]] = {}
    p, m, v = _fp32_state(n, 1)
    step = [0]

    def zenflow_call():
        step[0] += 1
        ops.cpu_adamw_step(
            p, m, v, grad, step=step[0], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD
        )

    rows["zenflow ops.cpu_adamw_step"] = (zenflow_call, 28 * n, False)
    keep = []
    for name, kwargs in (
        ("torch AdamW(fused=True)", {"fused": True}),
        ("torch AdamW(foreach=True)", {"foreach": True}),
    ):
        tp = torch.nn.Parameter(_fp32_state(n, 1)[0])
        tp.grad = grad
        opt = torch.optim.AdamW([tp], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, **kwargs)
        rows[name] = (opt.step, 28 * n, True)
        keep.append(tp)
    note = "Bytes: 28 per element (read p, m, v, g; write p, m, v)."
    if config.deepspeed:
        cls, status = _load_deepspeed()
        if cls is not None:
            dp = torch.nn.Parameter(_fp32_state(n, 1)[0])
            dp.grad = grad
            ds = cls([dp], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, adamw_mode=True)
            rows["DeepSpeedCPUAdam"] = (ds.step, 28 * n, True)
            keep.append(dp)
        note += f" DeepSpeed: {status}."
    return _run(
        f"AdamW step, fp32, one tensor of {_fmt_n(n)} elements", rows, config, progress, note
    )


def bench_window(config: OpsConfig, progress: Progress) -> Section:
    """fp32 accumulator A (scaled by 1/S), fp32 master + m + v, bf16 weights: update the
    master, write the bf16 copy, zero A."""
    n = config.elements
    gen = torch.Generator().manual_seed(3)
    acc_z = torch.randn(n, generator=gen)
    master_z, m_z, v_z = _fp32_state(n, 4)
    weights_z = master_z.to(torch.bfloat16)
    step_z = [0]

    def zenflow_call():
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

    acc_t = torch.randn(n, generator=gen)
    master_t = torch.nn.Parameter(_fp32_state(n, 4)[0])
    master_t.grad = acc_t
    weights_t = master_t.detach().to(torch.bfloat16)
    opt = torch.optim.AdamW([master_t], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True)
    # The fused kernel unscales the gradient itself, as under torch.amp.GradScaler.
    opt.grad_scale = torch.tensor(float(WINDOW))
    opt.found_inf = torch.tensor(0.0)

    def torch_call():
        opt.step()
        weights_t.copy_(master_t.detach())
        acc_t.zero_()

    return _run(
        f"window-close update, {_fmt_n(n)} elements (bf16 weights, fp32 master)",
        {
            "zenflow ops.cpu_adamw_step (scale, bf16 copy, zero A: one pass)": (
                zenflow_call,
                34 * n,
                False,
            ),
            "torch AdamW(fused, grad_scale=S); w.copy_(master); A.zero_()": (
                torch_call,
                34 * n,
                True,
            ),
        },
        config,
        progress,
        note="Bytes: 34 per element (read master, m, v, A; write master, m, v, the bf16 copy, A).",
    )


def bench_skip(config: OpsConfig, progress: Progress) -> Section:
    rows = max(1, min(4096, config.elements // 10))
    cols = max(1, config.elements // rows)
    n = cols * rows
    gen = torch.Generator().manual_seed(6)
    selected = _selected(cols, gen, "cpu")
    grad = torch.randn(cols, rows, generator=gen)
    p_z, m_z, v_z = (t.view(cols, rows) for t in _fp32_state(n, 7))
    state = ops.ColumnState(p_z, m_z, v_z, torch.zeros(cols, dtype=torch.int32))

    def zenflow_call():
        ops.cpu_adamw_step_skip_columns(
            [state],
            [selected],
            grads=[grad],
            increment_steps=True,
            lr=LR,
            betas=BETAS,
            eps=EPS,
            weight_decay=WD,
        )

    # torch's fused multi-tensor step over views of the runs of unselected columns.
    p_t, m_t, v_t = (t.view(cols, rows) for t in _fp32_state(n, 7))
    bounds = [-1, *selected.tolist(), cols]
    runs = [(a + 1, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a + 1]
    views = [[t[a:b] for a, b in runs] for t in (p_t, grad, m_t, v_t)]
    steps = [torch.tensor(0.0) for _ in runs]

    def torch_call():
        for s in steps:
            s += 1
        torch._fused_adamw_(
            views[0],
            views[1],
            views[2],
            views[3],
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

    unselected_elements = rows * (cols - len(selected))
    return _run(
        f"host step over the unselected columns, [{cols} columns x {rows} rows], 10% selected",
        {
            "zenflow ops.cpu_adamw_step_skip_columns": (
                zenflow_call,
                28 * unselected_elements,
                False,
            ),
            f"torch _fused_adamw_ over the {len(runs)} runs (views)": (
                torch_call,
                28 * unselected_elements,
                True,
            ),
        },
        config,
        progress,
        note="Bytes: 28 per unselected element.",
    )


def run(config: OpsConfig, progress: Progress) -> list[Section]:
    sections = []
    for case in config.cases:
        if config.device != "cpu" and case not in CUDA_CASES:
            continue
        if case == "column_stats":
            for dtype in (torch.bfloat16, torch.float32):
                sections.append(bench_column_stats(config, dtype, progress))
        elif case == "topk":
            sections.append(bench_topk(config, progress))
        elif case == "pack":
            sections.append(bench_pack(config, progress))
        elif case == "accumulate":
            sections.append(bench_accumulate(config, progress))
        elif case == "adamw":
            sections.append(bench_adamw(config, progress))
        elif case == "window":
            sections.append(bench_window(config, progress))
        elif case == "skip":
            sections.append(bench_skip(config, progress))
        else:
            raise ValueError(
                f"cases: unknown case {case!r} (expected some of {', '.join(CPU_CASES)})"
            )
        gc.collect()
    return sections


def _fmt_n(n: int) -> str:
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}Mi"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    return str(n)


def threads_note() -> str:
    return (
        f"zenflow host threads {zenflow.get_num_threads()} ({zenflow.host_threads()}), "
        f"torch threads {torch.get_num_threads()}"
    )
