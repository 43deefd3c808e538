"""`python -m zenflow demo`: zenflow on real training, against plain AdamW and synchronous offload.

A small GPT-style language model learns real English text: the Python Language Reference's
topic pages, which every CPython installation ships (`pydoc_data.topics`, the text behind
`help("if")` and friends), so nothing is downloaded at run time. A byte-level BPE tokenizer
(the `tokenizers` library) is trained on that text at first use and cached with the encoded
tokens (under --cache, default ~/.cache/zenflow/demo). Every tenth paragraph is held out.

Three runs from the same seed, the same initial weights and the same batches:
  adamw       torch.optim.AdamW: no offload (the accuracy reference);
  sync        ZenFlowAdamW(topk_ratio=0, update_interval=1, overlap_step=False): every column
              offloaded and updated by the CPU optimizer every step while training waits
              (synchronous offload, ZeRO-Offload's schedule);
  zenflow     ZenFlowAdamW with its defaults (top 10% of columns every step, the rest every
              4 steps, in the background).
For each: train and held-out loss, step time, stall seconds per step, bytes down and up per
step as multiples of the model's size, and the optimizer's device-memory footprint. Writes a
side-by-side table (stdout and table.md), every number as JSON (results.json) and a PNG with
the loss curves and the time per step split into compute, stall and copies (demo.png).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import os
import platform
import statistics
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

import zenflow

from .config import ENGINE_DEFAULTS
from .optimizer import ZenFlowAdamW, stall_seconds

__all__ = ["DemoConfig", "PRESETS", "run_demo", "main"]


@dataclass(frozen=True)
class ModelSize:
    d_model: int
    layers: int
    heads: int
    context: int
    vocab: int
    batch: int
    pretrain_steps: int


# Sizes of the demo's model. The optimizer's share of a step grows with the parameter count
# per token of the batch: "large" (33.6M parameters, 2 x 32 tokens) is where the optimizer
# (the host update and the engine's device-side ops) is the largest share of a step on a
# 2-core machine.
PRESETS: dict[str, ModelSize] = {
    "tiny": ModelSize(
        d_model=64, layers=2, heads=4, context=64, vocab=1024, batch=8, pretrain_steps=300
    ),
    "small": ModelSize(
        d_model=128, layers=4, heads=4, context=64, vocab=2048, batch=8, pretrain_steps=400
    ),
    "medium": ModelSize(
        d_model=256, layers=6, heads=8, context=64, vocab=4096, batch=4, pretrain_steps=400
    ),
    "large": ModelSize(
        d_model=512, layers=8, heads=8, context=32, vocab=8192, batch=2, pretrain_steps=300
    ),
}

RUNS = ("adamw", "sync", "zenflow")


@dataclass
class DemoConfig:
    model_size: str = "small"
    steps: int = 300
    lr: float = 1e-3
    pretrain_lr: float = 3e-3
    weight_decay: float = 0.01
    seed: int = 0
    eval_every: int = 50
    eval_batches: int = 16
    device: str = "cpu"
    runs: tuple[str, ...] = RUNS
    zenflow_options: dict | None = None  # extra ZenFlowAdamW keywords for the "zenflow" run
    cache: str | None = None
    out: str | None = None
    progress: bool = True


# ---- data: real text, a real tokenizer, cached ----


def _paragraphs_of_topics() -> list[str]:
    from pydoc_data.topics import topics

    out = []
    for name in sorted(topics):
        out += [p.strip() for p in topics[name].split("\n\n") if p.strip()]
    return out


def _stdlib_docstrings() -> list[str]:
    """The docstrings of the standard library's public top-level modules, read with `ast`
    (nothing is imported)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.glob("*.py")):
        if path.name.startswith("_"):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 40:
                    out.append(doc.strip())
    return out


