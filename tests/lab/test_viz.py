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


def test_a_smaller_run_never_replaces_a_larger_runs_figure(monkeypatch, tmp_path):
    monkeypatch.setattr(viz, "figures_dir", lambda: tmp_path)
    monkeypatch.setenv("FUSIONLAB_QUICK", "0")
    monkeypatch.setenv("FUSIONLAB_FULL", "1")
    viz.save_figure(plt.figure(), "f")
    assert json.loads((tmp_path / "f.json").read_text())["run_size"] == "full"
    monkeypatch.setenv("FUSIONLAB_FULL", "0")
    out = viz.save_figure(plt.figure(), "f")  # a default run: beside, not over, the full run's figure
    assert out["png"].parent == tmp_path / "default"
    assert json.loads((tmp_path / "f.json").read_text())["run_size"] == "full"
    plt.close("all")


def test_every_committed_figure_is_fit_for_a_paper():
    """Each exported figure: PDF + SVG + PNG + manifest; fonts embedded as TrueType (no Type 3); PNG >= 300 dpi."""
    from fusionlab.lab import figures

    t = figures.table()
    assert len(t) >= 13
    assert t["files"].all(), t[~t["files"]]["figure"].tolist()
    assert t["pdf_fonts_embedded"].all(), t[~t["pdf_fonts_embedded"]]["figure"].tolist()
    assert (t["png_dpi"] >= figures.MIN_DPI - 0.5).all(), t[t["png_dpi"] < 299.5][["figure", "png_dpi"]]


def test_the_font_check_can_fail(tmp_path):
    from fusionlab.lab import figures

    bad = tmp_path / "t3.pdf"
    bad.write_bytes(b"%PDF-1.4 /Font << /Subtype /Type3 >>")
    assert not figures.pdf_fonts_embedded(bad)
    plt.rcParams["pdf.fonttype"] = 42
    fig = plt.figure()
    fig.text(0.5, 0.5, "text")
    fig.savefig(tmp_path / "ok.pdf")
    assert figures.pdf_fonts_embedded(tmp_path / "ok.pdf")
    plt.close(fig)
