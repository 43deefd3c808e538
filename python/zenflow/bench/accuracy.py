"""Accuracy of ZenFlowAdamW against torch.optim.AdamW in two regimes (issue 28):

* from scratch: a GPT-2-style model (LayerNorm, GELU MLP, learned positions) and a
  Llama-style model (RMSNorm, SwiGLU MLP, rotary positions, no biases), both built from a
  size here (nothing is downloaded), trained byte-level on CPython's documentation topics
  (`pydoc_data`), held-out loss on the last 10% of the text;
* fine-tuning: the demo's GPT (zenflow/demo.py), pretrained on the Language Reference and
  fine-tuned on the standard library's docstrings.

Every run of a comparison starts from the same initial weights and sees the same batches;
AdamW and ZenFlowAdamW clip at the same global norm and follow the same schedule (linear
warm-up, cosine decay). The held-out loss is taken after ZenFlowAdamW.flush() (the exact
weights); the curve points before it are the weights as training sees them.

    python -m zenflow bench accuracy --regime scratch --arch gpt2,llama --steps 600 \
        --lr 1e-3,3e-3 --seeds 0,1,2 --setting defaults --setting update_lag=1
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .. import demo
from ..optimizer import ZenFlowAdamW, stall_seconds

__all__ = ["ScratchSize", "SCRATCH_SIZES", "Llama", "train_scratch", "finetune", "main"]


@dataclass(frozen=True)
class ScratchSize:
    d_model: int
    layers: int
    heads: int
    context: int
    batch: int


SCRATCH_SIZES = {
    "tiny": ScratchSize(d_model=64, layers=2, heads=4, context=64, batch=8),
    "small": ScratchSize(d_model=128, layers=4, heads=4, context=64, batch=8),
}
VOCAB = 256  # bytes


# ---- models ----


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class LlamaBlock(torch.nn.Module):
    def __init__(self, d: int, heads: int, mlp: int):
        super().__init__()
        self.heads = heads
        self.norm1 = RMSNorm(d)
        self.q = torch.nn.Linear(d, d, bias=False)
        self.k = torch.nn.Linear(d, d, bias=False)
        self.v = torch.nn.Linear(d, d, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)
        self.norm2 = RMSNorm(d)
        self.gate = torch.nn.Linear(d, mlp, bias=False)
        self.up = torch.nn.Linear(d, mlp, bias=False)
        self.down = torch.nn.Linear(mlp, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.norm1(x)

        def heads(layer: torch.nn.Linear) -> torch.Tensor:
            return layer(h).view(b, t, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = _rotate(heads(self.q), cos, sin), _rotate(heads(self.k), cos, sin), heads(self.v)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attention.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(torch.nn.Module):
    """A Llama-style decoder: RMSNorm, rotary positions, SwiGLU MLP (hidden 8/3 d rounded up
    to a multiple of 16), no biases, untied embedding and head."""

    def __init__(self, size: ScratchSize, vocab: int = VOCAB):
        super().__init__()
        d, head_dim = size.d_model, size.d_model // size.heads
        mlp = 16 * math.ceil(8 * d / 3 / 16)
        self.embed = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(
            LlamaBlock(d, size.heads, mlp) for _ in range(size.layers)
        )
        self.norm = RMSNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        inverse = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(size.context).float(), inverse)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        for module in self.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(module.weight, std=0.02)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, self.cos[:t], self.sin[:t])
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def build(arch: str, size: ScratchSize, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    if arch == "gpt2":
        return demo.GPT(
            demo.ModelSize(
                d_model=size.d_model,
                layers=size.layers,
                heads=size.heads,
                context=size.context,
                vocab=VOCAB,
                batch=size.batch,
                pretrain_steps=0,
            )
        )
    if arch == "llama":
        return Llama(size)
    raise ValueError(f"arch: expected gpt2 or llama, got {arch!r}")


# ---- from scratch ----


def scratch_text() -> tuple[torch.Tensor, torch.Tensor]:
    """CPython's documentation topics as bytes: the first 90% to train, the rest held out."""
    from pydoc_data.topics import topics

    data = "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    ids = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    split = int(0.9 * ids.numel())
    return ids[:split], ids[split:]


def _schedule(opt: torch.optim.Optimizer, steps: int, warm_up: int) -> Any:
    return torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1.0, (s + 1) / warm_up) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
        ),
    )


@torch.no_grad()
def _held_out(model: torch.nn.Module, held: torch.Tensor, size: ScratchSize, batches: int) -> float:
    model.eval()
    span = size.context + 1
    starts = list(range(0, held.numel() - span, span))[: batches * size.batch]
    losses = []
    for i in range(0, len(starts), size.batch):
        window = torch.stack([held[s : s + span] for s in starts[i : i + size.batch]])
        losses.append(model(window[:, :-1], window[:, 1:]).item())
    model.train()
    return statistics.fmean(losses)


