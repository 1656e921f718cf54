"""llama.cpp beside attnlab (the llamacpp extra; skipped without llama-cpp-python): llama.cpp's tokenizer
reads attnlab's ids from exported files, its decoding loop gives attnlab's greedy tokens, and its own
quantizer's K-quant files (Q4_K, Q6_K) convert to the model llama.cpp computes.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

import attnlab
from attnlab.decoding.sampling import stream
from attnlab.interop.gguf_in import convert_from_gguf
from attnlab.interop.gguf_out import export_gguf, write_gguf
from attnlab.models.gpt import GPT, GPTConfig
from tests.conftest import TEXT
from tests.test_gguf import (
    CORPUS,
    LLAMA_BLOCK,
    SPM,
    Q,
    logits,
    make_run,
    references,
    runs,
    tokenizer,
    write_reference,
)

llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp's Python binding: pip install -e '.[llamacpp]'")
from attnlab.interop.llamacpp import greedy, greedy_rows, last_logits, tokenize  # noqa: E402  (after the skip)

pytestmark = pytest.mark.usefixtures("one_thread")
__all__ = ["references", "runs"]  # the fixtures test_gguf.py makes, used here


def test_llamacpp_reads_the_same_ids(runs, tmp_path):
    """A character run's vocabulary (bytes merged back into characters) and a BPE run's give llama.cpp's
    tokenizer attnlab's ids for text of the run's characters; a character the run never saw is <unk> to
    attnlab and dropped by llama.cpp (a byte-level vocabulary has no unknown token to fall back on)."""
    for name in ("gpt2_char", "llama_bpe"):
        export_gguf(runs[name].path, tmp_path / f"{name}.gguf")
        for text in (CORPUS, "  spaces\n\nand — 🙂 ≥ é", CORPUS[::-1]):
            assert tokenize(tmp_path / f"{name}.gguf", text) == runs[name].tokenizer.encode(text), (name, text)
    bpe = runs["llama_bpe"].tokenizer  # its <|endoftext|> is a special token in text too, as llama.cpp's control token
    assert tokenize(tmp_path / "llama_bpe.gguf", "a<|endoftext|>b", special=True) == bpe.encode("a<|endoftext|>b")
    tok = runs["gpt2_char"].tokenizer
    assert tok.encode("aZb") == [tok.encode("a")[0], tok.unk_id, tok.encode("b")[0]]
    assert tokenize(tmp_path / "gpt2_char.gguf", "aZb") == tok.encode("ab")


def test_llamacpp_reads_sentencepiece_as_the_converted_run_does(references, tmp_path):
    write_reference(tmp_path / "m.gguf", references["llama"][0], "llama", SPM, Q.F32)
    convert_from_gguf(tmp_path / "m.gguf", tmp_path / "run")
    ours = attnlab.load(tmp_path / "run", device="cpu").tokenizer
    for text in ["the cat in the hat", "  two spaces first", "def add(a, b):\n    return a + b", "é — 🙂"]:
        assert [1, *tokenize(tmp_path / "m.gguf", text)] == ours.encode(text), text


@pytest.mark.parametrize("name", ["gpt2_char", "llama_bpe", "mixtral_char", "llama_wide_heads", "qwen3_bpe"])
def test_llamacpp_decodes_attnlabs_greedy_tokens(runs, tmp_path, name):
    run = runs[name]
    export_gguf(run.path, tmp_path / "m.gguf")
    prompt = run.tokenizer.encode(TEXT)[:8]
    ours = list(stream(run.model, prompt, 32, temperature=0, dtype="float32"))
    theirs, per_second = greedy(tmp_path / "m.gguf", prompt, 32)
    print(f"{name}: llama.cpp {per_second:,.0f} tokens/s; {len(set(ours))} distinct tokens; same: {ours == theirs}")
    assert len(set(ours)) > 3 and ours == theirs


def written_in_memory(path):
    """A GPT built in memory (GPT-2's block, vocabulary 256, weights spread so its logit gaps are wide),
    written to `path` by write_gguf with placeholder tokens; the model and a prompt of token ids."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, d_model=64, context=128, vocab_size=256, activation="gelu_tanh"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    write_gguf(model.eval(), path)
    return model, list(range(40, 56))


def test_llamacpp_decodes_a_model_written_from_memory(tmp_path):
    """The benchmark's way in: a GPT built in memory (GPT-2's block, vocabulary 256), written by
    write_gguf with placeholder tokens and fed token ids."""
    model, prompt = written_in_memory(tmp_path / "m.gguf")
    theirs, _ = greedy(tmp_path / "m.gguf", prompt, 32)
    assert theirs == list(stream(model, prompt, 32, temperature=0, dtype="float32"))


def test_llamacpp_decodes_rows_together_as_each_alone(tmp_path):
    """greedy_rows, the benchmark's batch rows: 16 sequences in one llama_decode a step, each the lone
    greedy sequence (attnlab's here)."""
    model, prompt = written_in_memory(tmp_path / "m.gguf")
    tokens, per_second = greedy_rows(tmp_path / "m.gguf", prompt, 16, 24)
    assert tokens == list(stream(model, prompt, 24, temperature=0, dtype="float32")) and per_second > 0


def test_quantized_files_decode_in_llamacpp(runs, tmp_path):
    """Q8_0 and Q4_0 files decode a prompt of several tokens. On a CPU with AMX (Sapphire Rapids and
    later) llama.cpp's AMX kernels crash the process on such a prompt (ggml-org/llama.cpp#20824) unless
    greedy() keeps the weights as the file stores them: if that guard breaks, this test crashes."""
    run = runs["llama_bpe"]
    prompt = run.tokenizer.encode(TEXT)[:8]
    for qtype in ("q8_0", "q4_0"):
        export_gguf(run.path, tmp_path / f"{qtype}.gguf", qtype)
        tokens, _ = greedy(tmp_path / f"{qtype}.gguf", prompt, 8)
        assert len(tokens) == 8 and all(0 <= t < run.model.cfg.vocab_size for t in tokens)


def ggml_dequantized(t) -> np.ndarray:
    """llama.cpp's own dequantization of a K-quant tensor (ggml's dequantize_row_q4_K / _q6_K)."""
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    row = getattr(lib, f"dequantize_row_{t.tensor_type.name[:2].lower()}_K")
    row.argtypes, row.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    blocks = np.ascontiguousarray(t.data)
    out = np.empty(int(t.n_elements), np.float32)
    row(blocks.ctypes.data, out.ctypes.data, out.size)
    return out


def test_k_quants_from_llamacpps_quantizer(tmp_path):
    """Q4_K and Q6_K, which gguf.quants reads but cannot write: a file made by llama.cpp's own quantizer
    (Q4_K_M mixes both). Every block reads as ggml's own dequantization reads it, and the converted
    run's logits are llama.cpp's for that file up to llama.cpp's rounding of the activations (its
    K-quant products round them to 8 bits), several times closer than the unquantized model's are."""
    keys = dict(LLAMA_BLOCK, d_model=256, d_ff=512, n_layer=1, n_head=4, context=64, tie_weights=False)
    src = attnlab.load(make_run(tmp_path / "run", GPTConfig(**keys), tokenizer("bpe"), scale=0.02), device="cpu")
    export_gguf(src.path, tmp_path / "f32.gguf")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = gguf.LlamaFileType.MOSTLY_Q4_K_M
    assert (
        llama_cpp.llama_model_quantize(
            str(tmp_path / "f32.gguf").encode(), str(tmp_path / "q4km.gguf").encode(), params
        )
        == 0
    )
    for t in gguf.GGUFReader(tmp_path / "q4km.gguf").tensors:
        if t.tensor_type in (Q.Q4_K, Q.Q6_K):
            assert np.array_equal(gguf.quants.dequantize(t.data, t.tensor_type).ravel(), ggml_dequantized(t))
    types = convert_from_gguf(tmp_path / "q4km.gguf", tmp_path / "back")["types"]
    assert {"Q4_K", "Q6_K"} <= set(types), types
    back = attnlab.load(tmp_path / "back", device="cpu")
    prompt = src.tokenizer.encode(TEXT)[:12]
    theirs = torch.from_numpy(last_logits(tmp_path / "q4km.gguf", prompt))
    read = (logits(back.model, torch.tensor([prompt]))[0, -1] - theirs).abs().max().item()
    quantized = (logits(src.model, torch.tensor([prompt]))[0, -1] - theirs).abs().max().item()
    print(f"Q4_K_M {types}: |run - llama.cpp| = {read:.3g}, |unquantized - llama.cpp| = {quantized:.3g}")
    assert read < quantized / 4
