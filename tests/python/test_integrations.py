"""ZenFlowAdamW inside Hugging Face Trainer, Accelerate and PyTorch Lightning (docs/integrations.md),
on the CPU with tiny models and a few steps. Each framework is optional: its tests skip when it
is not installed (tools/test_deps.sh installs the "integrations" extra).

What holds today, bit for bit: each framework's gradient accumulation path equals a plain loop
that accumulates the same way, and resuming from a checkpoint continues the run that saved
there. What does not hold yet (issue 27): resuming equals the run that never saved, because a
checkpoint flushes (closes the open window early).
"""

from __future__ import annotations

import glob
import math
import os
import sys
from pathlib import Path

import pytest
import torch

import zenflow
from zenflow.integrations import flush, zenflow_optimizers

# What users get: the engine's defaults, its synchronous start detection included.
pytestmark = pytest.mark.engine_defaults

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """ZenFlowAdamW lowers torch's thread count process-wide (its host update runs beside
    the model); give the next test the count it had."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def snapshot(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def classifier() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def classification_data() -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(
        torch.randn(32, 16, generator=gen), torch.randint(0, 4, (32,), generator=gen)
    )


def plain_accumulation_run(accumulate: int) -> list[torch.Tensor]:
    """The reference: a plain loop, each micro-batch's loss divided by the accumulation count,
    one step per `accumulate` micro-batches of 2 samples."""
    model = classifier()
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(classification_data(), batch_size=2, shuffle=False)
    for i, (x, y) in enumerate(loader):
        (torch.nn.functional.cross_entropy(model(x), y) / accumulate).backward()
        if (i + 1) % accumulate == 0:
            opt.step()
            opt.zero_grad()
    opt.flush()
    return snapshot(model)


# ---- the framework-free helpers ----


def test_flush_finds_the_optimizer_inside_wrappers():
    model = classifier()
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2)

    class Wrapper:  # accelerate's and Lightning's wrappers keep it in .optimizer
        def __init__(self, inner):
            self.optimizer = inner

    assert zenflow_optimizers(Wrapper(Wrapper(opt))) == [opt]
    assert flush(Wrapper(opt)) == 1
    assert flush(torch.optim.AdamW(model.parameters())) == 0
    assert flush(None) == 0


# ---- transformers.Trainer ----


def tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # Trainer needs it
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        vocab_size=64,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def token_data(count: int = 64) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(count):
        ids = torch.randint(0, 64, (16,), generator=gen)
        rows.append({"input_ids": ids, "labels": ids})
    return rows


def run_trainer(
    out: Path,
    *,
    save_steps: int | None = None,
    resume: str | None = None,
    flush_on_save: bool | None = None,
    accumulate: int = 2,
    eval_steps: int | None = None,
    max_steps: int = 12,
    batch_size: int = 4,
):
    """Trainer with ZenFlowAdamW and the callback; returns (final parameters, callback,
    trainer). The optimizer is flushed by the callback at the end of training."""
    transformers = pytest.importorskip("transformers")
    from zenflow.integrations.transformers import ZenFlowCallback

    model = tiny_gpt2()
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2)
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=accumulate,
        learning_rate=1e-2,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        eval_strategy="steps" if eval_steps else "no",
        eval_steps=eval_steps,
        logging_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
        max_grad_norm=0.0,  # zenflow clips itself (max_grad_norm=) when asked
    )
    callback = (
        ZenFlowCallback() if flush_on_save is None else ZenFlowCallback(flush_on_save=flush_on_save)
    )
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=token_data(),
        eval_dataset=token_data(8) if eval_steps else None,
        optimizers=(opt, None),
        callbacks=[callback],
    )
    trainer.train(resume_from_checkpoint=resume)
    return snapshot(model), callback, trainer


def test_trainer_trains_and_flushes_at_the_end(tmp_path):
    params, callback, trainer = run_trainer(tmp_path / "run", accumulate=1)
    (opt,) = zenflow_optimizers(trainer.optimizer)
    # 8 synchronous steps (the start's detection), a window of 4, the flush
    assert opt.stats()["steps"] == 12 and opt.stats()["windows"] >= 1
    assert callback.flushes == 1  # on_train_end
    # Flushed: another flush changes nothing, so save_model() writes the exact weights.
    opt.flush()
    assert max_difference(params, snapshot(trainer.model)) == 0.0
    assert all(
        math.isfinite(h["train_loss"]) for h in trainer.state.log_history if "train_loss" in h
    )


def test_trainer_flushes_before_evaluation_and_saves(tmp_path):
    _, callback, trainer = run_trainer(
        tmp_path / "run", save_steps=6, eval_steps=4, accumulate=1, flush_on_save=True
    )
    # Evaluations at 4, 8, 12 and saves at 6, 12, then the end of training (one flush per
    # step that saves or evaluates).
    assert callback.flushes >= 4
    assert any("eval_loss" in h for h in trainer.state.log_history)


def test_trainer_gradient_accumulation_steps_once_per_accumulated_batch(tmp_path):
    """Trainer with 2 micro-batches of 4 per step against 1 batch of 8: the optimizer steps
    once per accumulated batch, and the runs agree to rounding (Trainer normalises the loss
    by the tokens of the whole accumulated batch; the sums differ in their last bits)."""
    accumulated, _, trainer = run_trainer(tmp_path / "a", accumulate=2, max_steps=4)
    (opt,) = zenflow_optimizers(trainer.optimizer)
    assert opt.stats()["steps"] == 4
    whole, _, _ = run_trainer(tmp_path / "b", accumulate=1, max_steps=4, batch_size=8)
    assert max_difference(accumulated, whole) < 1e-3


def test_trainer_resume_continues_the_run_that_saved(tmp_path):
    """With flush_on_save=True (exact weights in each checkpoint's model file), resuming
    from a Trainer checkpoint gives the same bits as the run that wrote it (which flushed at
    the same steps), with gradient accumulation."""
    saved, _, _ = run_trainer(tmp_path / "saved", save_steps=5, flush_on_save=True)
    resumed, callback, _ = run_trainer(
        tmp_path / "resumed",
        save_steps=5,
        resume=str(tmp_path / "saved" / "checkpoint-5"),
        flush_on_save=True,
    )
    assert max_difference(saved, resumed) == 0.0
    assert callback.flushes >= 2


def test_trainer_resume_equals_the_uninterrupted_run(tmp_path):
    """Resuming from a checkpoint equals the run that never checkpointed (the callback's
    default: no flush at saves), with gradient accumulation; Trainer loads the model before
    the optimizer, whose state holds the open window."""
    uninterrupted, _, _ = run_trainer(tmp_path / "plain")
    saved, _, _ = run_trainer(tmp_path / "saved", save_steps=5)
    resumed, _, _ = run_trainer(
        tmp_path / "resumed", save_steps=5, resume=str(tmp_path / "saved" / "checkpoint-5")
    )
    assert max_difference(uninterrupted, saved) == 0.0  # saving changed nothing
    assert max_difference(uninterrupted, resumed) == 0.0


def test_callback_refuses_another_optimizer():
    pytest.importorskip("transformers")
    from zenflow.integrations.transformers import ZenFlowCallback

    with pytest.raises(TypeError, match="optimizer"):
        ZenFlowCallback(torch.optim.AdamW(classifier().parameters()))
    with pytest.raises(TypeError, match="flush_on_save"):
        ZenFlowCallback(flush_on_save="yes")


def test_finetune_example_runs(tmp_path, capsys):
    """examples/finetune_hf_causal_lm.py, at its smallest: GPT-2 and Llama-style from a
    config, then fine-tuning the saved GPT-2 through --model (a local checkpoint path)."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import finetune_hf_causal_lm as example
    finally:
        sys.path.pop(0)
    common = ["--size", "tiny", "--steps", "4", "--batch-size", "2", "--seq-len", "32"]
    common += ["--eval-batches", "2", "--device", "cpu"]
    out = tmp_path / "out"
    assert example.main([*common, "--output-dir", str(out), "--save"]) == 0
    assert example.main([*common, "--arch", "llama", "--compare"]) == 0
    checkpoint = out / "zenflow" / "final"
    assert (checkpoint / "config.json").exists()
    assert (
        example.main([*common, "--model", str(checkpoint), "--json", str(tmp_path / "r.json")]) == 0
    )
    text = capsys.readouterr().out
    assert "| zenflow |" in text and "| adamw |" in text and "held-out loss" in text
    assert str(checkpoint) in text


# ---- accelerate ----


def accelerate_run(
    tmp_path: Path, *, save_at: int | None = None, load: bool = False, start: int = 0
):
    """Accelerator.prepare with ZenFlowAdamW, gradient accumulation 2; save_state after
    micro-batch `save_at` (flushed first, the documented recipe) or load_state first and
    skip to micro-batch `start`."""
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = classifier()
    opt = zenflow.ZenFlowAdamW(model.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(classification_data(), batch_size=2, shuffle=False)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    if load:
        accelerator.load_state(str(tmp_path / "state"))
    for i, (x, y) in enumerate(loader):
        if i < start:
            continue
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
            opt.step()
            opt.zero_grad()
        if save_at is not None and i + 1 == save_at:
            flush(opt)  # the model's weights are saved first: make them exact
            accelerator.save_state(str(tmp_path / "state"))
    assert flush(opt) == 1
    return snapshot(model), zenflow_optimizers(opt)[0]


def test_accelerate_accumulation_matches_a_plain_loop(tmp_path):
    params, opt = accelerate_run(tmp_path)
    assert opt.stats()["steps"] == 8  # 16 micro-batches, a step every second one
    assert max_difference(params, plain_accumulation_run(2)) == 0.0


def test_accelerate_save_and_load_state_continue_the_run(tmp_path):
    saved, _ = accelerate_run(tmp_path, save_at=6)
    resumed, opt = accelerate_run(tmp_path, load=True, start=6)
    assert max_difference(saved, resumed) == 0.0
    assert opt.stats()["steps"] == 8  # the step count came back with the checkpoint


# ---- PyTorch Lightning ----


def lightning_fit(directory: Path, *, epochs: int, save: bool = False, ckpt: str | None = None):
    L = pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = classifier()

        def training_step(self, batch, index):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return zenflow.ZenFlowAdamW(self.parameters(), lr=1e-2)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(classification_data(), batch_size=2, shuffle=False)

        def on_train_end(self):
            flush(self.optimizers())  # exact weights for whatever follows fit()

    module = Classifier()
    callbacks = (
        [ModelCheckpoint(dirpath=directory, every_n_epochs=1, save_top_k=-1)] if save else []
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        accumulate_grad_batches=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=save,
        callbacks=callbacks,
        deterministic=True,
    )
    trainer.fit(module, ckpt_path=ckpt)
    return snapshot(module), trainer.optimizers[0]


@pytest.fixture
def quiet_lightning():
    import logging

    previous = os.environ.get("POSSIBLE_USER_WARNINGS")
    os.environ["POSSIBLE_USER_WARNINGS"] = "off"
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    yield
    if previous is None:
        os.environ.pop("POSSIBLE_USER_WARNINGS", None)
    else:
        os.environ["POSSIBLE_USER_WARNINGS"] = previous


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_lightning_accumulation_matches_a_plain_loop(tmp_path, quiet_lightning):
    params, opt = lightning_fit(tmp_path, epochs=1)
    assert isinstance(opt, zenflow.ZenFlowAdamW) and opt.stats()["steps"] == 8
    assert max_difference(params, plain_accumulation_run(2)) == 0.0


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_lightning_checkpoint_resume_continues_the_run(tmp_path, quiet_lightning):
    saved, _ = lightning_fit(tmp_path / "saved", epochs=2, save=True)
    (first,) = glob.glob(str(tmp_path / "saved" / "epoch=0-*.ckpt"))
    resumed, opt = lightning_fit(tmp_path / "resumed", epochs=2, ckpt=first)
    assert max_difference(saved, resumed) == 0.0
    assert opt.stats()["steps"] == 16  # the step count came back with the checkpoint
