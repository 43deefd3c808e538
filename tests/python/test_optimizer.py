"""zenflow.ZenFlowAdamW (the engine behind torch's optimizer interface) on CPU tensors.

* The exact cases (topk_ratio 1; everything on the host every step; warm-up covering the
  run) against torch.optim.AdamW for 30 steps, on an MLP and a transformer block, float32 and
  bfloat16, with two param groups, an lr scheduler and clipping.
* General configurations against the float64 reference (engine_reference.py), driven through
  the optimizer API (groups, dense groups, schedulers, clipping).
* The rest of the surface: zero_grad modes, overlap_backward and no_sync, checkpoints
  (torch.save, torch.distributed.checkpoint, another topk_ratio or thread count, a
  torch.optim.AdamW state, another model), configuration errors, loss scaling and
  GradScaler, robustness (failed backward, NaN gradient, interpreter exit), and a
  HuggingFace-style loop that only knows torch.optim.Optimizer.

Tolerances are test_engine.py's (documented there): fp32 weights within
t * (4 eps32 |w| + 64 eps32 lr) of the reference; bf16 weights within one bf16 ulp of the
reference rounded to bf16, plus that.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from engine_reference import ReferenceZenFlow

import zenflow

EPS32 = 2.0**-24
STEPS = 30


def fp32_tolerance(want, steps, lr_max):
    return steps * (4 * EPS32 * np.abs(want) + 64 * EPS32 * lr_max) + 1e-30


def assert_weights(got: torch.Tensor, want64: np.ndarray, steps: int, lr_max: float, what: str):
    want64 = np.asarray(want64, dtype=np.float64).reshape(tuple(got.shape))
    if got.dtype == torch.float32:
        tol = fp32_tolerance(want64, steps, lr_max)
        ref = want64
    else:
        ref = torch.from_numpy(want64).to(got.dtype).double().numpy()
        bits = {torch.bfloat16: 8, torch.float16: 11}[got.dtype]
        tol = 2.0 ** (1 - bits) * np.abs(ref) + fp32_tolerance(ref, steps, lr_max) + 2.0**-24
    err = np.abs(got.detach().double().numpy() - ref)
    assert np.all(err <= tol), (
        f"{what}: max error {err.max():.3g} above tolerance (at {np.argmax(err - tol)})"
    )


# ---- models ----


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(12, 23)
        self.norm = torch.nn.LayerNorm(23)
        self.fc2 = torch.nn.Linear(23, 7)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x))))


class Block(torch.nn.Module):
    """A pre-norm transformer block (attention + MLP) with a linear head."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(
            d_model=16, nhead=2, dim_feedforward=29, dropout=0.0, batch_first=True, norm_first=True
        )
        self.head = torch.nn.Linear(16, 7)

    def forward(self, x):
        return self.head(self.layer(x.view(x.shape[0], 3, 16)[:, :, :16]).mean(dim=1))


MODELS = {"mlp": (MLP, 12), "block": (Block, 48)}


