"""The exported figures as a paper needs them: every PDF embeds its fonts as TrueType (no Type 3 fonts), every PNG
is at least 300 dpi, and each figure has its manifest. `fusionlab figures` lists them; `--rasterize` re-renders a
PNG below 300 dpi from its own PDF (the vector master) at 300 dpi and records that in the manifest."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

from ..files import atomic_write_text
from ..paths import figures_dir

MIN_DPI = 300


def png_dpi(path: Path) -> float:
    from PIL import Image

    with Image.open(path) as im:
        return float(min(im.info.get("dpi", (0, 0))))


def pdf_fonts_embedded(path: Path) -> bool:
    """True iff the PDF embeds its fonts as TrueType programs (matplotlib's pdf.fonttype 42) and has no Type 3."""
    raw = path.read_bytes()
    return b"/Type3" not in raw and (b"/FontFile2" in raw or b"/Font" not in raw)


def manifests(folder: Path | None = None) -> list[Path]:
    folder = Path(folder or figures_dir())
    return sorted(p for p in folder.rglob("*.json") if "quick" not in p.relative_to(folder).parts)


def table(folder: Path | None = None) -> pd.DataFrame:
    """One row per figure: name, folder, run size, date, git revision, PNG dpi, fonts embedded, files present."""
    folder = Path(folder or figures_dir())
    rows = []
    for m in manifests(folder):
        meta = json.loads(m.read_text())
        png, pdf = m.with_suffix(".png"), m.with_suffix(".pdf")
        rows.append({"figure": meta.get("figure", m.stem), "folder": str(m.parent.relative_to(folder)) or ".",
                     "run_size": meta.get("run_size"), "date": meta.get("date", "")[:10],
                     "git_revision": meta.get("git_revision"), "png_dpi": png_dpi(png) if png.exists() else None,
                     "pdf_fonts_embedded": pdf_fonts_embedded(pdf) if pdf.exists() else None,
                     "files": all(m.with_suffix(f".{x}").exists() for x in ("pdf", "svg", "png")),
                     "png_source": meta.get("png_source", "matplotlib")})
    return pd.DataFrame(rows)


def rasterize(pdf: Path, dpi: int = MIN_DPI) -> Path:
    """Render the PDF's page as the PNG beside it at `dpi`, and note it in the manifest."""
    import pypdfium2 as pdfium

    doc = pdfium.PdfDocument(str(pdf))
    image = doc[0].render(scale=dpi / 72).to_pil()
    png = pdf.with_suffix(".png")
    image.save(png, dpi=(dpi, dpi))
    m = pdf.with_suffix(".json")
    meta = json.loads(m.read_text())
    meta["png_source"] = f"rasterized from the PDF at {dpi} dpi on {time.strftime('%Y-%m-%d')}"
    atomic_write_text(m, json.dumps(meta, indent=2, default=str))
    return png


def upgrade_low_dpi(folder: Path | None = None) -> list[Path]:
    """Re-render every PNG below MIN_DPI from its PDF."""
    done = []
    for m in manifests(folder):
        png, pdf = m.with_suffix(".png"), m.with_suffix(".pdf")
        if pdf.exists() and (not png.exists() or png_dpi(png) < MIN_DPI - 0.5):
            done.append(rasterize(pdf))
    return done
