"""The README's API sketch is a tested example: every ```python block of its "API sketch"
section runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks(section: str) -> list[str]:
    text = README.read_text()
    match = re.search(rf"^## {section}\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert match, f"README.md has no '## {section}' section"
    blocks = re.findall(r"^```python\n(.*?)^```", match.group(1), flags=re.S | re.M)
    assert blocks, f"the README's {section} section has no python block"
    return blocks


def sketch_blocks() -> list[str]:
    return python_blocks("API sketch")


@pytest.mark.parametrize("index", range(len(sketch_blocks())))
def test_api_sketch_runs_as_written(index, restore_threads, capsys):
    code = sketch_blocks()[index]
    namespace: dict = {"__name__": "readme_sketch"}
    exec(compile(code, f"README.md API sketch block {index}", "exec"), namespace)
    # It did what it says: the selected columns moved, the optimizer stepped.
    if "opt" in namespace:
        opt = namespace["opt"]
        assert all(float(s["step"]) == 1 for s in opt.state.values()) and opt.state
    assert capsys.readouterr().out.strip(), "the sketch prints the gradient norm"


def test_engine_example_runs_as_written(capsys):
    code = python_blocks("The engine")[0]
    namespace: dict = {"__name__": "readme_engine"}
    exec(compile(code, "README.md engine example", "exec"), namespace)
    engine = namespace["engine"]
    stats = engine.stats()
    assert stats["steps"] == 8 and stats["windows"] == 2  # closes at steps 4 and 8
    assert set(namespace["state"]) == {"params", "schedule", "loss_scaler"}
    windows, bytes_down = capsys.readouterr().out.split()
    assert int(windows) == 2 and int(bytes_down) == stats["bytes_down"] > 0


def test_training_loop_runs_as_written(capsys):
    blocks = python_blocks("Training with ZenFlowAdamW")
    assert len(blocks) == 1
    assert len(blocks[0].strip().splitlines()) <= 16  # a short loop, as the README says
    namespace: dict = {"__name__": "readme_training"}
    exec(compile(blocks[0], "README.md training loop", "exec"), namespace)
    stats = namespace["opt"].stats()
    assert stats["steps"] == 200 and stats["windows"] >= 49 and stats["bytes_down"] > 0
    # it learned: far below the 10-class chance level (ln 10 = 2.30)
    assert namespace["loss"].item() < 1.0
    out = capsys.readouterr().out
    assert out.startswith("loss ") and "windows" in out