def make_model(kind: str, dtype=torch.float32, seed=0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cls, _ = MODELS[kind]
    return cls().to(dtype)


def batch(kind: str, t: int, dtype=torch.float32, size=9):
    gen = torch.Generator().manual_seed(500 + t)
    features = MODELS[kind][1]
    x = torch.randn(size, features, generator=gen).to(dtype)
    y = torch.randn(size, 7, generator=gen).to(dtype)
    return x, y


def loss_of(model, x, y):
    return ((model(x).float() - y.float()) ** 2).mean()


def param_groups(model, **extra):
    """Matrices with weight decay, vectors without: the usual LLM split."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return [
        {"params": matrices, "weight_decay": 0.1, **extra},
        {"params": vectors, "weight_decay": 0.0, "lr": 2e-2, **extra},
    ]


def schedule(t):
    return 1.0 / (1.0 + 0.05 * t)


# ---- exact cases against torch.optim.AdamW ----

EXACT = {
    "topk_1": dict(topk_ratio=1.0, update_interval=3),
    "host_every_step": dict(topk_ratio=0.0, update_interval=1, overlap_step=False),
    "warm_up_covers_run": dict(topk_ratio=0.25, update_interval="auto", full_warm_up_rounds=STEPS),
}


@pytest.mark.parametrize("max_grad_norm", [None, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("case", sorted(EXACT))
def test_exact_cases_match_torch_adamw(case, kind, dtype, max_grad_norm):
    model = make_model(kind, dtype)
    # The reference: torch.optim.AdamW on float32 copies (the masters), fed our gradients.
    masters = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
    lookup = dict(zip(model.parameters(), masters))
    opt = zenflow.ZenFlowAdamW(
        param_groups(model), lr=1e-2, max_grad_norm=max_grad_norm, **EXACT[case]
    )
    ref_groups = [
        {
            **{k: v for k, v in g.items() if k != "params"},
            "params": [lookup[p] for p in g["params"]],
        }
        for g in param_groups(model)
    ]
    ref = torch.optim.AdamW(ref_groups, lr=1e-2, foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    ref_sched = torch.optim.lr_scheduler.LambdaLR(ref, schedule)
    params = list(model.parameters())
    for t in range(STEPS):
        loss_of(model, *batch(kind, t, dtype)).backward()
        for p, m in zip(params, masters):
            m.grad = p.grad.float().clone()  # a copy: the clip below must not touch ours
        if max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(masters, max_grad_norm, foreach=False)
        opt.step()
        ref.step()
        opt.zero_grad()
        sched.step()
        ref_sched.step()
        for i, (p, m) in enumerate(zip(params, masters)):
            assert_weights(
                p, m.detach().double().numpy(), t + 1, 2e-2, f"{case} step {t + 1} param {i}"
            )
        if max_grad_norm is not None:
            assert opt.stats()["last_global_norm"] == pytest.approx(norm.item(), rel=1e-5)


# ---- general configurations against the float64 reference ----

SHAPES = [(7, 13), (1, 17), (11, 1), (3, 5, 2), (5,), (), (4, 6)]
DENSE = {6}

GENERAL = {
    "overlap_fixed": dict(topk_ratio=0.3, update_interval=3),
    "no_overlap_reselect": dict(
        topk_ratio=0.2,
        update_interval=2,
        overlap_step=False,
        select_strategy="step",
        select_interval=4,
    ),
    "auto_interval_clipped": dict(
        topk_ratio=0.25, update_interval="auto", auto_ratio=0.5, max_grad_norm=2.0
    ),
    "window_score_warm_up": dict(
        topk_ratio=0.4,
        update_interval=2,
        full_warm_up_rounds=3,
        selection_score="window",
        select_strategy="step",
        select_interval=4,
    ),
}


def synthetic_gradients(t, dtype):
    gen = torch.Generator().manual_seed(2000 + t)
    out = []
    for s in SHAPES:
        g = torch.randn(s, generator=gen)
        if len(s) >= 2:
            view = g.view(s[0], -1)
            view[:, (3 * t) % view.shape[1]] *= 6.0  # moves the top-k set between selections
        out.append(g.to(dtype))
    return out


def synthetic_model(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in SHAPES]


def synthetic_groups(params):
    return [
        {"params": [params[i] for i in (0, 1, 4)], "lr": 1e-2, "weight_decay": 0.1},
        {"params": [params[i] for i in (2, 3, 5)], "lr": 2e-2, "weight_decay": 0.0},
        {"params": [params[6]], "lr": 1.5e-2, "weight_decay": 0.05, "zenflow": False},
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", sorted(GENERAL))
def test_general_configurations_match_the_reference(case, dtype):
    params = synthetic_model(dtype)
    opt = zenflow.ZenFlowAdamW(synthetic_groups(params), **GENERAL[case])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    ref_groups = [
        {"params": [0, 1, 4], "lr": 1e-2, "weight_decay": 0.1},
        {"params": [2, 3, 5], "lr": 2e-2, "weight_decay": 0.0},
        {"params": [6], "lr": 1.5e-2, "weight_decay": 0.05, "dense": True},
    ]
    ref = ReferenceZenFlow([p.detach() for p in params], ref_groups, GENERAL[case])
    # the engine orders parameters by group: map the reference's indices onto it
    order = [0, 1, 4, 2, 3, 5, 6]
    steps = 14
    for t in range(steps):
        grads = synthetic_gradients(t, dtype)
        for p, g in zip(params, grads):
            p.grad = g
        lrs = [g["lr"] for g in opt.param_groups]
        opt.step()
        ref.step(grads, lrs)
        sched.step()
        for i in order:
            assert_weights(params[i], ref.weights(i), t + 1, 3e-2, f"{case} step {t + 1} param {i}")
    stats = opt.stats()
    want = ref.stats()
    for key in ("steps", "windows", "reselections", "bytes_down", "bytes_up"):
        assert stats[key] == want[key], key
    opt.flush()
    ref.flush()
    for i in order:
        assert_weights(params[i], ref.weights(i), steps, 3e-2, f"{case} after flush, param {i}")


@pytest.mark.parametrize("overlap", [False, True])
def test_one_cycle_lr_with_momentum_cycling_matches_the_reference_and_never_flushes(overlap):
    """OneCycleLR changes lr and betas every step, and the loop changes weight decay and eps:
    the engine takes them at each step (a window's host update those of its last step, as
    the float64 reference does), the same engine runs throughout, and the windows close on
    schedule (no flush)."""
    config = dict(topk_ratio=0.3, update_interval=3, overlap_step=overlap)
    params = synthetic_model(torch.float32)
    opt = zenflow.ZenFlowAdamW(synthetic_groups(params), **config)
    steps = 14
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=[2e-2, 3e-2, 2e-2], total_steps=steps, base_momentum=0.8, max_momentum=0.95
    )
    ref_groups = [
        {"params": [0, 1, 4], "lr": 1e-2, "weight_decay": 0.1},
        {"params": [2, 3, 5], "lr": 2e-2, "weight_decay": 0.0},
        {"params": [6], "lr": 1.5e-2, "weight_decay": 0.05, "dense": True},
    ]
    ref = ReferenceZenFlow([p.detach() for p in params], ref_groups, config)
    engine = None
    betas_seen = set()
    for t in range(steps):
        for g, group in enumerate(opt.param_groups):
            group["weight_decay"] = ref_groups[g]["weight_decay"] * (1.0 + 0.1 * t)
            group["eps"] = 1e-8 * (1 + t)
        grads = synthetic_gradients(t, torch.float32)
        for p, g in zip(params, grads):
            p.grad = g
        group = opt.param_groups[0]
        ref.set_hyperparameters(
            group["betas"], group["eps"], [g["weight_decay"] for g in opt.param_groups]
        )
        betas_seen.add(tuple(group["betas"]))
        ref.step(grads, [g["lr"] for g in opt.param_groups])
        opt.step()
        engine = engine or opt._engine
        assert opt._engine is engine, "a hyper-parameter change built a new engine"
        sched.step()
        for i in range(len(params)):
            assert_weights(params[i], ref.weights(i), t + 1, 3e-2, f"step {t + 1} param {i}")
    assert len(betas_seen) >= steps - 1, "OneCycleLR did not cycle the momentum"
    stats = opt.stats()
    assert stats["windows"] == steps // 3 == ref.stats()["windows"]


def test_dense_group_is_plain_adamw():
    params = synthetic_model(torch.float32)
    twins = [p.detach().clone().requires_grad_() for p in params]
    opt = zenflow.ZenFlowAdamW([{"params": params, "zenflow": False}], lr=1e-2, topk_ratio=0.1)
    ref = torch.optim.AdamW(twins, lr=1e-2, foreach=False)
    for t in range(10):
        for p, q, g in zip(params, twins, synthetic_gradients(t, torch.float32)):
            p.grad, q.grad = g, g.clone()
        opt.step()
        ref.step()
    for p, q in zip(params, twins):
        assert_weights(p, q.detach().double().numpy(), 10, 1e-2, "dense")
    assert opt.stats()["bytes_down"] == 0


# ---- the rest of the surface ----


def train(model, opt, kind="mlp", steps=10, start=0, set_to_none=True, dtype=torch.float32):
    for t in range(start, start + steps):
        loss = loss_of(model, *batch(kind, t, dtype))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def assert_bitwise(a, b, what=""):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"{what} tensor {i} differs"


def state_tensors(sd):
    out = []
    for index in sorted(sd["state"]):
        for key in sorted(sd["state"][index]):
            out.append(sd["state"][index][key])
    return out


CONFIG = dict(topk_ratio=0.3, update_interval=3, overlap_step=True)


def test_zero_grad_modes_give_the_same_trajectory():
    runs = []
    for set_to_none in (True, False):
        model = make_model("mlp")
        opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2, **CONFIG)
        train(model, opt, set_to_none=set_to_none)
        runs.append(weights(model))
    assert_bitwise(*runs)


@pytest.mark.parametrize("bucket_bytes", [1, 700, 64 << 20])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_overlap_backward_is_bitwise_a_plain_step(kind, bucket_bytes):
    plain = make_model(kind)
    opt = zenflow.ZenFlowAdamW(plain.parameters(), lr=1e-2, bucket_bytes=bucket_bytes, **CONFIG)
    train(plain, opt, kind, steps=9)
    hooked = make_model(kind)
    opt2 = zenflow.ZenFlowAdamW(hooked.parameters(), lr=1e-2, bucket_bytes=bucket_bytes, **CONFIG)
    handle = opt2.overlap_backward(hooked)
    for t in range(9):
        loss_of(hooked, *batch(kind, t)).backward()
        assert opt2._split == "open"  # the hooks opened the engine's step during backward
        if bucket_bytes == 1:  # and the engine submitted every parameter there
            params = opt2._layout.params
            for i in (0, len(params) - 1):
                with pytest.raises(ValueError, match="already submitted"):
                    opt2._engine.submit(i, [params[i].grad])
        opt2.step()
        opt2.zero_grad()
    assert_bitwise(weights(plain), weights(hooked))
    assert_bitwise(state_tensors(opt.state_dict()), state_tensors(opt2.state_dict()))
    handle.remove()
    train(hooked, opt2, kind, steps=1, start=9)  # plain steps again after remove()
    with pytest.raises(ValueError, match="already registered"):
        opt2.overlap_backward(hooked)
        opt2.overlap_backward(hooked)


def accumulate(model, opt, steps, micro, use_no_sync, overlap):
    if overlap:
        opt.overlap_backward(model)
    for t in range(steps):
        for m in range(micro):
            x, y = batch("mlp", 10 * t + m)
            loss = loss_of(model, x, y) / micro
            last = m == micro - 1
            if overlap and use_no_sync and not last:
                with opt.no_sync():
                    loss.backward()
            else:
                loss.backward()
        opt.step()
        opt.zero_grad()


def test_gradient_accumulation_with_no_sync():
    plain = make_model("mlp")
    accumulate(
        plain, zenflow.ZenFlowAdamW(plain.parameters(), lr=1e-2, **CONFIG), 6, 3, False, False
    )
    hooked = make_model("mlp")
    accumulate(
        hooked,
        zenflow.ZenFlowAdamW(hooked.parameters(), lr=1e-2, bucket_bytes=1, **CONFIG),
        6,
        3,
        True,
        True,
    )
    assert_bitwise(weights(plain), weights(hooked))
    # Without no_sync, every micro-batch's backward marks the gradients ready again after
    # their submit: the engine retakes each step whole from the accumulated gradients, as
    # autograd accumulated them (the result is the same; only the overlap is lost).
    for bucket_bytes in (1, 64 << 20):
        forgot = make_model("mlp")
        opt = zenflow.ZenFlowAdamW(
            forgot.parameters(), lr=1e-2, bucket_bytes=bucket_bytes, **CONFIG
        )
        accumulate(forgot, opt, 6, 3, False, True)
        assert_bitwise(weights(plain), weights(forgot))


class Explode(torch.autograd.Function):
    """Identity forward; its backward raises (a failure half way through backward)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("boom in backward")


def uninterrupted(steps, **options):
    """The weights of an MLP after `steps` plain steps (what a disturbed run must end at)."""
    model = make_model("mlp")
    train(
        model,
        zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2, **{**CONFIG, **options}),
        steps=steps,
    )
    return weights(model)