def corpus() -> dict[str, str]:
    """The demo's text, all of it shipped with CPython:
    pretrain   the Python Language Reference's topic pages (pydoc_data.topics);
    train      the docstrings of the standard library's modules, but every tenth;
    held_out   every tenth of those docstrings."""
    docs = _stdlib_docstrings()
    return {
        "pretrain": "\n\n".join(_paragraphs_of_topics()),
        "train": "\n\n".join(d for i, d in enumerate(docs) if i % 10 != 9),
        "held_out": "\n\n".join(d for i, d in enumerate(docs) if i % 10 == 9),
    }


def _cache_dir(cache: str | None) -> Path:
    if cache:
        return Path(cache)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "zenflow" / "demo"


def _save_atomic(obj: Any, path: Path) -> None:
    partial = path.with_suffix(".tmp")
    torch.save(obj, partial)
    partial.replace(path)  # a concurrent run never reads half a file


def tokens(vocab: int, cache: str | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """Token ids (int64) of every part of the corpus, encoded with a byte-level BPE tokenizer
    of `vocab` entries trained on all of it. Cached, keyed by the text's hash. Without the
    `tokenizers` package (an offline GPU machine, say) the ids are the text's UTF-8 bytes:
    the same model and runs, on a plainer tokenization."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        return _byte_tokens(cache)
    started = time.perf_counter()
    text = corpus()
    digest = hashlib.sha256(str(vocab).encode())
    for part in sorted(text):
        digest.update(part.encode() + b"\0" + text[part].encode() + b"\0")
    folder = _cache_dir(cache) / digest.hexdigest()[:16]
    token_file = folder / "tokens.pt"
    info = {
        "pretrain_text": "pydoc_data.topics: the Python Language Reference's topic pages",
        "finetune_text": "docstrings of the standard library's modules (every tenth held out)",
        "cache": str(folder),
        "characters": {part: len(value) for part, value in text.items()},
    }
    if token_file.exists():
        ids = torch.load(token_file, weights_only=True)
        info["tokenizer"] = "cached"
    else:
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(
            (p for part in sorted(text) for p in text[part].split("\n\n")), trainer=trainer
        )
        ids = {
            part: torch.tensor(tokenizer.encode(value).ids, dtype=torch.int64)
            for part, value in text.items()
        }
        folder.mkdir(parents=True, exist_ok=True)
        tokenizer.save(str(folder / "tokenizer.json"))
        _save_atomic(ids, token_file)
        info["tokenizer"] = "trained"
    info["tokens"] = {part: value.numel() for part, value in ids.items()}
    info["seconds"] = time.perf_counter() - started
    info["folder"] = folder
    return ids, info


def _byte_tokens(cache: str | None) -> tuple[dict[str, torch.Tensor], dict]:
    started = time.perf_counter()
    text = corpus()
    digest = hashlib.sha256(b"utf-8 bytes")
    for part in sorted(text):
        digest.update(part.encode() + b"\0" + text[part].encode() + b"\0")
    folder = _cache_dir(cache) / f"bytes-{digest.hexdigest()[:16]}"  # the pretrained model's
    folder.mkdir(parents=True, exist_ok=True)
    ids = {
        part: torch.frombuffer(bytearray(value.encode()), dtype=torch.uint8).to(torch.int64)
        for part, value in text.items()
    }
    info = {
        "pretrain_text": "pydoc_data.topics: the Python Language Reference's topic pages",
        "finetune_text": "docstrings of the standard library's modules (every tenth held out)",
        "cache": str(folder),
        "characters": {part: len(value) for part, value in text.items()},
        "tokenizer": "UTF-8 bytes (the tokenizers package is not installed: pip install 'zenflow[demo]')",
        "tokens": {part: value.numel() for part, value in ids.items()},
        "seconds": time.perf_counter() - started,
        "folder": folder,
    }
    return ids, info


# ---- the model: a small GPT ----


class Block(torch.nn.Module):
    def __init__(self, size: ModelSize):
        super().__init__()
        self.heads = size.heads
        self.norm1 = torch.nn.LayerNorm(size.d_model)
        self.qkv = torch.nn.Linear(size.d_model, 3 * size.d_model)
        self.proj = torch.nn.Linear(size.d_model, size.d_model)
        self.norm2 = torch.nn.LayerNorm(size.d_model)
        self.up = torch.nn.Linear(size.d_model, 4 * size.d_model)
        self.down = torch.nn.Linear(4 * size.d_model, size.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            self.qkv(self.norm1(x))
            .view(b, t, 3, self.heads, d // self.heads)
            .permute(2, 0, 3, 1, 4)
        )
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class GPT(torch.nn.Module):
    def __init__(self, size: ModelSize):
        super().__init__()
        self.embed = torch.nn.Embedding(size.vocab, size.d_model)
        self.position = torch.nn.Parameter(torch.zeros(size.context, size.d_model))
        self.blocks = torch.nn.ModuleList(Block(size) for _ in range(size.layers))
        self.norm = torch.nn.LayerNorm(size.d_model)
        self.head = torch.nn.Linear(size.d_model, size.vocab, bias=False)
        for module in self.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    torch.nn.init.zeros_(module.bias)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.position[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices, none on biases and norms (the usual LLM split)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _batch(
    data: torch.Tensor, size: ModelSize, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, data.numel() - size.context - 1, (size.batch,), generator=gen)
    window = torch.stack([data[s : s + size.context + 1] for s in starts.tolist()])
    return window[:, :-1], window[:, 1:]


@torch.no_grad()
def held_out_loss(
    model: torch.nn.Module, data: torch.Tensor, size: ModelSize, batches: int
) -> float:
    gen = torch.Generator().manual_seed(12345)  # the same held-out windows for every run
    device = next(model.parameters()).device
    losses = [
        model(*(t.to(device) for t in _batch(data, size, gen))).item() for _ in range(batches)
    ]
    return statistics.fmean(losses)


# ---- --device cuda: the same runs on the GPU ----
# The model is bf16 on the GPU (the peer: torch.optim.AdamW(fused=True) on the bf16
# parameters); batches are drawn on the CPU, from the same generator, then moved. Step times
# are taken between torch.cuda.synchronize() calls; copies are counted at the pinned
# host <-> device copy rate measured here; GPU memory is torch.cuda.max_memory_allocated().
CUDA_DTYPE = torch.bfloat16


def _check_device(device: str) -> torch.device:
    if device == "cpu":
        return torch.device("cpu")
    if device not in ("cuda",) and not device.startswith("cuda:"):
        raise SystemExit(f"--device: expected cpu or cuda, got {device!r}")
    if not torch.cuda.is_available():
        raise SystemExit(
            f"--device {device}: no GPU is visible to torch (torch.cuda.is_available() is False); "
            "the demo runs on the CPU with --device cpu (the default)"
        )
    if not zenflow.cuda_available():
        raise SystemExit(
            f"--device {device}: this build of zenflow has no CUDA backend (zenflow.cuda_available() "
            "is False); rebuild with ZENFLOW_WITH_CUDA=ON, or use --device cpu"
        )
    return torch.device(device)


def pcie_bandwidth(device: torch.device) -> float:
    """Bytes per second of pinned host <-> device copies (down and up, 64 MiB each)."""
    host = torch.empty(64 << 20, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty_like(host, device=device)
    samples = []
    for _ in range(5):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        host.copy_(dev, non_blocking=True)
        torch.cuda.synchronize(device)
        samples.append(time.perf_counter() - start)
    return 2 * host.numel() / statistics.median(samples)


def memcpy_bandwidth() -> float:
    """Bytes per second of a large copy on this machine (to turn bytes moved into time)."""
    src = torch.ones(16 << 20)
    dst = torch.empty_like(src)
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        samples.append(time.perf_counter() - start)
    return 2 * src.numel() * 4 / statistics.median(samples)  # read + write


def _cosine(opt: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over 20 steps, then cosine decay to zero at `steps`."""
    return torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)),
    )


