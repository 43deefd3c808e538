"""Data-parallel ZenFlowAdamW on torch.distributed (gloo, CPU, spawned processes).

Every data-parallel run is compared with a single-process run of the same global batch in
this (the parent) process: rank r of N sees rows [r*B/N, (r+1)*B/N) of each batch and takes
the mean loss over them, the single process sees the whole batch. They follow the same
trajectory up to float32 reduction order. The children send their results back through
files in tmp_path; a child that raises, or hangs past the join timeout, fails the test.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import os
import socket
import sys
import time
import traceback
from datetime import timedelta

import pytest
import torch
import torch.multiprocessing as mp

import zenflow

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed is not available"
)

BATCH = 12  # divisible by 2 and 3: every rank's share has the same size
IN, HIDDEN, OUT = 40, 64, 8
JOIN_TIMEOUT_S = 150
TOLERANCE = {"rtol": 1e-4, "atol": 2e-5}

# Settings of the runs: a re-selection every 4 steps (windows of 2), clipping that bites
# (the gradient norm is well above 0.05), the overlapped host update, windows from step 1
# (no start detection: test_the_start_detection_decides_the_same_on_every_rank has it).
FIXED = dict(
    lr=1e-2,
    weight_decay=0.01,
    topk_ratio=0.1,
    update_interval=2,
    select_strategy="step",
    select_interval=4,
    overlap_step=True,
    max_grad_norm=0.05,
    num_threads=1,
    auto_warm_up_rounds=0,
)
AUTO = dict(FIXED, update_interval="auto", max_update_interval=3)


# Where a child's model and batches live: the CPU (gloo), or in an NCCL group the rank's GPU
# (set by _child). The parent's references always run on the CPU.
_DEVICE = torch.device("cpu")

# The process groups a multi-rank test runs over: gloo on CPU parameters everywhere, and the
# same test with NCCL on one GPU per rank where there are two (benchmarks/device/check.sh runs
# `pytest -m gpu`; NCCL refuses two ranks on one GPU).
_NCCL_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and torch.cuda.device_count() >= 2),
        reason="NCCL data parallel needs two GPUs",
    ),
]
BACKENDS = pytest.mark.parametrize("backend", ["gloo", pytest.param("nccl", marks=_NCCL_MARKS)])


def _model(weights: list | None = None) -> torch.nn.Module:
    """The model, with `weights` when given (a checkpoint holds the model's weights beside the
    optimizer's state: fp32 weights are their own master)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT)
    )
    if weights is not None:
        with torch.no_grad():
            for p, w in zip(model.parameters(), weights):
                p.copy_(w)
    return model.to(_DEVICE)


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, IN, generator=generator)
    y = torch.randn(BATCH, OUT, generator=generator)
    return x.to(_DEVICE), y.to(_DEVICE)


# The continuations change weight_decay before this step: the optimizer rebuilds its engine,
# carrying the (in data parallel: consolidated) state over.
REBUILD_STEP = 8


def _train(model, opt, steps: range, rank: int = 0, world_size: int = 1, overlap: bool = False):
    """Trains on `steps` (this rank's share of each global batch); returns the parameters
    after every step."""
    handle = opt.overlap_backward(model) if overlap else None
    trajectory = []
    share = BATCH // world_size
    for step in steps:
        if step == REBUILD_STEP:
            opt.param_groups[0]["weight_decay"] = 0.02
        x, y = _batch(step)
        x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        trajectory.append([p.detach().clone() for p in model.parameters()])
    if handle is not None:
        handle.remove()
    return trajectory


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(
    rank: int, world_size: int, port: int, body: str, out: str, args: tuple, backend: str
) -> None:
    global _DEVICE
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    code = 0
    try:
        if backend == "nccl":
            _DEVICE = torch.device("cuda", rank)
            torch.cuda.set_device(_DEVICE)
        torch.distributed.init_process_group(
            backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
        )
        result = globals()[body](rank, world_size, *args)
        torch.save(result, os.path.join(out, f"rank{rank}.pt"))
        torch.distributed.barrier()  # every rank done before any tears its group down
    except BaseException:
        with open(os.path.join(out, f"rank{rank}.error"), "w") as f:
            f.write(traceback.format_exc())
        code = 1
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    # The result (or the error) is on disk. The interpreter's own finalization is skipped:
    # about one child in 30 to 60 aborted there with "terminate called without an active
    # exception" from torch's distributed teardown, after every step and the barrier had
    # completed, which would fail a test whose ranks all did their work.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _spawn(body: str, world_size: int, tmp_path, *args, backend: str = "gloo") -> list:
    """Runs globals()[body](rank, world_size, *args) in world_size processes over `backend`
    (nccl: rank r on GPU r); returns each rank's result, on the CPU. A child's exception
    fails the test with its traceback."""
    out = tmp_path / f"{body}-{world_size}-{backend}"
    out.mkdir()
    context = mp.get_context("spawn")
    port = _free_port()
    processes = [
        context.Process(target=_child, args=(r, world_size, port, body, str(out), args, backend))
        for r in range(world_size)
    ]
    for p in processes:
        p.start()
    for p in processes:
        p.join(JOIN_TIMEOUT_S)
    hung = [r for r, p in enumerate(processes) if p.is_alive()]
    for p in processes:
        if p.is_alive():
            p.kill()
            p.join()
    errors = [
        f"rank {r}:\n{(out / f'rank{r}.error').read_text()}"
        for r in range(world_size)
        if (out / f"rank{r}.error").exists()
    ]
    assert not errors, "\n".join(errors)
    assert not hung, f"ranks {hung} did not finish within {JOIN_TIMEOUT_S} s"
    assert all(p.exitcode == 0 for p in processes), [p.exitcode for p in processes]
    return [
        torch.load(out / f"rank{r}.pt", weights_only=False, map_location="cpu")
        for r in range(world_size)
    ]