def fresh_mlp(**options):
    model = make_model("mlp")
    return model, zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2, **{**CONFIG, **options})


class SharedTwice(torch.nn.Module):
    """fc applied twice (shared weights) and, optionally, each use in a reentrant
    activation-checkpoint segment: fc's gradient arrives twice in one backward."""

    def __init__(self, reentrant: bool):
        super().__init__()
        self.fc = torch.nn.Linear(12, 12)
        self.head = torch.nn.Linear(12, 7)
        self.reentrant = reentrant

    def forward(self, x):
        for _ in range(2):
            if self.reentrant:
                x = torch.utils.checkpoint.checkpoint(self.fc, x, use_reentrant=True)
            else:
                x = self.fc(x)
            x = torch.tanh(x)
        return self.head(x)


@pytest.mark.parametrize("bucket_bytes", [1, 64 << 20])
@pytest.mark.parametrize("reentrant", [False, True])
def test_a_parameter_used_twice_in_backward_is_accumulated_as_autograd_does(
    reentrant, bucket_bytes
):
    runs = []
    for overlap in (False, True):
        torch.manual_seed(3)
        model = SharedTwice(reentrant)
        opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2, bucket_bytes=bucket_bytes, **CONFIG)
        if overlap:
            opt.overlap_backward(model)
        for t in range(7):
            x, y = batch("mlp", t)
            x = x.requires_grad_(reentrant)  # reentrant checkpointing needs an input that does
            loss_of(model, x, y).backward()
            opt.step()
            opt.zero_grad()
        runs.append(weights(model))
    assert_bitwise(*runs, what=f"reentrant={reentrant}")


def test_frozen_parameters_get_no_hook_until_they_require_grad():
    """A partial fine-tune: fc1 frozen. overlap_backward registers no hook on it (torch
    refuses one on a tensor that does not require grad) and gives it one at the first step
    where it requires grad; every step is bit for bit the plain step's."""
    runs = []
    for overlap in (False, True):
        model = make_model("mlp")
        for p in model.fc1.parameters():
            p.requires_grad_(False)
        opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2, bucket_bytes=1, **CONFIG)
        handle = opt.overlap_backward(model) if overlap else None
        if overlap:
            assert id(model.fc1.weight) not in handle._handles
            assert id(model.fc2.weight) in handle._handles
        train(model, opt, steps=3)
        for p in model.fc1.parameters():
            p.requires_grad_(True)
        train(model, opt, steps=1, start=3)  # fc1 joins here; its hook comes after the step
        if overlap:
            assert id(model.fc1.weight) in handle._handles
        train(model, opt, steps=3, start=4)
        runs.append(weights(model))
    assert_bitwise(*runs, what="frozen then unfrozen")


