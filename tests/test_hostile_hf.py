"""Hostile HuggingFace and PEFT folders given to `attnlab convert DIR` or `--init DIR` (issue 55).

Every case asserts, through tests/hostile.py: one AttnlabError line (through the CLI: exit code 2 and one
`attnlab: error:` line), no traceback, at most SECONDS seconds and MIB MiB of peak memory growth, the
folder unchanged and no run written. The folders are tiny models of each family read here (GPT-2, a
Llama, a Mixtral, BERT, ViT) written by attnlab's own exporters, and a PEFT adapter on the GPT-2 one,
copied and edited per case. Hypothesis sets random keys of the real config.json to random JSON values:
each such folder converts or is refused in one line, within the same bounds.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from attnlab.data.tokenizers import CharTokenizer
from attnlab.errors import AttnlabError
from attnlab.interop.convert import convert_from_hf, convert_hf_parts
from attnlab.interop.hf import bert, gpt2, llama, vit
from attnlab.interop.hf.bounds import MAX_CONTEXT, check_count
from attnlab.interop.hf.io import read_hf_dir, write_hf_dir
from attnlab.interop.hf.tokenizer import char_json
from attnlab.interop.peft import CONFIG as PEFT_CONFIG
from attnlab.interop.peft import WEIGHTS as PEFT_WEIGHTS
from attnlab.interop.peft import read_peft, write_peft
from attnlab.models import build_model
from attnlab.models.encoder import EncoderConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.vit import ViTConfig
from attnlab.nn.lora import LoRAConfig, add_lora, lora_state_dict
from tests.hostile import bounded, cli_refuses, one_line, refused

pytestmark = pytest.mark.usefixtures("one_thread")

SECONDS, MIB = 10.0, 300  # per case; refusals take milliseconds, a conversion about 0.2 s
CHARS = "abcdefghijklmnopqrstuvwxyz .,!?\n"
V = len(CHARS) + 2  # the character tokenizer's <unk> and <|endoftext|> first
TINY = dict(n_layer=2, n_head=2, d_model=16)
LLAMA = dict(
    TINY, context=32, vocab_size=V, positions="rope", norm_kind="rmsnorm", bias=False, tie_weights=False, n_kv_head=1
)
MODELS: dict[str, tuple[Any, str, Any, list[str] | None]] = {  # name -> (module, family, config, labels)
    "gpt2": (gpt2, "gpt", GPTConfig(**TINY, context=32, vocab_size=V, activation="gelu_tanh"), None),
    "llama": (llama, "gpt", GPTConfig(**LLAMA, feedforward="swiglu"), None),
    "mixtral": (llama, "gpt", GPTConfig(**LLAMA, feedforward="moe", n_experts=4, expert_ff="swiglu", d_ff=24), None),
    "bert": (bert, "encoder", EncoderConfig(**TINY, context=32, vocab_size=V, head="mlm", norm="post"), None),
    "vit": (vit, "vit", ViTConfig(**TINY, image_size=8, patch_size=4, n_labels=3), ["cat", "dog", "fox"]),
}


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> Path:
    """A HuggingFace folder per model, and a PEFT adapter (rank 2 on q, v, out, up, down) on the GPT-2."""
    root = tmp_path_factory.mktemp("bases")
    torch.manual_seed(0)
    for name, (module, family, cfg, labels) in MODELS.items():
        state = build_model(family, cfg).state_dict()
        tokenizer = char_json(CharTokenizer(CHARS), root) if family != "vit" else None
        write_hf_dir(root / name, module.config_to_hf(cfg, labels), module.weights_to_hf(state, cfg), tokenizer)
    model, lora = build_model("gpt", MODELS["gpt2"][2]), LoRAConfig(rank=2, targets=("q", "v", "out", "up", "down"))
    add_lora(model, lora)
    write_peft(root / "peft", lora_state_dict(model), MODELS["gpt2"][2], lora, str(root / "gpt2"))
    return root


def copy(bases: Path, tmp_path: Path, name: str) -> Path:
    shutil.copytree(bases / name, tmp_path / name, symlinks=True)
    return tmp_path / name


DROP = object()  # a key to take out of config.json


def config(file: str = "config.json", **changes: Any) -> Callable[[Path], None]:
    """Set (or, with DROP, remove) keys of a JSON file of the folder."""

    def edit(d: Path) -> None:
        data = json.loads((d / file).read_text())
        data = {k: v for k, v in {**data, **changes}.items() if v is not DROP}
        (d / file).write_text(json.dumps(data))

    return edit


def raw(file: str, data: bytes | str) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        (d / file).write_bytes(data.encode() if isinstance(data, str) else data)

    return edit


def header(change: Callable[[dict], Any]) -> Callable[[Path], None]:
    """model.safetensors with its JSON header changed (the bytes after it as they were)."""

    def edit(d: Path) -> None:
        data = (d / "model.safetensors").read_bytes()
        n = struct.unpack("<Q", data[:8])[0]
        head = json.loads(data[8 : 8 + n])
        change(head)
        new = json.dumps(head).encode()
        (d / "model.safetensors").write_bytes(struct.pack("<Q", len(new)) + new + data[8 + n :])

    return edit


def _lie_about(head: dict) -> None:
    name = next(k for k in head if k != "__metadata__")
    head[name]["shape"] = [10**6, 10**6]


def _offsets_past_the_end(head: dict) -> None:
    name = next(k for k in head if k != "__metadata__")
    head[name]["data_offsets"] = [0, 10**12]


def _huge_header(d: Path) -> None:
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", 2**60) + data[8:])


def _truncated(d: Path) -> None:
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) - 100])


def _sharded(weight_map: Callable[[list[str]], dict[str, str]]) -> Callable[[Path], None]:
    """The weights as one shard, model-00001-of-00001.safetensors, and an index whose weight_map is given."""

    def edit(d: Path) -> None:
        names = list(load_file(d / "model.safetensors"))
        (d / "model.safetensors").rename(d / "model-00001-of-00001.safetensors")
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map(names)}))

    return edit


def _linked(name: str) -> Callable[[Path], None]:
    """The folder's own `name` moved outside it (a sibling), and a link to it left in its place."""

    def edit(d: Path) -> None:
        outside = d.parent / f"elsewhere-{name}"
        (d / name).rename(outside)
        (d / name).symlink_to(outside)

    return edit


