"""Model zoo: names, verification, errors that name the fix; tiny models and their differences."""
from __future__ import annotations

import pytest
import torch

import fusionlab as fl
from fusionlab.models import zoo
from fusionlab.errors import FusionLabError
from fusionlab.files import sha256_file


def test_unknown_name_lists_valid_ones():
    with pytest.raises(FusionLabError, match=r"unknown model 'gpt-9'.*qwen2.5-coder-0.5b-instruct.*tiny-qwen2"):
        fl.load("gpt-9")


def test_local_path_without_config(tmp_path):
    with pytest.raises(FusionLabError, match="has no config.json"):
        fl.load(str(tmp_path))


def test_local_path_with_saved_model_loads(tmp_path, tiny):
    t = tiny("tiny-llama")
    t.model.save_pretrained(tmp_path)
    t.tokenizer.save_pretrained(tmp_path)
    lm = fl.load(str(tmp_path))
    ids = t.encode("abc")
    with torch.no_grad():
        assert torch.equal(lm.model(ids).logits, t.model(ids).logits)


def test_missing_package_names_fetch_command():
    chunk = zoo.Chunk("no_such_module_xyz", "data/x.bin", "0" * 64, "no-such-package")
    with pytest.raises(FusionLabError, match=r"fusionlab fetch.*pip install no-such-package"):
        zoo.chunk_path(chunk)


def test_bad_chunk_sha_names_the_file_and_never_assembles(tmp_path):
    good, bad = tmp_path / "a.part", tmp_path / "b.part"
    good.write_bytes(b"hello")
    bad.write_bytes(b"world")
    chunks = [(good, sha256_file(good)), (bad, "f" * 64)]
    target = tmp_path / "out.gguf"
    with pytest.raises(FusionLabError, match=r"b\.part has sha256 .* expected f{64}"):
        zoo.assemble(chunks, target, "0" * 64)
    assert not target.exists()


def test_assembled_sha_is_checked(tmp_path):
    a = tmp_path / "a.part"
    a.write_bytes(b"abc")
    with pytest.raises(FusionLabError, match="assembled out.gguf has sha256"):
        zoo.assemble([(a, sha256_file(a))], tmp_path / "out.gguf", "0" * 64)
    ok = zoo.assemble([(a, sha256_file(a))], tmp_path / "ok.gguf", sha256_file(a))
    assert ok.read_bytes() == b"abc"


def test_dtype_and_device_errors():
    with pytest.raises(FusionLabError, match="unknown dtype"):
        fl.load("tiny-qwen2", dtype="float8")
    with pytest.raises(FusionLabError, match="float16 on CPU"):
        fl.load("tiny-qwen2", dtype="float16")
    if not torch.cuda.is_available():
        with pytest.raises(FusionLabError, match="CUDA is not available"):
            fl.load("tiny-qwen2", device="cuda")
        with pytest.raises(FusionLabError, match="flash_attention_2 needs a CUDA device"):
            fl.load("tiny-qwen2", attn_implementation="flash_attention_2")
    with pytest.raises(FusionLabError, match="unknown device"):
        fl.load("tiny-qwen2", device="tpu")


def test_tiny_models_differ_in_geometry(tiny):
    specs = {n: tiny(n).spec for n in ["tiny-qwen2", "tiny-llama", "tiny-phi3", "tiny-gemma3"]}
    assert len({(s.layers, s.kv_heads, s.head_dim) for s in specs.values()}) == 4
    assert len({specs[n].rope["full_attention"].theta for n in ["tiny-qwen2", "tiny-llama", "tiny-phi3"]}) == 3
    g = specs["tiny-gemma3"]
    assert "sliding_attention" in g.layer_types and g.rope["sliding_attention"].theta != g.rope["full_attention"].theta
    assert specs["tiny-qwen2"].has_chat_template


def test_tiny_models_are_deterministic():
    a, b = fl.load("tiny-phi3"), fl.load("tiny-phi3")
    assert a.fingerprint == b.fingerprint
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))


def test_registry_pins_every_chunk():
    for entry in zoo.EMBEDDED.values():
        assert len(entry.sha256) == 64 and all(len(c.sha256) == 64 for c in entry.chunks)


def test_a_model_loaded_under_inference_mode_loads_and_keeps_no_rebuild_recipe():
    """Inference tensors keep no version counter, so an in-place edit could not be seen: such a model must load
    (notebook 08 loads under torch.inference_mode) and never claim its recipe still makes it."""
    with torch.inference_mode():
        lm = fl.load("tiny-llama")
    assert lm.rebuild_recipe() is None
    assert fl.load("tiny-llama").rebuild_recipe() is not None


@pytest.mark.parametrize("name, short", [("smollm2-135m-instruct", "smollm2"), ("gemma3-270m", "gemma3"),
                                         ("tiny-qwen2", "tiny"), ("HuggingFaceTB/SmolLM2-135M", "SmolLM2"),
                                         ("/models/my-model/", "my"), ("qwen", "qwen")])
def test_short_name_is_the_family_before_the_first_hyphen(name, short):
    assert fl.short_name(name) == short