def train_scratch(
    arch: str,
    size: ScratchSize,
    optimizer: str,
    options: dict | None,
    steps: int,
    lr: float,
    seed: int,
    *,
    clip: float = 1.0,
    weight_decay: float = 0.01,
    eval_every: int = 0,
    eval_batches: int = 16,
) -> dict:
    """One run from scratch. optimizer: "adamw" (torch.optim.AdamW) or "zenflow"
    (ZenFlowAdamW with `options`). Same seed: same initial weights and batches."""
    train, held = scratch_text()
    model = build(arch, size, seed)
    groups = demo.param_groups(model, weight_decay)
    if optimizer == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW(groups, lr=lr)
    else:
        opt = ZenFlowAdamW(groups, lr=lr, max_grad_norm=clip, **(options or {}))
    schedule = _schedule(opt, steps, warm_up=max(1, min(20, steps // 10)))
    gen = torch.Generator().manual_seed(seed + 1)
    curve: list[tuple[int, float]] = []
    losses = []
    started = time.perf_counter()
    for step in range(1, steps + 1):
        starts = torch.randint(0, train.numel() - size.context - 1, (size.batch,), generator=gen)
        window = torch.stack([train[s : s + size.context + 1] for s in starts.tolist()])
        loss = model(window[:, :-1], window[:, 1:])
        loss.backward()
        if optimizer == "adamw":
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        schedule.step()
        losses.append(loss.item())
        if eval_every and step % eval_every == 0 and step != steps:
            curve.append((step, _held_out(model, held, size, eval_batches)))
    stats = None
    if isinstance(opt, ZenFlowAdamW):
        stats = opt.stats()
        opt.flush()
    final = _held_out(model, held, size, eval_batches)
    curve.append((steps, final))
    if isinstance(opt, ZenFlowAdamW):
        opt.close()
    tail = max(1, steps // 10)
    return {
        "held_out": final,
        "train_loss": statistics.fmean(losses[-tail:]),
        "curve": curve,
        "seconds": time.perf_counter() - started,
        "stats": stats,
    }


# ---- fine-tuning ----


def finetune(
    model_size: str, options: dict | None, steps: int, seed: int, lr: float = 1e-3
) -> dict:
    """The demo's fine-tuning (zenflow/demo.py) with AdamW (options None) or ZenFlowAdamW."""
    config = demo.DemoConfig(
        model_size=model_size,
        steps=steps,
        lr=lr,
        seed=seed,
        eval_every=max(1, steps // 4),
        progress=False,
        zenflow_options=options,
    )
    size = demo.PRESETS[model_size]
    ids, info = demo.tokens(size.vocab, config.cache)
    start = demo.pretrained(config, ids, info.pop("folder"))
    # The last argument is the copy bandwidth, used only for the demo's timing columns.
    record = demo.run_one("adamw" if options is None else "zenflow", config, ids, start, 1.0)
    return {
        "held_out": record["final_held_out_loss"],
        "train_loss": record["final_train_loss"],
        "curve": record["held_out"],
        "seconds": sum(record["step_seconds"]),
        "stats": record["engine_stats"],
    }


# ---- the comparison ----


def parse_setting(text: str) -> tuple[str, dict]:
    """ "defaults", or comma-separated key=value ZenFlowAdamW keywords (ints, floats, bools,
    words)."""
    if text == "defaults":
        return text, {}
    options: dict[str, Any] = {}
    for item in text.split(","):
        key, _, raw = item.partition("=")
        if not _ or not key:
            raise ValueError(f"--setting: expected key=value items, got {item!r}")
        value: Any = raw
        if raw in ("true", "false", "True", "False"):
            value = raw.lower() == "true"
        else:
            for kind in (int, float):
                try:
                    value = kind(raw)
                    break
                except ValueError:
                    pass
        options[key] = value
    return text, options


def _one_run(regime, arch, size, steps, lr, seed, options) -> dict:
    """AdamW (options None) or ZenFlowAdamW with options, in the regime."""
    if regime == "finetune":
        return finetune(arch, options, steps, seed, lr)
    optimizer = "adamw" if options is None else "zenflow"
    return train_scratch(
        arch,
        SCRATCH_SIZES[size],
        optimizer,
        options,
        steps,
        lr,
        seed,
        eval_every=max(1, steps // 6),
    )


def run(
    regime: str,
    archs: list[str],
    size: str,
    steps: int,
    lrs: list[float],
    seeds: list[int],
    settings: list[tuple[str, dict]],
    progress: bool = True,
) -> list[dict]:
    """Every (model, lr, seed): AdamW once, then each zenflow setting. Rows: one per
    (model, lr, setting) with the per-seed held-out losses of both and their ratio."""
    rows = []
    for arch in archs:
        for lr in lrs:
            base: dict[int, dict] = {}
            per_setting: dict[str, dict[int, dict]] = {name: {} for name, _ in settings}
            for seed in seeds:

                def one(options, seed=seed, arch=arch, lr=lr):
                    return _one_run(regime, arch, size, steps, lr, seed, options)

                base[seed] = one(None)
                if progress:
                    print(
                        f"  {arch} lr {lr:g} seed {seed}: adamw {base[seed]['held_out']:.4f}",
                        file=sys.stderr,
                    )
                for name, options in settings:
                    per_setting[name][seed] = one(options)
                    if progress:
                        r = per_setting[name][seed]["held_out"] / base[seed]["held_out"] - 1
                        print(
                            f"    {name}: {per_setting[name][seed]['held_out']:.4f} ({100 * r:+.2f}%)",
                            file=sys.stderr,
                        )
            for name, _ in settings:
                ratios = [per_setting[name][s]["held_out"] / base[s]["held_out"] - 1 for s in seeds]
                rows.append(
                    {
                        "regime": regime,
                        "arch": arch,
                        "size": size,
                        "steps": steps,
                        "lr": lr,
                        "setting": name,
                        "seeds": seeds,
                        "adamw": [base[s]["held_out"] for s in seeds],
                        "zenflow": [per_setting[name][s]["held_out"] for s in seeds],
                        "gap": statistics.fmean(ratios),
                        "gap_per_seed": ratios,
                        "adamw_curves": [base[s]["curve"] for s in seeds],
                        "zenflow_curves": [per_setting[name][s]["curve"] for s in seeds],
                        "stall_per_step": statistics.fmean(
                            stall_seconds(per_setting[name][s]["stats"]) / steps for s in seeds
                        ),
                    }
                )
    return rows


def markdown(rows: list[dict]) -> str:
    out = [
        "| regime | model | steps | lr | zenflow setting | AdamW held-out (mean) | zenflow held-out (mean) "
        "| vs AdamW, mean of seeds | per seed |",
        "|---|---|---:|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        per_seed = ", ".join(f"{100 * g:+.2f}%" for g in r["gap_per_seed"])
        out.append(
            f"| {r['regime']} | {r['arch'] if r['regime'] == 'finetune' else r['arch'] + ' ' + r['size']} "
            f"| {r['steps']} | {r['lr']:g} | {r['setting']} "
            f"| {statistics.fmean(r['adamw']):.4f} | {statistics.fmean(r['zenflow']):.4f} "
            f"| **{100 * r['gap']:+.2f}%** | {per_seed} |"
        )
    return "\n".join(out)


def plot(rows: list[dict], path: Path) -> bool:
    """Held-out loss curves (mean of seeds), one panel per (model, lr); False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = sorted({(r["regime"], r["arch"], r["lr"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (regime, arch, lr) in zip(axes[0], panels):
        mine = [r for r in rows if (r["regime"], r["arch"], r["lr"]) == (regime, arch, lr)]

        def mean_curve(curves: list) -> tuple[list, list]:
            steps = [s for s, _ in curves[0]]
            return steps, [statistics.fmean(c[i][1] for c in curves) for i in range(len(steps))]

        ax.plot(*mean_curve(mine[0]["adamw_curves"]), label="AdamW", color="black")
        for r in mine:
            ax.plot(*mean_curve(r["zenflow_curves"]), label=f"zenflow {r['setting']}")
        ax.set_title(f"{regime} {arch} lr {lr:g}")
        ax.set_xlabel("step")
        ax.set_ylabel("held-out loss")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m zenflow bench accuracy", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--regime", choices=("scratch", "finetune"), default="scratch")
    parser.add_argument(
        "--arch", default="gpt2,llama", help="scratch: gpt2,llama; finetune: demo sizes"
    )
    parser.add_argument("--size", default="tiny", choices=sorted(SCRATCH_SIZES))
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", default="1e-3,3e-3")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--setting", action="append", default=None, help="defaults, or key=value,..."
    )
    parser.add_argument("--json", type=Path, default=None, help="write every row (curves too)")
    parser.add_argument(
        "--plot", type=Path, default=None, help="write the curves (needs matplotlib)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch's threads (the same for every run)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    settings = [parse_setting(s) for s in (args.setting or ["defaults"])]
    rows = run(
        args.regime,
        args.arch.split(","),
        args.size,
        args.steps,
        [float(x) for x in args.lr.split(",")],
        [int(x) for x in args.seeds.split(",")],
        settings,
    )
    print(markdown(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.plot is not None and not plot(rows, args.plot):
        print("no plot: matplotlib is not installed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