def _shard_linked_outside(d: Path) -> None:
    _sharded(lambda names: dict.fromkeys(names, "model-00001-of-00001.safetensors"))(d)
    _linked("model-00001-of-00001.safetensors")(d)


def _two_shards_one_tensor(d: Path) -> None:
    _sharded(lambda names: {**dict.fromkeys(names, "model-00001-of-00001.safetensors"), "x": "b.safetensors"})(d)
    shutil.copy(d / "model-00001-of-00001.safetensors", d / "b.safetensors")


def _without(tensor: str) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        tensors = load_file(d / "model.safetensors")
        del tensors[tensor]
        save_file(tensors, d / "model.safetensors")

    return edit


def _fifo(name: str) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        (d / name).unlink()
        os.mkfifo(d / name)  # a read would wait forever

    return edit


class Payload:
    """What a malicious pickle carries: unpickling it calls a function of the author's choosing."""

    def __reduce__(self):
        return (print, ("unpickled!",))


def _pickled(*names: str) -> Callable[[Path], None]:
    """The safetensors weights replaced by pickles (a real one: its tensors and a Payload)."""

    def edit(d: Path) -> None:
        state = {**load_file(d / "model.safetensors"), "x": Payload()}
        (d / "model.safetensors").unlink()
        for name in names:
            (d / name).write_bytes(pickle.dumps(state))

    return edit


def _big(name: str, size: int) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        with open(d / name, "wb") as f:
            f.truncate(size)  # sparse: nothing to write, a size to refuse (just over the limit: the test hashes it)

    return edit


def _tokenizer_id(n: int) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        data = json.loads((d / "tokenizer.json").read_text())
        data["model"]["vocab"]["a"] = n
        (d / "tokenizer.json").write_text(json.dumps(data))

    return edit


def _literal(key: str, text: str) -> Callable[[Path], None]:
    """config.json with `key` written as the literal `text` (a number no json.dumps writes)."""

    def edit(d: Path) -> None:
        data = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**data, key: "@"}).replace('"@"', text))

    return edit


def _bom(name: str) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        (d / name).write_bytes(b"\xef\xbb\xbf" + (d / name).read_bytes())

    return edit


