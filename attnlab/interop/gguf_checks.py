"""A GGUF file's settings and vocabulary checked against what the file holds, before anything is built.

gguf_layout.settings_from_gguf reads each setting in range; here
  keys        the {arch}.* keys attnlab does not read are refused by name unless they change nothing
              (rotary scaling, a sliding window: the run would compute another model than the file's)
  sizes       every size against the tensors present: a block count of 10^9 or an expert count of 10^6
              is refused in one line, before `expected` names that many blocks' tensors
  vocabulary  the tokenizer.ggml.* keys gguf_vocab reads: their types, lengths and ids
"""

from __future__ import annotations

import re
from typing import Any

import gguf

from attnlab.errors import AttnlabError, kind
from attnlab.interop.gguf_layout import Layout

T, K = gguf.TokenType, gguf.Keys.Tokenizer

# {arch}.* settings attnlab reads no value from but may pass, with the values that change nothing it
# computes (None: any value). vocab_size is checked against the embedding (check_sizes).
HARMLESS = {
    "vocab_size": None,
    "tensor_data_layout": None,
    "rope.scaling.original_context_length": None,
    "rope.scaling.finetuned": None,
    "rope.scaling.type": ("none",),
    "rope.scaling.factor": (0.0, 1.0),
    "rope.scaling.attn_factor": (1.0,),
    "rope.scale_linear": (0.0, 1.0),
}


def check_keys(meta: dict[str, Any], layout: Layout, where: str) -> None:
    """Every {arch}.* key is one attnlab reads or one HARMLESS says changes nothing: a setting it
    would drop (rotary scaling, a sliding window, logit soft-capping, ...) is refused by name,
    since the run would compute another model than the file's."""
    read, prefix = {key.gguf for key in layout.keys}, f"{layout.arch}."
    for full, value in meta.items():
        name = full.removeprefix(prefix)
        if name == full or name in read:
            continue
        if _harmless(name, value):
            continue
        if name.startswith("rope.scal"):
            raise AttnlabError(
                f"{where} scales its rotary angles ({full} is {kind(value)}): attnlab computes the default angles only"
            )
        raise AttnlabError(
            f"{where} sets {full} ({kind(value)}), which attnlab's {layout.arch} does not read: "
            "the run would compute another model than the file's"
        )


def _harmless(name: str, value: Any) -> bool:
    allowed = HARMLESS.get(name, ())
    return allowed is None or (
        isinstance(value, str | int | float) and not isinstance(value, bool) and value in allowed
    )


BLOCK = re.compile(r"blk\.(\d+)\.")
OWN_CHECK = ("block_count", "context_length")  # sizes that are no dimension: checked above, or by convert_hf_parts
ROUTER = "blk.0.ffn_gate_inp.weight"  # (E, C): a Mixtral's router in its first block


def check_sizes(
    meta: dict[str, Any], hf: dict[str, Any], shapes: dict[str, tuple[int, ...]], layout: Layout, where: str
) -> None:
    """The settings' sizes against the tensors the file holds (numpy shapes by GGUF name), before any
    layer is built or named from them: the block count against the blk.N tensors, the width and
    vocabulary against token_embd's, the experts against the router's, GPT-2's context against its
    positions, and every other size against the largest dimension present."""
    arch, hf_key = layout.arch, {key.gguf: key.hf for key in layout.keys}
    _check_blocks(hf[hf_key["block_count"]], shapes, arch, where)
    if len(shapes["token_embd.weight"]) != 2:
        raise AttnlabError(
            f"{where}: token_embd.weight has the shape {shapes['token_embd.weight']}; a token embedding is a matrix"
        )
    rows, width = shapes["token_embd.weight"]
    embedding = "its token embedding (token_embd.weight)"
    _same(f"{arch}.embedding_length", hf[hf_key["embedding_length"]], width, f"{embedding} is {{}} wide", where)
    _same(f"{arch}.vocab_size", meta.get(f"{arch}.vocab_size", rows), rows, f"{embedding} has {{}} rows", where)
    if "position_embd.weight" in shapes:  # GPT-2's learned positions serve exactly its context
        served = shapes["position_embd.weight"][0]
        what = "its position embedding (position_embd.weight) serves {} positions"
        _same(f"{arch}.context_length", hf[hf_key["context_length"]], served, what, where)
    _check_experts(hf, shapes, arch, where)
    heads, kv = hf[hf_key["attention.head_count"]], hf.get(hf_key.get("attention.head_count_kv", ""))
    _check_heads(heads, kv, width, "head_dim" in hf, arch, where)
    largest = max(max(shape) for shape in shapes.values())
    for key in layout.keys:
        value = hf.get(key.hf)
        if key.kind is int and key.gguf not in OWN_CHECK and value is not None and value > largest:
            raise AttnlabError(
                f"{where} sets {arch}.{key.gguf} {value:,}, larger than any dimension of its "
                f"tensors (the largest is {largest:,})"
            )


