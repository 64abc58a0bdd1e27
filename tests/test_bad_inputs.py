"""Every public entry point, fed bad input: one FusionLabError (or a documented subclass) whose message names the
argument or the file, never a raw torch / transformers / safetensors error, never a silent result.

Each case: (id, a call that must fail, a regex the message must contain). README "Reliability" counts these cases.
"""
from __future__ import annotations

import pytest
import torch

import fusionlab as fl
from fusionlab import kv
from fusionlab.analysis.attention_capture import capture_attention
from fusionlab.training.fuser import FuserConfig, LearnedFuser
from fusionlab.engine.sampling import SamplingConfig
from fusionlab.training import TrainChunk, TrainConfig, train_fuser
from fusionlab.errors import FusionLabError
from fusionlab.experiments import nb04_humaneval as he, nb02_niah as niah
from fusionlab.models.tiny import tiny_tokenizer

TEXT = "The quick brown fox jumps over the lazy dog."
_CACHE: dict[str, object] = {}


def lm(name: str = "tiny-qwen2") -> fl.LM:
    if name not in _CACHE:
        _CACHE[name] = fl.load(name)
    return _CACHE[name]  # type: ignore[return-value]


def fused(**slave_kw):
    return fl.fuse(lm(), [fl.Slave(fl.load("tiny-qwen2"), **slave_kw)])


def with_fused(fn):
    def run():
        with fused() as f:
            fn(f)
    return run


def proj():
    if "proj" not in _CACHE:
        _CACHE["proj"] = fl.fit_lstsq(lm(), lm("tiny-llama"), texts=[TEXT, "x = 1"], holdout_every=0)
    return _CACHE["proj"]


