"""release_gradients: under overlap_backward each matrix's gradient is freed during backward,
once its bucket is consumed, and the run is bit for bit the run that keeps its gradients.

The live gradient bytes are measured by a hook registered before overlap_backward's (it sees
each gradient before the engine releases anything in that hook), with weak references for
the tensors themselves. On a step that is not a selection step the peak is at most the
largest bucket's gradients plus the dense parameters'; a selection step holds every gradient
until step() (the choice needs every column's sum first).
"""

from __future__ import annotations

import weakref

import pytest
import torch

import zenflow

SETTINGS = dict(topk_ratio=0.3, update_interval=3, select_strategy="step", select_interval=4)
STEPS = 9


def make_model(dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(24, 40),
        torch.nn.Tanh(),
        torch.nn.Linear(40, 40),
        torch.nn.Tanh(),
        torch.nn.Linear(40, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 8),
    ).to(dtype)


def batch(t: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + t)
    return torch.randn(12, 24, generator=g).to(dtype), torch.randn(12, 8, generator=g).to(dtype)


class LiveGradients:
    """Per backward, the most gradient bytes alive at once, seen before the engine's hook of
    the same parameter runs (registered first)."""

    def __init__(self, model: torch.nn.Module):
        self.params = list(model.parameters())
        self.peaks: list[int] = []
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._seen)

    def _seen(self, _param: torch.Tensor) -> None:
        live = sum(
            q.grad.numel() * q.grad.element_size() for q in self.params if q.grad is not None
        )
        self.peaks[-1] = max(self.peaks[-1], live)


def run(dtype: torch.dtype, release: bool, **options):
    """Weights, the optimizer's state and per step (live-gradient peak, engine's held peak,
    gradients left in .grad after backward, whether it selected) of STEPS overlapped steps."""
    model = make_model(dtype)
    settings = {**SETTINGS, **options}
    fp16 = dtype == torch.float16
    opt = zenflow.ZenFlowAdamW(
        model.parameters(), lr=1e-2, release_gradients=release, num_threads=1, **settings
    )
    live = LiveGradients(model)
    opt.overlap_backward(model)
    per_step = []
    for t in range(STEPS):
        live.peaks.append(0)
        x, y = batch(t, dtype)
        loss = torch.nn.functional.mse_loss(model(x).float(), y.float())
        (opt.scale_loss(loss) if fp16 else loss).backward()
        left = sum(p.grad is not None for p in model.parameters())
        reselections = opt.stats()["reselections"]
        opt.step()
        stats = opt.stats()
        selected = t == 0 or stats["reselections"] > reselections
        per_step.append((live.peaks[-1], stats["held_gradient_bytes_peak"], left, selected))
        opt.zero_grad()
    opt.flush()
    return [p.detach().clone() for p in model.parameters()], opt.state_dict(), per_step


def bucket_bound(model: torch.nn.Module) -> tuple[int, int, int]:
    """(largest matrix's gradient bytes, the dense parameters' bytes, all bytes): with
    bucket_bytes 1 each matrix is a bucket of its own."""
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    matrices = [s for p, s in zip(model.parameters(), sizes) if p.dim() >= 2]
    dense = [s for p, s in zip(model.parameters(), sizes) if p.dim() < 2]
    return max(matrices), sum(dense), sum(sizes)


def assert_same(a, b, what: str) -> None:
    for i, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"{what}: tensor {i} differs"


