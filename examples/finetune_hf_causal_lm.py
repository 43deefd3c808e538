"""Fine-tune a Hugging Face causal language model with zenflow.ZenFlowAdamW, through
transformers.Trainer and zenflow's Trainer callback (docs/integrations.md).

Nothing is downloaded. By default a small GPT-2 (or, with --arch llama, a Llama-style model)
is built from a config and trained on the text of CPython's own documentation (the
pydoc_data module behind help("if")), tokenized as UTF-8 bytes; the last tenth of the text is
held out. --model PATH fine-tunes a local checkpoint instead (AutoModelForCausalLM, and its
tokenizer when the directory has one). CPU by default; CUDA when a GPU is usable (bf16
autocast), or --device cuda.

    pip install transformers accelerate        # (zenflow's "integrations" extra)
    python examples/finetune_hf_causal_lm.py --steps 50
    python examples/finetune_hf_causal_lm.py --model ./my-checkpoint --steps 200
    python examples/finetune_hf_causal_lm.py --compare --steps 200 --arch llama   # vs AdamW

--compare trains the same model twice from the same initial weights and batches, with
torch.optim.AdamW and with ZenFlowAdamW, and prints the held-out loss of both.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

import zenflow
from zenflow.integrations.transformers import ZenFlowCallback

SIZES = {
    # hidden size, layers, heads, MLP size
    "tiny": (64, 2, 2, 256),
    "small": (128, 4, 4, 512),
    "medium": (256, 6, 4, 1024),
}


def load_text() -> bytes:
    """CPython's documentation topics (ships with every Python)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics)).encode("utf-8")


def build_model(args, vocab_size: int):
    import transformers

    if args.model:
        return transformers.AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True)
    hidden, layers, heads, mlp = SIZES[args.size]
    torch.manual_seed(args.seed)
    if args.arch == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=vocab_size,
            n_positions=args.seq_len,
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_inner=mlp,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        )
        return transformers.GPT2LMHeadModel(config)
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=args.seq_len,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    return transformers.LlamaForCausalLM(config)


def encode(args) -> tuple[torch.Tensor, int]:
    """Token ids of the text, and the vocabulary size."""
    text = load_text()
    if args.model and (Path(args.model) / "tokenizer_config.json").exists():
        import transformers

        tokenizer = transformers.AutoTokenizer.from_pretrained(args.model, local_files_only=True)
        ids = tokenizer(text.decode("utf-8"), return_tensors="pt")["input_ids"][0]
        return ids, len(tokenizer)
    return torch.tensor(list(text), dtype=torch.long), 256


def datasets(ids: torch.Tensor, args) -> tuple[list, list]:
    """Fixed windows of seq_len tokens: training windows at seeded random offsets of the
    first 90% of the text, held-out windows tiling the last 10%."""
    split = int(0.9 * len(ids))
    train_ids, held_ids = ids[:split], ids[split:]
    gen = torch.Generator().manual_seed(args.seed)
    count = args.steps * args.batch_size
    starts = torch.randint(0, len(train_ids) - args.seq_len - 1, (count,), generator=gen)
    train = [
        {"input_ids": train_ids[s : s + args.seq_len], "labels": train_ids[s : s + args.seq_len]}
        for s in starts.tolist()
    ]
    held = [
        {"input_ids": held_ids[s : s + args.seq_len], "labels": held_ids[s : s + args.seq_len]}
        for s in range(0, len(held_ids) - args.seq_len, args.seq_len)
    ][: args.eval_batches * args.batch_size]
    return train, held


def make_optimizer(name: str, model, args):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=args.lr)
    update_interval = (
        args.update_interval if args.update_interval == "auto" else int(args.update_interval)
    )
    return zenflow.ZenFlowAdamW(
        groups, lr=args.lr, topk_ratio=args.topk_ratio, update_interval=update_interval
    )