def _check_blocks(n: int, shapes: dict[str, tuple[int, ...]], arch: str, where: str) -> None:
    blocks = {int(m[1]) for name in shapes if (m := BLOCK.match(name))}
    if n != len(blocks) or n - 1 != max(blocks, default=-1):
        held = f"blk.{min(blocks)} to blk.{max(blocks)}" if blocks else "none"
        raise AttnlabError(
            f"{where} sets {arch}.block_count {n:,}, but holds tensors of {len(blocks):,} blocks ({held})"
        )


def _same(full: str, value: Any, held: int, what: str, where: str) -> None:
    """The setting `full` is `held`, which `what` ("its ... is {} wide") says the file holds."""
    if value != held:
        shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else kind(value)
        raise AttnlabError(f"{where} sets {full} {shown}, but {what.format(f'{held:,}')}")


def _check_experts(hf: dict[str, Any], shapes: dict[str, tuple[int, ...]], arch: str, where: str) -> None:
    experts, used = hf.get("num_local_experts"), hf.get("num_experts_per_tok")
    router = shapes.get(ROUTER)
    if experts is None and router is not None:
        raise AttnlabError(f"{where} holds a router ({ROUTER}) but sets no {arch}.expert_count")
    if experts is not None and router is None:
        raise AttnlabError(f"{where} sets {arch}.expert_count {experts:,} but holds no router ({ROUTER})")
    if experts is not None and used is None:
        raise AttnlabError(
            f"{where} sets {arch}.expert_count {experts:,} but not {arch}.expert_used_count (how "
            "many experts each token uses)"
        )
    if experts is not None:
        _same(f"{arch}.expert_count", experts, router[0], f"its router ({ROUTER}) chooses among {{}} experts", where)
        if used > experts:
            raise AttnlabError(f"{where} sets {arch}.expert_used_count {used:,}, more than its {experts:,} experts")


def _check_heads(heads: int, kv: int | None, width: int, own_width: bool, arch: str, where: str) -> None:
    """Query heads share the width unless the file gives their own (attention.key_length); key/value
    heads serve whole groups of query heads."""
    if not own_width and width % heads:
        raise AttnlabError(
            f"{where} sets {arch}.attention.head_count {heads:,}, which does not divide its width "
            f"{width:,} (and no attention.key_length)"
        )
    if kv is not None and heads % kv:
        raise AttnlabError(
            f"{where} sets {arch}.attention.head_count_kv {kv:,}, which does not divide its {heads:,} query heads"
        )


# ---- the vocabulary (tokenizer.ggml.*)


