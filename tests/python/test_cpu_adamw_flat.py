"""CPUAdamW's flat state (one buffer per field per kernel batch, each parameter's state a
view into it) and the op under it, zenflow.ops.cpu_adamw_step_flat (zf_cpu_adamw_step_flat):
a float64 reference on awkward shapes, bitwise equality with the per-tensor op, state_dict
round trips, groups added after steps, state replaced by user code, failed steps that
change nothing, and every SIMD level chosen through ZENFLOW_SIMD."""

from __future__ import annotations

import copy
import hashlib
import io
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import zenflow
from zenflow import ops

HYPER = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)
# Prime sizes, 1xN, Nx1, an empty tensor and a 0-d tensor.
SHAPES = [(13, 7), (1, 101), (97, 1), (0, 5), (), (3, 5, 11), (257,)]


def random_tensors(shapes, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen).to(dtype) for s in shapes]


def numel(shape):
    return math.prod(shape)


def layout(shapes, gap=3):
    """Offsets with a gap after every tensor (gaps must stay untouched) and the total."""
    offsets, position = [], gap
    for s in shapes:
        offsets.append(position)
        position += numel(s) + gap
    return offsets, position


def reference_step(p, m, v, g, step, lr, betas, eps, weight_decay):
    """torch.optim.AdamW's update in float64 (all tensors float64, in place)."""
    beta1, beta2 = betas
    p.mul_(1 - lr * weight_decay)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bc1, bc2 = 1 - beta1**step, 1 - beta2**step
    denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
    p.addcdiv_(m, denom, value=-lr / bc1)


# ---- the op ----


@pytest.mark.parametrize("low_precision", [False, True], ids=["fp32-params", "bf16-master"])
def test_flat_step_matches_float64_reference(low_precision, simd_level):
    offsets, total = layout(SHAPES)
    sentinel = -12345.0
    exp_avg = torch.full((total,), sentinel)
    exp_avg_sq = torch.full((total,), sentinel)
    master = torch.full((total,), sentinel)
    weights = random_tensors(SHAPES, 1)
    for o, w in zip(offsets, weights):
        exp_avg[o : o + w.numel()] = 0.0
        exp_avg_sq[o : o + w.numel()] = 0.0
        master[o : o + w.numel()] = w.reshape(-1)
    params = [w.clone() for w in weights]
    refs = [(w.double(), torch.zeros(w.shape, dtype=torch.float64)) for w in weights]
    refs = [(p, m, m.clone()) for p, m in refs]
    outs = [torch.full(s, float("nan"), dtype=torch.bfloat16) for s in SHAPES]
    for step in range(1, 8):
        grads = random_tensors(SHAPES, 100 + step, torch.bfloat16)
        for outputs in outs:
            outputs.fill_(float("nan"))  # poisoned: every element must be written
        ops.cpu_adamw_step_flat(
            exp_avg,
            exp_avg_sq,
            grads,
            offsets,
            params=None if low_precision else params,
            master=master if low_precision else None,
            out_params=outs if low_precision else None,
            step=step,
            **HYPER,
        )
        for (p, m, v), g in zip(refs, grads):
            reference_step(p, m, v, g.double(), step, **HYPER)
    for i, (p, m, v) in enumerate(refs):
        n = p.numel()
        got = master[offsets[i] : offsets[i] + n] if low_precision else params[i].reshape(-1)
        torch.testing.assert_close(got.double(), p.reshape(-1), rtol=2e-5, atol=1e-6)
        torch.testing.assert_close(
            exp_avg[offsets[i] : offsets[i] + n].double(), m.reshape(-1), rtol=2e-5, atol=1e-6
        )
        torch.testing.assert_close(
            exp_avg_sq[offsets[i] : offsets[i] + n].double(), v.reshape(-1), rtol=2e-5, atol=1e-9
        )
        if low_precision:
            assert torch.equal(outs[i].reshape(-1), got.to(torch.bfloat16))
    gaps = torch.ones(total, dtype=torch.bool)
    for o, s in zip(offsets, SHAPES):
        gaps[o : o + numel(s)] = False
    for buffer in (exp_avg, exp_avg_sq) + ((master,) if low_precision else ()):
        assert torch.all(buffer[gaps] == sentinel)


