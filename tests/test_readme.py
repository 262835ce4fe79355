"""Every ```python block of README.md runs as a user would run it, and does what the README says.

Each block is written to a file as is and run with this interpreter in a fresh process, from an
empty folder, with a timeout (a loop that does not terminate fails here). A block that uses
`LocalBackend()` runs on the embedded SmolLM2 weights (marked `model`). A block that cannot run on
its own (it needs a server, a key...) says so on the line before its fence, e.g.
``<!-- readme-test: skip (needs a running `parley serve`) -->``; nothing else is skipped.

The quick-start example (the one with `send_report`) is held to its claims: it ends with a typed
`Answer`, and the report is sent exactly once (the tool prints one line per send), whatever the
model repeats; five times greedy and five times sampled (temperature 0.8, seeds 1-5: the test
adds `sampling=` to the block's `Agent(...)`, nothing else changes), in one process.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

README = REPO_ROOT / "README.md"
TIMEOUT_S = 600  # the embedded model loads in ~20 s; each turn takes seconds on a shared CPU
_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_SKIP = re.compile(r"<!--\s*readme-test:\s*skip\b(.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    index: int
    line: int
    code: str
    skip: str | None

    @property
    def uses_model(self) -> bool:
        return "LocalBackend(" in self.code


def python_blocks(text: str) -> list[Block]:
    blocks = []
    for index, match in enumerate(_FENCE.finditer(text)):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = _SKIP.search(before)
        blocks.append(Block(index, line, match.group(1), skip.group(1).strip() or "marked" if skip else None))
    return blocks


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def run_block(block: Block, folder: Path) -> str:
    script = folder / f"readme_block_{block.index}.py"
    script.write_text(block.code, encoding="utf-8")
    try:
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"README block at line {block.line} did not finish in {TIMEOUT_S} s:\n{exc.stdout!r}")
    where = f"README block at line {block.line}"
    assert done.returncode == 0, f"{where} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_readme_has_the_quickstart_example() -> None:
    assert any("def send_report" in b.code and b.uses_model for b in BLOCKS), "the README lost its example"
    assert all(b.skip is None for b in BLOCKS if "def send_report" in b.code)


def test_fence_parsing() -> None:
    text = "x\n```python\nprint(1)\n```\n<!-- readme-test: skip (needs a server) -->\n```python\nprint(2)\n```\n"
    first, second = python_blocks(text)
    assert (first.code, first.skip, first.line) == ("print(1)\n", None, 2)
    assert (second.code, second.skip) == ("print(2)\n", "(needs a server)")


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(b, id=f"line{b.line}", marks=[pytest.mark.model] if b.uses_model else [])
        for b in BLOCKS
        if "def send_report" not in b.code
    ],
)
def test_other_blocks_run(block: Block, tmp_path: Path) -> None:
    if block.skip:
        pytest.skip(f"README says: {block.skip}")
    run_block(block, tmp_path)


SAMPLED = "output_type=Answer,"


def _check_quickstart_run(out: str) -> None:
    lines = out.splitlines()
    sent = [line for line in lines if line.startswith("report sent to ")]
    assert len(sent) == 1, f"send_report ran {len(sent)} times:\n{out}"
    answers = [line for line in lines if re.fullmatch(r"Answer\(city=(['\"]).*\1, temp_c=-?\d+\)", line)]
    assert len(answers) == 1, f"no typed Answer printed:\n{out}"
    # the decisions the loop printed: every pending call was shown with its arguments
    assert any(line.startswith("approve? send_report(") for line in lines), out


@pytest.mark.model
@pytest.mark.parametrize("block", [b for b in BLOCKS if "def send_report" in b.code], ids=lambda b: f"line{b.line}")
def test_quickstart_five_times_greedy_and_five_times_sampled(block: Block, tmp_path: Path) -> None:
    assert block.code.count(SAMPLED) == 1, f"the test adds sampling after {SAMPLED!r}, which the block lost"
    variants = [block.code] * 5 + [
        block.code.replace(SAMPLED, f"{SAMPLED} sampling=SamplingSettings(temperature=0.8, seed={seed}),")
        for seed in range(1, 6)
    ]
    driver = "from parley.backends import SamplingSettings\n" + "".join(
        f"print('=== run {i}', flush=True)\nexec(compile({code!r}, 'README.md', 'exec'), "
        "{'__name__': '__main__', 'SamplingSettings': SamplingSettings})\n"
        for i, code in enumerate(variants)
    )
    out = run_block(Block(block.index, block.line, driver, None), tmp_path)
    runs = out.split("=== run ")[1:]
    assert len(runs) == 10, out
    for run in runs:
        _check_quickstart_run(run)
