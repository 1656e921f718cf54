"""GGUF out and in, against the gguf package's reader and writer, transformers, and llama.cpp itself.

Tiny runs of each block GGUF holds (GPT-2's, Llama's with grouped-query attention, a Mixtral's experts)
are exported and read back with gguf.GGUFReader; GGUF files written here with gguf.GGUFWriter alone, laid
out as llama.cpp's convert_hf_to_gguf lays them (rotary rows paired, Conv1D transposed, gguf's own tensor
names), from random transformers models, are converted and compared with transformers' logits; exported
files load in transformers (its GGUF reader) with the same logits; and, where llama-cpp-python is
installed, llama.cpp reads the same token ids and decodes the same greedy tokens as attnlab.
"""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch

import attnlab
from attnlab.data.tokenizers import BPETokenizer, CharTokenizer, WordTokenizer
from attnlab.errors import AttnlabError
from attnlab.interop.convert import export_hf
from attnlab.interop.gguf_in import convert_from_gguf
from attnlab.interop.gguf_out import export_gguf, write_gguf
from attnlab.models.gpt import GPT, GPTConfig
from tests.conftest import TEXT, extra, make_run, run_cli

transformers = extra("transformers", "transformers, the reference here, is a dev extra")
pytestmark = pytest.mark.usefixtures("one_thread")

Q = gguf.GGMLQuantizationType
# Multi-byte characters of every width, so a character vocabulary needs merges of 2, 3 and 4 bytes.
CORPUS = TEXT + "The quick brown fox jumps over the lazy dog.\nCafé, naïve — 🙂 ≥ 10 ü\n"
GPT2_BLOCK = dict(n_layer=2, n_head=4, d_model=64, activation="gelu_tanh")
LLAMA_BLOCK = dict(
    n_layer=2, n_head=4, d_model=64, d_ff=96, positions="rope", norm_kind="rmsnorm", feedforward="swiglu", bias=False
)
MIXTRAL_BLOCK = {**LLAMA_BLOCK, "feedforward": "moe", "expert_ff": "swiglu", "n_experts": 4, "experts_per_token": 2}
# name -> (model settings, tokenizer). transformers' GGUF reader sizes GPT-2's positions as GPT-2's
# 1024 whatever the file says (it reads context_length as n_ctx), so the GPT-2 it loads has that context.
RUNS = {
    "gpt2_char": (dict(GPT2_BLOCK, context=64), "char"),
    "gpt2_bpe": (dict(GPT2_BLOCK, context=1024), "bpe"),
    "llama_bpe": (dict(LLAMA_BLOCK, n_kv_head=2, context=64, tie_weights=False), "bpe"),
    "mixtral_char": (dict(MIXTRAL_BLOCK, n_kv_head=1, context=64, tie_weights=True), "char"),
    "llama_wide_heads": (dict(LLAMA_BLOCK, d_head=32, context=64, tie_weights=True), "char"),  # 4 heads of 32 in 64
    "qwen3_bpe": (dict(LLAMA_BLOCK, qk_norm=True, n_kv_head=2, context=64, tie_weights=False), "bpe"),  # QK-norm
}


