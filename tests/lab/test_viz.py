"""save_figure writes PDF + SVG + PNG and a manifest; QUICK runs write to figures/quick only."""
from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fusionlab import paths  # noqa: E402
from fusionlab.lab import viz  # noqa: E402


def test_save_figure_writes_every_format_and_a_manifest(tmp_path, tiny):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    out = viz.save_figure(fig, "t", models=[tiny("tiny-qwen2")], params={"k": 1}, folder=tmp_path)
    assert sorted(p.suffix for p in out.values()) == [".json", ".pdf", ".png", ".svg"]
    man = json.loads(out["json"].read_text())
    assert man["models"][0]["name"] == "tiny-qwen2" and man["params"] == {"k": 1} and man["fusionlab_version"]
    plt.close(fig)


def test_quick_figures_go_to_the_ignored_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("FUSIONLAB_QUICK", "1")
    monkeypatch.setattr(viz, "figures_dir", lambda: tmp_path)
    fig = plt.figure()
    out = viz.save_figure(fig, "q")
    assert out["png"].parent == tmp_path / "quick" and paths.figures_dir().name == "figures"
    plt.close(fig)
