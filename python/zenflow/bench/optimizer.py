"""`python -m zenflow bench optimizer`: zenflow's torch optimizers against
torch.optim.AdamW(fused=True) on the same model, interleaved step by step.

  step time     CPUAdamW and ZenFlowAdamW against AdamW(fused=True) (and foreach=True) on a
                model of mid-size matrices and biases: the mean step time over the whole run
                (ZenFlowAdamW's window closes and their waits included) is the headline.
  overhead      the per-step cost of the optimizer layer on many tiny tensors, where the
                math is negligible: ZenFlowAdamW.step() against zenflow._C.Engine.step() on
                the same gradients, the overlap_backward hooks of one backward pass, and
                AdamW(fused=True).step() as the peer (issue 9's target: under 1 ms at 300
                tensors).
  defaults      (bench_cpu_adamw.py --defaults) CPUAdamW at its defaults against fused
                AdamW with nothing set, and CPUAdamW on zenflow's own threads.

torch's fused AdamW on the CPU takes fp32, bf16 and fp16 parameters in recent torch; where a
dtype is refused, the peer falls back to foreach=True and the report says so.

ZenFlowAdamW runs its window update in the background, overlapping the calls that follow it:
here the peer's steps, in training the model's forward and backward. So the peer is also
timed alone, in a block of its own, and the ratio is taken against the faster of its two
figures (the ratio never favours zenflow for that reason).
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch

import zenflow

from ._harness import Progress, Row, Samples, Section, interleave, synchronizer

LR = 1e-3


@dataclass
class OptimizerConfig:
    matrices: int = 24
    rows: int = 1024
    cols: int = 1024
    dtype: str = "float32"
    steps: int = 40  # timed steps of each optimizer (whole windows of 4)
    warmup: int = 8
    device: str = "cpu"
    # the per-step overhead case
    tensors: int = 300
    tiny_rows: int = 8
    tiny_cols: int = 16
    tiny_dtype: str = "bfloat16"
    reps: int = 200
    bucket_bytes: int = 4096
    cases: tuple[str, ...] = ("step", "overhead")

    @classmethod
    def quick(cls, device: str = "cpu") -> OptimizerConfig:
        return cls(matrices=8, rows=256, cols=512, steps=16, warmup=8, reps=20, device=device)


def _model(config: OptimizerConfig, seed: int) -> list[torch.nn.Parameter]:
    """`matrices` weight matrices, each followed by a bias, with fixed gradients."""
    gen = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, config.dtype)
    params = []
    for _ in range(config.matrices):
        for shape in ((config.rows, config.cols), (config.rows,)):
            p = torch.nn.Parameter(
                (0.02 * torch.randn(shape, generator=gen)).to(dtype).to(config.device)
            )
            p.grad = (1e-3 * torch.randn(shape, generator=gen)).to(dtype).to(config.device)
            params.append(p)
    return params


def _fused_peer(params: list[torch.nn.Parameter]) -> tuple[torch.optim.Optimizer, str]:
    """AdamW(fused=True) when torch takes these parameters, else foreach=True (and why)."""
    try:
        opt = torch.optim.AdamW(params, lr=LR, fused=True)
        # Some refusals only come at the first step: try it on a copy.
        probe = [torch.nn.Parameter(p.detach()[:1].clone()) for p in params[:1]]
        for q, p in zip(probe, params[:1]):
            q.grad = p.grad[:1].clone()
        torch.optim.AdamW(probe, lr=LR, fused=True).step()
        return opt, "torch AdamW(fused=True)"
    except (RuntimeError, ValueError) as error:
        reason = str(error).splitlines()[0][:80]
        return torch.optim.AdamW(
            params, lr=LR, foreach=True
        ), f"torch AdamW(foreach=True) (fused refused: {reason})"


def bench_step_time(config: OptimizerConfig, progress: Progress) -> list[Section]:
    """CPUAdamW and ZenFlowAdamW against fused AdamW, mean step time over the whole run."""
    sync = synchronizer(config.device)
    n_params = config.matrices * (config.rows * config.cols + config.rows)
    shape = (
        f"{config.matrices} x ([{config.rows}, {config.cols}] + [{config.rows}]) {config.dtype} "
        f"on {config.device}, {n_params / 1e6:.1f}M parameters"
    )
    sections = []
    torch_threads = torch.get_num_threads()

    # --- CPUAdamW (host parameters only) against fused AdamW: both synchronous.
    if config.device == "cpu":
        ours = zenflow.CPUAdamW(_model(config, 0), lr=LR)
        peer, peer_name = _fused_peer(_model(config, 0))
        progress.start("CPUAdamW vs fused AdamW", config.steps)
        samples = interleave(
            {"zenflow.CPUAdamW": ours.step, peer_name: peer.step},
            config.steps,
            warmup=config.warmup,
            progress=progress,
        )
        progress.close()
        # CPUAdamW keeps an fp32 master, m and v: 28 bytes per element moved, 32 with bf16
        # weights written too; the fused peer keeps its state in the parameter's dtype.
        element = torch.tensor([], dtype=getattr(torch, config.dtype)).element_size()
        ours_bytes = (28 if element == 4 else 28 + element) * n_params
        sections.append(
            Section(
                title=f"CPUAdamW step, {shape}",
                rows=[
                    Row("zenflow.CPUAdamW().step()", samples["zenflow.CPUAdamW"], ours_bytes),
                    Row(
                        f"{peer_name}.step()", samples[peer_name], 7 * element * n_params, peer=True
                    ),
                ],
                headline="mean",
                note="Bytes: CPUAdamW reads and writes an fp32 master, m and v and reads the "
                "gradient (and writes the rounded weights below fp32); the peer keeps its "
                "state in the parameter's dtype.",
            )
        )
        del ours, peer
        gc.collect()

    # --- ZenFlowAdamW at its defaults against fused AdamW.
    zf_params = _model(config, 0)
    # Windows from step 1 (the start's detection, 8 synchronous steps once, is bench engine's).
    ours = zenflow.ZenFlowAdamW(zf_params, lr=LR, auto_warm_up_rounds=0)
    lowered = torch.get_num_threads()
    # The peer is a plain AdamW run, which keeps every torch thread.
    torch.set_num_threads(torch_threads)
    peer, peer_name = _fused_peer(_model(config, 0))
    progress.start("ZenFlowAdamW vs fused AdamW", config.steps)
    samples = interleave(
        {"zenflow.ZenFlowAdamW": ours.step, peer_name: peer.step},
        config.steps,
        warmup=config.warmup,
        progress=progress,
        sync=sync,
    )
    progress.close()
    stats = ours.stats()
    ours.flush()
    ours.close()
    del ours
    gc.collect()
    progress.start(f"{peer_name} alone", config.steps)
    alone = interleave({"peer": peer.step}, config.steps, warmup=2, progress=progress, sync=sync)
    progress.close()
    faster = min((samples[peer_name], alone["peer"]), key=lambda s: s.mean)
    rows = [
        Row(
            "zenflow.ZenFlowAdamW().step() (defaults: top 10% columns, window of 4, overlap; windows from step 1)",
            samples["zenflow.ZenFlowAdamW"],
            extra={
                "windows": stats["windows"],
                "stall_ms_per_step": 1e3
                * sum(stats[k] for k in stats if k.startswith("stall_seconds"))
                / max(1, stats["steps"]),
            },
        ),
        Row(f"{peer_name}.step(), interleaved", samples[peer_name], peer=True),
        Row(f"{peer_name}.step(), alone", alone["peer"], peer=True),
    ]
    sections.append(
        Section(
            title=f"ZenFlowAdamW step, {shape}",
            rows=rows,
            headline="mean",
            reference=(rows[1] if faster is samples[peer_name] else rows[2]).name,
            device=config.device,
            note=(
                "ZenFlowAdamW's whole step on this device (column statistics, top-k, the "
                "selected columns' update, packing, and the host lane's accumulate and window "
                "update in the background). Its ratio is taken against the faster peer figure. "
                f"In training ZenFlowAdamW lowers torch's threads from {torch_threads} to "
                f"{lowered} (pt_reserved_cores_perc); the peers here ran with {torch_threads}. "
                "On a CPU-only machine the model and the host update share the cores: the design's "
                "speed-up needs a GPU (docs/benchmarks.md)."
            ),
        )
    )
    torch.set_num_threads(torch_threads)
    return sections


def bench_overhead(config: OptimizerConfig, progress: Progress) -> Section:
    """The optimizer layer's own per-step cost on many tiny tensors (bench_optimizer.py)."""
    dtype = getattr(torch, config.tiny_dtype)
    gen = torch.Generator().manual_seed(0)

    def make():
        out = []
        for i in range(config.tensors):
            shape = (config.tiny_rows,) if i % 3 == 2 else (config.tiny_rows, config.tiny_cols)
            out.append(torch.nn.Parameter(torch.randn(shape, generator=gen).to(dtype)))
        return out

    params = make()
    torch_threads = torch.get_num_threads()
    opt = zenflow.ZenFlowAdamW(
        params, lr=LR, bucket_bytes=config.bucket_bytes, auto_warm_up_rounds=0
    )
    engine = _twin_engine(params, config.bucket_bytes)
    peer_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    peer = torch.optim.AdamW(peer_params, lr=LR, fused=True)
    hooked_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    hooked = zenflow.ZenFlowAdamW(
        hooked_params, lr=LR, bucket_bytes=config.bucket_bytes, auto_warm_up_rounds=0
    )
    hooked.overlap_backward()
    # The hook overlap_backward registers, called directly: a private method of today's
    # optimizer (issue 27 moves readiness into the engine); without it the row is left out.
    hook = getattr(hooked, "_on_gradient", None)
    grad_gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(p.shape, generator=grad_gen).to(dtype) for p in params]
    for p, q, h, g in zip(params, peer_params, hooked_params, grads):
        p.grad, q.grad, h.grad = g, g.clone(), g.clone()
    lrs = [LR]
    hook_samples = Samples()

    def hooks_then_step():
        # The hooks of one backward pass, in backward order, then the step that finishes it.
        import time

        start = time.perf_counter()
        for h in reversed(hooked_params):
            hook(h)
        hook_samples.seconds.append(time.perf_counter() - start)
        hooked.step()

    progress.start(f"optimizer overhead, {config.tensors} tiny tensors", config.reps)
    candidates = {"ZenFlowAdamW.step()": opt.step, "peer": peer.step}
    if engine is not None:
        candidates["engine"] = lambda: engine.step(grads, lrs)
    if hook is not None:
        candidates["hooks"] = hooks_then_step
    samples = interleave(
        candidates,
        config.reps,
        warmup=10,
        progress=progress,
    )
    progress.close()
    hook_samples.seconds = hook_samples.seconds[-config.reps :]
    for o in (opt, hooked):
        o.close()
    torch.set_num_threads(torch_threads)
    rows = [Row("ZenFlowAdamW.step()", samples["ZenFlowAdamW.step()"])]
    if engine is not None:
        engine.close()
        overhead = Samples(
            [
                a - b
                for a, b in zip(samples["ZenFlowAdamW.step()"].seconds, samples["engine"].seconds)
            ]
        )
        rows += [
            Row("zenflow._C.Engine.step() (same gradients)", samples["engine"]),
            Row("optimizer layer overhead (step - engine, per round)", overhead, compare=False),
        ]
    if hook is not None:
        rows.append(Row("overlap_backward hooks of one backward pass", hook_samples, compare=False))
    rows.append(
        Row("torch AdamW(fused=True).step() (the math included)", samples["peer"], peer=True)
    )
    return Section(
        title=(
            f"Optimizer layer overhead, {config.tensors} tensors ({config.tiny_dtype}; "
            f"[{config.tiny_rows}, {config.tiny_cols}] matrices, every third a [{config.tiny_rows}] bias)"
        ),
        rows=rows,
        headline="median",
        note="The math is negligible at these sizes: the times are bookkeeping and conversion. "
        "Target: the optimizer layer's own cost under 1 ms at 300 tensors.",
    )