NESTED = "[" * 100_000 + "]" * 100_000  # Python's json raises RecursionError on it
G, L = "gpt2", "llama"
# name -> (the base folder, what is done to it, what the one line says)
CASES: dict[str, tuple[str, Callable[[Path], None], str]] = {
    # sizes against the tensors: absurd, zero, negative and of the wrong kind
    "n_layer 10^6": (G, config(n_layer=10**6), r"n_layer 1,000,000, but the weights hold 2 \(layers transformer.h.N\)"),
    "n_embd 10^9": (G, config(n_embd=10**9), r"n_embd 1,000,000,000, but the weights hold 16"),
    "vocab 10^9": (G, config(vocab_size=10**9), r"vocab_size 1,000,000,000, but the weights hold 34 \(rows of"),
    "n_positions 10^12": (G, config(n_positions=10**12), r"n_positions 1,000,000,000,000, but the weights hold 32"),
    "n_inner 10^9": (G, config(n_inner=10**9), r"n_inner 1,000,000,000, but the weights hold 64"),
    "n_head 10^6": (G, config(n_head=10**6), r"d_model 16 is not divisible by n_head 1000000"),
    "n_layer 0": (G, config(n_layer=0), r"n_layer must be a whole number of at least 1, got 0 \(int\)"),
    "n_layer -1": (G, config(n_layer=-1), r"n_layer must be a whole number of at least 1, got -1"),
    "n_layer 2.0": (G, config(n_layer=2.0), r"n_layer must be a whole number of at least 1, got 2.0 \(float\)"),
    "n_layer '2'": (G, config(n_layer="2"), r"n_layer must be .*, got '2' \(str\)"),
    "n_layer null": (G, config(n_layer=None), r"n_layer must be .*, got None"),
    "n_layer true": (G, config(n_layer=True), r"n_layer must be .*, got True \(bool\)"),
    "n_layer missing": (G, config(n_layer=DROP), r"n_layer 12, but the weights hold 2"),  # GPT-2's default
    "llama context 10^12": (L, config(max_position_embeddings=10**12), rf"more than the {MAX_CONTEXT:,} positions"),
    "llama heads x head_dim": (L, config(head_dim=10**6), r"num_attention_heads x head_dim 2,000,000, but the"),
    "llama kv heads 10^6": (L, config(num_key_value_heads=10**6), r"n_kv_head must divide n_head 2"),
    "llama layers 10^6": (L, config(num_hidden_layers=10**6), r"num_hidden_layers 1,000,000, but the weights hold 2"),
    "llama intermediate 10^9": (L, config(intermediate_size=10**9), r"intermediate_size 1,000,000,000, but"),
    "llama head missing": (L, _without("lm_head.weight"), r"implies 2 layers and 7,312 parameters; the weights hold"),
    "experts 10^6": ("mixtral", config(num_local_experts=10**6), r"num_local_experts 1,000,000, but the weights"),
    "experts per token 10^6": ("mixtral", config(num_experts_per_tok=10**6), r"experts_per_token must be 1..n_experts"),
    "bert positions 10^12": ("bert", config(max_position_embeddings=10**12), r"max_position_embeddings 1,000,000,"),
    "bert token types 10^9": ("bert", config(type_vocab_size=10**9), r"type_vocab_size 1,000,000,000, but the"),
    "vit image 10^6": ("vit", config(image_size=10**6), r"positions \(1 \+ patches of image_size / patch_size\)"),
    "vit patch 0": ("vit", config(patch_size=0), r"patch_size must be a whole number of at least 1, or \[height"),
    "vit labels 10^9": ("vit", config(id2label=DROP, label2id=DROP, num_labels=10**9), r"num_labels must be a whole"),
    "vit id2label gaps": ("vit", config(id2label={"0": "a", "7": "b", "9": "c"}), r"number the labels 0 to n-1"),
    "vit id2label keys": ("vit", config(id2label={"x": "a"}), r"id2label must map label numbers to names"),
    "vit std 0": ("vit", raw("preprocessor_config.json", '{"image_std": 0}'), r"image_std must be above 0"),
    "vit mean text": ("vit", raw("preprocessor_config.json", '{"image_mean": "x"}'), r"image_mean must be a number"),
    # values in range; sections attnlab does not compute, by name
    "eps 0": (G, config(layer_norm_epsilon=0), r"layer_norm_epsilon must be a finite number above 0, got 0"),
    "eps negative": (L, config(rms_norm_eps=-1e-5), r"rms_norm_eps must be a finite number above 0, got -1e-05"),
    "eps NaN": (G, config(layer_norm_epsilon=float("nan")), r"layer_norm_epsilon must be a finite number above 0"),
    "eps text": (G, config(layer_norm_epsilon="1e-5"), r"layer_norm_epsilon must be .*, got '1e-5' \(str\)"),
    "rope_scaling": (L, config(rope_scaling={"rope_type": "linear", "factor": 4.0}), r"sets rope_scaling .*default"),
    "rope_scaling on gpt2": (G, config(rope_scaling={"type": "dynamic", "factor": 2}), r"sets rope_scaling"),
    "rope_scaling a list": (L, config(rope_scaling=[1, 2]), r"rope_scaling must be an object \(or null\)"),
    "rope_theta 0": (L, config(rope_parameters={"rope_type": "default", "rope_theta": 0}), r"rope_theta must be"),
    "quantized": (L, config(quantization_config={"quant_method": "gptq"}), r"sets quantization_config"),
    "partial rotary": (L, config(partial_rotary_factor=0.5), r"sets partial_rotary_factor"),
    "sliding window text": (L, config(sliding_window="x"), r"sliding_window must be a whole number"),
    "dropout 2": (G, config(resid_pdrop=2), r"resid_pdrop must be a number in \[0, 1\)"),
    "activation a list": (G, config(activation_function=["gelu"]), r"activation_function must be a string"),
    "no architectures": (G, config(architectures=DROP), r"names no architecture"),
    "architectures [1]": (G, config(architectures=[1]), r"names no architecture"),
    # config.json itself
    "config invalid UTF-8": (G, raw("config.json", b'{"n_layer": "\xff\xfe"}'), r"config.json is not UTF-8 text"),
    "config a list": (G, raw("config.json", "[1, 2]"), r"config.json is corrupt: expected a JSON object"),
    "config nested 10^5": (G, raw("config.json", NESTED), r"config.json is not valid JSON"),
    "config 5000 digits": (G, _literal("n_layer", "9" * 5000), r"config.json is not valid JSON \(Exceeds the limit"),
    "config 1e999": (G, _literal("n_layer", "1e999"), r"n_layer must be .*, got inf"),
    "config 16 MiB": (G, _big("config.json", 2**24 + 1), r"config.json is 16,777,217 bytes, more than any"),
    "config a fifo": (G, _fifo("config.json"), r"config.json is not a regular file \(a device, pipe or folder\)"),
    "config linked outside": (G, _linked("config.json"), r"config.json is a link to .*outside the model folder"),
    # tokenizer.json
    "tokenizer absent": (G, lambda d: (d / "tokenizer.json").unlink(), r"tokenizer.json is missing"),
    "tokenizer empty": (G, raw("tokenizer.json", ""), r"cannot read .*tokenizer.json"),
    "tokenizer invalid JSON": (G, raw("tokenizer.json", "{'model':"), r"cannot read .*tokenizer.json"),
    "tokenizer invalid UTF-8": (G, raw("tokenizer.json", b"\xc3\x28"), r"tokenizer.json is not UTF-8 text"),
    "tokenizer nested 10^5": (G, raw("tokenizer.json", NESTED), r"cannot read .*tokenizer.json"),
    "tokenizer id 10^6": (G, _tokenizer_id(10**6), r"tokenizer.json gives ids up to 1000000, beyond the model's"),
    "tokenizer id 10^12": (G, _tokenizer_id(10**12), r"cannot read .*tokenizer.json: invalid value: integer"),
    "tokenizer 64 MiB": (G, _big("tokenizer.json", 2**26 + 1), r"tokenizer.json is 67,108,865 bytes"),
    # the weights: headers that lie, links and shards that leave the folder, pickles
    "header lies about a shape": (G, header(_lie_about), r"model.safetensors is corrupt or truncated"),
    "header offsets past the end": (G, header(_offsets_past_the_end), r"model.safetensors is corrupt or truncated"),
    "header length 2^60": (G, _huge_header, r"model.safetensors is corrupt or truncated \(.*header too large"),
    "weights truncated": (G, _truncated, r"model.safetensors is corrupt or truncated"),
    "weights linked outside": (G, _linked("model.safetensors"), r"model.safetensors is a link to .*outside the"),
    "weights a fifo": (G, _fifo("model.safetensors"), r"model.safetensors is not a regular file"),
    "shard ../": (G, _sharded(lambda names: dict.fromkeys(names, "../x.safetensors")), r"names a file outside"),
    "shard /etc/passwd": (G, _sharded(lambda names: dict.fromkeys(names, "/etc/passwd")), r"names a file outside"),
    "shard linked outside": (G, _shard_linked_outside, r"model-00001-of-00001.safetensors is a link to .*outside"),
    "shard a pickle": (G, _sharded(lambda names: dict.fromkeys(names, "x.bin")), r"safetensors shards only"),
    "shard missing": (G, _sharded(lambda names: dict.fromkeys(names, "y.safetensors")), r"which .* does not hold"),
    "shard map a list": (G, _sharded(lambda names: names), r"index.json is corrupt: it has no weight_map"),
    "two shards, one tensor": (G, _two_shards_one_tensor, r"tensor .* is in two weight files"),
    "pytorch_model.bin": (G, _pickled("pytorch_model.bin"), r"\(pytorch_model.bin\): attnlab never loads a pickle"),
    "bin shards": (G, _pickled("pytorch_model.bin.index.json", "pytorch_model-00001-of-00001.bin"), r"never loads"),
    "model.pt, .ckpt": (G, _pickled("model.pt", "model.ckpt"), r"pickles \(model.ckpt, model.pt\): attnlab never"),
}