@pytest.mark.parametrize(
    "options",
    [
        dict(overlap_step=True),
        dict(overlap_step=False, max_grad_norm=0.5),
        dict(update_interval="auto", max_grad_norm=0.5),
    ],
    ids=["overlap", "serial-clip", "auto-clip"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_released_gradients_free_memory_in_backward_and_change_nothing(dtype, options):
    options = {"bucket_bytes": 1, **options}
    kept_weights, kept_state, kept = run(dtype, False, **options)
    weights, state, released = run(dtype, True, **options)
    assert_same(kept_weights, weights, "weights")
    for index in kept_state["state"]:
        for key, value in kept_state["state"][index].items():
            other = state["state"][index][key]
            assert torch.equal(value, other) if torch.is_tensor(value) else value == other, key
    largest, dense, total = bucket_bound(make_model(dtype))
    matrices = sum(p.dim() >= 2 for p in make_model(dtype).parameters())
    assert sum(step[3] for step in released) >= 2  # the first selection and a re-selection
    for t, ((live_kept, _, left_kept, _), (live, held, left, selected)) in enumerate(
        zip(kept, released)
    ):
        assert live_kept == total and left_kept == 2 * matrices, t  # nothing freed without it
        if selected:
            assert live == held == total, (t, live, held)  # a selection step holds everything
            assert left == 2 * matrices, t
        else:
            assert live <= largest + dense, (t, live, largest, dense)
            assert held <= largest + dense, (t, held)
            assert left == matrices, t  # only the biases keep .grad after backward


def test_a_gradient_is_freed_before_backward_ends():
    model = make_model(torch.float32)
    opt = zenflow.ZenFlowAdamW(
        model.parameters(), lr=1e-2, release_gradients=True, bucket_bytes=1, **SETTINGS
    )
    first = model[0].weight
    refs: dict[str, weakref.ref] = {}

    def watch_last(_param):  # the last layer's gradient arrives first, the first layer's last
        if model[-1].weight.grad is not None:
            refs["last"] = weakref.ref(model[-1].weight.grad)

    def at_first(_param):
        refs["alive_at_first"] = refs["last"]() is not None

    # Both before overlap_backward's hooks: each sees its parameter's gradient before the
    # engine's hook of that parameter runs.
    model[-1].weight.register_post_accumulate_grad_hook(watch_last)
    first.register_post_accumulate_grad_hook(at_first)
    opt.overlap_backward(model)
    for t in range(2):  # step 0 selects (everything held); step 1 releases
        refs.clear()
        x, y = batch(t, torch.float32)
        torch.nn.functional.mse_loss(model(x), y).backward()
        released_in_backward = not refs["alive_at_first"]
        assert released_in_backward == (t == 1), t
        opt.step()
        opt.zero_grad()


class SharedTwice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(12, 12)
        self.head = torch.nn.Linear(12, 7)

    def forward(self, x):
        for _ in range(2):
            x = torch.tanh(torch.utils.checkpoint.checkpoint(self.fc, x, use_reentrant=True))
        return self.head(x)


def test_a_gradient_arriving_again_after_its_release_is_refused_and_changes_nothing():
    torch.manual_seed(3)
    model = SharedTwice()
    opt = zenflow.ZenFlowAdamW(
        model.parameters(), lr=1e-2, release_gradients=True, bucket_bytes=1, **SETTINGS
    )
    opt.overlap_backward(model)

    def backward(t):
        x = torch.randn(5, 12, generator=torch.Generator().manual_seed(t)).requires_grad_(True)
        model(x).square().mean().backward()

    backward(0)  # a selection step: nothing released, the step is retaken whole
    opt.step()
    opt.zero_grad()
    before = [p.detach().clone() for p in model.parameters()]
    state = opt.state_dict()
    backward(1)
    with pytest.raises(ValueError, match=r"grads\[\d\]: its gradient arrived again"):
        opt.step()
    assert_same(before, [p.detach() for p in model.parameters()], "a refused step")
    after = opt.state_dict()
    for index in state["state"]:
        for key, value in state["state"][index].items():
            if torch.is_tensor(value):
                assert torch.equal(value, after["state"][index][key]), key
    opt.zero_grad()
    model.head(torch.randn(5, 12)).sum().backward()  # fc unused: nothing arrives twice
    opt.step()  # the optimizer goes on


def test_release_gradients_setting_is_checked():
    model = make_model(torch.float32)
    with pytest.raises(TypeError, match="release_gradients"):
        zenflow.ZenFlowAdamW(model.parameters(), release_gradients="yes")