def tokenizer(kind: str):
    return CharTokenizer.train([CORPUS]) if kind == "char" else BPETokenizer.train([CORPUS] * 5, 300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {
        name: attnlab.load(make_run(root / name, GPTConfig(**keys), tokenizer(kind)), device="cpu")
        for name, (keys, kind) in RUNS.items()
    }


def ids(run, n: int = 20, seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randint(0, run.model.cfg.vocab_size, (2, n))  # (B, T)


@torch.no_grad()
def logits(model, idx) -> torch.Tensor:
    out = model(idx)
    return out.logits if hasattr(out, "logits") else out


# ---- llama.cpp's layout, written here independently of attnlab's code: the reference both ways.

CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


def llamacpp_rows(w: np.ndarray, heads: int, back: bool = False) -> np.ndarray:
    """convert_hf_to_gguf's permutation of q_proj / k_proj rows (reshape(H, 2, Dh/2, C).swapaxes(1, 2))."""
    split = (heads, w.shape[0] // heads // 2, 2) if back else (heads, 2, w.shape[0] // heads // 2)
    return w.reshape(*split, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_layout(name: str, w: np.ndarray, arch: str, heads: dict[str, int], back: bool = False) -> np.ndarray:
    """A HuggingFace tensor as GGUF stores it (back=True: the other way)."""
    if arch == "gpt2" and name.endswith(CONV1D):
        return w.T
    proj = name.split(".")[-2]
    return llamacpp_rows(w, heads[proj], back) if arch == "llama" and proj in heads else w


def heads_of(hf_cfg) -> dict[str, int]:
    return {"q_proj": getattr(hf_cfg, "num_attention_heads", 0), "k_proj": getattr(hf_cfg, "num_key_value_heads", 0)}


# ---- 1. what attnlab writes, read back by the gguf package


def block_bound(original: np.ndarray) -> np.ndarray:
    """Q8_0's error bound per weight: half a step (absmax / 127 / 2) of its block of 32, plus the f16
    rounding of the block's scale (127 steps of at most 2^-11 of it: absmax * 2^-11)."""
    blocks = np.abs(original.reshape(-1, 32)).max(axis=1, keepdims=True)
    return np.broadcast_to(blocks / 254 + blocks * 2**-11 + 1e-7, (blocks.shape[0], 32)).reshape(original.shape)


@pytest.mark.parametrize(("name", "qtype"), [("llama_bpe", "f32"), ("llama_bpe", "q8_0"), ("gpt2_char", "q8_0")])
def test_written_tensors_read_back(runs, tmp_path, name, qtype):
    run = runs[name]
    summary = export_gguf(run.path, tmp_path / "m.gguf", qtype)
    export_hf(run.path, tmp_path / "hf")  # HuggingFace's tensors of the same run: what the file holds, laid out
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    arch = summary["architecture"]
    table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA if arch == "llama" else gguf.MODEL_ARCH.GPT2, 2)
    tensors = {k: v for k, v in hf.state_dict().items() if not (k == "lm_head.weight" and run.model.cfg.tie_weights)}
    wanted = {
        table.get_name(k, try_suffixes=(".weight", ".bias")): gguf_layout(k, v.numpy(), arch, heads_of(hf.config))
        for k, v in tensors.items()
    }
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    assert {t.name for t in reader.tensors} == set(wanted)
    worst = 0.0
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(wanted[t.name].shape)
        if len(wanted[t.name].shape) == 1 or qtype == "f32" or t.name == "position_embd.weight":  # f32 always
            assert t.tensor_type == Q.F32 and np.array_equal(values, wanted[t.name]), t.name
        else:
            assert t.tensor_type == Q.Q8_0, t.name  # the token embedding too
            err = np.abs(values - wanted[t.name])
            assert (err <= block_bound(wanted[t.name])).all(), t.name
            worst = max(worst, float((err / block_bound(wanted[t.name])).max()))
    print(f"{name} {qtype}: worst error / bound = {worst:.3f}")
    meta = {k: f.contents() for k, f in reader.fields.items()}
    assert meta["general.architecture"] == arch and meta[f"{arch}.block_count"] == 2
    assert len(meta["tokenizer.ggml.tokens"]) == run.model.cfg.vocab_size
    assert meta["tokenizer.ggml.bos_token_id"] == meta["tokenizer.ggml.eos_token_id"] == run.tokenizer.eot_id
    if arch == "llama":
        assert meta["llama.attention.head_count_kv"] == 2 and "output.weight" in wanted


# ---- 2. GGUF files of transformers models, written with the gguf package alone, converted

# A SentencePiece-style vocabulary (Llama's layout): <unk>, <s>, </s>, the 256 byte tokens, then pieces
# scored best first; as in a real one, every character of a piece is a piece itself.
MERGED = [
    "▁t",
    "he",
    "▁the",
    "in",
    "▁a",
    "er",
    "on",
    "re",
    "at",
    "▁s",
    "en",
    "▁w",
    "▁o",
    "nd",
    "▁c",
    "es",
    "or",
    "▁f",
    "▁in",
    "ar",
    "is",
    "ed",
    "le",
    "▁d",
    "ou",
    "▁an",
    "de",
    "▁(",
    "):",
    "rn",
]
PIECES = sorted(set("".join(MERGED))) + MERGED
SPM = {
    "model": "llama",
    "tokens": ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], *PIECES],
    "types": [2, 3, 3] + [6] * 256 + [1] * len(PIECES),
    "scores": [0.0] * 259 + [-float(i) for i in range(len(PIECES))],
    "bos": 1,
    "eos": 2,
    "unk": 0,
}


def gpt2_vocab(tok: BPETokenizer) -> dict:
    data = json.loads(tok.to_json())
    tokens = [t for t, _ in sorted(tok.tok.get_vocab().items(), key=lambda kv: kv[1])]
    types = [3 if t == "<|endoftext|>" else 1 for t in tokens]  # a control token, the rest normal
    return {
        "model": "gpt2",
        "pre": "gpt-2",
        "tokens": tokens,
        "types": types,
        "merges": [" ".join(m) for m in data["model"]["merges"]],
        "bos": tok.eot_id,
        "eos": tok.eot_id,
    }


# A vocabulary's keys (vocab()), in the order llama.cpp's converter writes them, and GGUFWriter's add_* for each;
# "pre", "merges", "scores" and "unk" are written when a vocabulary has them.
VOCAB_KEYS = (
    "model:tokenizer_model pre:tokenizer_pre tokens:token_list types:token_types merges:token_merges "
    "scores:token_scores bos:bos_token_id eos:eos_token_id unk:unk_token_id"
).split()


def write_vocab(w: gguf.GGUFWriter, v: dict) -> None:
    for key, method in (pair.split(":") for pair in VOCAB_KEYS):
        if key in v:
            getattr(w, f"add_{method}")(v[key])


def write_reference(path, hf, arch: str, vocab: dict, qtype: Q) -> dict[str, torch.Tensor]:
    """`hf` as a GGUF file laid out as llama.cpp's converter writes one (its GPT-2 head written out as
    output.weight, as the converter does), matrices in `qtype`; returns HuggingFace's tensors holding
    the values the file stores (dequantized), for an exact comparison."""
    c, w = hf.config, gguf.GGUFWriter(path, arch)
    if arch == "llama":
        w.add_context_length(c.max_position_embeddings)
        w.add_embedding_length(c.hidden_size)
        w.add_block_count(c.num_hidden_layers)
        w.add_feed_forward_length(c.intermediate_size)
        w.add_head_count(c.num_attention_heads)
        w.add_head_count_kv(c.num_key_value_heads)
        w.add_layer_norm_rms_eps(c.rms_norm_eps)
        w.add_rope_freq_base(500000.0)
        w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    else:
        w.add_context_length(c.n_positions)
        w.add_embedding_length(c.n_embd)
        w.add_feed_forward_length(4 * c.n_embd)
        w.add_block_count(c.n_layer)
        w.add_head_count(c.n_head)
        w.add_layer_norm_eps(c.layer_norm_epsilon)
    write_vocab(w, vocab)
    table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA if arch == "llama" else gguf.MODEL_ARCH.GPT2, 99)
    stored = {}
    for name, t in hf.state_dict().items():
        data = np.ascontiguousarray(gguf_layout(name, t.numpy(), arch, heads_of(c)))
        target = table.get_name(name, try_suffixes=(".weight", ".bias"))
        if data.ndim == 2 and qtype != Q.F32 and target != "position_embd.weight":  # the converter's F32 rule
            blocks = gguf.quants.quantize(data, qtype)
            w.add_tensor(target, blocks, raw_dtype=qtype)
            data = gguf.quants.dequantize(blocks, qtype)
        else:
            w.add_tensor(target, data)
        stored[name] = torch.from_numpy(np.ascontiguousarray(gguf_layout(name, data, arch, heads_of(c), back=True)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored


def reference_model(arch: str):
    """A random transformers model (seeded, weights moved off their initial values) and its vocabulary."""
    from tests.conftest import TINY_LLAMA, random_hf_model

    if arch == "llama":
        hf = random_hf_model(
            "LlamaConfig",
            "LlamaForCausalLM",
            vocab_size=len(SPM["tokens"]),
            **TINY_LLAMA,
            hidden_size=64,
            intermediate_size=96,
            num_key_value_heads=2,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
            initializer_range=0.2,
        )
        return hf, SPM
    tok = tokenizer("bpe")
    sizes = dict(vocab_size=tok.vocab_size, n_layer=2, n_embd=64, n_head=4, n_positions=64, initializer_range=0.2)
    hf = random_hf_model("GPT2Config", "GPT2LMHeadModel", **sizes, bos_token_id=None, eos_token_id=None)
    return hf, gpt2_vocab(tok)


@pytest.fixture(scope="module")
def references():
    return {arch: reference_model(arch) for arch in ("llama", "gpt2")}


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0], ids=lambda q: q.name)
def test_file_of_a_transformers_model_converts(references, tmp_path, arch, qtype):
    """F32: the converted run's logits are transformers' within 1e-4. Q8_0, Q4_0: the run must compute
    exactly the model the file stores, so its logits are compared, within the same 1e-4, with those of
    transformers' model holding the file's dequantized weights: the quantization of the weights is then
    the only difference from the original model. That difference is printed and only loosely bounded
    (relative RMS below 0.15 for Q8_0, below 1, the logits' own size, for Q4_0): it is gguf's
    quantizer's error amplified by two random layers of weights 0.2 wide, not attnlab's doing (the
    weights' own error is bounded per block in test_written_tensors_read_back)."""
    hf, vocab = references[arch]
    stored = write_reference(tmp_path / "m.gguf", hf, arch, vocab, qtype)
    summary = convert_from_gguf(tmp_path / "m.gguf", tmp_path / "run")
    assert summary["architecture"] == ("LlamaForCausalLM" if arch == "llama" else "GPT2LMHeadModel")
    run = attnlab.load(tmp_path / "run", device="cpu")
    idx = ids(run)
    as_stored = transformers.AutoModelForCausalLM.from_config(hf.config).eval()
    as_stored.load_state_dict(stored)
    exact = (logits(run.model, idx) - logits(as_stored, idx)).abs().max().item()
    original = logits(hf, idx)
    off = ((logits(run.model, idx) - original).pow(2).mean() / original.pow(2).mean()).sqrt().item()
    print(
        f"{arch} {qtype.name}: max |logits - the file's model's| = {exact:.2g}; relative RMS change from the "
        f"unquantized model {off:.3g}"
    )
    assert exact < 1e-4
    assert off < {Q.F32: 1e-5, Q.F16: 0.01, Q.BF16: 0.05, Q.Q8_0: 0.15, Q.Q4_0: 1.0}[qtype]


