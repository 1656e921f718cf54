"""llama.cpp beside attnlab: a GGUF file decoded greedily by llama.cpp's own loop, and timed.

Legend: V vocabulary.

    from attnlab.interop.llamacpp import greedy, greedy_text
    tokens, per_second = greedy("demo.gguf", prompt=[5, 17, 2], new_tokens=32, threads=2)
    answer = greedy_text("sft.gguf", "<|im_start|>user\nReverse abc<|im_end|>\n<|im_start|>assistant\n", 48,
                         stop="<|im_end|>")

The prompt is fed as token ids (no tokenizer in between), decoded once as one batch; then each new
token is one llama_decode of one position through llama.cpp's key/value cache, and greedy is the
argmax of the last position's logits: no sampling code of either side, so the tokens are what the
weights and llama.cpp's arithmetic give. Timed: the prompt and the decode steps, from the first
llama_decode to the last token's logits, so tokens/s = new_tokens / that time, as
benchmarks/generate_speed.py times attnlab's (prompt included); loading the file is not timed.

Needs the llamacpp extra, llama-cpp-python, which pip compiles from source (about 7 minutes on 2
cores): CMAKE_ARGS="-DGGML_NATIVE=ON" pip install -e '.[llamacpp]'. Nothing else in attnlab imports
this module, so the command line never loads llama.cpp.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from attnlab.errors import AttnlabError

try:
    import llama_cpp  # the llamacpp extra: llama.cpp's C API through ctypes
except ImportError:  # greedy() says how to install it
    llama_cpp = None

INSTALL = "CMAKE_ARGS=\"-DGGML_NATIVE=ON\" pip install -e '.[llamacpp]'"


def greedy(
    path: str | Path,
    prompt: Sequence[int],
    new_tokens: int,
    threads: int = 1,
    repack: bool | None = None,
    exact: bool = False,
) -> tuple[list[int], float]:
    """Load GGUF file `path` in llama.cpp (CPU, `threads` threads) and continue `prompt` (token ids)
    by `new_tokens` greedy tokens. Returns (the new token ids, new_tokens / seconds of decoding).

    repack: let llama.cpp repack quantized weights for its CPU kernels (llama-cli's --no-repack is
    False). None: yes, except in a build with AMX kernels (Intel's CPUs with AMX): there the
    AMX matrix product crashes the process on any batch of more than one position (ggml-org/llama.cpp
    #20824; here: every Q8_0 and Q4_0 file, with a prompt of 2 tokens or more), so the weights stay as
    the file stores them.

    exact: keys and values float32 and no flash attention. llama.cpp's defaults (an f16 key/value
    cache; flash attention, which reads it in f16) round them to f16: its logits then differ from
    float32 arithmetic by about 1e-4 of their size (5e-4 on the demo's model, 8e-6 with exact), and
    a greedy text parts from attnlab's at the first near-tie (one of five prompts, after 30
    characters, at a gap of 2e-4). llama.cpp's programs take `-ctk f32 -ctv f32 -fa off` for it."""
    if llama_cpp is None:
        raise AttnlabError(f"llama.cpp's Python binding is not installed: {INSTALL}")
    if not prompt or new_tokens < 1:
        raise AttnlabError("greedy needs a prompt of at least one token and at least one new token")
    repack = _repack_by_default() if repack is None else repack
    with _context(Path(path), len(prompt) + new_tokens, len(prompt), threads, repack, exact=exact) as (ctx, vocab_size):
        batch = llama_cpp.llama_batch_init(len(prompt), 0, 1)
        try:
            start = time.perf_counter()
            out = [_step(ctx, batch, list(prompt), 0, vocab_size)]  # the prompt, once
            for pos in range(len(prompt), len(prompt) + new_tokens - 1):
                out.append(_step(ctx, batch, [out[-1]], pos, vocab_size))  # one position per call
            seconds = time.perf_counter() - start
        finally:
            llama_cpp.llama_batch_free(batch)
    return out, new_tokens / seconds


def greedy_rows(
    path: str | Path, prompt: Sequence[int], rows: int, new_tokens: int, threads: int = 1, repack: bool | None = None
) -> tuple[list[int], float]:
    """greedy() for `rows` sequences of the same prompt decoded together, one llama_decode per step
    holding a token of each (llama.cpp's sequences, as its server batches requests): the first row's
    tokens, and rows * new_tokens / seconds. Every row is the same greedy sequence."""
    if llama_cpp is None:
        raise AttnlabError(f"llama.cpp's Python binding is not installed: {INSTALL}")
    if not prompt or new_tokens < 1 or rows < 1:
        raise AttnlabError("greedy_rows needs a prompt, at least one new token and at least one row")
    repack = _repack_by_default() if repack is None else repack
    positions = len(prompt) + new_tokens
    with _context(Path(path), rows * positions, rows * len(prompt), threads, repack, rows) as (ctx, vocab_size):
        batch = llama_cpp.llama_batch_init(rows * len(prompt), 0, rows)
        try:
            start = time.perf_counter()
            nexts = _rows_step(ctx, batch, [list(prompt)] * rows, 0, vocab_size)  # every row's prompt, at once
            out = [nexts[0]]
            for pos in range(len(prompt), positions - 1):
                nexts = _rows_step(ctx, batch, [[t] for t in nexts], pos, vocab_size)  # a token of each row
                out.append(nexts[0])
            seconds = time.perf_counter() - start
        finally:
            llama_cpp.llama_batch_free(batch)
    return out, rows * new_tokens / seconds


def _rows_step(ctx, batch, tokens: list[list[int]], start: int, vocab_size: int) -> list[int]:
    """Decode row r's `tokens[r]` at positions start.. (sequence r), every row in one batch; each
    row's argmax of its last logits."""
    i, last = 0, []
    for r, row in enumerate(tokens):
        for j, token in enumerate(row):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + j, 1
            batch.seq_id[i][0] = r
            batch.logits[i] = j == len(row) - 1
            i += 1
        last.append(i - 1)
    batch.n_tokens = i
    if llama_cpp.llama_decode(ctx, batch) != 0:
        raise AttnlabError(f"llama.cpp could not decode {i} token(s) of {len(tokens)} rows at position {start}")
    return [
        int(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, k), shape=(vocab_size,)).argmax()) for k in last
    ]