# ---- the bodies the children run ----


def _train_and_save(
    rank: int, world_size: int, settings: dict, steps: int, overlap: bool, one_batch: bool = False
):
    model = _model()
    if rank != 0:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)  # construction must broadcast rank 0's parameters
    opt = zenflow.ZenFlowAdamW(model.parameters(), **settings)
    initial = [p.detach().clone() for p in model.parameters()]
    batches = [0] * steps if one_batch else range(steps)
    trajectory = _train(model, opt, batches, rank, world_size, overlap)
    return {
        "initial": initial,
        "trajectory": trajectory,
        "stats": opt.stats(),
        "state": opt.state_dict(),
        "shard": opt.sharded_state_dict(),
        "flushed": [p.detach().clone() for p in model.parameters()],
    }


def _load_and_train(
    rank: int, world_size: int, settings: dict, weights: list, shards: list, steps: range
):
    model = _model(weights)
    opt = zenflow.ZenFlowAdamW(model.parameters(), **settings)
    opt.load_sharded_state_dict(shards)
    loaded = opt.state_dict()
    trajectory = _train(model, opt, steps, rank, world_size)
    stats = opt.stats()
    return {"loaded": loaded, "trajectory": trajectory, "state": opt.state_dict(), "stats": stats}


def _failing_rank(rank: int, world_size: int, bad_rank: int, bad_step: int):
    model = _model()
    opt = zenflow.ZenFlowAdamW(model.parameters(), **FIXED)
    # GradScaler: refused on every rank, before any collective (each rank's scaler would see
    # only its own overflow).
    scaler = torch.amp.GradScaler("cpu")
    x, y = _batch(0)
    scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
    try:
        scaler.step(opt)
        scaler_error = None
    except ValueError as error:
        scaler_error = str(error)
    opt.zero_grad()
    for step in range(bad_step + 1):
        x, y = _batch(step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        if rank == bad_rank and step == bad_step:
            weight = model[0].weight
            # Same shape, not contiguous: the engine refuses this gradient.
            weight.grad = weight.grad.t().contiguous().t()
        try:
            opt.step()
        except Exception as error:  # the test inspects it
            return {
                "step": step,
                "type": type(error).__name__,
                "message": str(error),
                "scaler": scaler_error,
            }
        opt.zero_grad()
    return {"step": None, "scaler": scaler_error}


def _host_lane_fault(rank: int, world_size: int, fault_rank: int, fault_step: int):
    # The host lane of one rank fails in the background (as a real failure of the host work
    # would); every rank must raise within a few steps, then keep refusing, and never hang.
    model = _model()
    opt = zenflow.ZenFlowAdamW(model.parameters(), **FIXED)
    failure = None
    for step in range(fault_step + 8):
        x, y = _batch(step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        if rank == fault_rank and step == fault_step:
            opt._engine._inject_host_lane_fault("injected host lane fault")
        try:
            opt.step()
        except Exception as error:  # the test inspects it
            failure = {"step": step, "type": type(error).__name__, "message": str(error)}
            break
        opt.zero_grad()
    if failure is None:
        return {"step": None}
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    try:
        opt.step()
        failure["again"] = None
    except Exception as error:  # sticky: the next step fails too, on every rank
        failure["again"] = str(error)
    return failure


def _missing_gradient(rank: int, world_size: int, steps: int):
    """Rank 1 has no gradient for the last layer's weight at every step: once as None (the
    optimizer's zeros), once as explicit zeros. The engine reduces gradients in place, so a
    zeros buffer kept from one step to the next held the other ranks' sum after the first."""
    out = {}
    share = BATCH // world_size
    for mode in ("none", "zeros"):
        model = _model()
        opt = zenflow.ZenFlowAdamW(model.parameters(), **FIXED)
        for step in range(steps):
            x, y = _batch(step)
            x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
            torch.nn.functional.mse_loss(model(x), y).backward()
            if rank == 1:
                weight = model[2].weight
                weight.grad = None if mode == "none" else torch.zeros_like(weight)
            opt.step()
            opt.zero_grad()
        out[mode] = [p.detach().clone() for p in model.parameters()]
        # The ranks of this host share its cores: the engine's thread plan is per rank.
        out["ranks_per_host"] = opt._parallel.ranks_per_host
        out["plan"] = zenflow._C.engine_thread_plan(opt._engine_config((0.9, 0.999), 1e-8, "none"))
        opt.close()
    return out


def _checkpoint_mid_window(rank: int, world_size: int, steps: int):
    """The uninterrupted run; the run that calls state_dict() after each step; and, for each
    step, the run resumed from a checkpoint taken there (a new model and optimizer)."""
    share = BATCH // world_size

    def train(model, opt, step):
        x, y = _batch(step)
        x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    def run(save_every=False, resume_at=None):
        model = _model()
        opt = zenflow.ZenFlowAdamW(model.parameters(), **FIXED)
        out = []
        for step in range(steps):
            train(model, opt, step)
            if save_every:
                opt.state_dict()
            if step + 1 == resume_at:
                saved_model = copy.deepcopy(model.state_dict())
                saved_opt = copy.deepcopy(opt.state_dict())
                opt.close()
                model = _model([p + 1.0 for p in model.parameters()])
                opt = zenflow.ZenFlowAdamW(model.parameters(), **FIXED)
                model.load_state_dict(saved_model)
                opt.load_state_dict(saved_opt)
            out.append([p.detach().clone() for p in model.parameters()])
        opt.close()
        return out

    return {
        "uninterrupted": run(),
        "saved": run(save_every=True),
        "resumed": {at: run(resume_at=at) for at in (1, 2, 3)},
    }


def _timed(call) -> tuple[float, str | None]:
    started = time.monotonic()
    try:
        call()
        return time.monotonic() - started, None
    except Exception as error:  # the test inspects it
        return time.monotonic() - started, f"{type(error).__name__}: {error}"


def _failure_at_each_entry(rank: int, world_size: int):
    """For each entry point, a fresh optimizer; rank 1 fails (its host lane, or a state it
    cannot load), and every rank makes the call until it raises: all must raise in the same
    call, promptly (the group's timeout is 60 s: a rank left waiting would take that long)."""
    share = BATCH // world_size
    results = {}

    def train_step(model, opt, step):
        x, y = _batch(step)
        x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    entries = (
        "step",
        "split",
        "flush",
        "state_dict",
        "load_state_dict",
        "rebuild",
        "betas",
        "split_betas",
    )
    for entry in entries:
        model = _model()
        split = entry.startswith("split")
        # split: backward reduces a bucket per parameter; a refusal at step() joins the rest
        opt = zenflow.ZenFlowAdamW(
            model.parameters(), **{**FIXED, "bucket_bytes": 1 if split else 64 << 20}
        )
        if split:
            opt.overlap_backward(model)
        for step in range(2):
            train_step(model, opt, step)
        saved = opt.state_dict()
        before = [p.detach().clone() for p in model.parameters()]
        attempts = []
        if entry == "load_state_dict":
            state = copy.deepcopy(saved)
            if rank == 1:
                # another model's shape
                state["state"][0]["exp_avg"] = torch.zeros(3, 3, device=_DEVICE)
            attempts.append(_timed(functools.partial(opt.load_state_dict, state)))
        elif entry == "rebuild":
            if rank == 1:  # a setting fixed at the engine's creation, changed on one rank only
                opt.param_groups[0]["zenflow"] = False
            attempts.append(_timed(functools.partial(train_step, model, opt, 2)))
        elif entry in ("betas", "split_betas"):
            if rank == 1:  # a scheduler's bad value, on one rank: refused before the engine
                opt.param_groups[0]["betas"] = (1.0, 0.999)
            attempts.append(_timed(functools.partial(train_step, model, opt, 2)))
        else:
            if rank == 1:
                opt._engine._inject_host_lane_fault("rank one's host lane")
            train_step(model, opt, 2)  # its host work meets the fault, in the background
            call = {
                "step": functools.partial(train_step, model, opt, 3),
                "split": functools.partial(train_step, model, opt, 3),
                "flush": opt.flush,
                "state_dict": opt.state_dict,
            }[entry]
            for _ in range(6):
                attempts.append(_timed(call))
                if attempts[-1][1] is not None:
                    break
        changed = entry in ("load_state_dict", "rebuild", "betas", "split_betas") and any(
            not torch.equal(p.detach(), b) for p, b in zip(model.parameters(), before)
        )
        results[entry] = {"attempts": attempts, "changed": changed}
        opt.zero_grad()
        opt.close()
    return results


def _cuda_ranks(rank: int, world_size: int, steps: int):
    # CUDA parameters on one GPU shared by the ranks, over gloo (its collectives through host
    # copies): the engine's CUDA backend in data parallel, on the stream order it promises
    # (a bucket per parameter: each reduced during backward on the engine's reduction stream).
    model = _model().cuda()
    opt = zenflow.ZenFlowAdamW(model.parameters(), **{**FIXED, "bucket_bytes": 1})
    trajectory = []
    share = BATCH // world_size
    handle = opt.overlap_backward(model)
    for step in range(steps):
        x, y = _batch(step)
        x, y = (
            x[rank * share : (rank + 1) * share].cuda(),
            y[rank * share : (rank + 1) * share].cuda(),
        )
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        trajectory.append([p.detach().cpu() for p in model.parameters()])
    handle.remove()
    return {"trajectory": trajectory, "state": opt.state_dict(), "stats": opt.stats()}


def _ddp_no_sync(rank: int, world_size: int, steps: int):
    # A model kept wrapped in DDP, every backward under no_sync (DDP reduces nothing, zenflow
    # once), against the same model unwrapped: the same parameters, bit for bit.
    out = {}
    for wrapped in (False, True):
        model = _model()
        opt = zenflow.ZenFlowAdamW(model.parameters(), **FIXED)
        ddp = torch.nn.parallel.DistributedDataParallel(model) if wrapped else model
        share = BATCH // world_size
        for step in range(steps):
            x, y = _batch(step)
            x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
            context = ddp.no_sync() if wrapped else contextlib.nullcontext()
            with context:
                torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()
        out[wrapped] = [p.detach().clone() for p in model.parameters()]
    return out


def _shared_weights_overlap(rank: int, world_size: int, steps: int):
    # A layer applied twice (its gradient arrives twice in one backward), with and without
    # overlap_backward (bucket_bytes=1: every arrival submitted at once, so the second one
    # makes the engine retake the step whole); rank 1 alone uses it twice in odd steps, so
    # the ranks take different paths to the same step.
    out = {}
    for overlap in (False, True):
        torch.manual_seed(0)
        shared = torch.nn.Linear(IN, IN)
        head = torch.nn.Linear(IN, OUT)
        params = [*shared.parameters(), *head.parameters()]
        opt = zenflow.ZenFlowAdamW(params, **{**FIXED, "bucket_bytes": 1})
        if overlap:
            opt.overlap_backward()
        share = BATCH // world_size
        for step in range(steps):
            x, y = _batch(step)
            x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
            h = torch.tanh(shared(x))
            if rank == 1 and step % 2 == 1:
                h = torch.tanh(shared(h))
            torch.nn.functional.mse_loss(head(h), y).backward()
            opt.step()
            opt.zero_grad()
        out[overlap] = [p.detach().clone() for p in params]
        opt.close()
    return out


def _in_backward_reductions(rank: int, world_size: int, steps: int):
    """overlap_backward with a bucket per parameter (each reduced during backward, in one
    order on every rank), against plain steps: (1) every rank's backward hands its gradients
    over; (2) the last rank's hands nothing over at odd steps (its loss skips the model: the
    optimizer's zeros, a plain step that meets the others' split step); (3) rank 0 runs a
    second backward in step 2 after its buckets were reduced: every rank refuses that step, at
    once, and the next steps run on."""
    share = BATCH // world_size
    settings = {**FIXED, "bucket_bytes": 1}
    out = {}

    def run(case: str, overlap: bool):
        model = _model()
        opt = zenflow.ZenFlowAdamW(model.parameters(), **settings)
        if overlap:
            opt.overlap_backward(model)
        errors, reduced_before_step = [], 0
        for step in range(steps):
            x, y = _batch(step)
            x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
            idle = case == "idle" and rank == world_size - 1 and step % 2 == 1
            if not idle:
                torch.nn.functional.mse_loss(model(x), y).backward()
            if case == "late" and rank == 0 and step == 2:
                torch.nn.functional.mse_loss(model(x), y).backward()
            last = model[2].weight.grad
            if overlap and last is not None and not idle:
                # its bucket came first in backward: reduced in place before step()
                local = last.clone()
                reduced_before_step += int(
                    step > 0 and not torch.equal(local, _local_grad(model, x, y))
                )
            started = time.monotonic()
            try:
                opt.step()
                errors.append(None)
            except ValueError as error:
                errors.append((str(error), time.monotonic() - started))
            opt.zero_grad()
        params = [p.detach().clone() for p in model.parameters()]
        opt.close()
        return params, errors, reduced_before_step

    for case in ("all", "idle", "late"):
        out[case] = {"plain": run(case, False), "overlap": run(case, True)}
    return out


def _release_gradients(rank: int, world_size: int, steps: int, dtype: torch.dtype):
    """overlap_backward with and without release_gradients (a bucket per matrix, clipping):
    the weights after each step, and per step the most gradient bytes alive at once (seen by
    a hook before the engine's) and whether the step selected."""
    share = BATCH // world_size
    settings = {**FIXED, "bucket_bytes": 1, "max_grad_norm": 0.5}
    out = {}
    for release in (False, True):
        model = _model().to(dtype)
        opt = zenflow.ZenFlowAdamW(model.parameters(), release_gradients=release, **settings)
        params = list(model.parameters())
        peaks: list[int] = []

        def seen(_param, params=params, peaks=peaks):
            live = sum(q.grad.numel() * q.grad.element_size() for q in params if q.grad is not None)
            peaks[-1] = max(peaks[-1], live)

        for p in params:
            p.register_post_accumulate_grad_hook(seen)
        opt.overlap_backward(model)
        trajectory, selected = [], []
        for step in range(steps):
            peaks.append(0)
            x, y = _batch(step)
            x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
            loss = torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y)
            (opt.scale_loss(loss) if dtype == torch.float16 else loss).backward()
            before = opt.stats()["reselections"]
            opt.step()
            selected.append(step == 0 or opt.stats()["reselections"] > before)
            opt.zero_grad()
            trajectory.append([p.detach().clone() for p in params])
        sizes = [p.numel() * p.element_size() for p in params]
        out[release] = {
            "trajectory": trajectory,
            "peaks": peaks,
            "selected": selected,
            "largest_matrix": max(s for p, s in zip(params, sizes) if p.dim() >= 2),
            "dense": sum(s for p, s in zip(params, sizes) if p.dim() < 2),
            "total": sum(sizes),
        }
        opt.close()
    return out


def _local_grad(model, x, y):
    """This rank's own gradient of the last weight (a fresh backward on a copy)."""
    clone = copy.deepcopy(model)
    clone.zero_grad()
    torch.nn.functional.mse_loss(clone(x), y).backward()
    return clone[2].weight.grad


def _added_group(rank: int, world_size: int, steps: int, add_at: int):
    # A parameter group added mid-run (its parameters differ by rank: the optimizer broadcasts
    # rank 0's): the engine is rebuilt with the consolidated state, on every rank alike.
    model = _model()
    first, second = list(model[0].parameters()), list(model[2].parameters())
    opt = zenflow.ZenFlowAdamW(first, **FIXED)
    trajectory = []
    share = BATCH // world_size
    for step in range(steps):
        if step == add_at:
            if rank != 0:
                with torch.no_grad():
                    for p in second:
                        p.add_(0.5)  # the group's rank-0 parameters must win
            opt.add_param_group({"params": second, "lr": 2e-3})
        x, y = _batch(step)
        if world_size > 1:
            x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        model.zero_grad()  # the group not yet added too: no gradient piles up before it joins
        trajectory.append([p.detach().clone() for p in model.parameters()])
    return {"trajectory": trajectory, "state": opt.state_dict()}


def _low_precision(rank: int, world_size: int, no_gradient_step: int):
    """bf16 and fp16 (the engine's dynamic loss scaling) models; rank 1 has no gradient at
    all in one step. Returns each model's weights and step counts, with plain steps and under
    overlap_backward (a bucket per parameter, reduced during backward)."""
    out = {}
    for dtype, overlap in itertools.product((torch.bfloat16, torch.float16), (False, True)):
        model = _model().to(dtype)
        opt = zenflow.ZenFlowAdamW(model.parameters(), **{**FIXED, "bucket_bytes": 1})
        if overlap:
            opt.overlap_backward(model)
        share = BATCH // world_size
        steps = []
        for step in range(2 * no_gradient_step):
            x, y = (t[rank * share : (rank + 1) * share].to(dtype) for t in _batch(step))
            loss = torch.nn.functional.mse_loss(model(x).float(), y.float())
            scaled = opt.scale_loss(loss)
            if not (rank == 1 and step == no_gradient_step):
                scaled.backward()
            opt.step()
            opt.zero_grad()
            steps.append(opt.stats()["steps"])
        opt.flush()
        out[str(dtype) + (" overlap" if overlap else "")] = {
            "weights": [p.detach().clone() for p in model.parameters()],
            "steps": steps,
            "loss_scale": opt.loss_scale,
        }
        opt.close()
    return out


# ---- the tests ----


def _collectives_in_pieces(rank: int, world_size: int, piece_bytes: int):
    """The gloo collectives of one engine (distributed._EngineCollectives), each run whole and
    in pieces of `piece_bytes` over the same inputs; returns both results of each. The values
    are small integers, so any order of summation gives the same bits."""
    from types import SimpleNamespace

    import zenflow.distributed as zdist

    parallel = SimpleNamespace(
        group=torch.distributed.group.WORLD, world_size=world_size, device=_DEVICE, staged=False
    )
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        size = dtype.itemsize
        count = 1237  # a prime: no piece size divides it
        memory = torch.zeros(4 * count * world_size * size, dtype=torch.uint8)
        collectives = zdist._EngineCollectives(parallel)
        collectives.attach(memory)
        base = memory.data_ptr()
        generator = torch.Generator().manual_seed(rank)
        data = torch.randint(-50, 50, (count * world_size,), generator=generator).to(dtype)
        name = str(dtype).removeprefix("torch.")
        out = {}
        for pieces in (None, piece_bytes):
            collectives._piece_bytes = pieces
            view = memory.view(dtype)
            view.fill_(float("nan"))  # poison: every output element must be written
            view[: count * world_size] = data
            collectives.all_reduce_sum(base, count * world_size, name, 0)
            reduced = view[: count * world_size].clone()
            view[: count * world_size] = data
            scattered_at = base + count * world_size * size
            collectives.reduce_scatter_sum(base, scattered_at, count, name, 0)
            scattered = view[count * world_size : count * world_size + count].clone()
            gathered_at = base + 2 * count * world_size * size
            collectives.all_gather(scattered_at, gathered_at, count, name, 0)
            gathered = view[2 * count * world_size : 3 * count * world_size].clone()
            out["pieces" if pieces else "whole"] = (reduced, scattered, gathered)
        results[name] = out
    return results


def _assert_trajectories(got: list, want: list, what: str) -> None:
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g, w)):
            torch.testing.assert_close(
                a,
                b,
                **TOLERANCE,
                msg=lambda m, where=f"{what} step {step} param {i}": f"{where}: {m}",
            )


