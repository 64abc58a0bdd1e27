"""Fine-tuned siblings (notebook 10's ladder): made by one seeded growing run per domain, read back by the sibling
recipe, never trained on a document the transfer map scores, and each bad recipe refused with the fix."""
from __future__ import annotations

import json

import pytest
import torch

from fusionlab.errors import FusionLabError
from fusionlab.experiments import nb07_corpora as corpora, nb10_finetune as ft
from fusionlab.models import siblings
from fusionlab.models.siblings import parse_recipe, sibling

TEXT = ("The harbour master wrote about rivers, bridges and the long winter of the northern towns. " * 12)
DOCS = [corpora.Doc("english", f"essay{k}.txt", TEXT.replace("winter", f"winter {k}"), "train") for k in range(4)]


@pytest.fixture
def made(tiny, monkeypatch, tmp_path):
    monkeypatch.setattr(siblings, "cache_dir", lambda: tmp_path)
    return tiny("tiny-qwen2")


@pytest.mark.parametrize("recipe, says", [("finetune:french:10", "domain"), ("finetune:english:0", ">= 1"),
                                          ("finetune:english", ">= 1"), ("finetune:english:x", ">= 1")])
def test_bad_finetune_recipes_are_refused(recipe, says):
    with pytest.raises(FusionLabError, match=says):
        parse_recipe(recipe)


def test_a_recipe_not_made_yet_names_the_command(made):
    with pytest.raises(FusionLabError, match="nb10_finetune finetune:english:3"):
        sibling(made, "finetune:english:3")


def test_one_growing_run_makes_each_snapshot_and_the_sibling_reads_it(made, tmp_path, monkeypatch):
    ft.run(made, "english", [2, 4], DOCS, exclude={"essay3.txt"}, tokens=16)
    two, four = sibling(made, "finetune:english:2"), sibling(made, "finetune:english:4")
    base = dict(made.model.named_parameters())
    for n, p in four.model.named_parameters():
        assert torch.equal(p, base[n]) != (".layers." in f".{n}"), n  # the decoder moved, embeddings/head did not
    assert two.fingerprint != four.fingerprint != made.fingerprint
    manifest = json.loads(siblings.finetuned_path(made, "finetune:english:4").with_suffix(".json").read_text())
    assert manifest["steps"] == 4 and len(manifest["losses"]) == 4 and "essay3.txt" not in manifest["documents"]

    monkeypatch.setattr(siblings, "cache_dir", lambda: tmp_path / "again")  # a run to 2 steps only: the same bits
    ft.run(made, "english", [2], DOCS, exclude={"essay3.txt"}, tokens=16)
    again = sibling(made, "finetune:english:2")
    assert all(torch.equal(p, dict(two.model.named_parameters())[n]) for n, p in again.model.named_parameters())
    assert ft.missing(made, ["finetune:english:2", "finetune:english:4", "int8"]) == ["finetune:english:4"]


def test_ensure_makes_only_what_is_missing(made, monkeypatch):
    monkeypatch.setattr(ft, "evaluated_names", lambda tok, docs: {"essay0.txt"})
    assert ft.ensure(made, ["int8", "finetune:english:1"], DOCS, tokens=16) == ["finetune:english:1"]
    assert ft.ensure(made, ["int8", "finetune:english:1"], DOCS, tokens=16) == []


def test_no_training_window_comes_from_a_document_the_transfer_map_scores(tiny):
    m = tiny("tiny-qwen2")
    docs = corpora.documents()
    scored = ft.evaluated_names(m.tokenizer, docs)
    _, used = ft.training_windows(m.tokenizer, docs, "code", scored, tokens=64)  # the ladder's fine-tunes: code
    assert len(used) >= 50 and not set(used) & scored
    assert {d.split for d in docs if d.name in used and d.domain == "code"} == {"train"}