def test_a_parameter_whose_storage_was_replaced_is_an_error_at_the_next_step():
    model, opt = fresh_mlp()
    train(model, opt, steps=2)
    model.fc2.weight.data = model.fc2.weight.data.clone()  # the engine holds the old memory
    before = weights(model)
    loss_of(model, *batch("mlp", 2)).backward()
    with pytest.raises(ValueError, match=r"params\[\d+\]: its memory moved"):
        opt.step()
    assert_bitwise(before, weights(model))
    opt.overlap_backward(model)
    with pytest.raises(ValueError, match="its memory moved"):
        loss_of(model, *batch("mlp", 3)).backward()  # the first hook opens the step


def test_overlap_backward_refuses_a_wrapped_module():
    model, opt = fresh_mlp()
    ddp = torch.nn.parallel.DistributedDataParallel.__new__(
        torch.nn.parallel.DistributedDataParallel
    )
    with pytest.raises(TypeError, match=r"DistributedDataParallel.*model\.module"):
        opt.overlap_backward(ddp)
    assert opt._overlap_handle is None
    opt.overlap_backward(model)  # the module itself is fine


def test_failed_backward_then_zero_grad_leaves_the_optimizer_usable():
    clean = uninterrupted(8)
    model, opt = fresh_mlp(bucket_bytes=1)
    opt.overlap_backward(model)
    train(model, opt, steps=4)
    x, y = batch("mlp", 99)
    # fc2's gradients arrive (and are submitted) before the failure upstream of it
    out = model.fc2(Explode.apply(torch.nn.functional.gelu(model.norm(model.fc1(x)))))
    with pytest.raises(RuntimeError, match="boom"):
        ((out - y) ** 2).mean().backward()
    assert opt._split is not None
    opt.zero_grad()  # discards the half-submitted step
    train(model, opt, steps=4, start=4)
    assert_bitwise(clean, weights(model))


def test_exception_in_the_training_loop_mid_window():
    clean = uninterrupted(8)
    model, opt = fresh_mlp()
    train(model, opt, steps=4)  # mid-window (update_interval 3), a host update in flight
    with pytest.raises(ZeroDivisionError):
        loss_of(model, *batch("mlp", 4)).backward()
        raise ZeroDivisionError  # the user's own code fails between backward and step
    opt.zero_grad()
    train(model, opt, steps=4, start=4)
    assert_bitwise(clean, weights(model))


def test_nan_gradient_raises_naming_the_parameter_and_changes_nothing():
    clean = uninterrupted(6)
    model, opt = fresh_mlp()
    train(model, opt, steps=3)
    loss_of(model, *batch("mlp", 3)).backward()
    good = [p.grad.clone() for p in model.parameters()]
    model.fc2.weight.grad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite|NaN|nan"):
        opt.step()
    for p, g in zip(model.parameters(), good):
        p.grad = g
    opt.step()
    opt.zero_grad()
    train(model, opt, steps=2, start=4)
    assert_bitwise(clean, weights(model))


