"""Templated synthetic facts: needles no model can know in advance, for context-offload accuracy with enough items.

Our hand-written needles (`data/needles.json`) are a dozen; a ladder of slaves needs scores of items per setting to
separate 10-point differences, and answers no model could produce from memory (a master that "knows" Lisbon without
reading anything would score above the floor for the wrong reason). Each fact here is a template filled with values
drawn from a seeded generator: a made-up place, and a made-up code, number or name. Its distractor is the same kind of
fact about another made-up place, so the question can only be answered by finding the right sentence.

`facts(n, lang, seed)` is a pure function of its arguments: the same call gives the same facts on every machine.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from ..engine import checks
from ..errors import FusionLabError
from .nb02_niah import Needle

LANGS = ("en", "zh")
_CONS, _VOWELS = "bdfgklmnprstvz", "aeiou"
_ZH_PLACE = "青岚石渡柳溪白沙云栖松岗枫桥梅坞鹿鸣竹岭"  # characters drawn in pairs: 青柳镇, 渡岗镇, ... (made up)
_ZH_SURNAME = "葛蔺宓郗阚漆庹"  # rare surnames
_ZH_GIVEN = "岑舜琰砚棠翊璟朔霁暄"
_CODE_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"  # no I or O: never read as 1 or 0


@dataclass(frozen=True)
class Template:
    """One kind of fact in one language: the needle, its question and its distractor, with {place} and {value}
    slots; `value` draws the answer."""

    kind: str
    lang: str
    needle: str
    question: str
    distractor: str
    value: Callable[[random.Random], str]


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_CONS) + rng.choice(_VOWELS) for _ in range(syllables)).capitalize()


def _code(rng: random.Random) -> str:
    return "".join(rng.choice(_CODE_LETTERS) for _ in range(2)) + "-" + str(rng.randint(1000, 9999))


def _number(rng: random.Random) -> str:
    return str(rng.randint(101, 989))  # three digits: no thousands separator to match


def _en_name(rng: random.Random) -> str:
    return f"{_word(rng, 2)} {_word(rng, 3)}"


def _zh_name(rng: random.Random) -> str:
    return rng.choice(_ZH_SURNAME) + "".join(rng.sample(_ZH_GIVEN, 2))


TEMPLATES = (
    Template("code", "en", "The storage room at {place} station opens with the access code {value}.",
             "What is the access code of the storage room at {place} station?",
             "The storage room at {place} station opens with the code {value}.", _code),
    Template("number", "en", "The footbridge over the river at {place} is exactly {value} metres long.",
             "How many metres long is the footbridge over the river at {place}?",
             "The footbridge at {place} is {value} metres long.", _number),
    Template("name", "en", "The new keeper of the archive in {place} is a woman named {value}.",
             "What is the name of the new keeper of the archive in {place}?",
             "The archive in {place} is kept by a man named {value}.", _en_name),
    Template("code", "zh", "{place}车站储物间的门禁密码是{value}。", "{place}车站储物间的门禁密码是什么？",
             "{place}车站储物间的密码是{value}。", _code),
    Template("number", "zh", "{place}河上的那座步行桥全长正好{value}米。", "{place}河上的那座步行桥全长多少米？",
             "{place}的步行桥全长{value}米。", _number),
    Template("name", "zh", "{place}档案馆新任的管理员名叫{value}。", "{place}档案馆新任的管理员叫什么名字？",
             "{place}档案馆原来的管理员名叫{value}。", _zh_name),
)


def _place(rng: random.Random, lang: str) -> str:
    return rng.choice(_ZH_PLACE) + rng.choice(_ZH_PLACE) + "镇" if lang == "zh" else _word(rng, 2) + "holm"


def _alike(a: str, b: str) -> bool:
    """Places a reader could confuse: the same initial (English: Seluholm, Saleholm) or a shared character (Chinese)."""
    if not b:
        return False
    return a[0] == b[0] if a.isascii() else bool(set(a[:2]) & set(b[:2]))


def _answers(kind: str, value: str) -> tuple[str, ...]:
    """What counts as the answer: a code with or without its hyphen, a name in full or (English) by surname."""
    if kind == "code":
        return value, value.replace("-", "")
    if kind == "name" and " " in value:
        return value, value.split()[-1]
    return (value,)


def facts(n: int, lang: str, seed: int = 0) -> list[Needle]:
    """`n` facts in `lang`, the template kinds in turn, every place and value distinct (ids `syn-<lang>-<kind>-<i>`)."""
    checks.integer("n", n, 1)
    if lang not in LANGS:
        raise FusionLabError(f"lang must be one of {LANGS}, got {lang!r}.")
    rng = random.Random(f"synthetic-facts|{lang}|{seed}")
    kinds = [t for t in TEMPLATES if t.lang == lang]
    used: set[str] = set()

    def fresh(draw: Callable[[], str], unlike: str = "") -> str:
        for _ in range(1000):
            x = draw()
            if x not in used and not _alike(x, unlike):
                used.add(x)
                return x
        raise FusionLabError(f"cannot draw {n} distinct {lang} facts: ask for fewer (n={n}).")

    out = []
    for i in range(n):
        t = kinds[i % len(kinds)]
        place = fresh(lambda: _place(rng, lang))
        other = fresh(lambda: _place(rng, lang), unlike=place)  # the distractor's place: never a near-spelling
        value, decoy = fresh(lambda: t.value(rng)), fresh(lambda: t.value(rng))
        out.append(Needle(f"syn-{lang}-{t.kind}-{i}", lang, t.needle.format(place=place, value=value),
                          t.question.format(place=place), _answers(t.kind, value),
                          t.distractor.format(place=other, value=decoy), _answers(t.kind, decoy)))
    return out