def test_sentencepiece_vocabulary_reads_as_transformers_reads_it(references, tmp_path):
    """The llama vocabulary (scores, byte fallback) becomes a tokenizer.json with the ids transformers'
    own GGUF tokenizer gives (begin-of-text first, as the file's add_bos says by default)."""
    write_reference(tmp_path / "m.gguf", references["llama"][0], "llama", SPM, Q.F32)
    convert_from_gguf(tmp_path / "m.gguf", tmp_path / "run")
    ours = attnlab.load(tmp_path / "run", device="cpu").tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")
    for text in ["the cat in the hat", "def add(a, b):\n    return a + b", "Café — naïve 🙂 and the end"]:
        assert ours.encode(text) == theirs(text).input_ids, text
        assert ours.decode(ours.encode(text)[1:]) == text


# ---- 3. what attnlab writes, read by transformers


# Not qwen3_bpe: transformers' GGUF reader does not read qwen3.attention.key_length and builds heads of its
# Qwen3Config's default 128 (llama.cpp reads it: test_gguf_llamacpp.py decodes the file).
@pytest.mark.parametrize("name", ["gpt2_bpe", "llama_bpe"])
def test_exported_file_loads_in_transformers(runs, tmp_path, name):
    run = runs[name]
    export_gguf(run.path, tmp_path / "m.gguf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf").eval()
    idx = ids(run)
    diff = (logits(hf, idx) - logits(run.model, idx)).abs().max().item()
    print(f"{name}: transformers' logits from the GGUF file vs attnlab's: {diff:.2g}")
    assert diff < 1e-4
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")
    assert theirs(CORPUS, add_special_tokens=False).input_ids == run.tokenizer.encode(CORPUS)