def _no_unpickling(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a pickle was opened")

    for module, name in ((torch, "load"), (pickle, "load"), (pickle, "loads")):
        monkeypatch.setattr(module, name, refuse)


@pytest.mark.parametrize("case", CASES)
def test_hostile_folders_are_refused_in_one_line(bases, tmp_path, case, monkeypatch, capsys):
    base, change, match = CASES[case]
    d = copy(bases, tmp_path, base)
    change(d)
    _no_unpickling(monkeypatch)
    refused(lambda: convert_from_hf(d, tmp_path / "run"), match, SECONDS, MIB, keep=(tmp_path,))
    assert not (tmp_path / "run").exists() and "unpickled!" not in capsys.readouterr().out


WELCOME = {  # what converts, as transformers reads it too
    "extra keys": (G, config(anything_else={"a": [1, 2]}, torch_dtype="float32")),
    "a BOM in config.json": (G, _bom("config.json")),
    "a BOM in tokenizer.json": (G, _bom("tokenizer.json")),
    "default rope sections": (L, config(rope_scaling={"rope_type": "default"}, rope_parameters=None)),
    "shards": (G, _sharded(lambda names: dict.fromkeys(names, "model-00001-of-00001.safetensors"))),
    "a pickle beside safetensors": (G, raw("pytorch_model.bin", b"never opened")),
}


@pytest.mark.parametrize("case", WELCOME)
def test_what_is_not_hostile_converts(bases, tmp_path, case, monkeypatch):
    base, change = WELCOME[case]
    d = copy(bases, tmp_path, base)
    change(d)
    _no_unpickling(monkeypatch)
    with bounded(SECONDS, MIB):
        assert convert_from_hf(d, tmp_path / "run")["run"] == str(tmp_path / "run")


def test_the_parameter_count_of_a_million_layers_costs_what_two_do():
    """bounds.check_count extrapolates from models of 1 and 2 blocks: it never builds the million. (Warmed
    first: a process's first model on the meta device imports torch._dynamo, seconds that every
    conversion pays once anyway.)"""
    check_count(GPT, MODELS["gpt2"][2], {"w": (10**6,)}, None, Path("x"))
    cfg = replace(MODELS["gpt2"][2], n_layer=10**6)
    # a block of width 16: 3,280 parameters (norms 64, q|k|v 816, out 272, MLP 2,128); embeddings and norm 1,088
    implied = r"implies 1,000,000 layers and 3,280,001,088 parameters; the weights hold 10,000 values"
    refused(lambda: check_count(GPT, cfg, {"w": (100, 100)}, None, Path("x")), implied, 1.0)


def test_a_huggingface_cache_snapshot_is_read_through_its_links(bases, tmp_path):
    """The Hub's cache keeps a snapshot's files as links to ../../blobs/HASH: followed there, and nowhere else."""
    repo = tmp_path / "models--someone--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    for f in (bases / "gpt2").iterdir():
        shutil.copy(f, repo / "blobs" / f"hash-{f.name}")
        (snapshot / f.name).symlink_to(Path("../../blobs") / f"hash-{f.name}")
    assert convert_from_hf(snapshot, tmp_path / "run")["family"] == "gpt"
    (snapshot / "tokenizer.json").unlink()
    (snapshot / "tokenizer.json").symlink_to(tmp_path / "run" / "tokenizer.json")  # not a blob
    refused(lambda: convert_from_hf(snapshot, tmp_path / "run2"), r"tokenizer.json is a link to .*outside")


def test_through_the_command_line(bases, tmp_path, capsys, monkeypatch):
    """`attnlab convert DIR --out RUN`: a config of a million layers, and a folder of pickles only."""
    d = copy(bases, tmp_path, G)
    config(n_layer=10**6)(d)
    convert = lambda d: ["convert", d, "--out", tmp_path / "run"]  # noqa: E731
    line = cli_refuses(convert(d), capsys, r"n_layer 1,000,000, but the weights", SECONDS, MIB, keep=(d,))
    assert line.startswith("attnlab: error: ") and not (tmp_path / "run").exists()
    d = copy(bases, tmp_path / "p", G)
    _pickled("pytorch_model.bin")(d)
    _no_unpickling(monkeypatch)
    cli_refuses(convert(d), capsys, r"never loads a pickle.*safe_serialization=True", SECONDS, MIB, keep=(d,))


# JSON values a random config.json key may take: sizes near and far, every kind, nested a little.
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.sampled_from([0, 1, 2, 16, 32, -1, 10**6, 10**12, 2**63, 0.5, 1e-5])
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
OTHER_KEYS = [
    "rope_scaling",
    "rope_parameters",
    "n_ctx",
    "head_dim",
    "quantization_config",
    "sliding_window",
    "num_local_experts",
    "id2label",
    "tie_word_embeddings",
    "architectures",
    "model_type",
]


@pytest.fixture(scope="module")
def parts(bases) -> dict[str, tuple]:
    """Each model's folder, read once: (config.json, tensors, tokenizer.json or None)."""
    return {name: read_hf_dir(bases / name) for name in MODELS}


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data())
def test_random_configs_convert_or_are_refused_in_one_line(parts, tmp_path_factory, data):
    name = data.draw(st.sampled_from(sorted(parts)))
    hf, tensors, tokenizer = parts[name]
    keys = data.draw(st.lists(st.sampled_from(sorted(hf) + OTHER_KEYS), min_size=1, max_size=3, unique=True))
    changed = {**hf, **{k: data.draw(JSON, label=k) for k in keys}}
    out = tmp_path_factory.mktemp("run") / "run"
    with bounded(SECONDS, MIB):
        try:
            convert_hf_parts(changed, tensors, tokenizer, Path(name), out, {"hf": name})
        except AttnlabError as e:
            one_line(str(e))
            assert not out.exists()