CASES = [
    # fl.load
    ("load: not a string", lambda: fl.load(None), r"fl.load\(name\) needs a model name"),
    ("load: empty name", lambda: fl.load(""), r"fl.load\(name\) needs a model name"),
    ("load: unknown name", lambda: fl.load("gpt-9"), r"unknown model 'gpt-9'"),
    ("load: bad dtype", lambda: fl.load("tiny-qwen2", dtype="float8"), r"unknown dtype 'float8'"),
    ("load: bad device", lambda: fl.load("tiny-qwen2", device="tpu"), r"unknown device 'tpu'"),
    ("load: bad attention", lambda: fl.load("tiny-qwen2", attn_implementation="magic"), r"attn_implementation"),
    # fuse / Slave
    ("fuse: master not an LM", lambda: fl.fuse("tiny-qwen2", []), r"expects an fl.LM as master"),
    ("fuse: one Slave, not a list", lambda: fl.fuse(lm(), fl.Slave(lm("tiny-llama"))), r"takes a list of fl.Slave"),
    ("fuse: a list of models", lambda: fl.fuse(lm(), [lm("tiny-llama")]), r"takes a list of fl.Slave.*LM"),
    ("fuse: strict not bool", lambda: fl.fuse(lm(), [], strict="yes"), r"strict must be True or False"),
    ("fuse: bad timing", lambda: fl.fuse(lm(), [], timing="soon"), r"unknown timing 'soon'"),
    ("slave: bad mode", lambda: fused(mode="mix"), r"unknown mode 'mix'"),
    ("slave: bad rope", lambda: fused(rope="both"), r"unknown rope 'both'"),
    ("slave: bad align", lambda: fused(align="median"), r"unknown align 'median'"),
    ("slave: negative gate", lambda: fused(gate=-1.0), r"gates must be >= 0"),
    ("slave: nan gate", lambda: fused(gate=float("nan")), r"gates must be finite"),
    ("slave: inf gate", lambda: fused(gate=float("inf")), r"gates must be finite"),
    ("slave: gate as string", lambda: fused(gate="1"), r"gates must be finite numbers"),
    ("slave: gate for an unmapped layer", lambda: fused(gate={0: 1.0, 9: 1.0}), r"layers \[9\] that the layer map"),
    ("slave: window_slots not bool", lambda: fused(window_slots="no"), r"window_slots must be True or False"),
    ("slave: layer map of strings", lambda: fused(layer_map={"a": 0}), r"master layer must be an int"),
    ("slave: layer map out of range", lambda: fused(layer_map={7: 0}), r"master layer 7 is out of range"),
    ("slave: bad layer map type", lambda: fused(layer_map=3.5), r"layer_map must be a LayerMap"),
    ("slave: unknown projector", lambda: fused(projector="magic"), r"unknown projector 'magic'"),
    # FusedModel calls
    ("call: None prompt", with_fused(lambda f: f(None)), r"prompt is None"),
    ("call: empty prompt", with_fused(lambda f: f("")), r"the prompt is empty"),
    ("call: ids out of vocabulary", with_fused(lambda f: f(torch.tensor([[1, 5, 10**6]]))), r"input_ids holds ids outside"),
    ("call: negative ids", with_fused(lambda f: f(torch.tensor([[-3, 1]]))), r"input_ids holds ids outside"),
    ("call: float ids", with_fused(lambda f: f(torch.tensor([[1.0, 2.0]]))), r"integer token ids"),
    ("call: prompt_len out of range", with_fused(lambda f: f(TEXT, prompt_len=999)), r"prompt_len must be in 1\.\."),
    ("call: prompt_len zero", with_fused(lambda f: f(TEXT, prompt_len=0)), r"prompt_len must be >= 1"),
    ("call: too long", with_fused(lambda f: f("a" * 600)), r"exceeds master tiny-qwen2's max positions"),
    ("generate: negative max_new_tokens", with_fused(lambda f: f.generate(TEXT, max_new_tokens=-1)),
     r"max_new_tokens must be >= 0"),
    ("generate: float max_new_tokens", with_fused(lambda f: f.generate(TEXT, max_new_tokens=2.5)),
     r"max_new_tokens must be an int"),
    ("generate: empty stop string", with_fused(lambda f: f.generate(TEXT, stop=[""])), r"stop\[0\] must be a non-empty"),
    ("generate: stop as a string", with_fused(lambda f: f.generate(TEXT, stop="\n")), r"stop must be a list of strings"),
    ("generate: zero temperature", with_fused(lambda f: f.generate(TEXT, do_sample=True, temperature=0)),
     r"temperature must be a finite number > 0"),
    ("generate: nan temperature", with_fused(lambda f: f.generate(TEXT, do_sample=True, temperature=float("nan"))),
     r"temperature must be a finite number > 0"),
    ("generate: top_p above 1", with_fused(lambda f: f.generate(TEXT, do_sample=True, top_p=1.5)), r"top_p must be <= 1"),
    ("generate: top_p zero", with_fused(lambda f: f.generate(TEXT, do_sample=True, top_p=0)), r"top_p must be > 0"),
    ("generate: seed as float", with_fused(lambda f: f.generate(TEXT, do_sample=True, seed=1.5)), r"seed must be an int"),
    ("generate: bad eos", with_fused(lambda f: f.generate(TEXT, eos_token_id="x")), r"eos_token_id must be an int"),
    ("generate: do_sample not bool", with_fused(lambda f: f.generate(TEXT, do_sample="yes")), r"do_sample must be True"),
    ("generate: chat not bool", with_fused(lambda f: f.generate(TEXT, chat=1)), r"chat must be True or False"),
    ("decode: foreign sequence", with_fused(lambda f: f.decode_one_token(object(), torch.tensor([[1]]))),
     r"needs the SequenceState"),
    ("decode: wrong token shape", with_fused(lambda f: f.decode_one_token(f.prefill(TEXT, 2)[0], torch.tensor([[1, 2]]))),
     r"token must be \(batch, 1\)"),
    ("decode: token out of vocabulary", with_fused(lambda f: f.decode_one_token(f.prefill(TEXT, 2)[0],
                                                                             torch.tensor([[10**6]]))),
     r"token holds ids outside"),
    ("batch: empty list", with_fused(lambda f: f.generate([])), r"the batch is empty"),
    ("batch: empty string inside", with_fused(lambda f: f(["a", ""])), r"prompt 1 of the batch is an empty string"),
    ("batch: mask not 0/1", with_fused(lambda f: f(torch.ones(2, 3, dtype=torch.long),
                                                   attention_mask=torch.full((2, 3), 7))), r"only 0 \(padding\) and 1"),
    ("context: empty", with_fused(lambda f: f(TEXT, context="")), r"context is empty"),
    # LayerMap
    ("layermap: from_dict without pairs", lambda: fl.LayerMap.from_dict({"strategy": "x"}), r"needs \{'pairs'"),
    ("layermap: from_dict not a dict", lambda: fl.LayerMap.from_dict([1, 2]), r"needs \{'pairs'"),
    ("layermap: pairs not a dict", lambda: fl.LayerMap([(0, 0)]), r"needs a dict"),
    ("layermap: float layer", lambda: fl.LayerMap({0.5: 0}), r"master layer must be an int"),
    ("layermap: zero layers", lambda: fl.LayerMap.identity(0, 3), r"at least one layer"),
    ("layermap: bad layer count", lambda: fl.LayerMap.identity("four", 3), r"layer count must be"),
    ("layermap: stride step float", lambda: fl.LayerMap.stride(4, 4, step=1.5), r"stride step must be >= 1"),
    ("layermap: step for proportional", lambda: fl.LayerMap.build("proportional", 4, 4, step=2), r"takes no \['step'\]"),
    # fit / projectors / fusers
    ("fit: negative ridge", lambda: fl.fit_lstsq(lm(), lm("tiny-llama"), texts=[TEXT], ridge=-1), r"ridge must be >= 0"),
    ("fit: nan ridge", lambda: fl.fit_lstsq(lm(), lm("tiny-llama"), texts=[TEXT], ridge=float("nan")),
     r"ridge must be finite"),
    ("fit: texts as a string", lambda: fl.fit_lstsq(lm(), lm("tiny-llama"), texts=TEXT), r"texts must be a non-empty list"),
    ("fit: empty text", lambda: fl.fit_lstsq(lm(), lm("tiny-llama"), texts=["", "x"]), r"texts\[0\] is an empty string"),
    ("fit: bad align", lambda: fl.fit_lstsq(lm(), lm("tiny-llama"), texts=[TEXT], align="avg"), r"unknown align 'avg'"),
    ("fit: slave not an LM", lambda: fl.fit_lstsq(lm(), "tiny-llama"), r"the slave is a str"),
    ("projector: missing file", lambda: fl.LstsqProjector.load("/no/such/file.safetensors"), r"no projector or fuser file"),
    ("fuser config: bad mode", lambda: FuserConfig(mode="sum"), r"FuserConfig mode='sum'"),
    ("train config: zero budget", lambda: TrainConfig(max_tokens=0), r"max_tokens must be >= 1"),
    ("train config: nan lr", lambda: TrainConfig(lr=float("nan")), r"lr must be finite"),
    ("train config: negative decay", lambda: TrainConfig(weight_decay=-0.1), r"weight_decay must be >= 0"),
    ("train config: float warmup", lambda: TrainConfig(warmup=2.5), r"warmup must be an int, got float"),
    ("train config: zero clip", lambda: TrainConfig(clip=0), r"clip must be > 0"),
    ("train config: zero threads", lambda: TrainConfig(threads=0), r"threads must be >= 1"),
    ("train config: patience alone", lambda: TrainConfig(patience=3), r"patience=3 needs eval_every"),
    ("train config: eval every 0", lambda: TrainConfig(eval_every=0), r"eval_every must be >= 1"),
    ("fuser config: dropout 1", lambda: FuserConfig(dropout=1.0), r"dropout must be <= 0.9"),
    ("fuser config: negative table", lambda: FuserConfig(table=-1), r"table must be >= 0"),
    ("fuser config: per_head string", lambda: FuserConfig(per_head="yes"), r"per_head must be"),
    ("train config: negative time", lambda: TrainConfig(max_seconds=-5), r"max_seconds must be > 0"),
    ("train config: bad task", lambda: TrainConfig(task="copy"), r"task 'copy'"),
    ("train: short chunk", lambda: train_fuser(lm(), lm("tiny-llama"), [TrainChunk("hi")], projector=proj()),
     r"chunk 0 is empty or too short"),
    ("sampling: config top_p", lambda: SamplingConfig(True, 1.0, 2.0), r"top_p must be <= 1"),
    # capture, preflight, kv
    ("capture: layer out of range", lambda: capture_attention(lm(), layers=[9]).__enter__(), r"layers \[9\].*out of range"),
    ("capture: layers as strings", lambda: capture_attention(lm(), layers=["0"]).__enter__(), r"lists of ints"),
    ("capture: bad queries string", lambda: capture_attention(lm(), queries="first").__enter__(), r"queries must be None"),
    ("capture: negative query", lambda: capture_attention(lm(), queries=[-1]).__enter__(), r"non-negative int positions"),
    ("capture: bad keep", lambda: capture_attention(lm(), keep="some").__enter__(), r"keep must be one of"),
    ("capture: not a model", lambda: capture_attention("qwen").__enter__(), r"expects an fl.LM or a FusedModel"),
    ("preflight: not models", lambda: fl.check_alignment(lm(), None), r"expects two fl.LM"),
    ("kv: zero length", lambda: kv.budget(lm(), 0), r"seq_len and batch must be positive"),
    ("kv: float length", lambda: kv.budget(lm(), 10.5), r"seq_len must be an int"),
    ("kv: bool batch", lambda: kv.budget(lm(), 10, batch=True), r"batch must be an int"),
    ("kv: unknown dtype", lambda: kv.budget(lm(), 10, dtype="fp8"), r"unknown dtype 'fp8'"),
    ("kv: not a config", lambda: kv.budget(42, 10), r"kv.budget expects"),
    # harnesses
    ("niah: depth out of range", lambda: niah.build_context(tiny_tokenizer(), TEXT * 50, niah.load_needles()[0], 200, 120),
     r"depth must be within 0-100"),
    ("niah: float length", lambda: niah.build_context(tiny_tokenizer(), TEXT * 50, niah.load_needles()[0], 20.5, 50),
     r"length must be an int"),
    ("niah: needle not a Needle", lambda: niah.build_context(tiny_tokenizer(), TEXT * 50, "city", 200, 50),
     r"needle must be a niah.Needle"),
    ("niah: unknown haystack", lambda: niah.load_haystack("nope"), r"haystack 'nope' not found"),
    ("niah: score of None", lambda: niah.score(None, niah.load_needles()[0]), r"needs the answer text"),
    ("humaneval: zero subset", lambda: he.subset(0), r"n must be >= 1"),
    ("humaneval: no tasks", lambda: he.generate_all("s", "k", lambda: fl.fuse(lm(), []), []), r"tasks must be"),
    ("humaneval: bad max_new_tokens", lambda: he.generate_all("s", "k", lambda: fl.fuse(lm(), []), he.subset(1),
                                                            max_new_tokens=0), r"max_new_tokens must be >= 1"),
    ("humaneval: no shared settings", lambda: he.generate_shared({}, lambda: fl.fuse(lm(), []), he.subset(1)),
     r"settings must map a setting's name to \(cache key, slaves it reads\)"),
    ("humaneval: check needs a frame", lambda: he.check([{"task_id": "x"}]), r"check\(\) needs the DataFrame"),
    ("humaneval: zero timeout", lambda: he.check(__import__("pandas").DataFrame(columns=["task_id", "completion"]),
                                                 timeout=0), r"timeout must be > 0"),
]


