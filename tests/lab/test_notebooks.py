"""Every notebook executes top to bottom in QUICK mode (as CI and the lab command run them)."""
from __future__ import annotations

import pytest

from fusionlab.lab.runner import execute, notebook_paths

from conftest import embedded_available


@pytest.mark.notebook
@pytest.mark.skipif(not embedded_available("qwen2.5-coder-0.5b-instruct"), reason="run `fusionlab fetch` first")
@pytest.mark.parametrize("path", notebook_paths(), ids=lambda p: p.name)
def test_notebook_runs_quick(path, tmp_path):
    out = execute(path, out_dir=tmp_path, env={"FUSIONLAB_QUICK": "1"})
    assert out.exists()