@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_flat_step_is_bitwise_the_per_tensor_step(grad_dtype, simd_level):
    offsets, total = layout(SHAPES, gap=0)
    weights = random_tensors(SHAPES, 2)
    master = torch.cat([w.reshape(-1) for w in weights])
    exp_avg, exp_avg_sq = torch.zeros(total), torch.zeros(total)
    per_master = [w.clone() for w in weights]
    per_m = [torch.zeros(s) for s in SHAPES]
    per_v = [torch.zeros(s) for s in SHAPES]
    outs = [torch.empty(s, dtype=torch.float16) for s in SHAPES]
    per_outs = [torch.empty(s, dtype=torch.float16) for s in SHAPES]
    lrs = [1e-2 * (i + 1) for i in range(len(SHAPES))]
    for step in range(1, 6):
        grads = random_tensors(SHAPES, 200 + step, grad_dtype)
        ops.cpu_adamw_step_flat(
            exp_avg, exp_avg_sq, grads, offsets, master=master, out_params=outs,
            step=step, lr=lrs, betas=(0.8, 0.99), weight_decay=0.1, mode="adam", grad_scale=0.5,
        )  # fmt: skip
        ops.cpu_adamw_step(
            per_master, per_m, per_v, grads, out_params=per_outs,
            step=step, lr=lrs, betas=(0.8, 0.99), weight_decay=0.1, mode="adam", grad_scale=0.5,
        )  # fmt: skip
    assert torch.equal(master, torch.cat([p.reshape(-1) for p in per_master]))
    assert torch.equal(exp_avg, torch.cat([m.reshape(-1) for m in per_m]))
    assert torch.equal(exp_avg_sq, torch.cat([v.reshape(-1) for v in per_v]))
    assert all(torch.equal(a, b) for a, b in zip(outs, per_outs))


def test_flat_step_bad_layouts_raise_and_write_nothing():
    sizes = [8, 5]
    exp_avg, exp_avg_sq, master = torch.ones(16), torch.ones(16), torch.ones(16)
    grads = [torch.ones(n) for n in sizes]
    outs = [torch.zeros(n, dtype=torch.bfloat16) for n in sizes]
    before = [t.clone() for t in (exp_avg, exp_avg_sq, master, *outs)]

    def call(offsets, **kwargs):
        args = dict(master=master, out_params=outs, step=1, lr=1e-2)
        args.update(kwargs)
        ops.cpu_adamw_step_flat(exp_avg, exp_avg_sq, grads, offsets, **args)

    with pytest.raises(ValueError, match=r"offsets\[1\]"):
        call([0, 7])  # overlaps tensor 0
    with pytest.raises(ValueError, match=r"offsets\[1\]"):
        call([0, 12])  # past the end
    with pytest.raises(ValueError, match=r"offsets\[0\]"):
        call([-1, 8])
    with pytest.raises(ValueError, match="params/master"):
        call([0, 8], params=[torch.zeros(8), torch.zeros(5)])
    with pytest.raises(ValueError, match="exp_avg_sq"):
        ops.cpu_adamw_step_flat(
            exp_avg, torch.ones(15), grads, [0, 8], master=master, step=1, lr=1e-2
        )
    with pytest.raises(ValueError, match=r"out_params\[1\]"):
        call([0, 8], out_params=[outs[0], torch.zeros(4, dtype=torch.bfloat16)])
    with pytest.raises(ValueError, match="overlap"):
        call([0, 8], out_params=[outs[0], master[:5]])
    with pytest.raises(ValueError, match=r"steps\[0\]"):
        call([0, 8], step=0)
    for a, b in zip((exp_avg, exp_avg_sq, master, *outs), before):
        assert torch.equal(a, b)