def _assert_states(got: dict, want: dict, what: str) -> None:
    assert got["zenflow"]["schedule"] == want["zenflow"]["schedule"], what
    assert got["state"].keys() == want["state"].keys(), what
    for index, entry in want["state"].items():
        assert got["state"][index].keys() == entry.keys(), (what, index)
        for key, value in entry.items():
            if key == "selected":
                assert torch.equal(got["state"][index][key], value), (what, index, key)
            else:
                torch.testing.assert_close(
                    got["state"][index][key].float(),
                    value.float(),
                    **TOLERANCE,
                    msg=lambda m, where=f"{what}[{index}][{key}]": f"{where}: {m}",
                )


def _reference(
    settings: dict,
    steps: range,
    state: dict | None = None,
    weights: list | None = None,
    overlap: bool = False,
):
    model = _model(weights)
    opt = zenflow.ZenFlowAdamW(model.parameters(), limit_torch_threads=False, **settings)
    if state is not None:
        opt.load_state_dict(state)
    trajectory = _train(model, opt, steps, overlap=overlap)
    return model, opt, trajectory


@BACKENDS
def test_the_start_detection_decides_the_same_on_every_rank(tmp_path, backend):
    """auto_warm_up_rounds over 2 ranks: each rank's moments cover its columns, their sums are
    all-reduced, and every rank takes the single process's decision and trajectory, both when
    the gradients read as noise (a fresh batch every step: the start ends after the probe)
    and when they are consistent (one batch every step: it runs to auto_warm_up_rounds)."""
    steps = 14
    settings = dict(FIXED, auto_warm_up_rounds=12)
    for one_batch, length in ((False, 8), (True, 12)):
        batches = [0] * steps if one_batch else range(steps)
        ref_model, ref_opt, ref_trajectory = _reference(settings, batches, overlap=True)
        assert ref_opt.stats()["synchronous_start_steps"] == length, ref_opt.stats()
        folder = tmp_path / f"one_batch_{one_batch}"
        folder.mkdir()
        ranks = _spawn(
            "_train_and_save", 2, folder, settings, steps, True, one_batch, backend=backend
        )
        for rank, result in enumerate(ranks):
            assert result["stats"]["synchronous_start_steps"] == length, f"rank {rank}"
            _assert_trajectories(result["trajectory"], ref_trajectory, f"rank {rank}")