def test_interpreter_exit_never_hangs():
    script = textwrap.dedent(
        """
        import torch, zenflow
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256))
        opt = zenflow.ZenFlowAdamW(model.parameters(), topk_ratio=0.05, update_interval=2)
        hooked = torch.nn.Linear(64, 64)
        opt2 = zenflow.ZenFlowAdamW(hooked.parameters())
        opt2.overlap_backward(hooked)
        for t in range(5):
            model(torch.randn(8, 256)).square().mean().backward()
            opt.step()
            opt.zero_grad()
        hooked(torch.randn(4, 64)).sum().backward()  # a step left open at exit
        print("done", flush=True)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "done" in result.stdout


# ---- checkpoints ----


def roundtrip(sd):
    buffer = io.BytesIO()
    torch.save(sd, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def resume_run(load, **opt_kwargs):
    """9 steps; state_dict; 7 more. Returns (uninterrupted weights, resumed weights)."""
    model = make_model("mlp", torch.bfloat16)
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2, **CONFIG)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    for t in range(7):
        train(model, opt, steps=1, start=t, dtype=torch.bfloat16)
        sched.step()
    saved = load(opt.state_dict())
    saved_model = copy.deepcopy(model.state_dict())
    saved_sched = sched.state_dict()
    for t in range(7, 16):
        train(model, opt, steps=1, start=t, dtype=torch.bfloat16)
        sched.step()
    resumed = make_model("mlp", torch.bfloat16, seed=123)
    resumed.load_state_dict(saved_model)
    opt2 = zenflow.ZenFlowAdamW(resumed.parameters(), lr=5.0, **{**CONFIG, **opt_kwargs})
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, schedule)
    opt2.load_state_dict(saved)
    sched2.load_state_dict(saved_sched)
    for t in range(7, 16):
        train(resumed, opt2, steps=1, start=t, dtype=torch.bfloat16)
        sched2.step()
    return model, opt, resumed, opt2


@pytest.mark.parametrize("num_threads", [None, 2])
def test_resume_continues_the_exact_trajectory(num_threads):
    model, opt, resumed, opt2 = resume_run(roundtrip, num_threads=num_threads)
    assert_bitwise(weights(model), weights(resumed))
    assert_bitwise(state_tensors(opt.state_dict()), state_tensors(opt2.state_dict()))
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_state_dict_holds_only_tensors_and_plain_values():
    model = make_model("mlp")
    opt = zenflow.ZenFlowAdamW(model.parameters(), **CONFIG)
    train(model, opt, steps=2)
    allowed = (torch.Tensor, int, float, bool, str, type(None))

    def walk(value, path):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}[{k!r}]")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]")
        else:
            assert isinstance(value, allowed), f"{path}: {type(value).__name__}"

    walk(opt.state_dict(), "state_dict")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_distributed_checkpoint_single_process(tmp_path):
    dcp = pytest.importorskip("torch.distributed.checkpoint")

    def through_dcp(sd):
        dcp.save(sd, checkpoint_id=str(tmp_path / "ckpt"))
        template = zenflow.ZenFlowAdamW(
            make_model("mlp", torch.bfloat16).parameters(), **CONFIG
        ).state_dict()
        dcp.load(template, checkpoint_id=str(tmp_path / "ckpt"))
        return template

    model, _, resumed, _ = resume_run(through_dcp)
    assert_bitwise(weights(model), weights(resumed))


def test_loads_with_another_topk_ratio():
    model = make_model("mlp")
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2, **CONFIG)
    train(model, opt, steps=5)
    saved = opt.state_dict()
    other = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2, **{**CONFIG, "topk_ratio": 0.6})
    other.load_state_dict(saved)
    again = other.state_dict()
    for index, entry in saved["state"].items():
        for key in ("master", "exp_avg", "exp_avg_sq", "steps"):
            assert torch.equal(entry[key], again["state"][index][key]), (index, key)
    train(model, other, steps=4, start=5)
    assert other.stats()["selected_fraction"] > 0.5


def test_torch_adamw_state_dict_loads():
    # (the MLP: the transformer block's key bias has a zero gradient up to rounding noise, on
    # which two independently computed backward passes do not agree)
    torch_model = make_model("mlp")
    zen_model = make_model("mlp")
    torch_opt = torch.optim.AdamW(torch_model.parameters(), lr=1e-2)
    zen_opt = zenflow.ZenFlowAdamW(zen_model.parameters(), lr=1e-2, topk_ratio=1.0)
    train(zen_model, zen_opt, "mlp", steps=3)  # state to be replaced
    train(torch_model, torch_opt, "mlp", steps=5)
    zen_model.load_state_dict(torch_model.state_dict())
    zen_opt.load_state_dict(roundtrip(torch_opt.state_dict()))
    train(torch_model, torch_opt, "mlp", steps=6, start=5)
    train(zen_model, zen_opt, "mlp", steps=6, start=5)
    for p, q in zip(zen_model.parameters(), torch_model.parameters()):
        assert_weights(p, q.detach().double().numpy(), 6, 1e-2, "after a torch.optim.AdamW state")


def test_another_models_state_raises_and_changes_nothing():
    model = make_model("mlp")
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2, **CONFIG)
    train(model, opt, steps=4)
    before = state_tensors(opt.state_dict())
    groups_before = copy.deepcopy(opt.param_groups[0]["lr"])
    block = make_model("block")
    other = zenflow.ZenFlowAdamW(block.parameters(), lr=3e-1, **CONFIG)
    train(block, other, "block", steps=2)
    with pytest.raises(ValueError, match="another model"):
        opt.load_state_dict(other.state_dict())
    wrong = opt.state_dict()
    wrong["state"][0]["exp_avg"] = torch.zeros(3, 3)
    wrong["param_groups"][0]["lr"] = 9.0
    with pytest.raises(ValueError, match="another model"):
        opt.load_state_dict(wrong)
    wrong = opt.state_dict()
    wrong["param_groups"].append(wrong["param_groups"][0])
    with pytest.raises(ValueError, match="groups"):
        opt.load_state_dict(wrong)
    assert_bitwise(before, state_tensors(opt.state_dict()))
    assert opt.param_groups[0]["lr"] == groups_before
    train(model, opt, steps=2, start=4)  # still usable


# ---- groups, parameters, placement ----


def test_add_param_group_after_steps_and_changed_weight_decay():
    model = make_model("mlp")
    extra = torch.nn.Parameter(torch.randn(5, 4))
    opt = zenflow.ZenFlowAdamW([model.fc1.weight, model.fc2.weight], lr=1e-2, **CONFIG)
    train(model, opt, steps=3)
    opt.add_param_group({"params": [extra], "lr": 3e-2, "weight_decay": 0.0})
    opt.param_groups[0]["weight_decay"] = 0.5
    before = extra.detach().clone()
    for t in range(3, 6):
        loss_of(model, *batch("mlp", t)).backward()
        extra.grad = torch.ones_like(extra)
        opt.step()
        opt.zero_grad()
    assert not torch.equal(before, extra.detach())
    assert opt.state_dict()["param_groups"][0]["weight_decay"] == 0.5
    with pytest.raises(ValueError, match=r"param_groups\[2\].*lr"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))], "lr": -1.0})
    assert len(opt.param_groups) == 2


def test_parameters_on_another_device_raise_naming_them():
    on_meta = torch.nn.Parameter(torch.empty(4, 4, device="meta"))
    with pytest.raises(
        ValueError,
        match=r"param_groups\[0\]\['params'\]\[1\]: on meta, but param_groups\[0\]\['params'\]\[0\] "
        r"is on cpu; the parameters of a ZenFlowAdamW are all on the CPU or all on CUDA devices",
    ):
        zenflow.ZenFlowAdamW([torch.nn.Parameter(torch.zeros(3)), on_meta])
    with pytest.raises(
        ValueError, match=r"param_groups\[0\]\['params'\]\[0\]: on meta; .*CPU .*CUDA"
    ):
        zenflow.ZenFlowAdamW([on_meta])
    with pytest.raises(TypeError, match="dtype"):
        zenflow.ZenFlowAdamW([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))])
    with pytest.raises(ValueError, match="betas and eps"):
        zenflow.ZenFlowAdamW(
            [
                {"params": [torch.nn.Parameter(torch.zeros(3))]},
                {"params": [torch.nn.Parameter(torch.zeros(3))], "betas": (0.8, 0.9)},
            ]
        )


def test_parameters_across_groups_on_two_devices_raise_naming_the_first_elsewhere():
    cpu = [torch.nn.Parameter(torch.zeros(3, 2)), torch.nn.Parameter(torch.zeros(2))]
    on_meta = torch.nn.Parameter(torch.empty(4, 4, device="meta"))
    with pytest.raises(
        ValueError,
        match=r"param_groups\[2\]\['params'\]\[1\]: on meta, but param_groups\[0\]\['params'\]\[0\] is on cpu",
    ):
        zenflow.ZenFlowAdamW([{"params": cpu[:1]}, {"params": []}, {"params": [cpu[1], on_meta]}])
    # After construction: the group is rejected and nothing changes.
    opt = zenflow.ZenFlowAdamW([{"params": []}, {"params": cpu}], lr=1e-2, **CONFIG)
    with pytest.raises(
        ValueError, match=r"param_groups\[2\]\['params'\]\[0\].*all on the CPU or all on CUDA"
    ):
        opt.add_param_group({"params": [on_meta]})
    assert len(opt.param_groups) == 2
    for p in cpu:
        p.grad = torch.ones_like(p)
    opt.step()
    opt.flush()
    assert all(torch.all(p != 0) for p in cpu)


def test_cpu_engine_takes_no_stream_and_reports_the_cuda_stats_fields():
    """What the CUDA path adds, on the host backend: set_stream accepts only the NULL stream
    (0), attach_device_memory checks its tensor and the stats carry the new fields."""
    params = [torch.zeros(6, 5), torch.zeros(4)]
    engine = zenflow._C.Engine(params, [{"params": [0, 1], "lr": 1e-2}], {"topk_ratio": 0.4})
    engine.set_stream(0)
    with pytest.raises(ValueError, match="stream"):
        engine.set_stream(12345)
    with pytest.raises(ValueError, match="stream"):
        engine.set_stream(-1)
    with pytest.raises(TypeError, match="stream"):
        engine.set_stream("default")
    size = engine.device_memory_size()
    assert size > 0
    # One device: the index of the per-device forms is 0 (or None); others are refused.
    assert engine.device_count() == 1 and engine.devices() == ["cpu"]
    assert engine.device_memory_size(0) == size
    engine.set_stream(0, 0)
    for bad in (1, -1):
        with pytest.raises(ValueError, match=r"index: must be in \[0, 1\)"):
            engine.device_memory_size(bad)
        with pytest.raises(ValueError, match="index"):
            engine.set_stream(0, bad)
    with pytest.raises(TypeError, match="index"):
        engine.device_memory_size("0")
    with pytest.raises(TypeError, match="memory"):
        engine.attach_device_memory(bytearray(size))
    with pytest.raises(ValueError, match="memory: expected dtype torch.uint8"):
        engine.attach_device_memory(torch.empty(size, dtype=torch.int32))
    with pytest.raises(ValueError, match="memory: must be contiguous"):
        engine.attach_device_memory(torch.empty(2 * size, dtype=torch.uint8)[::2])
    with pytest.raises(
        ValueError, match=f"memory: holds {size - 1} bytes, the engine needs {size}"
    ):
        engine.attach_device_memory(torch.empty(size - 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="memory: on meta, the parameters are on cpu"):
        engine.attach_device_memory(torch.empty(size, dtype=torch.uint8, device="meta"))
    backing = torch.full((size + 512,), 0xAB, dtype=torch.uint8)
    aligned = (-backing.data_ptr()) % 256
    with pytest.raises(ValueError, match="memory: not 256-byte aligned"):
        engine.attach_device_memory(backing[aligned + 1 : aligned + 1 + size])
    engine.attach_device_memory(backing[aligned : aligned + size])
    del backing  # the engine keeps its view alive
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        engine.step([torch.randn(6, 5, generator=gen), torch.randn(4, generator=gen)])
    stats = engine.stats()
    assert stats["stall_seconds_readback"] == 0.0  # the host backend never reads back
    assert stats["device_bytes"] == size
    assert stats["pinned_host_bytes"] >= 0
    engine.close()


class _StreamRecorder:
    """Stands in for the engine of an optimizer whose parameters the test declares to be on
    CUDA: records the `stream` of every call that runs work (and set_streams), which the CPU
    engine would refuse for a non-NULL stream, and forwards the work without it to the real
    CPU engine."""

    WORK = (
        "step",
        "begin_step",
        "mark_ready",
        "end_step_with",
        "abort_step",
        "flush",
        "state_dict",
        "load_state_dict",
    )

    def __init__(self, engine):
        self.engine = engine
        self.calls = []

    def set_streams(self, stream):
        self.calls.append(("set_streams", stream))

    def __getattr__(self, name):
        attr = getattr(self.engine, name)
        if name not in self.WORK:
            return attr

        def work(*args, stream=None, **kwargs):
            self.calls.append((name, stream))
            return attr(*args, **kwargs)

        return work


@pytest.mark.parametrize("device_count", [1, 2])
def test_cuda_parameters_pass_the_current_stream_with_every_engine_call(monkeypatch, device_count):
    """The wiring of the CUDA path, on the CPU: with the parameters declared on cuda:0 (and
    cuda:1), each engine call that runs work (step, the split form of overlap_backward,
    abort_step, flush, state_dict) passes stream= the current stream of every device, in the
    engine's device order."""
    model = make_model("mlp")
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2, **CONFIG)
    recorder = _StreamRecorder(opt._engine)
    opt._engine = recorder
    devices = [torch.device("cuda", d) for d in range(device_count)]
    opt._layout.devices = devices
    asked = []

    class FakeStream:
        def __init__(self, device):
            self.cuda_stream = 0xC0DE + device.index

    def current_stream(device=None):
        asked.append(device)
        return FakeStream(device)

    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    train(model, opt, steps=2)
    handle = opt.overlap_backward(model)
    train(model, opt, steps=2, start=2)
    loss_of(model, *batch("mlp", 4)).backward()  # a backward whose step never comes
    opt.zero_grad()  # aborts the split step it opened
    handle.remove()
    opt.flush()
    opt.state_dict()
    names = {name for name, _ in recorder.calls}
    assert names == set(_StreamRecorder.WORK) - {"load_state_dict"} | {"set_streams"}
    expected = [0xC0DE + d for d in range(device_count)]
    for name, stream in recorder.calls:
        assert stream == expected, (name, stream, recorder.calls)
    assert asked and set(asked) == set(devices)
    opt._engine = recorder.engine
    opt.close()