def test_flat_step_with_counts_in_place():
    """CPUAdamW's steady-state call: the binding reads torch's fp32 step counts, uses count + 1,
    and advances them (with their autograd version) only when the step succeeded."""
    native = zenflow._native.native()
    sizes = [8, 5]

    def call(counts, steps=(), grads=None):
        native.cpu_adamw_step_flat(
            [torch.ones(8), torch.ones(5)], None, exp_avg, exp_avg_sq, [0, 8], sizes,
            grads or [torch.ones(8), torch.ones(5)], None, list(steps), [1e-2] * 2, [0.0] * 2,
            0.9, 0.999, 1e-8, native.ADAM_MODE_ADAMW, 1.0, 0, counts,
        )  # fmt: skip

    exp_avg, exp_avg_sq = torch.zeros(13), torch.zeros(13)
    counts = torch.tensor([0.0, 41.0])
    version = counts._version
    call(counts)
    assert counts.tolist() == [1.0, 42.0] and counts._version > version
    bad_cases = [
        (torch.tensor([1, 2], dtype=torch.int32), (), "step_counts"),
        (torch.tensor([1.0]), (), "step_counts"),
        (torch.tensor([[1.0, 2.0]]), (), "step_counts"),
        (torch.tensor([1.0, 2.0]), (3, 4), "step_counts"),  # steps and counts both given
        (torch.tensor([-1.0, 2.0]), (), r"steps\[0\]"),  # a count the step cannot use
        (torch.tensor([1.0, float("nan")]), (), r"steps\[1\]"),
        (torch.tensor([1.0, 2.0**31]), (), r"steps\[1\]"),
    ]
    for bad, steps, match in bad_cases:
        before, m_before = bad.clone(), exp_avg.clone()
        error = TypeError if bad.dtype != torch.float32 else ValueError
        with pytest.raises(error, match=match):
            call(bad, steps)
        assert torch.equal(bad.nan_to_num(), before.nan_to_num())
        assert torch.equal(exp_avg, m_before)
    # A call rejected by the C layer (a gradient of the wrong size) leaves the counts as they were.
    with pytest.raises(ValueError, match=r"grads\[1\]"):
        call(counts, grads=[torch.ones(8), torch.ones(4)])
    assert counts.tolist() == [1.0, 42.0]


# ---- CPUAdamW ----


def make_model(dtype, seed=0, shapes=SHAPES):
    return [t.requires_grad_() for t in random_tensors(shapes, seed, dtype)]


def set_grads(params, step, skip=()):
    gen = torch.Generator().manual_seed(1000 + step)
    for i, p in enumerate(params):
        g = torch.randn(p.shape, generator=gen).to(p.dtype)
        p.grad = None if i in skip else g


def two_groups(params):
    return [
        {"params": params[:3]},
        {"params": params[3:], "lr": 3e-3, "weight_decay": 0.0},
    ]