# ---- 4. export -> convert


@pytest.mark.parametrize("name", RUNS)
def test_round_trip(runs, tmp_path, name):
    run = runs[name]
    export_gguf(run.path, tmp_path / "m.gguf")
    summary = convert_from_gguf(tmp_path / "m.gguf", tmp_path / "back")
    back = attnlab.load(tmp_path / "back", device="cpu")
    idx = ids(run)
    assert torch.equal(logits(back.model, idx), logits(run.model, idx))
    assert back.tokenizer.kind == run.tokenizer.kind and back.tokenizer.encode(CORPUS) == run.tokenizer.encode(CORPUS)
    assert summary["parameters"] == sum(p.numel() for p in run.model.parameters())
    source = json.loads((tmp_path / "back" / "config.json").read_text())["source"]
    n_tensors = len(gguf.GGUFReader(tmp_path / "m.gguf").tensors)
    assert source["gguf"] == str(tmp_path / "m.gguf") and source["types"] == {"F32": n_tensors}


def test_quantized_round_trip_stays_within_the_blocks(runs, tmp_path):
    run = runs["llama_bpe"]
    export_gguf(run.path, tmp_path / "m.gguf", "q4_0")
    types = convert_from_gguf(tmp_path / "m.gguf", tmp_path / "back")["types"]
    assert types == {"F32": 5, "Q4_0": 14, "Q8_0": 2}  # norms; block matrices; token embedding and output
    back = attnlab.load(tmp_path / "back", device="cpu")
    for (k, ours), theirs in zip(back.model.state_dict().items(), run.model.state_dict().values(), strict=True):
        blocks = theirs.reshape(-1, 32).abs().amax(dim=1, keepdim=True) if theirs.dim() > 1 else None
        err = (ours - theirs).abs()
        if blocks is None:
            assert torch.equal(ours, theirs), k
        else:  # q4_0's worst case is a full step (absmax / 8) at the block's far end; q8_0's far less
            assert (err.reshape(-1, 32) <= blocks / 8 * (1 + 2**-10) + 1e-7).all(), k


