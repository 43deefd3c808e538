"""The README and docs/ as tested documentation: the README's two commands are the first block,
copyable as they are (and .ci/run extracts exactly them), its quickstart runs as written, it
stays short, every number it quotes links to a dated result, every relative link resolves,
and the Python blocks of docs/usage.md and docs/integrations.md run as written."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
import torch

# What users get: the engine's defaults, its synchronous start detection included.
pytestmark = pytest.mark.engine_defaults

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
USAGE = ROOT / "docs" / "usage.md"
INTEGRATIONS = ROOT / "docs" / "integrations.md"


def section(path: Path, title: str) -> str:
    text = path.read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"{path.name} has no '## {title}' section"
    return match.group(1)


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


@pytest.fixture
def restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


# ---- the README ----


def test_the_two_commands_come_first_without_a_prompt():
    lines = README.read_text().splitlines()
    assert lines[0] == "# zenflow"
    first_block = next(i for i, line in enumerate(lines) if line.startswith("```"))
    assert lines[first_block] == "```bash" and all(not s.strip() for s in lines[1:first_block])
    end = lines.index("```", first_block + 1)
    install, tests = lines[first_block + 1 : end]
    assert install.startswith("pip install torch==2.13.0 ") and install.endswith(
        "zenflow demo --quick"
    )
    assert tests == "bash tests/run_all.sh"
    assert not any(line.lstrip().startswith("$") for line in (install, tests))


def test_ci_extracts_exactly_the_two_commands():
    """.ci/run runs the README's commands: its extraction lines give these two."""
    ci = (ROOT / ".ci" / "run").read_text()
    commands = {}
    for name in ("readme_install", "readme_tests"):
        line = next(line for line in ci.splitlines() if line.startswith(f"{name}="))
        script = f"{line}\nprintf '%s' \"${name}\""
        commands[name] = subprocess.run(
            ["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    block = re.search(r"^```bash\n(.*?)\n```", README.read_text(), flags=re.S | re.M).group(1)
    assert [commands["readme_install"], commands["readme_tests"]] == block.splitlines()


def test_readme_is_short():
    assert len(README.read_text().splitlines()) < 200


def test_quickstart_runs_as_written(capsys, restore_threads, restore_torch_threads):
    (code,) = python_blocks(section(README, "Quickstart"))
    assert len(code.strip().splitlines()) <= 20
    namespace: dict = {"__name__": "readme_quickstart"}
    exec(compile(code, "README.md quickstart", "exec"), namespace)
    stats = namespace["opt"].stats()
    # the first 8 steps synchronous (the start's detection reads them: noise-like gradients,
    # no longer start), then windows of 4
    assert stats["synchronous_start_steps"] == 8
    assert stats["steps"] == 200 and stats["windows"] >= 48 and stats["bytes_down"] > 0
    # it learned: far below the 10-class chance level (ln 10 = 2.30)
    assert namespace["loss"].item() < 1.0
    out = capsys.readouterr().out
    assert out.startswith("loss ") and "windows" in out


def test_every_number_links_to_a_dated_result():
    """Each row of the Measured table ends in a link to benchmarks/results/ (or "same", the
    row above's), and every settings bullet that quotes a percentage links to one."""
    result_link = re.compile(r"\]\((benchmarks/results/2026-\d\d-\d\d-[^)]+)\)")
    rows = [r for r in section(README, "Measured").splitlines() if r.startswith("| ")][1:]
    assert rows and not rows[0].startswith("|---")
    rows = [r for r in rows if not r.startswith("|---")]
    previous = None
    for row in rows:
        last = row.rstrip(" |").split("|")[-1].strip()
        match = result_link.search(last)
        assert match or (last == "same" and previous), f"no dated result for: {row}"
        previous = match or previous
    bullets = re.split(r"\n- ", section(README, "Which settings"))
    for bullet in bullets:
        if re.search(r"\d%", bullet):
            assert result_link.search(bullet), f"a percentage without its result: {bullet[:80]}"


@pytest.mark.parametrize(
    "path", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name
)
def test_relative_links_resolve(path):
    text = path.read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (path.parent / target).exists(), f"{path.name}: broken link {target}"


# ---- docs/usage.md ----


def test_usage_ops_sketch_runs_as_written(restore_threads, capsys):
    (code,) = python_blocks(section(USAGE, "The low-level ops"))
    namespace: dict = {"__name__": "usage_ops"}
    exec(compile(code, "docs/usage.md ops sketch", "exec"), namespace)
    opt = namespace["opt"]
    assert all(float(s["step"]) == 1 for s in opt.state.values()) and opt.state
    assert capsys.readouterr().out.strip(), "the sketch prints the gradient norm"


def test_usage_engine_example_runs_as_written(capsys):
    (code,) = python_blocks(section(USAGE, "The engine"))
    namespace: dict = {"__name__": "usage_engine"}
    exec(compile(code, "docs/usage.md engine example", "exec"), namespace)
    stats = namespace["engine"].stats()
    # 8 synchronous steps (the start's detection), then windows closing at steps 12 and 16
    assert stats["steps"] == 16 and stats["windows"] == 2 and stats["synchronous_start_steps"] == 8
    assert set(namespace["state"]) == {"params", "schedule", "loss_scaler"}
    windows, bytes_down = capsys.readouterr().out.split()
    assert int(windows) == 2 and int(bytes_down) == stats["bytes_down"] > 0


# ---- docs/integrations.md ----

RECIPES = python_blocks(INTEGRATIONS.read_text())
FRAMEWORKS = ("transformers", "accelerate", "lightning")


@pytest.mark.parametrize("index", range(len(RECIPES)))
def test_integration_recipes_run_as_written(index, tmp_path, monkeypatch, restore_torch_threads):
    code = RECIPES[index]
    for framework in FRAMEWORKS:
        if re.search(rf"^(import|from) {framework}\b", code, flags=re.M):
            pytest.importorskip(framework)
            if framework == "transformers" and importlib.util.find_spec("accelerate") is None:
                pytest.skip("transformers.Trainer needs accelerate")
    monkeypatch.chdir(tmp_path)  # the recipes write their output folders here
    namespace: dict = {"__name__": f"integrations_recipe_{index}"}
    exec(compile(code, f"docs/integrations.md block {index}", "exec"), namespace)
    assert any(tmp_path.iterdir()), "the recipe saved nothing"