def fingerprint(opt, params):
    """Parameters and every state entry, bit for bit."""
    digest = hashlib.sha256()
    for p in params:
        digest.update(p.detach().reshape(-1).view(torch.uint8).numpy().tobytes())
        for key in ("step", "exp_avg", "exp_avg_sq", "master"):
            value = opt.state[p].get(key)
            if value is not None:
                digest.update(
                    value.detach().float().reshape(-1).view(torch.uint8).numpy().tobytes()
                )
    return digest.hexdigest()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_state_entries_are_views_of_one_buffer_per_field(dtype):
    params = make_model(dtype)
    opt = zenflow.CPUAdamW(params, lr=1e-2)
    set_grads(params, 0)
    opt.step()
    names = ["exp_avg", "exp_avg_sq"] + (["master"] if dtype != torch.float32 else [])
    for name in names:
        bases = {opt.state[p][name].untyped_storage().data_ptr() for p in params}
        assert len(bases) == 1, name
        for p in params:
            assert opt.state[p][name].shape == p.shape
            assert opt.state[p][name].dtype == torch.float32
    assert all(opt.state[p]["step"].shape == () for p in params)
    assert len({opt.state[p]["step"].untyped_storage().data_ptr() for p in params}) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cpu_adamw_is_bitwise_the_per_tensor_op(dtype, simd_level):
    """CPUAdamW (flat state) against a loop over ops.cpu_adamw_step (per-tensor state)."""
    params = make_model(dtype)
    opt = zenflow.CPUAdamW(two_groups(params), lr=1e-2)
    mirror = [p.detach().clone() for p in params]
    master = [p.float() for p in mirror]
    m = [torch.zeros(p.shape) for p in mirror]
    v = [torch.zeros(p.shape) for p in mirror]
    lrs = [1e-2] * 3 + [3e-3] * (len(params) - 3)
    wds = [1e-2] * 3 + [0.0] * (len(params) - 3)
    for step in range(1, 7):
        set_grads(params, step)
        opt.step()
        grads = [p.grad for p in params]
        if dtype == torch.float32:
            ops.cpu_adamw_step(mirror, m, v, grads, step=step, lr=lrs, weight_decay=wds)
        else:
            ops.cpu_adamw_step(
                master, m, v, grads, step=step, lr=lrs, weight_decay=wds, out_params=mirror
            )
    for i, p in enumerate(params):
        assert torch.equal(p.detach(), mirror[i])
        assert torch.equal(opt.state[p]["exp_avg"], m[i])
        assert torch.equal(opt.state[p]["exp_avg_sq"], v[i])
        if dtype != torch.float32:
            assert torch.equal(opt.state[p]["master"], master[i])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("through", ["deepcopy", "torch.save"])
def test_state_dict_round_trip_is_bitwise_the_uninterrupted_run(dtype, through):
    straight = make_model(dtype)
    opt = zenflow.CPUAdamW(two_groups(straight), lr=1e-2)
    for t in range(10):
        set_grads(straight, t)
        opt.step()

    first = make_model(dtype)
    opt1 = zenflow.CPUAdamW(two_groups(first), lr=1e-2)
    for t in range(5):
        set_grads(first, t)
        opt1.step()
    if through == "deepcopy":
        saved = copy.deepcopy(opt1.state_dict())
    else:
        buffer = io.BytesIO()
        torch.save(opt1.state_dict(), buffer)
        buffer.seek(0)
        saved = torch.load(buffer)
    resumed = [p.detach().clone().requires_grad_() for p in first]
    opt2 = zenflow.CPUAdamW(two_groups(resumed), lr=0.5)
    opt2.load_state_dict(saved)
    # Loading copies: the loaded optimizer shares no memory with the state dict.
    saved_m = saved["state"][0]["exp_avg"].clone()
    for t in range(5, 10):
        set_grads(resumed, t)
        opt2.step()
    assert torch.equal(saved["state"][0]["exp_avg"], saved_m)
    assert fingerprint(opt, straight) == fingerprint(opt2, resumed)
    # And the reloaded state is laid out flat again.
    bases = {opt2.state[p]["exp_avg"].untyped_storage().data_ptr() for p in resumed}
    assert len(bases) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_param_group_added_after_steps(dtype):
    """A group added after steps re-lays the state out: bitwise the same as an optimizer
    that had the group from the start but no gradients for it until then."""
    params = make_model(dtype)
    late = make_model(dtype, seed=5, shapes=[(31, 3), (2,)])
    opt = zenflow.CPUAdamW(params, lr=1e-2)
    twin_params = [p.detach().clone().requires_grad_() for p in params]
    twin_late = [p.detach().clone().requires_grad_() for p in late]
    twin = zenflow.CPUAdamW(
        [{"params": twin_params}, {"params": twin_late, "lr": 2e-3, "betas": (0.8, 0.9)}],
        lr=1e-2,
    )
    for t in range(6):
        if t == 3:
            opt.add_param_group({"params": late, "lr": 2e-3, "betas": (0.8, 0.9)})
        set_grads(params, t)
        set_grads(twin_params, t)
        if t >= 3:
            set_grads(late, 50 + t)
            set_grads(twin_late, 50 + t)
        opt.step()
        twin.step()
    assert fingerprint(opt, params + late) == fingerprint(twin, twin_params + twin_late)
    assert float(opt.state[late[0]]["step"]) == 3.0 and float(opt.state[params[0]]["step"]) == 6.0