def tokenize(path: str | Path, text: str, special: bool = False) -> list[int]:
    """`text` as llama.cpp's tokenizer reads it with the vocabulary of GGUF file `path`, no begin-of-text
    added, to check a file's tokenizer against attnlab's. special: read a control token's text
    (<|endoftext|>) as that token, as a BPE run's tokenizer does, rather than as plain text."""
    if llama_cpp is None:
        raise AttnlabError(f"llama.cpp's Python binding is not installed: {INSTALL}")
    _quiet()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True  # the tokenizer, not the weights
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise AttnlabError(f"llama.cpp could not load {path} (run with ATTNLAB_LLAMACPP_LOG=1 to see why)")
    try:
        data = text.encode("utf-8")
        ids = (llama_cpp.llama_token * (len(data) + 2))()  # at most one token per byte
        n = llama_cpp.llama_tokenize(
            llama_cpp.llama_model_get_vocab(model), data, len(data), ids, len(ids), False, special
        )
        return list(ids[:n])
    finally:
        llama_cpp.llama_model_free(model)


def detokenize(path: str | Path, ids: Sequence[int]) -> str:
    """Token ids as text, by llama.cpp's own vocabulary of GGUF file `path` (control tokens' texts
    written out), the way back of `tokenize`: what llama.cpp prints for the tokens it generates."""
    if llama_cpp is None:
        raise AttnlabError(f"llama.cpp's Python binding is not installed: {INSTALL}")
    _quiet()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise AttnlabError(f"llama.cpp could not load {path} (run with ATTNLAB_LLAMACPP_LOG=1 to see why)")
    try:
        vocab, piece = llama_cpp.llama_model_get_vocab(model), ctypes.create_string_buffer(256)
        out = b""
        for token in ids:  # byte pieces of one character may come apart: join the bytes, then decode
            n = llama_cpp.llama_token_to_piece(vocab, token, piece, len(piece), 0, True)
            out += piece.raw[:n]
        return out.decode("utf-8", errors="replace")
    finally:
        llama_cpp.llama_model_free(model)


