"""The README's "Outgrowing one machine" section runs as written against a real vLLM, with its flags."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.sdk.backends.real_servers.conftest import SERVED_NAME, VLLM_FLAGS, RunningServer
from tests.test_readme import BLOCKS

pytestmark = [pytest.mark.real_server, pytest.mark.model,
              pytest.mark.parametrize("real_server", ["vllm"], indirect=True)]
SECTION = REPO_ROOT.joinpath("README.md").read_text(encoding="utf-8").split("## Outgrowing one machine", 1)[1]
SECTION = SECTION.split("\n## ", 1)[0]


def test_the_readmes_vllm_command_has_the_flags_these_tests_start_vllm_with(real_server: RunningServer) -> None:
    command = re.search(r"```sh\n(.*?)```", SECTION, re.DOTALL)
    assert command is not None
    flags = command.group(1).replace("\\\n", " ").split()[3:]  # after "vllm serve MODEL"
    assert tuple(flags) == VLLM_FLAGS


def test_the_readmes_scale_out_example_runs_against_vllm(real_server: RunningServer, tmp_path: Path) -> None:
    [block] = [b for b in BLOCKS if b.skip and "test_readme_scale_out" in b.skip]
    script = tmp_path / "scale_out.py"
    script.write_text(block.code, encoding="utf-8")
    env = {**os.environ, "VLLM_URL": real_server.base_url, "VLLM_MODEL": SERVED_NAME}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = done.stdout.splitlines()[-2:]
    name, flavor, requests = first.split()
    assert (name, flavor) == ("Forecast", "vllm") and int(requests) >= 1
    assert second.startswith("cache reads: ") and second.endswith("unreported: 0")