def test_parameters_without_gradients_keep_their_state():
    params = make_model(torch.bfloat16)
    opt = zenflow.CPUAdamW(params, lr=1e-2)
    ref_params = [p.detach().float().requires_grad_() for p in params]
    ref = torch.optim.AdamW(ref_params, lr=1e-2, foreach=False)
    for t in range(6):
        skip = {t % len(params), 2} if t < 4 else set()
        set_grads(params, t, skip)
        for p, r in zip(params, ref_params):
            r.grad = None if p.grad is None else p.grad.float()
        opt.step()
        ref.step()
    for p, r in zip(params, ref_params):
        torch.testing.assert_close(opt.state[p]["master"], r.detach(), rtol=1e-5, atol=1e-6)
        assert float(opt.state[p]["step"]) == float(ref.state[r]["step"])


def test_frozen_parameters_get_no_state_memory_until_they_train():
    """As torch allocates state at a parameter's first step: parameters without a gradient
    take no room in the flat buffers; one that starts training later is laid out then."""
    params = make_model(torch.bfloat16)
    frozen = params[1]
    ref_params = [p.detach().float().requires_grad_() for p in params]
    opt = zenflow.CPUAdamW(params, lr=1e-2)
    ref = torch.optim.AdamW(ref_params, lr=1e-2, foreach=False)
    for t in range(6):
        set_grads(params, t, skip={1} if t < 3 else set())
        for p, r in zip(params, ref_params):
            r.grad = None if p.grad is None else p.grad.float()
        opt.step()
        ref.step()
        if t < 3:
            assert frozen not in opt.state
            stepped = sum(p.numel() for p in params if p is not frozen)
            storage = opt.state[params[0]]["exp_avg"].untyped_storage()
            assert storage.nbytes() == 4 * stepped
    for p, r in zip(params, ref_params):
        torch.testing.assert_close(opt.state[p]["master"], r.detach(), rtol=1e-5, atol=1e-6)
        assert float(opt.state[p]["step"]) == float(ref.state[r]["step"])
    assert float(opt.state[frozen]["step"]) == 3.0


@pytest.mark.parametrize("replace", ["entry", "whole-state", "deleted"])
def test_state_replaced_by_user_code_is_laid_out_again(replace):
    params = make_model(torch.bfloat16)
    ref_params = [p.detach().float().requires_grad_() for p in params]
    opt = zenflow.CPUAdamW(params, lr=1e-2)
    ref = torch.optim.AdamW(ref_params, lr=1e-2, foreach=False)

    def both_step(t):
        set_grads(params, t)
        for p, r in zip(params, ref_params):
            r.grad = p.grad.float()
        opt.step()
        ref.step()

    for t in range(3):
        both_step(t)
    target, ref_target = params[1], ref_params[1]
    if replace == "entry":
        new_m = torch.full(target.shape, 0.25)
        opt.state[target]["exp_avg"] = new_m.clone()
        ref.state[ref_target]["exp_avg"] = new_m.clone()
    elif replace == "whole-state":
        new_state = {
            "step": torch.tensor(7.0),
            "exp_avg": torch.full(target.shape, -0.5),
            "exp_avg_sq": torch.full(target.shape, 0.125),
            "master": target.detach().float(),
        }
        opt.state[target] = {k: v.clone() for k, v in new_state.items()}
        ref.state[ref_target] = {k: v.clone() for k, v in new_state.items() if k != "master"}
        ref_target.data.copy_(new_state["master"])
    else:
        del opt.state[target]
        del ref.state[ref_target]
        ref_target.data.copy_(target.detach().float())  # a restart from the bf16 weights
    for t in range(3, 6):
        both_step(t)
    for p, r in zip(params, ref_params):
        torch.testing.assert_close(opt.state[p]["master"], r.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            opt.state[p]["exp_avg"], ref.state[r]["exp_avg"], rtol=1e-5, atol=1e-7
        )
        assert float(opt.state[p]["step"]) == float(ref.state[r]["step"])
    bases = {opt.state[p]["exp_avg"].untyped_storage().data_ptr() for p in params}
    assert len(bases) == 1  # flat again