def _twin_engine(params: list, bucket_bytes: int):
    """A zenflow._C.Engine of ZenFlowAdamW's default configuration over copies of `params`,
    or None where this build's Python configuration layer has another shape (the contract
    work of issue 27 reshapes it): the engine row is then left out."""
    try:
        from zenflow.config import ENGINE_DEFAULTS, engine_config

        settings = dict(ENGINE_DEFAULTS, bucket_bytes=bucket_bytes, auto_warm_up_rounds=0)
        config = engine_config(settings, (0.9, 0.999), 1e-8, "none")
    except (ImportError, TypeError, KeyError):
        return None
    twins = [p.detach().clone() for p in params]
    groups = [{"params": list(range(len(twins))), "lr": LR, "weight_decay": 1e-2}]
    return zenflow._C.Engine(twins, groups, config)


# ---- CPUAdamW at its defaults (bench_cpu_adamw.py --defaults) ----


def _defaults_model(shapes: list, dtype: torch.dtype, seed: int) -> list:
    gen = torch.Generator().manual_seed(seed)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.randn(shape, generator=gen).to(dtype))
        p.grad = torch.randn(shape, generator=gen).to(dtype)
        params.append(p)
    return params


def bench_defaults(
    cases: list, dtypes: list, reps: int, progress: Progress, shipped_only: bool = False
) -> list[Section]:
    """CPUAdamW() against AdamW(fused=True), both at their defaults (lr aside). Separate
    interleaved pairs, each against its own fused run (a pause of torch's OpenMP workers also
    costs torch's next parallel region, so variants must not share a loop): CPUAdamW as
    shipped (its regions on torch's OpenMP team), and on zenflow's own threads with the
    OpenMP pause from 8M elements, and without it."""
    from zenflow import _omp

    shipped = zenflow.host_threads()
    variants = (
        (f"zenflow.CPUAdamW() as shipped (host_threads={shipped!r})", shipped, True),
        ("zenflow's own threads, OpenMP pause from 8M elements", "zenflow", True),
        ("zenflow's own threads, OpenMP pause off", "zenflow", False),
    )
    if shipped_only:
        variants = variants[:1]
    sections = []
    for label, shapes in cases:
        n = sum(int(torch.Size(s).numel()) for s in shapes)
        for dtype in dtypes:
            ours = zenflow.CPUAdamW(_defaults_model(shapes, dtype, 1), lr=LR)
            fused = torch.optim.AdamW(_defaults_model(shapes, dtype, 1), lr=LR, fused=True)
            element = torch.tensor([], dtype=dtype).element_size()
            ours_bytes = (28 if element == 4 else 28 + element) * n
            for name, source, pause in variants:
                zenflow.set_host_threads(source)
                _omp.set_enabled(pause)
                try:
                    progress.start(f"{label} {dtype}: {name}", reps)
                    samples = interleave(
                        {name: ours.step, "fused": fused.step}, reps, progress=progress
                    )
                    progress.close()
                finally:
                    zenflow.set_host_threads(shipped)
                    _omp.set_enabled(True)
                sections.append(
                    Section(
                        title=f"{name}, {label}, {str(dtype).replace('torch.', '')}",
                        rows=[
                            Row(name, samples[name], ours_bytes),
                            Row(
                                "torch AdamW(fused=True)",
                                samples["fused"],
                                7 * element * n,
                                peer=True,
                            ),
                        ],
                        headline="median",
                        note="CPUAdamW and fused AdamW at their defaults, nothing set (OMP_WAIT_POLICY="
                        f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}): the drop-in question.",
                    )
                )
            del ours, fused
            gc.collect()
    return sections


def run(config: OptimizerConfig, progress: Progress) -> list[Section]:
    sections: list[Section] = []
    if "step" in config.cases:
        sections += bench_step_time(config, progress)
    if "overhead" in config.cases and config.device == "cpu":
        sections.append(bench_overhead(config, progress))
    return sections