def test_frozen_parameters_are_left_alone_until_they_have_a_gradient():
    model = make_model("mlp")
    model.fc1.weight.requires_grad_(False)
    frozen = model.fc1.weight.detach().clone()
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2, **CONFIG)
    train(model, opt, steps=3)
    assert torch.equal(frozen, model.fc1.weight)
    model.fc1.weight.requires_grad_(True)
    train(model, opt, steps=2, start=3)
    assert not torch.equal(frozen, model.fc1.weight)


def test_a_missing_gradient_is_a_zero_gradient_and_no_gradient_is_no_step():
    runs = []
    for explicit in (False, True):
        params = synthetic_model(torch.float32)
        opt = zenflow.ZenFlowAdamW(params, lr=1e-2, **CONFIG)
        for t in range(5):
            for i, (p, g) in enumerate(zip(params, synthetic_gradients(t, torch.float32))):
                p.grad = torch.zeros_like(g) if (explicit and i == 2) else (None if i == 2 else g)
            opt.step()
        runs.append([p.detach().clone() for p in params])
        before = [p.detach().clone() for p in params]
        opt.zero_grad()
        opt.step()
        assert_bitwise(before, [p.detach() for p in params])
    assert_bitwise(*runs)


# ---- configuration ----


@pytest.mark.parametrize(
    "kwargs, error, key",
    [
        (dict(topk_ratio=1.5), ValueError, "topk_ratio"),
        (dict(topk_ratio=-0.1), ValueError, "topk_ratio"),
        (dict(update_interval=0), ValueError, "update_interval"),
        (dict(update_interval="sometimes"), ValueError, "update_interval"),
        (
            dict(update_interval=4, select_interval=2, select_strategy="step"),
            ValueError,
            "select_interval",
        ),
        (dict(select_strategy="bogus"), ValueError, "select_strategy"),
        (dict(select_strategy="epoch"), ValueError, "steps_per_epoch"),
        (dict(master_weights="fp16"), ValueError, "master_weights"),
        (dict(selection_score="mean"), ValueError, "selection_score"),
        (dict(overlap_step="yes"), TypeError, "overlap_step"),
        (dict(max_grad_norm=-1.0), ValueError, "max_grad_norm"),
        (dict(auto_ratio=0.0), ValueError, "auto_ratio"),
        (dict(pt_reserved_cores_perc=1.5), ValueError, "pt_reserved_cores_perc"),
        (dict(num_threads=0), ValueError, "num_threads"),
        (dict(loss_scaling="static"), ValueError, "loss_scaling"),
        (dict(lr=-1.0), ValueError, "lr"),
        (dict(betas=(1.0, 0.9)), ValueError, "betas"),
        (dict(eps=-1e-8), ValueError, "eps"),
        (dict(weight_decay=float("nan")), ValueError, "weight_decay"),
    ],
)
def test_invalid_settings_raise_naming_the_key(kwargs, error, key):
    with pytest.raises(error, match=key):
        zenflow.ZenFlowAdamW([torch.nn.Parameter(torch.zeros(3, 3))], **kwargs)