def test_a_model_without_a_run_is_written_with_placeholder_tokens(tmp_path):
    """write_gguf takes a GPT held in memory (what a benchmark builds): ids 0..255 are written as the
    bytes and the rest as [PAD] tokens; the file converts back to the same model."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**GPT2_BLOCK, context=32, vocab_size=300)).eval()
    summary = write_gguf(model, tmp_path / "m.gguf", "f32")
    assert summary["tokenizer"].startswith("placeholders")
    convert_from_gguf(tmp_path / "m.gguf", tmp_path / "back")
    back = attnlab.load(tmp_path / "back", device="cpu")
    idx = torch.randint(0, 300, (2, 16))
    assert torch.equal(logits(back.model, idx), logits(model, idx)) and back.tokenizer.vocab_size == 256


def test_a_converted_checkpoint_keeps_its_padding_rows(tmp_path):
    """A HuggingFace GPT-2 whose embedding has rows beyond its tokenizer (padding): the file lists them as
    UNUSED [PAD] tokens, as llama.cpp's converter does, and converting back drops them from the tokenizer."""
    tok = tokenizer("bpe")
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=tok.vocab_size + 7,
            n_layer=1,
            n_embd=32,
            n_head=2,
            n_positions=32,
            bos_token_id=None,
            eos_token_id=None,
        )
    )
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_text(tok.to_json())
    from attnlab.interop.convert import convert_from_hf

    convert_from_hf(tmp_path / "hf", tmp_path / "run")
    export_gguf(tmp_path / "run", tmp_path / "m.gguf")
    fields = gguf.GGUFReader(tmp_path / "m.gguf").fields
    tokens, types = fields["tokenizer.ggml.tokens"].contents(), fields["tokenizer.ggml.token_type"].contents()
    assert len(tokens) == tok.vocab_size + 7 and tokens[-1] == "[PAD6]" and types[-7:] == [gguf.TokenType.UNUSED] * 7
    convert_from_gguf(tmp_path / "m.gguf", tmp_path / "back")
    back = attnlab.load(tmp_path / "back", device="cpu")
    assert back.tokenizer.vocab_size == tok.vocab_size and back.model.cfg.vocab_size == tok.vocab_size + 7


# ---- refusals: one line each, and nothing written


def no_file(path) -> bool:
    return not path.exists() and not any(path.parent.glob(f".{path.name}.tmp-*"))


def test_an_existing_file_needs_force(runs, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"keep me")
    with pytest.raises(AttnlabError, match="exists: choose another name, or add --force"):
        export_gguf(runs["gpt2_char"].path, out)
    assert out.read_bytes() == b"keep me"
    code, _, err = run_cli(["export", runs["gpt2_char"].path, "--to", "gguf", out], capsys)
    assert code == 2 and err.count("\n") == 1 and "--force" in err and out.read_bytes() == b"keep me"
    code, _, _ = run_cli(["export", runs["gpt2_char"].path, "--to", "gguf", out, "--force"], capsys)
    assert code == 0 and gguf.GGUFReader(out).fields["general.architecture"].contents() == "gpt2"