def peft_case(**changes: Any) -> Callable[[Path], None]:
    return config(PEFT_CONFIG, **changes)


def _adapter_shapes(d: Path) -> None:
    tensors = load_file(d / PEFT_WEIGHTS)
    name = next(k for k in tensors if k.endswith("c_fc.lora_A.weight"))
    tensors[name] = torch.zeros(2, 17)  # the base's width is 16
    save_file(tensors, d / PEFT_WEIGHTS)


def _adapter_bin(d: Path) -> None:
    (d / "adapter_model.bin").write_bytes(pickle.dumps({"x": Payload()}))
    (d / PEFT_WEIGHTS).unlink()


PEFT_CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "r 0": (peft_case(r=0), r"r must be a whole number of at least 1, got 0"),
    "r -1": (peft_case(r=-1), r"r must be a whole number of at least 1, got -1"),
    "r 10^9": (peft_case(r=10**9), r"lora_A has shape \[2, 16\]; rank 1000000000 .* needs \[1000000000, 16\]"),
    "r 1.5": (peft_case(r=1.5), r"r must be a whole number of at least 1, got 1.5"),
    "r '8'": (peft_case(r="8"), r"r must be a whole number of at least 1, got '8'"),
    "alpha NaN": (peft_case(lora_alpha=float("nan")), r"lora_alpha must be a finite number above 0, got nan"),
    "alpha text": (peft_case(lora_alpha="big"), r"lora_alpha must be a finite number above 0, got 'big'"),
    "dropout 2": (peft_case(lora_dropout=2), r"lora_dropout must be a number in \[0, 1\) \(or null\), got 2"),
    "dropout -1": (peft_case(lora_dropout=-1), r"lora_dropout must be a number in \[0, 1\)"),
    "alpha_pattern [1]": (peft_case(alpha_pattern=[1]), r"alpha_pattern must be an object of module names"),
    "alpha_pattern a regex": (peft_case(alpha_pattern={"(a+)+$": 2}), r"alpha_pattern must be an object of module"),
    "alpha_pattern text": (peft_case(alpha_pattern={"c_fc": "x"}), r"alpha_pattern must be .*finite number above 0"),
    "rank_pattern 0": (peft_case(rank_pattern={"c_attn": 0}), r"rank_pattern must be .*whole number of at least 1"),
    "rank_pattern wrong": (peft_case(rank_pattern={"c_attn": 3}), r"c_attn.lora_A has shape \[4, 16\]; rank 3"),
    "targets unknown": (peft_case(target_modules=["c_attn", "nope"]), r"target_modules names 'nope', but"),
    "targets short": (peft_case(target_modules=["c_attn"]), r"adapts attn.c_proj, which .* does not name"),
    "targets a number": (peft_case(target_modules=5), r"target_modules must be a list of module names"),
    "some layers": (peft_case(layers_to_transform=[0]), r"layers_to_transform is \[0\]"),
    "not LoRA": (peft_case(peft_type="IA3"), r"peft_type 'IA3'"),
    "config a list": (raw(PEFT_CONFIG, "[]"), r"peft_type None"),
    "config nested 10^5": (raw(PEFT_CONFIG, NESTED), r"adapter_config.json is not valid JSON"),
    "shapes": (_adapter_shapes, r"c_fc.lora_A has shape \[2, 17\]; rank 2 .* needs \[2, 16\]"),
    "adapter_model.bin": (_adapter_bin, r"pickles \(adapter_model.bin\): attnlab never loads a pickle.*PeftModel"),
}