DEEPSPEED_CONFIG = {
    "train_batch_size": 8,
    "gradient_clipping": 1.0,
    "optimizer": {
        "type": "AdamW",
        "params": {
            "lr": 3e-4,
            "betas": [0.8, 0.95],
            "eps": 1e-7,
            "weight_decay": 0.05,
            "torch_adam": True,
        },
    },
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "zenflow": {
            "topk_ratio": 0.05,
            "select_strategy": "step",
            "select_interval": 12,
            "update_interval": 4,
            "full_warm_up_rounds": 2,
            "overlap_step": True,
            "offload": False,
            "auto_ratio": 0.9,
            "pt_reserved_cores_perc": 0.5,
        },
    },
}


def test_from_config_takes_a_deepspeed_config_unchanged(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(DEEPSPEED_CONFIG))
    for source in (DEEPSPEED_CONFIG, str(path)):
        model = make_model("mlp")
        opt = zenflow.ZenFlowAdamW.from_config(model.parameters(), source)
        group = opt.param_groups[0]
        assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (
            3e-4,
            (0.8, 0.95),
            1e-7,
            0.05,
        )
        s = opt._settings
        assert (
            s["topk_ratio"],
            s["select_strategy"],
            s["select_interval"],
            s["update_interval"],
        ) == (
            0.05,
            "step",
            12,
            4,
        )
        assert (
            s["full_warm_up_rounds"],
            s["overlap_step"],
            s["auto_ratio"],
            s["max_grad_norm"],
        ) == (2, True, 0.9, 1.0)
        train(model, opt, steps=3)
    # DeepSpeed's defaults for missing keys; the short form; overrides
    opt = zenflow.ZenFlowAdamW.from_config(
        make_model("mlp").parameters(),
        {"zenflow": {"topk_ratio": 0.2}},
        num_threads=1,
        steps_per_epoch=10,
    )
    assert opt._settings["update_interval"] == "auto" and opt._settings["overlap_step"] is False
    assert opt._settings["steps_per_epoch"] == 10


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda c: c["zero_optimization"]["zenflow"].update(topk_ratios=0.1), "topk_ratios"),
        (lambda c: c["zero_optimization"]["zenflow"].update(topk_ratio=2.0), "topk_ratio"),
        (
            lambda c: c["zero_optimization"]["zenflow"].update(select_strategy="often"),
            "select_strategy",
        ),
        (lambda c: c["zero_optimization"]["zenflow"].update(update_interval=0), "update_interval"),
        (lambda c: c["optimizer"]["params"].update(lr="auto"), "lr"),
        (lambda c: c["optimizer"]["params"].update(momentum=0.9), "momentum"),
        (lambda c: c["optimizer"].update(type="SGD"), "optimizer.type"),
        (lambda c: c.pop("zero_optimization"), "zenflow"),
    ],
)
def test_from_config_errors_name_the_key(mutate, key):
    config = copy.deepcopy(DEEPSPEED_CONFIG)
    mutate(config)
    with pytest.raises(ValueError, match=key):
        zenflow.ZenFlowAdamW.from_config(make_model("mlp").parameters(), config)


# ---- precision and loss scaling ----


def test_float16_uses_dynamic_loss_scaling():
    model = make_model("mlp", torch.float16)
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-3, **CONFIG)
    assert opt.loss_scale == 65536.0
    loss_of(model, *batch("mlp", 0, torch.float16)).backward()
    with pytest.raises(ValueError, match="scale_loss"):
        opt.step()
    opt.zero_grad()
    for t in range(4):
        opt.scale_loss(loss_of(model, *batch("mlp", t, torch.float16))).backward()
        opt.step()
        opt.zero_grad()
    before = weights(model)
    opt.scale_loss(loss_of(model, *batch("mlp", 4, torch.float16))).backward()
    model.fc1.weight.grad[0, 0] = float("inf")  # an overflow
    opt.step()
    opt.zero_grad()
    assert_bitwise(before, weights(model))
    stats = opt.stats()
    assert stats["skipped_steps"] == 1 and stats["steps"] == 4 and opt.loss_scale == 32768.0
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_grad_scaler_interoperates_with_float32_parameters():
    plain = make_model("mlp")
    train(plain, zenflow.ZenFlowAdamW(plain.parameters(), lr=1e-2, **CONFIG), steps=6)
    model = make_model("mlp")
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2, **CONFIG)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for t in range(6):
        scaler.scale(loss_of(model, *batch("mlp", t))).backward()
        if t == 2:
            scaler.unscale_(opt)  # the HuggingFace pattern: unscale, clip, step
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    for p, q in zip(model.parameters(), plain.parameters()):
        assert_weights(p, q.detach().double().numpy(), 6, 1e-2, "GradScaler")
    before = weights(model)
    scaler.scale(loss_of(model, *batch("mlp", 7))).backward()
    model.fc2.bias.grad[0] = float("inf")
    scaler.step(opt)  # skipped
    scaler.update()
    opt.zero_grad()
    assert_bitwise(before, weights(model))
    assert scaler.get_scale() == 512.0