@pytest.mark.parametrize(
    ("keys", "tok", "says"),
    [
        (dict(GPT2_BLOCK, activation="gelu"), "char", "llama.cpp's GPT-2 computes the tanh GELU: train with --act"),
        (dict(LLAMA_BLOCK, feedforward="geglu"), "char", "llama.cpp's llama gates with SiLU"),
        (dict(GPT2_BLOCK, positions="alibi"), "char", "does not fit HuggingFace's GPT-2: positions 'alibi'"),
        (dict(GPT2_BLOCK), "word", "has a word tokenizer: GGUF holds byte-level BPE and character tokenizers"),
    ],
    ids=["exact_gelu", "geglu", "alibi", "word_tokenizer"],
)
def test_runs_gguf_cannot_express_are_refused(tmp_path, keys, tok, says):
    vocab = WordTokenizer.train([CORPUS], 100) if tok == "word" else tokenizer(tok)
    run = make_run(tmp_path / "run", GPTConfig(**keys, context=32), vocab)
    with pytest.raises(AttnlabError, match=says) as e:
        export_gguf(run, tmp_path / "m.gguf", "q8_0")
    assert "\n" not in str(e.value) and no_file(tmp_path / "m.gguf")


def test_families_gguf_has_no_form_for_are_refused(tmp_path):
    from attnlab.models.encoder import Encoder, EncoderConfig

    model = Encoder(EncoderConfig(n_layer=1, n_head=2, d_model=16, context=16, vocab_size=50))
    with pytest.raises(AttnlabError, match="holds a model of the encoder family: GGUF export writes gpt runs"):
        write_gguf(model, tmp_path / "m.gguf")
    assert no_file(tmp_path / "m.gguf")


def test_other_architectures_and_weight_types_are_refused(references, tmp_path):
    w = gguf.GGUFWriter(tmp_path / "qwen.gguf", "qwen2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(AttnlabError, match="holds a 'qwen2' model: attnlab converts GGUF's gpt2, llama and qwen3"):
        convert_from_gguf(tmp_path / "qwen.gguf", tmp_path / "run")
    hf, vocab = references["gpt2"]
    write_reference(tmp_path / "q5.gguf", hf, "gpt2", vocab, Q.Q5_0)
    with pytest.raises(AttnlabError, match=r"tensor \S+ is Q5_0; attnlab reads the weight types F32, F16, BF16"):
        convert_from_gguf(tmp_path / "q5.gguf", tmp_path / "run")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(AttnlabError, match="is not a readable GGUF file"):
        convert_from_gguf(tmp_path / "junk.gguf", tmp_path / "run")
    assert not (tmp_path / "run").exists()


# ---- the command line


def test_command_line_both_ways(runs, tmp_path, capsys):
    run = runs["llama_bpe"]
    code, out, err = run_cli(["export", run.path, "--to", "gguf", tmp_path / "m.gguf", "--type", "q8_0"], capsys)
    assert code == 0 and json.loads(out)["tensors"] == {"F32": 5, "Q8_0": 16}
    code, out, _ = run_cli(["convert", tmp_path / "m.gguf", "--out", tmp_path / "back"], capsys)
    assert code == 0 and "gpt run from LlamaForCausalLM (GGUF tensors 16 Q8_0, 5 F32; 100,160 parameters)" in out
    code, out, _ = run_cli(
        ["sample", tmp_path / "back", "--prompt", "def", "--max-new-tokens", "5", "--device", "cpu"], capsys
    )
    assert code == 0 and out.startswith("def")
    code, _, _ = run_cli(["attention", tmp_path / "back", "def add", "--out", tmp_path / "a.json"], capsys)
    assert code == 0 and (tmp_path / "a.json").is_file()
    export_hf(run.path, tmp_path / "hf")  # --from-hf still reads a HuggingFace folder, and so does SOURCE
    assert run_cli(["convert", "--from-hf", tmp_path / "hf", "--out", tmp_path / "h1"], capsys)[0] == 0
    assert run_cli(["convert", tmp_path / "hf", "--out", tmp_path / "h2"], capsys)[0] == 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["convert", "--out", "r"], "convert takes one source"),
        (["convert", "a.gguf", "--from-hf", "d", "--out", "r"], "convert takes one source"),
        (["export", "RUN", "--to", "hf", "OUT", "--type", "q8_0"], "--type is a GGUF weight type"),
    ],
)
def test_command_line_refusals_are_one_line(tmp_path, capsys, args, says):
    code, _, err = run_cli(args, capsys)
    assert code == 2 and err.count("\n") == 1 and says in err


def test_help_names_both_sources(capsys):
    code, text, _ = run_cli(["convert", "--help"], capsys)
    assert code == 0 and "SOURCE" in text and "--from-hf DIR" in text and ".gguf" in text