def test_matches_single_process_and_checkpoints_across_world_sizes(tmp_path):
    """2 ranks (fixed windows, overlap_backward) against one process; their shards load into
    3 ranks (auto windows) and into one process, which continue as the single process."""
    first, second = 6, range(6, 10)
    ref_model, ref_opt, ref_trajectory = _reference(FIXED, range(first), overlap=True)
    ref_state = ref_opt.state_dict()  # flushes: the weights are exact
    ref_weights = [p.detach().clone() for p in ref_model.parameters()]
    ref_stats = ref_opt.stats()
    assert ref_stats["reselections"] >= 1 and ref_stats["last_global_norm"] > FIXED["max_grad_norm"]

    two = _spawn("_train_and_save", 2, tmp_path, FIXED, first, True)
    for rank, result in enumerate(two):
        for a, b in zip(result["initial"], two[0]["initial"]):
            assert torch.equal(a, b), f"rank {rank} did not start from rank 0's parameters"
        _assert_trajectories(result["trajectory"], ref_trajectory, f"rank {rank}")
        _assert_states(result["state"], ref_state, f"rank {rank} state_dict")
        stats = result["stats"]
        assert stats["reselections"] == ref_stats["reselections"]
        assert stats["windows"] == ref_stats["windows"]
        assert stats["collective_bytes_statistics"] > 0
        assert stats["collective_bytes_gradients"] > 0
        assert stats["collective_bytes_upload"] > 0
        # Each rank moves only its own deferred columns: about half of one engine's bytes.
        assert 0 < stats["bytes_down"] < ref_stats["bytes_down"]
        assert 0 < stats["host_state_bytes"] < ref_stats["host_state_bytes"]
    # The consolidated state is the same bits on every rank, the selection included.
    _assert_states(two[1]["state"], two[0]["state"], "rank 1 against rank 0")
    for index, entry in two[0]["state"]["state"].items():
        for key, value in entry.items():
            assert torch.equal(two[1]["state"]["state"][index][key], value), (index, key)
    shards = [result["shard"] for result in two]
    assert [s["zenflow"]["shard"]["rank"] for s in shards] == [0, 1]
    assert "selected" in shards[0]["state"][0] and "selected" not in shards[1]["state"][0]
    assert shards[0]["state"][0]["master"].shape == (HIDDEN, IN // 2)
    assert 1 not in shards[1]["state"]  # a bias (dense): rank 0's alone
    consolidated = zenflow.ZenFlowAdamW.consolidate_sharded_state_dict(shards[::-1])
    _assert_states(consolidated, two[0]["state"], "consolidated shards")
    with pytest.raises(ValueError, match="missing rank"):
        zenflow.ZenFlowAdamW.consolidate_sharded_state_dict(shards[:1])
    with pytest.raises(ValueError, match="appears twice"):
        zenflow.ZenFlowAdamW.consolidate_sharded_state_dict([shards[0], shards[0]])
    with pytest.raises(ValueError, match="not a ZenFlowAdamW.sharded_state_dict"):
        zenflow.ZenFlowAdamW.consolidate_sharded_state_dict([two[0]["state"], shards[1]])
    cut = {**shards[1], "state": dict(shards[1]["state"])}
    cut["state"][0] = {**cut["state"][0], "exp_avg": cut["state"][0]["exp_avg"][:, 1:]}
    with pytest.raises(ValueError, match="expected shape"):
        zenflow.ZenFlowAdamW.consolidate_sharded_state_dict([shards[0], cut])

    # The continuation: one process from the single run's state, with auto windows.
    _, _, ref_next = _reference(AUTO, second, state=ref_state, weights=ref_weights)
    # 2 -> 1: the 2-rank shards (and rank 0's weights) into a single process.
    weights = two[0]["flushed"]
    model = _model(weights)
    opt = zenflow.ZenFlowAdamW(model.parameters(), limit_torch_threads=False, **AUTO)
    opt.load_sharded_state_dict(shards)
    _assert_trajectories(_train(model, opt, second), ref_next, "2 -> 1")
    # 2 -> 3: the same shards into three ranks.
    three = _spawn("_load_and_train", 3, tmp_path, AUTO, weights, shards, second)
    for rank, result in enumerate(three):
        _assert_states(result["loaded"], ref_state, f"3 ranks, rank {rank}, loaded")
        _assert_trajectories(result["trajectory"], ref_next, f"3 ranks, rank {rank}")
        assert result["stats"]["reselections"] >= 1  # on 3 ranks too
    _assert_states(three[0]["state"], opt.state_dict(), "3 ranks against 1")


def test_a_failing_rank_fails_every_rank(tmp_path):
    results = _spawn("_failing_rank", 2, tmp_path, 1, 2)
    for rank, result in enumerate(results):
        assert result["step"] == 2, f"rank {rank} did not fail at the bad step: {result}"
    assert "contiguous" in results[1]["message"], results[1]
    for result in results:
        assert result["scaler"] is not None and "GradScaler" in result["scaler"], result
    assert results[0]["type"] == "ValueError"
    assert "rank(s) 1 of 2 failed" in results[0]["message"], results[0]


def test_a_host_lane_failure_on_one_rank_fails_every_rank(tmp_path):
    results = _spawn("_host_lane_fault", 3, tmp_path, 1, 3)
    steps = {result["step"] for result in results}
    assert len(steps) == 1 and None not in steps, results
    assert 3 <= steps.pop() <= 3 + 6, results  # found at a later agreement, within a few steps
    assert "injected host lane fault" in results[1]["message"], results[1]
    for rank in (0, 2):
        assert results[rank]["type"] == "ValueError", results[rank]
        assert "rank(s) 1 of 3 failed" in results[rank]["message"], results[rank]
    for result in results:
        assert result["again"] is not None and "refuses steps" in result["again"], result


@BACKENDS
def test_a_rank_without_a_gradient_steps_with_zeros_every_step(tmp_path, backend):
    results = _spawn("_missing_gradient", 2, tmp_path, 4, backend=backend)
    for rank, result in enumerate(results):
        for i, (a, b) in enumerate(zip(result["none"], result["zeros"])):
            assert torch.equal(a, b), f"rank {rank}, param {i}: None differs from explicit zeros"
    for a, b in zip(results[0]["none"], results[1]["none"]):
        assert torch.equal(a, b), "the ranks differ"
    cores = zenflow.info()["host_cpus"]
    for result in results:
        assert result["ranks_per_host"] == 2
        assert result["plan"]["cores"] == max(1, cores // 2)


@BACKENDS
def test_a_checkpoint_changes_nothing_and_two_ranks_resume_bit_for_bit(tmp_path, backend):
    """FIXED has windows of 2 and re-selections every 4 steps: saves after steps 1, 2 and 3
    fall at every position of a window, with and without a pending host result."""
    results = _spawn("_checkpoint_mid_window", 2, tmp_path, 6, backend=backend)
    for rank, result in enumerate(results):
        want = result["uninterrupted"]
        for what, got in [("state_dict() every step", result["saved"])] + [
            (f"resumed after step {at}", run) for at, run in result["resumed"].items()
        ]:
            for step, (a, b) in enumerate(zip(want, got)):
                for i, (x, y) in enumerate(zip(a, b)):
                    assert torch.equal(x, y), (
                        f"rank {rank}, {what}: param {i} after step {step + 1}"
                    )


@BACKENDS
def test_a_failure_on_one_rank_at_any_entry_point_fails_every_rank_at_once(tmp_path, backend):
    results = _spawn("_failure_at_each_entry", 2, tmp_path, backend=backend)
    for entry in results[0]:
        per_rank = [r[entry]["attempts"] for r in results]
        assert len(per_rank[0]) == len(per_rank[1]), f"{entry}: the ranks raised at different calls"
        for rank, attempts in enumerate(per_rank):
            seconds, error = attempts[-1]
            assert error is not None, f"{entry}: rank {rank} never raised"
            assert seconds < 1.0, f"{entry}: rank {rank} took {seconds:.1f} s to raise"
            assert all(e is None for _, e in attempts[:-1])
        _, other = per_rank[0][-1]
        if entry == "rebuild":
            for _, error in (per_rank[0][-1], per_rank[1][-1]):
                assert "every rank must make the same engine calls" in error, error
        elif entry in ("load_state_dict", "betas", "split_betas"):
            assert ("shape" if entry == "load_state_dict" else "beta1") in per_rank[1][-1][1]
            assert "rank(s) 1 of 2 failed" in other, other
        else:
            assert "rank one's host lane" in per_rank[1][-1][1], per_rank[1][-1]
            assert "rank(s) 1 of 2 failed" in other, other
        for rank in range(2):
            assert not results[rank][entry]["changed"], f"{entry}: rank {rank} changed its weights"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_ranks_sharing_one_gpu_match_one_cpu_process(tmp_path):
    steps = 8
    results = _spawn("_cuda_ranks", 2, tmp_path, steps)
    _, _, want = _reference(FIXED, range(steps))
    for step in range(steps):
        for a, b in zip(results[0]["trajectory"][step], results[1]["trajectory"][step]):
            assert torch.equal(a, b), f"step {step}: the ranks' parameters differ"
    _assert_trajectories(results[0]["trajectory"], want, "2 CUDA ranks against one CPU process")
    assert results[0]["stats"]["reselections"] == results[1]["stats"]["reselections"]


def test_a_ddp_wrapped_model_under_no_sync_is_reduced_once(tmp_path):
    results = _spawn("_ddp_no_sync", 2, tmp_path, 5)
    for rank, result in enumerate(results):
        for a, b in zip(result[True], result[False]):
            assert torch.equal(a, b), f"rank {rank}: DDP under no_sync differs from the plain model"
    for a, b in zip(results[0][True], results[1][True]):
        assert torch.equal(a, b), "the ranks differ"


def test_a_gradient_arriving_twice_on_one_rank_steps_as_autograd_accumulated(tmp_path):
    results = _spawn("_shared_weights_overlap", 2, tmp_path, 5)
    for rank, result in enumerate(results):
        for a, b in zip(result[False], result[True]):
            assert torch.equal(a, b), f"rank {rank}: overlap_backward differs from a plain step"
    for a, b in zip(results[0][True], results[1][True]):
        assert torch.equal(a, b), "the ranks differ"


@pytest.mark.parametrize(
    ("world_size", "backend"),
    [(2, "gloo"), (3, "gloo"), pytest.param(2, "nccl", marks=_NCCL_MARKS)],
)
def test_in_backward_reductions_match_plain_steps_and_refuse_a_late_gradient(
    tmp_path, world_size, backend
):
    results = _spawn("_in_backward_reductions", world_size, tmp_path, 5, backend=backend)
    for rank, result in enumerate(results):
        for case in ("all", "idle"):
            plain, overlap = result[case]["plain"], result[case]["overlap"]
            assert all(e is None for e in plain[1] + overlap[1]), (case, plain[1], overlap[1])
            for i, (a, b) in enumerate(zip(plain[0], overlap[0])):
                assert torch.equal(a, b), (
                    f"{case}: rank {rank}, param {i}: overlap differs from plain"
                )
        assert result["all"]["overlap"][2] >= 3, "nothing was reduced during backward"
        errors = result["late"]["overlap"][1]
        assert [e is None for e in errors] == [True, True, False, True, True], errors
        message, seconds = errors[2]
        assert seconds < 1.0, f"rank {rank} took {seconds:.1f} s to raise"
        if rank == 0:
            assert "grew after its bucket was reduced" in message, message
        else:
            assert f"rank(s) 0 of {world_size} failed" in message, message
    for case in ("all", "idle", "late"):
        for a, b in zip(results[0][case]["overlap"][0], results[-1][case]["overlap"][0]):
            assert torch.equal(a, b), f"{case}: the ranks differ"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_released_gradients_free_memory_in_backward_and_match_keeping_them(tmp_path, dtype):
    results = _spawn("_release_gradients", 2, tmp_path, 7, dtype)
    for rank, result in enumerate(results):
        kept, released = result[False], result[True]
        for step, (a, b) in enumerate(zip(kept["trajectory"], released["trajectory"])):
            for i, (x, y) in enumerate(zip(a, b)):
                assert torch.equal(x, y), f"rank {rank}, step {step}, param {i} differs"
        bound = released["largest_matrix"] + released["dense"]
        assert not all(released["selected"])
        for step, (peak, selected) in enumerate(zip(released["peaks"], released["selected"])):
            assert kept["peaks"][step] == kept["total"]
            assert peak == released["total"] if selected else peak <= bound, (rank, step, peak)
    for a, b in zip(results[0][True]["trajectory"][-1], results[1][True]["trajectory"][-1]):
        assert torch.equal(a, b), "the ranks differ"


def test_a_param_group_added_mid_run_matches_one_process(tmp_path):
    steps, add_at = 7, 3
    results = _spawn("_added_group", 2, tmp_path, steps, add_at)
    want = _added_group(0, 1, steps, add_at)
    for step in range(steps):
        for i, (a, b) in enumerate(zip(*(r["trajectory"][step] for r in results))):
            assert torch.equal(a, b), f"step {step} param {i}: the ranks differ"
    _assert_trajectories(results[0]["trajectory"], want["trajectory"], "add_param_group")
    _assert_states(results[0]["state"], want["state"], "state after add_param_group")


def test_low_precision_and_a_rank_without_gradients(tmp_path):
    """bf16 and fp16 parameters (fp16: the engine's dynamic loss scaling, agreed by all ranks)
    step in lockstep, also when one rank has no gradient in a step (it steps with zeros): the
    ranks' weights stay the same bits."""
    ranks = _spawn("_low_precision", 2, tmp_path, 3)
    for dtype, result in ranks[0].items():
        other = ranks[1][dtype]
        assert result["steps"] == other["steps"] == list(range(1, 7)), dtype
        assert result["loss_scale"] == other["loss_scale"], dtype
        for a, b in zip(result["weights"], other["weights"]):
            assert torch.equal(a, b), dtype
        plain = ranks[0][dtype.removesuffix(" overlap")]
        assert result["loss_scale"] == plain["loss_scale"], dtype
        for a, b in zip(result["weights"], plain["weights"]):
            assert torch.equal(a, b), f"{dtype}: differs from plain steps"
    assert ranks[0]["torch.float16"]["loss_scale"] > 1.0  # dynamic loss scaling was on


@pytest.mark.parametrize("world_size", [2, 3])
def test_gloo_collectives_in_pieces_match_whole_calls(tmp_path, world_size):
    """On gloo the engine's collectives are issued in pieces (bounded temporaries): each of
    the three, cut into pieces of 100 bytes (no piece size divides the count), gives the
    whole call's bits, and the whole call the sum of every rank's data."""
    ranks = _spawn("_collectives_in_pieces", world_size, tmp_path, 100)
    for name in ("float32", "bfloat16"):
        dtype = getattr(torch, name)
        count = 1237
        total = sum(
            torch.randint(
                -50, 50, (count * world_size,), generator=torch.Generator().manual_seed(r)
            )
            for r in range(world_size)
        ).to(dtype)
        for rank, result in enumerate(ranks):
            reduced, scattered, gathered = result[name]["whole"]
            assert torch.equal(reduced, total), (name, rank)
            assert torch.equal(scattered, total[rank * count : (rank + 1) * count]), (name, rank)
            assert torch.equal(gathered, total), (name, rank)
            for got, want, what in zip(result[name]["pieces"], result[name]["whole"], "rsg"):
                assert torch.equal(got, want), (name, rank, what)


def test_process_group_argument():
    model = _model()
    with pytest.raises(TypeError, match="process_group"):
        zenflow.ZenFlowAdamW(model.parameters(), process_group="gloo")
    # A single process (torch.distributed not initialised): a plain optimizer.
    assert not torch.distributed.is_initialized()
    opt = zenflow.ZenFlowAdamW(model.parameters(), limit_torch_threads=False, num_threads=1)
    assert opt._parallel is None
    _train(model, opt, range(2))
    stats = opt.stats()
    assert stats["collective_bytes_statistics"] == 0
    assert stats["collective_bytes_gradients"] == stats["collective_bytes_upload"] == 0
    shard = opt.sharded_state_dict()
    assert shard["zenflow"]["shard"]["world_size"] == 1
    _assert_states(
        zenflow.ZenFlowAdamW.consolidate_sharded_state_dict([shard]), opt.state_dict(), "one shard"
    )


def test_set_collectives_binding_checks_and_reports_callable_errors():
    """Engine.set_collectives in one process: bad arguments are refused, and an exception in
    a collective fails the engine's call with its text (the trampolines' error path)."""
    weight = torch.randn(16, 8)
    engine = zenflow._C.Engine([weight], [{"params": [0], "lr": 1e-3}], {"topk_ratio": 0.25})

    def unused(*args):
        raise AssertionError("not called")

    with pytest.raises(TypeError, match="all_gather"):
        engine.set_collectives(0, 2, unused, unused, None)
    with pytest.raises(ValueError, match="rank"):
        engine.set_collectives(2, 2, unused, unused, unused)
    with pytest.raises(ValueError, match="world_size"):
        engine.set_collectives(0, 0, unused, unused, unused)
    calls = []

    def failing(*args):
        calls.append(args)
        raise RuntimeError("link down 7")

    engine.set_collectives(0, 2, failing, failing, failing)
    size = engine.device_memory_size()
    raw = torch.empty(size + 256, dtype=torch.uint8)
    start = -raw.data_ptr() % 256
    memory = raw[start : start + size]
    engine.attach_device_memory(memory)
    before = weight.clone()
    with pytest.raises(RuntimeError, match="link down 7"):
        engine.step([torch.randn(16, 8)])
    address, count, dtype, stream = calls[0]
    assert memory.data_ptr() <= address < memory.data_ptr() + size and count > 0
    assert dtype in ("int32", "float32") and stream == 0
    assert torch.equal(weight, before)
    engine.close()