def train_one(name: str, args, ids: torch.Tensor, vocab: int, device: str, out_dir: Path) -> dict:
    import transformers

    threads = torch.get_num_threads()
    model = build_model(args, vocab).to(device)  # on its device before the optimizer sees it
    train, held = datasets(ids, args)
    optimizer = make_optimizer(name, model, args)
    callbacks = [ZenFlowCallback()] if isinstance(optimizer, zenflow.ZenFlowAdamW) else []
    training_args = transformers.TrainingArguments(
        output_dir=str(out_dir / name),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, args.steps // 10),
        # zenflow clips from its own fused column statistics; torch's clip is for AdamW.
        max_grad_norm=1.0 if name == "adamw" else 0.0,
        logging_strategy="steps" if args.progress else "no",
        logging_steps=max(1, args.steps // 10),
        save_strategy="no",
        eval_strategy="no",
        report_to=[],
        use_cpu=device == "cpu",
        bf16=device == "cuda",
        seed=args.seed,
        data_seed=args.seed,
        dataloader_num_workers=0,
        disable_tqdm=not args.progress,
    )
    trainer = transformers.Trainer(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=held,
        optimizers=(optimizer, None),  # Trainer builds the cosine schedule on our optimizer
        callbacks=callbacks,
    )
    if isinstance(optimizer, zenflow.ZenFlowAdamW):
        # ZenFlowAdamW gives torch part of the cores (its host update runs beside the model).
        zenflow_threads = torch.get_num_threads()
    started = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - started
    metrics = trainer.evaluate()  # exact weights: the callback flushed at the end of training
    out = {
        "optimizer": name,
        "steps": args.steps,
        "train_loss": result.training_loss,
        "eval_loss": metrics["eval_loss"],
        "seconds": seconds,
        "torch_threads": threads,
    }
    if isinstance(optimizer, zenflow.ZenFlowAdamW):
        out["torch_threads"] = zenflow_threads
        out["stats"] = zenflow.format_stats(optimizer.stats())
        out["flushes"] = callbacks[0].flushes
        optimizer.close()
    if args.save:
        trainer.save_model(str(out_dir / name / "final"))
    torch.set_num_threads(threads)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a local checkpoint directory (no download)")
    parser.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    parser.add_argument("--size", choices=tuple(SIZES), default="small")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--optimizer", choices=("zenflow", "adamw"), default="zenflow")
    parser.add_argument("--compare", action="store_true", help="train with AdamW and zenflow")
    parser.add_argument("--topk-ratio", type=float, default=0.1)
    parser.add_argument("--update-interval", default="4", help="an int or 'auto'")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--output-dir", type=Path, default=None, help="Trainer's (default: temporary)"
    )
    parser.add_argument("--save", action="store_true", help="save the final model(s)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--progress", action="store_true", help="Trainer's progress bar")
    args = parser.parse_args(argv)
    if args.update_interval != "auto" and not args.update_interval.isdigit():
        parser.error(f"--update-interval: expected an int or 'auto', got {args.update_interval!r}")
    device = args.device
    if device == "auto":
        device = "cuda" if zenflow.cuda_available() else "cpu"
    if device == "cuda" and not zenflow.cuda_available():
        parser.error(
            "--device cuda: no GPU, or zenflow was built without CUDA (python -m zenflow info)"
        )

    import transformers

    transformers.logging.set_verbosity_error()
    ids, vocab = encode(args)
    names = ["adamw", "zenflow"] if args.compare else [args.optimizer]
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.output_dir or Path(tmp)
        results = [train_one(name, args, ids, vocab, device, out_dir) for name in names]
    what = args.model or f"{args.arch} ({args.size}, built from a config)"
    print(f"{what}, {args.steps} steps of {args.batch_size} x {args.seq_len} tokens on {device}")
    print("| optimizer | train loss | held-out loss | vs AdamW | seconds |")
    print("|---|---:|---:|---:|---:|")
    reference = next((r["eval_loss"] for r in results if r["optimizer"] == "adamw"), None)
    for r in results:
        versus = f"{100 * (r['eval_loss'] / reference - 1):+.2f}%" if reference else "-"
        print(
            f"| {r['optimizer']} | {r['train_loss']:.4f} | {r['eval_loss']:.4f} | {versus} | "
            f"{r['seconds']:.1f} |"
        )
    for r in results:
        if "stats" in r:
            print(f"zenflow: {r['stats']}")
    if any(not math.isfinite(r["eval_loss"]) for r in results):
        print("a held-out loss is not finite", file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args)
                    | {"json": str(args.json), "output_dir": str(args.output_dir)},
                    "results": results,
                },
                indent=2,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