def pretrained(
    config: DemoConfig, ids: dict[str, torch.Tensor], folder: Path
) -> dict[str, torch.Tensor]:
    """The starting point of the fine-tuning runs: the model trained with torch.optim.AdamW on
    the Language Reference text, once, then cached beside the tokens."""
    size = PRESETS[config.model_size]
    device = torch.device(config.device)
    on = "" if device.type == "cpu" else "-cuda"  # pretrained on the GPU: other rounding
    path = (
        folder
        / f"pretrained-{config.model_size}-seed{config.seed}-{size.pretrain_steps}steps{on}.pt"
    )
    if path.exists():
        return torch.load(path, weights_only=True)
    torch.manual_seed(config.seed)
    model = GPT(size).to(device)
    opt = torch.optim.AdamW(
        param_groups(model, config.weight_decay), lr=config.pretrain_lr, foreach=True
    )
    schedule = _cosine(opt, size.pretrain_steps)
    gen = torch.Generator().manual_seed(config.seed + 7)
    bar = _progress(size.pretrain_steps, "pretrain", config.progress)
    for _ in range(size.pretrain_steps):
        loss = model(*(t.to(device) for t in _batch(ids["pretrain"], size, gen)))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        schedule.step()
        if bar is not None:
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
            bar.update()
    if bar is not None:
        bar.close()
    state = {key: value.cpu() for key, value in model.state_dict().items()}
    _save_atomic(state, path)
    return state


