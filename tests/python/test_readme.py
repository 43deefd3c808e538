"""The README's API sketch is a tested example: every ```python block of its "API sketch"
section runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def sketch_blocks() -> list[str]:
    text = README.read_text()
    match = re.search(r"^## API sketch\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert match, "README.md has no '## API sketch' section"
    blocks = re.findall(r"^```python\n(.*?)^```", match.group(1), flags=re.S | re.M)
    assert blocks, "the API sketch has no python block"
    return blocks


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