def test_grad_scaler_with_zenflow_loss_scaling_or_overlap_is_an_error():
    model = make_model("mlp", torch.float16)
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(loss_of(model, *batch("mlp", 0, torch.float16))).backward()
    with pytest.raises(ValueError, match="GradScaler"):
        scaler.step(opt)
    model = make_model("mlp")
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-3)
    opt.overlap_backward(model)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(loss_of(model, *batch("mlp", 0))).backward()
    with pytest.raises(ValueError, match="overlap_backward"):
        scaler.step(opt)
    opt.zero_grad()


def test_stats_and_format_stats():
    model = make_model("mlp")
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2, max_grad_norm=0.1, **CONFIG)
    train(model, opt, steps=7)
    stats = opt.stats()
    assert stats["steps"] == 7 and stats["windows"] >= 2 and stats["bytes_down"] > 0
    assert stats["last_global_norm"] > 0.1
    line = zenflow.format_stats(stats)
    assert "\n" not in line and "step 7" in line and "stall" in line
    assert "waiting for copies" not in line  # the host backend's copies are done when issued
    waited = zenflow.format_stats({**stats, "host_lane_wait_seconds": 1.25})
    assert "(waiting for copies 1.25 s)" in waited


# ---- a HuggingFace-style loop ----


def hf_style_training(
    model, optimizer, steps=8, micro_batches=2, quiet=contextlib.nullcontext, clip=True
):
    """What generic training code does with any torch.optim.Optimizer: autocast, gradient
    accumulation, clipping, a scheduler, zero_grad(set_to_none=True)."""
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))
    optimizer.zero_grad(set_to_none=True)
    for step in range(steps):
        for micro in range(micro_batches):
            x, y = batch("mlp", 10 * step + micro)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_of(model, x, y) / micro_batches
            last = micro == micro_batches - 1
            with contextlib.nullcontext() if last else quiet():
                loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    return scheduler.get_last_lr()


def test_huggingface_style_loop():
    torch_model = make_model("mlp")
    zen_model = make_model("mlp")
    lr_torch = hf_style_training(torch_model, torch.optim.AdamW(torch_model.parameters(), lr=1e-2))
    lr_zen = hf_style_training(
        zen_model, zenflow.ZenFlowAdamW(zen_model.parameters(), lr=1e-2, topk_ratio=1.0)
    )
    assert lr_torch == lr_zen
    for p, q in zip(zen_model.parameters(), torch_model.parameters()):
        assert_weights(p, q.detach().double().numpy(), 8, 1e-2, "HuggingFace-style loop")
    # zenflow's own settings, overlapping backward, accumulating with no_sync
    plain = make_model("mlp")
    hf_style_training(
        plain, zenflow.ZenFlowAdamW(plain.parameters(), lr=1e-2, **CONFIG), clip=False
    )
    hooked = make_model("mlp")
    opt = zenflow.ZenFlowAdamW(hooked.parameters(), lr=1e-2, bucket_bytes=1, **CONFIG)
    opt.overlap_backward(hooked)
    hf_style_training(hooked, opt, quiet=opt.no_sync, clip=False)
    assert_bitwise(weights(plain), weights(hooked))
    assert math.isfinite(opt.stats()["last_global_norm"])


def test_torch_threads_are_limited_to_the_reserved_share():
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(8)
        zenflow.ZenFlowAdamW(
            [torch.nn.Parameter(torch.zeros(4, 4))], num_threads=1, limit_torch_threads=False
        )
        assert torch.get_num_threads() == 8
        zenflow.ZenFlowAdamW([torch.nn.Parameter(torch.zeros(4, 4))], num_threads=1)
        cores = zenflow.info()["host_cpus"]
        assert torch.get_num_threads() == max(1, cores - 1)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize(
    "settings, synchronous",
    [
        (dict(topk_ratio=0.0, update_interval=1, overlap_step=False), True),  # sync offload
        (dict(topk_ratio=0.1, update_interval=1, overlap_step=False), True),
        (dict(topk_ratio=1.0), True),  # nothing deferred
        # overlap on, or windows of more than one step: host work runs beside torch
        (dict(topk_ratio=0.0, update_interval=1, overlap_step=True), False),
        (dict(topk_ratio=0.1, update_interval=1, overlap_step=True), False),
        (dict(topk_ratio=0.0, update_interval=2, overlap_step=False), False),
        (dict(topk_ratio=0.1, update_interval=2, overlap_step=False), False),
    ],
)
def test_a_synchronous_configuration_leaves_torch_its_threads(settings, synchronous):
    """No host work runs beside torch's compute, so no core is taken from it."""
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(8)
        opt = zenflow.ZenFlowAdamW(
            [torch.nn.Parameter(torch.zeros(4, 4))], num_threads=1, **settings
        )
        cores = zenflow.info()["host_cpus"]
        # Synchronous: torch keeps every core (it is capped at the cores, not below).
        assert torch.get_num_threads() == (min(8, cores) if synchronous else max(1, cores - 1))
        opt.close()
        assert torch.get_num_threads() == 8  # close() gives torch its threads back
    finally:
        torch.set_num_threads(previous)


def test_the_engine_publishes_its_thread_plan_and_ranks_on_a_host_share_the_cores():
    plan = zenflow._C.engine_thread_plan
    cores = zenflow.info()["host_cpus"]
    one = plan({})
    assert one["cores"] == cores
    assert one["host_threads"] == max(1, cores - cores // 2)  # pt_reserved_cores_perc 0.5
    assert one["framework_threads"] == max(1, cores - one["host_threads"])
    many = plan({"ranks_per_host": 4 * cores})  # more ranks than cores: one core each
    assert many["cores"] == 1 and many["host_threads"] == 1 and many["framework_threads"] == 1
    sync = plan({"topk_ratio": 0.0, "update_interval": 1, "overlap_step": False})
    assert sync["framework_threads"] == sync["host_threads"] == sync["compute_threads"] == cores
    with pytest.raises(ValueError, match="ranks_per_host"):
        plan({"ranks_per_host": -1})