@pytest.mark.parametrize("case,call,pattern", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gives_one_clear_error(case, call, pattern):
    with pytest.raises(FusionLabError, match=pattern):
        call()


def test_a_learned_fuser_for_another_pair_is_refused():
    fuser = LearnedFuser(proj(), FuserConfig(width=4))
    with pytest.raises(FusionLabError, match="fitted for master tiny-qwen2 \\+ slave tiny-llama"):
        fl.fuse(lm("tiny-phi3"), [fl.Slave(lm("tiny-llama"), projector=fuser, align="mean")])


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_damaged_projector_and_fuser_files_name_the_file(tmp_path, damage):
    for obj in (proj(), LearnedFuser(proj(), FuserConfig(width=4))):
        path = obj.save(tmp_path / f"{type(obj).__name__}.safetensors")
        raw = path.read_bytes()
        path.write_bytes({"truncated": raw[: len(raw) // 3], "garbage": b"\x00garbage" * 10, "empty": b""}[damage])
        with pytest.raises(FusionLabError, match=rf"{path.name}.*(truncated|not a FusionLab file)"):
            type(obj).load(path)


def test_cli_bad_input_exits_2_with_one_line(capsys):
    from fusionlab.lab.cli import main

    assert main(["kv", "tiny-qwen2", "--seq", "0"]) == 2
    assert main(["preflight", "nope", "tiny-qwen2"]) == 2
    assert main(["fetch", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("fusionlab: ") for line in err)