def vocab_keys(meta: dict[str, Any], where: str, rows: int | None = None) -> dict[str, Any]:
    """The tokenizer keys gguf_vocab reads, checked: distinct tokens (no more than the embedding's
    `rows`), a known type for each, merges of two tokens, a score for each, special ids inside the
    vocabulary, text where text belongs. By key; None (or the default) for one the file leaves out."""
    if K.LIST not in meta:
        raise AttnlabError(f"{where} holds no tokenizer (tokenizer.ggml.tokens): attnlab needs one to read text")
    tokens = _listed(meta, K.LIST, str, where)
    _check_tokens(tokens, rows, where)
    types = _listed(meta, K.TOKEN_TYPE, int, where, len(tokens)) or [T.NORMAL] * len(tokens)
    known = {int(t) for t in T} | {0}  # 0: llama.cpp's "undefined", read as a normal token
    bad = next((i for i, t in enumerate(types) if t not in known), None)
    if bad is not None:
        raise AttnlabError(
            f"{where}: token {bad} has the type {types[bad]} in {K.TOKEN_TYPE}; GGUF's types are "
            f"{', '.join(f'{int(t)} {t.name}' for t in T)}"
        )
    merges = _listed(meta, K.MERGES, str, where)
    bad = next((i for i, m in enumerate(merges) if len(merge_pair(m)) != 2), None)
    if bad is not None:
        raise AttnlabError(
            f"{where}: merge {bad} of {K.MERGES} is {merges[bad][:40]!r}, not two tokens with a space between them"
        )
    ids = {key: _token_id(meta, key, len(tokens), where) for key in meta if _is_token_id(key)}
    texts = {key: _text(meta, key, where) for key in (K.MODEL, K.PRE, K.CHAT_TEMPLATE)}
    return {
        K.LIST: tokens,
        K.TOKEN_TYPE: types,
        K.MERGES: merges,
        K.ADD_BOS: _flag(meta, K.ADD_BOS, where),
        K.SCORES: _listed(meta, K.SCORES, float, where, len(tokens)) or None,
        **{key: ids.get(key) for key in (K.BOS_ID, K.EOS_ID, K.UNK_ID)},
        **texts,
    }


def merge_pair(merge: str) -> list[str]:
    """A merge "a b" as [a, b], split where llama.cpp splits it: at the first space after its first character."""
    at = merge.find(" ", 1)
    return [merge[:at], merge[at + 1 :]] if 0 < at < len(merge) - 1 else [merge]


def _listed(meta: dict[str, Any], key: str, kind: type, where: str, length: int | None = None) -> list:
    """The list under `key` ([] if absent) of `kind` (a float list may hold integers), `length` long."""
    value = meta.get(key, [])
    kinds = (int, float) if kind is float else (kind,)
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, kinds) for v in value):
        raise AttnlabError(f"{where}: {key} is not a list of {kind.__name__} values")
    if length is not None and value and len(value) != length:
        raise AttnlabError(f"{where}: {key} has {len(value):,} entries for {length:,} tokens; it needs one per token")
    return value


def _check_tokens(tokens: list[str], rows: int | None, where: str) -> None:
    if not tokens:
        raise AttnlabError(f"{where}: its vocabulary ({K.LIST}) is empty")
    if rows is not None and len(tokens) > rows:
        raise AttnlabError(
            f"{where} has {len(tokens):,} tokens but its embedding (token_embd.weight) has only {rows:,} rows"
        )
    if len(set(tokens)) != len(tokens):
        first: dict[str, int] = {}
        i, token = next((i, t) for i, t in enumerate(tokens) if first.setdefault(t, i) != i)
        raise AttnlabError(f"{where}: the token {token[:40]!r} is in {K.LIST} twice (ids {first[token]} and {i})")


def _is_token_id(key: str) -> bool:
    return key.startswith("tokenizer.ggml.") and key.endswith("_token_id")


def _token_id(meta: dict[str, Any], key: str, n: int, where: str) -> int:
    value = meta[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        raise AttnlabError(f"{where}: {key} is {kind(value)}, not the id of one of its {n:,} tokens")
    return value


def _text(meta: dict[str, Any], key: str, where: str) -> str | None:
    value = meta.get(key)
    if value is not None and not isinstance(value, str):
        raise AttnlabError(f"{where}: {key} is not text")
    return value


def _flag(meta: dict[str, Any], key: str, where: str) -> bool:
    """add_bos_token; when absent, true for a SentencePiece vocabulary (llama.cpp's default)."""
    value = meta.get(key, meta.get(K.MODEL) == "llama")
    if not isinstance(value, bool):
        raise AttnlabError(f"{where}: {key} is not true or false")
    return value