def greedy_text(
    path: str | Path, text: str, new_tokens: int, stop: str | None = None, threads: int = 1, exact: bool = True
) -> str:
    """`text` continued greedily by llama.cpp alone: its tokenizer, its decoding loop, its detokenizer;
    cut at the first `stop` (a chat template's end of turn), as a chat client stops. exact: as for
    greedy (here on by default: this is what attnlab's text is compared with)."""
    out = detokenize(path, greedy(path, tokenize(path, text), new_tokens, threads, exact=exact)[0])
    return out.split(stop, 1)[0] if stop else out


def last_logits(
    path: str | Path, prompt: Sequence[int], threads: int = 1, repack: bool | None = None, exact: bool = False
) -> np.ndarray:
    """llama.cpp's logits (V,) at the last position of `prompt` (token ids), to compare a file's model
    with attnlab's; `repack` and `exact` as for greedy."""
    if llama_cpp is None:
        raise AttnlabError(f"llama.cpp's Python binding is not installed: {INSTALL}")
    repack = _repack_by_default() if repack is None else repack
    with _context(Path(path), len(prompt), len(prompt), threads, repack, exact=exact) as (ctx, vocab_size):
        batch = llama_cpp.llama_batch_init(len(prompt), 0, 1)
        try:
            _step(ctx, batch, list(prompt), 0, vocab_size)
            return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(vocab_size,)).copy()
        finally:
            llama_cpp.llama_batch_free(batch)


def _repack_by_default() -> bool:
    """Repack weights for llama.cpp's CPU kernels unless the build has AMX ones (see greedy)."""
    return b"AMX_INT8 = 1" not in llama_cpp.llama_print_system_info()


def _step(ctx, batch, tokens: list[int], start: int, vocab_size: int) -> int:
    """Decode `tokens` at positions start.. (sequence 0) and return the argmax of the last logits."""
    batch.n_tokens = len(tokens)
    for i, token in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + i, 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = i == len(tokens) - 1  # logits of the last position only
    if llama_cpp.llama_decode(ctx, batch) != 0:
        raise AttnlabError(f"llama.cpp could not decode {len(tokens)} token(s) at position {start}")
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(vocab_size,))  # (V,)
    return int(logits.argmax())


@contextmanager
def _context(
    path: Path, positions: int, batch: int, threads: int, repack: bool, sequences: int = 1, exact: bool = False
) -> Iterator[tuple[object, int]]:
    """(a llama.cpp context over the model in `path` holding `positions` positions, shared by
    `sequences` sequences, and its vocabulary size); exact: a float32 key/value cache, no flash attention."""
    if not path.is_file():
        raise AttnlabError(f"GGUF file not found: {path}")
    _quiet()
    model_params = llama_cpp.llama_model_default_params()
    model_params.use_extra_bufts = repack  # the extra buffer types are the repacked weights' (CPU_REPACK, AMX)
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params)
    if not model:
        raise AttnlabError(f"llama.cpp could not load {path} (run with ATTNLAB_LLAMACPP_LOG=1 to see why)")
    try:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = positions, max(batch, 1), max(batch, 1)
        params.n_threads = params.n_threads_batch = threads
        params.n_seq_max = sequences
        if exact:
            params.type_k = params.type_v = llama_cpp.GGML_TYPE_F32
            params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = llama_cpp.llama_init_from_model(model, params)
        if not ctx:
            raise AttnlabError(f"llama.cpp could not make a context of {positions} positions for {path}")
        try:
            yield ctx, llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        finally:
            llama_cpp.llama_free(ctx)
    finally:
        llama_cpp.llama_model_free(model)


@llama_cpp.llama_log_callback if llama_cpp is not None else (lambda f: f)
def _drop(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """llama.cpp's log lines (a page per model loaded), dropped."""


def _quiet() -> None:
    """Send llama.cpp's logging to `_drop`, unless ATTNLAB_LLAMACPP_LOG is set."""
    if not os.environ.get("ATTNLAB_LLAMACPP_LOG"):
        llama_cpp.llama_log_set(_drop, ctypes.c_void_p())
