"""Controls that cannot leak: every 'other text' a control reads comes from another document, never a window of its
own file; tested on hand-made corpora where a chunk-level shuffle (the neighbouring window) would read the answer."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from fusionlab.errors import FusionLabError
from fusionlab.experiments import nb07_corpora as corpora
from fusionlab.training.chunks import TrainChunk, document_derangement


def corpus(sizes: list[int]) -> list[TrainChunk]:
    """Offload chunks as the corpora cut them: window k of document d reads window k-1 of d as its context."""
    return [TrainChunk(f"document {d}, window {k}.", context=f"document {d}, window {k - 1}.", doc=f"d{d}")
            for d, n in enumerate(sizes) for k in range(1, n + 1)]


@given(st.lists(st.integers(1, 6), min_size=2, max_size=6), st.integers(0, 50))
@settings(max_examples=60, deadline=None)
def test_every_chunk_reads_another_document(sizes, seed):
    chunks = corpus(sizes)
    reads = document_derangement(chunks, seed)
    assert len(reads) == len(chunks)
    for c, r in zip(chunks, reads):
        assert chunks[r].doc != c.doc
        assert chunks[r].context != c.text  # the leak: the next window's context is this chunk's own target
    if 2 * max(sizes) <= sum(sizes):  # a permutation exists: each control text read exactly once
        assert sorted(reads) == list(range(len(chunks)))


def test_a_neighbouring_window_would_have_failed_this_test():
    chunks = corpus([4, 4])
    leaky = [(i + 1) % len(chunks) for i in range(len(chunks))]  # the old shuffled control
    assert any(chunks[r].context == c.text for c, r in zip(chunks, leaky))
    assert document_derangement(chunks, 0) != leaky


def test_seeded_and_chunks_without_a_document_are_their_own():
    chunks = corpus([3, 2, 5])
    assert document_derangement(chunks, 1) == document_derangement(chunks, 1)
    loose = [TrainChunk(f"text {i}") for i in range(4)]
    reads = document_derangement(loose, 0)
    assert all(r != i for i, r in enumerate(reads)) and sorted(reads) == [0, 1, 2, 3]


def test_one_document_cannot_have_a_control():
    with pytest.raises(FusionLabError, match="at least 2 documents"):
        document_derangement(corpus([5]), 0)


def test_one_large_document_still_never_reads_itself():
    chunks = corpus([30, 2])  # notebook 07's Chinese held-out set: 30 of 32 chunks from one file
    reads = document_derangement(chunks, 0)
    assert all(chunks[r].doc != c.doc for c, r in zip(chunks, reads))
    assert Counter(chunks[r].doc for r in reads)["d1"] == 30


def test_corpus_chunks_name_their_document(tiny):
    tok = tiny("tiny-qwen2").tokenizer
    docs = [corpora.Doc("code", f"m{i}.py", " ".join(f"def f{j}(x): return x + {j}" for j in range(80)), "train")
            for i in range(3)]
    chunks = corpora.chunks(tok, docs, "train", tokens=32, task="offload")
    assert {c.doc for c in chunks} == {"code/m0.py", "code/m1.py", "code/m2.py"}
    reads = document_derangement(chunks, 0)
    assert all(chunks[r].doc != c.doc for c, r in zip(chunks, reads))


def test_training_and_heldout_controls_read_another_document(tiny, monkeypatch):
    """Both places a shuffled control is built (train_fuser, notebook 07's held-out NLL) pair each chunk with a chunk
    of another document; a recorder stands in for `prepare` so only the pairing is under test."""
    import fusionlab as fl
    import fusionlab.training.train as train_mod
    from fusionlab.experiments import nb07_fusers
    from fusionlab.training.fuser import FuserConfig, LearnedFuser
    from fusionlab.training.train import TrainConfig, train_fuser

    m, s = tiny("tiny-qwen2"), tiny("tiny-llama")
    chunks = corpus([3, 3, 2])
    proj = fl.fit_lstsq(m, s, texts=[c.text * 4 for c in chunks], holdout_every=0)
    seen: list[list[int]] = []

    def record(fused, chs, task, reads):
        seen.append(list(reads))
        raise StopIteration  # only the pairing is under test

    for module in (train_mod, nb07_fusers):
        monkeypatch.setattr(module, "prepare", record)
    with pytest.raises(StopIteration):
        train_fuser(m, s, chunks, FuserConfig(width=4, input="shuffled"), TrainConfig(max_tokens=50),
                    projector=proj, progress=False)
    fuser = LearnedFuser(proj, FuserConfig(width=4))
    with pytest.raises(StopIteration):
        nb07_fusers.chunk_nll(m, nb07_fusers.Evaluated("x", fuser, s, reads="shuffled"), chunks, "offload")
    assert len(seen) == 2
    for reads in seen:
        assert all(chunks[r].doc != c.doc for c, r in zip(chunks, reads))


def test_a_held_out_domain_from_one_document_is_left_out_not_crashed_on():
    """Notebook 07's default run died on offload's held-out Chinese (two windows of one file: no other document to
    read); such a domain now leaves the evaluation, named, and every kept domain can derange."""
    kept, dropped = corpora.with_controls({"code": corpus([2, 1]), "chinese": corpus([3]), "english": []})
    assert list(kept) == ["code"] and dropped == ["chinese", "english"]
    assert all(chunks[i].doc != chunks[j].doc for chunks in kept.values()
               for i, j in enumerate(document_derangement(chunks, 0)))