# ---- one run ----


def _optimizer(name: str, model: torch.nn.Module, config: DemoConfig) -> torch.optim.Optimizer:
    groups = param_groups(model, config.weight_decay)
    if name == "adamw":
        if config.device != "cpu":
            return torch.optim.AdamW(groups, lr=config.lr, fused=True)
        return torch.optim.AdamW(groups, lr=config.lr, foreach=True)
    if name == "sync":
        return ZenFlowAdamW(
            groups, lr=config.lr, topk_ratio=0.0, update_interval=1, overlap_step=False
        )
    if name == "zenflow":
        return ZenFlowAdamW(groups, lr=config.lr, **(config.zenflow_options or {}))
    raise ValueError(f"runs: unknown run {name!r} (expected one of {', '.join(RUNS)})")


def _progress(total: int, label: str, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - the demo extra is missing
        return None
    return tqdm(
        total=total,
        desc=f"{label:>8}",
        unit="step",
        leave=True,
        dynamic_ncols=True,
        file=sys.stderr,
    )


def run_one(name: str, config: DemoConfig, ids: dict, start: dict, bandwidth: float) -> dict:
    size = PRESETS[config.model_size]
    train, held_out = ids["train"], ids["held_out"]
    device = torch.device(config.device)
    model = GPT(size)
    model.load_state_dict(start)
    if device.type == "cuda":
        model.to(device, CUDA_DTYPE)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    parameters = sum(p.numel() for p in model.parameters())
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = _optimizer(name, model, config)
    schedule = _cosine(opt, config.steps)
    gen = torch.Generator().manual_seed(config.seed + 1)
    record: dict[str, Any] = {"run": name, "train_loss": [], "step_seconds": [], "held_out": []}
    record["held_out"].append((0, held_out_loss(model, held_out, size, config.eval_batches)))
    bar = _progress(config.steps, name, config.progress)
    for step in range(1, config.steps + 1):
        ids, targets = (t.to(device) for t in _batch(train, size, gen))
        sync()
        start = time.perf_counter()
        loss = model(ids, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        record["step_seconds"].append(time.perf_counter() - start)
        schedule.step()
        record["train_loss"].append(loss.item())
        if step % config.eval_every == 0 and step != config.steps:
            record["held_out"].append(
                (step, held_out_loss(model, held_out, size, config.eval_batches))
            )
        if bar is not None:
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
            bar.update()
    stats = opt.stats() if isinstance(opt, ZenFlowAdamW) else None
    if isinstance(opt, ZenFlowAdamW):
        opt.flush()  # the exact weights for the final evaluation (not counted in the steps)
    final = held_out_loss(model, held_out, size, config.eval_batches)
    record["held_out"].append((config.steps, final))
    if bar is not None:
        bar.set_postfix(loss=f"{record['train_loss'][-1]:.3f}", held_out=f"{final:.3f}")
        bar.close()
    if isinstance(opt, ZenFlowAdamW):
        opt.close()
    if device.type == "cuda":
        record["gpu_max_memory_allocated"] = torch.cuda.max_memory_allocated(device)

    steps = config.steps
    timed = record["step_seconds"][min(5, steps - 1) :]  # the first steps warm caches up
    # The headline: the mean over every timed step, the periodic window-close stalls
    # included (a median would hide them); the median goes beside it.
    step_seconds = statistics.fmean(timed)
    stall = 0.0
    bytes_down = bytes_up = 0.0
    # torch.optim.AdamW: exp_avg and exp_avg_sq, in the parameters' dtype
    state_bytes = 2 * model_bytes
    if stats is not None:
        stall = stall_seconds(stats) / steps
        bytes_down, bytes_up = stats["bytes_down"] / steps, stats["bytes_up"] / steps
        state_bytes = stats["device_state_bytes"]
    copies = (bytes_down + bytes_up) / bandwidth
    tail = max(1, steps // 10)
    record.update(
        parameters=parameters,
        model_bytes=model_bytes,
        final_train_loss=statistics.fmean(record["train_loss"][-tail:]),
        final_held_out_loss=final,
        step_seconds_median=statistics.median(timed),
        step_seconds_mean=step_seconds,
        stall_seconds_per_step=stall,
        copy_seconds_per_step=copies,
        compute_seconds_per_step=max(0.0, step_seconds - stall - copies),
        bytes_down_per_step=bytes_down,
        bytes_up_per_step=bytes_up,
        down_per_step_model_sizes=bytes_down / model_bytes,
        up_per_step_model_sizes=bytes_up / model_bytes,
        device_optimizer_state_bytes=state_bytes,
        device_memory_bytes=2 * model_bytes + state_bytes,  # weights + gradients + optimizer state
        engine_stats=stats,
    )
    return record


# ---- reporting ----


def _mib(value: float) -> str:
    return f"{value / 2**20:.1f} MiB"


def table(results: dict[str, dict]) -> str:
    names = list(results)
    base = results.get("adamw")
    sync = results.get("sync")
    rows: list[tuple[str, Callable[[dict], str]]] = [
        ("train loss (last 10% of steps)", lambda r: f"{r['final_train_loss']:.4f}"),
        ("held-out loss", lambda r: f"{r['final_held_out_loss']:.4f}"),
        (
            "held-out vs adamw",
            lambda r: (
                f"{100 * (r['final_held_out_loss'] / base['final_held_out_loss'] - 1):+.2f}%"
                if base
                else "-"
            ),
        ),
        ("step time (mean ms)", lambda r: f"{1e3 * r['step_seconds_mean']:.1f}"),
        ("step time (median ms)", lambda r: f"{1e3 * r['step_seconds_median']:.1f}"),
        (
            "step time vs sync offload (means)",
            lambda r: f"{sync['step_seconds_mean'] / r['step_seconds_mean']:.2f}x" if sync else "-",
        ),
        ("stall per step (ms)", lambda r: f"{1e3 * r['stall_seconds_per_step']:.2f}"),
        ("bytes down per step (model sizes)", lambda r: f"{r['down_per_step_model_sizes']:.3f}"),
        ("bytes up per step (model sizes)", lambda r: f"{r['up_per_step_model_sizes']:.3f}"),
        ("optimizer state on the device", lambda r: _mib(r["device_optimizer_state_bytes"])),
        ("device memory (weights + grads + state)", lambda r: _mib(r["device_memory_bytes"])),
        (
            "device memory vs adamw",
            lambda r: (
                f"{r['device_memory_bytes'] / base['device_memory_bytes']:.2f}x" if base else "-"
            ),
        ),
    ]
    if all("gpu_max_memory_allocated" in r for r in results.values()):
        rows.append(
            (
                "GPU memory peak (max_memory_allocated)",
                lambda r: _mib(r["gpu_max_memory_allocated"]),
            )
        )
        rows.append(
            (
                "GPU memory peak vs adamw",
                lambda r: (
                    f"{r['gpu_max_memory_allocated'] / base['gpu_max_memory_allocated']:.2f}x"
                    if base
                    else "-"
                ),
            )
        )
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(cell(results[n]) for n in names) + " |")
    return "\n".join(lines)


def plot(results: dict[str, dict], path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - the demo extra is missing
        return False
    colors = {"adamw": "#4c72b0", "sync": "#c44e52", "zenflow": "#55a868"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, r in results.items():
        losses = r["train_loss"]
        window = max(1, len(losses) // 30)
        smooth = [
            statistics.fmean(losses[max(0, i - window + 1) : i + 1]) for i in range(len(losses))
        ]
        left.plot(
            range(1, len(losses) + 1),
            smooth,
            color=colors.get(name),
            label=f"{name} train",
            alpha=0.9,
        )
        steps, held = zip(*r["held_out"])
        left.plot(
            steps, held, "o--", color=colors.get(name), label=f"{name} held-out", markersize=4
        )
    left.set_xlabel("step")
    left.set_ylabel("loss (nats per token)")
    left.set_title("loss")
    left.legend(fontsize=8)
    names = list(results)
    compute = [1e3 * results[n]["compute_seconds_per_step"] for n in names]
    stall = [1e3 * results[n]["stall_seconds_per_step"] for n in names]
    copies = [1e3 * results[n]["copy_seconds_per_step"] for n in names]
    right.bar(
        names, compute, label="compute (the model, and the engine's own step work)", color="#8c8c8c"
    )
    right.bar(
        names, stall, bottom=compute, label="stall (waiting for the CPU optimizer)", color="#c44e52"
    )
    right.bar(
        names,
        copies,
        bottom=[c + s for c, s in zip(compute, stall)],
        label="copies (bytes / memcpy rate)",
        color="#dd8452",
    )
    right.set_ylabel("ms per step (mean)")
    right.set_title("time per step")
    right.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def run_demo(config: DemoConfig) -> dict[str, Any]:
    device = _check_device(config.device)
    if config.model_size not in PRESETS:
        raise SystemExit(
            f"--model-size: expected one of {', '.join(PRESETS)}, got {config.model_size!r}"
        )
    if config.steps < 2:
        raise SystemExit(f"--steps: must be >= 2, got {config.steps}")
    size = PRESETS[config.model_size]
    ids, data_info = tokens(size.vocab, config.cache)
    start = pretrained(config, ids, data_info.pop("folder"))
    bandwidth = memcpy_bandwidth() if device.type == "cpu" else pcie_bandwidth(device)
    torch_threads = torch.get_num_threads()
    results = {}
    for name in config.runs:
        torch.set_num_threads(torch_threads)  # ZenFlowAdamW lowers it to its reserved share
        results[name] = run_one(name, config, ids, start, bandwidth)
        results[name]["torch_threads"] = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    parameters = next(iter(results.values()))["parameters"]
    summary = {
        "config": asdict(config),
        "model": asdict(size),
        "parameters": parameters,
        "data": data_info,
        "machine": {
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "zenflow": zenflow.__version__,
            "simd": zenflow.simd_level(),
            "memcpy_bytes_per_second": bandwidth,
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        },
        "runs": results,
        "table": table(results),
    }
    if config.out:
        out = Path(config.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(summary, indent=1, default=float))
        (out / "table.md").write_text(summary["table"] + "\n")
        where = "CPU" if device.type == "cpu" else f"{torch.cuda.get_device_name(device)}, bf16"
        title = f"zenflow demo: {config.model_size} GPT ({parameters / 1e6:.1f}M parameters), {config.steps} steps, {where}"
        summary["plot"] = str(out / "demo.png") if plot(results, out / "demo.png", title) else None
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m zenflow demo", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu (default), or cuda: the three runs on the GPU, bf16 (needs a CUDA build of zenflow)",
    )
    parser.add_argument(
        "--model-size",
        default=None,
        choices=sorted(PRESETS),
        help="default: small (tiny with --quick)",
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="steps per run (default 300; 120 with --quick)"
    )
    parser.add_argument(
        "--out", default="zenflow-demo", help="folder for table.md, results.json, demo.png"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a tiny model and fewer steps: under a minute"
    )
    parser.add_argument("--lr", type=float, default=1e-3, help="fine-tuning learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache", default=None, help="tokenizer and token cache (default ~/.cache/zenflow/demo)"
    )
    parser.add_argument(
        "--topk-ratio", type=float, default=None, help="the zenflow run's topk_ratio (default 0.1)"
    )
    parser.add_argument(
        "--update-interval",
        default=None,
        help='the zenflow run\'s update_interval: an integer or "auto" (default 4)',
    )
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    options: dict[str, Any] = {}
    if args.topk_ratio is not None:
        options["topk_ratio"] = args.topk_ratio
    if args.update_interval is not None:
        options["update_interval"] = (
            args.update_interval if args.update_interval == "auto" else int(args.update_interval)
        )
    config = DemoConfig(
        model_size=args.model_size or ("tiny" if args.quick else "small"),
        zenflow_options=options or None,
        steps=args.steps or (120 if args.quick else 300),
        lr=args.lr,
        seed=args.seed,
        eval_every=40 if args.quick else 50,
        eval_batches=8 if args.quick else 16,
        device=args.device,
        cache=args.cache,
        out=args.out,
        progress=not args.no_progress,
    )
    started = time.perf_counter()
    summary = run_demo(config)
    size = PRESETS[config.model_size]
    print()
    print(
        f"zenflow demo: a {config.model_size} GPT ({summary['parameters'] / 1e6:.2f}M parameters, "
        f"{size.layers} layers, d_model {size.d_model}, vocab {size.vocab}), pretrained on "
        f"{summary['data']['pretrain_text']}, fine-tuned on {summary['data']['finetune_text']}: "
        f"{config.steps} steps of {size.batch} x {size.context} tokens per run, "
        + ("CPU" if config.device == "cpu" else f"{config.device}, bf16")
    )
    print()
    print(summary["table"])
    print()
    if config.device == "cpu" and "zenflow" in summary["runs"]:
        # The table alone would leave a CPU user wondering why the step is not faster.
        print(
            "On a CPU-only machine zenflow removes the stall but sets cores aside for the "
            "background host update, while synchronous offload keeps every core for the model: "
            "the step-time gain needs a GPU (--device cuda). See docs/benchmarks.md, 'The demo'."
        )
        print()
    if "zenflow" in summary["runs"] and "adamw" in summary["runs"]:
        # What this run measured, and what it does not say: the regime.
        print(
            "This measured fine-tuning (a pretrained model): zenflow's held-out loss against "
            "AdamW's is in the table (the defaults measured within 0.9% of AdamW on the demo's "
            "models, 3 seeds). zenflow's first "
            f"{summary['runs']['zenflow']['engine_stats']['synchronous_start_steps']} steps "
            "ran synchronously (their stall is in the table): the first 8 while it read the "
            "regime from the gradients; from scratch it keeps "
            f"{ENGINE_DEFAULTS['auto_warm_up_rounds']} synchronous (measured within "
            "2.7% of AdamW that way); see the README, 'Which settings'."
        )
        print()
    if config.out:
        print(
            f"wrote {config.out}/table.md, results.json"
            + (", demo.png" if summary.get("plot") else "")
        )
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0