def test_failed_step_changes_nothing():
    params = make_model(torch.bfloat16)
    opt = zenflow.CPUAdamW(two_groups(params), lr=1e-2)
    set_grads(params, 0)
    opt.step()
    set_grads(params, 1)
    # A parameter whose size changed under the optimizer (its state has the old size).
    params[5].data = torch.zeros(4, 4, dtype=torch.bfloat16)
    params[5].grad = torch.ones(4, 4, dtype=torch.bfloat16)
    before = fingerprint(opt, params)
    state_ids = {id(opt.state[p][k]) for p in params for k in ("exp_avg", "master")}
    with pytest.raises(ValueError, match=r"grads\[5\]"):  # one batch: both groups
        opt.step()
    assert fingerprint(opt, params) == before
    assert {id(opt.state[p][k]) for p in params for k in ("exp_avg", "master")} == state_ids

    # The same on the first step (nothing laid out yet: no state appears) and with a state
    # entry of the wrong size (the new layout is not committed).
    fresh = make_model(torch.bfloat16)
    opt = zenflow.CPUAdamW(fresh, lr=1e-2)
    set_grads(fresh, 0)
    fresh[2].grad = fresh[2].grad.to_sparse()
    weights = [p.detach().clone() for p in fresh]
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()
    assert len(opt.state) == 0 and all(torch.equal(a, b) for a, b in zip(fresh, weights))
    set_grads(fresh, 0)
    opt.step()
    wrong = torch.zeros(5)
    opt.state[fresh[0]]["exp_avg"] = wrong
    before = fingerprint(opt, fresh[1:])
    with pytest.raises(ValueError, match="exp_avg"):
        opt.step()
    assert opt.state[fresh[0]]["exp_avg"] is wrong and fingerprint(opt, fresh[1:]) == before


def test_non_contiguous_gradient_is_used():
    params = [torch.randn(6, 4).requires_grad_()]
    ref_params = [params[0].detach().clone().requires_grad_()]
    opt = zenflow.CPUAdamW(params, lr=1e-2)
    ref = torch.optim.AdamW(ref_params, lr=1e-2, foreach=False)
    grad = torch.randn(4, 6).t()
    params[0].grad, ref_params[0].grad = grad, grad.clone()
    opt.step()
    ref.step()
    torch.testing.assert_close(params[0], ref_params[0], rtol=1e-6, atol=1e-7)


_LEVEL_SCRIPT = textwrap.dedent(
    """
    import hashlib, torch, zenflow
    gen = torch.Generator().manual_seed(0)
    shapes = [(13, 7), (1, 101), (97, 1), (0, 5), (), (3, 5, 11), (257,), (4099,)]
    params = [torch.randn(s, generator=gen).to(torch.bfloat16).requires_grad_() for s in shapes]
    opt = zenflow.CPUAdamW(params, lr=1e-2)
    for t in range(5):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(torch.bfloat16)
        opt.step()
    digest = hashlib.sha256()
    for p in params:
        for t in (p.detach(), opt.state[p]["master"], opt.state[p]["exp_avg"],
                  opt.state[p]["exp_avg_sq"]):
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    print(zenflow.simd_level(), digest.hexdigest())
    """
)


def test_every_simd_level_through_the_environment_agrees_bitwise():
    digests = {}
    for level in zenflow.supported_simd_levels():
        env = dict(os.environ, ZENFLOW_SIMD=level)
        result = subprocess.run(
            [sys.executable, "-c", _LEVEL_SCRIPT], env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
        active, digest = result.stdout.split()
        assert active == level
        digests[level] = digest
    assert len(set(digests.values())) == 1, digests