@pytest.mark.parametrize("case", PEFT_CASES)
def test_hostile_peft_folders_are_refused_in_one_line(bases, tmp_path, case, monkeypatch, capsys):
    change, match = PEFT_CASES[case]
    d = copy(bases, tmp_path, "peft")
    change(d)
    _no_unpickling(monkeypatch)
    refused(lambda: read_peft(d, MODELS["gpt2"][2]), match, SECONDS, MIB, keep=(d,))
    assert "unpickled!" not in capsys.readouterr().out


def test_peft_through_the_command_line(bases, tmp_path, capsys, monkeypatch):
    """`attnlab train sft --init ADAPTER`: rank 0, and an adapter_model.bin, refused before any training."""
    (tmp_path / "chat.jsonl").write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    cases = (
        ("r0", peft_case(r=0), r"r must be a whole number of at least 1, got 0"),
        ("bin", _adapter_bin, r"adapter_model.bin\): attnlab never loads a pickle"),
    )
    for name, change, match in cases:
        d = copy(bases, tmp_path / name, "peft")
        change(d)
        _no_unpickling(monkeypatch)
        argv = [
            "train",
            "sft",
            "--init",
            d,
            "--data",
            tmp_path / "chat.jsonl",
            "--out",
            tmp_path / name / "run",
            "--max-steps",
            "1",
            "--device",
            "cpu",
        ]
        cli_refuses(argv, capsys, match, SECONDS, MIB, keep=(d, bases / "gpt2"))
        assert not (tmp_path / name / "run").exists()


def test_the_peft_adapter_reads(bases):
    lora, tensors = read_peft(bases / "peft", MODELS["gpt2"][2])
    assert lora.rank == 4 and lora.targets == ("q", "k", "v", "out", "up", "down") and len(tensors) == 2 * 2 * 6
