"""Tokenizers (char and BPE) and data sources, token caches and batches."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.data import TokenData, build_token_cache, resolve_sources, stdlib_files
from attnlab.data.tokenizers import BPETokenizer, CharTokenizer, load_tokenizer, train_tokenizer
from attnlab.errors import AttnlabError
from attnlab.io import cache_root


def test_char_round_trip_and_unknown_characters(tmp_path):
    tok = CharTokenizer.train(["hello world", "héllo"])
    ids = tok.encode("hello héllo")
    assert tok.decode(ids) == "hello héllo"
    assert tok.vocab_size == 2 + len(set("hello worldé"))
    # Unseen characters become <unk>, never a crash.
    unk = tok.encode("hello ✓ zq")
    assert unk.count(tok.unk_id) == 3
    (tmp_path / "tokenizer.json").write_text(tok.to_json())
    again = load_tokenizer(tmp_path)
    assert isinstance(again, CharTokenizer) and again.encode("hello héllo") == ids


def test_bpe_trains_round_trips_and_saves(tmp_path):
    texts = ["def function(argument):\n    return argument * 2\n"] * 50 + ["naïve café 🙂"]
    tok = train_tokenizer("bpe", texts, vocab_size=300)
    assert isinstance(tok, BPETokenizer) and 257 <= tok.vocab_size <= 300
    sample = "def function(x):\n    return naïve 🙂"
    assert tok.decode(tok.encode(sample)) == sample
    # Merges learned from the corpus make frequent words shorter than their bytes.
    assert len(tok.encode("argument")) < len("argument")
    (tmp_path / "tokenizer.json").write_text(tok.to_json())
    again = load_tokenizer(tmp_path / "tokenizer.json")
    assert again.encode(sample) == tok.encode(sample)
    assert tok.n_chars(np.array(tok.encode(sample))) == len(sample)


def test_bpe_vocab_too_small_is_a_clear_error():
    with pytest.raises(AttnlabError, match="vocab-size"):
        train_tokenizer("bpe", ["abc"], vocab_size=100)


def test_corrupt_tokenizer_is_a_clear_error(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(AttnlabError, match="cannot read tokenizer"):
        load_tokenizer(tmp_path)


def test_stdlib_corpus_is_found_without_tests():
    files = stdlib_files()
    assert len(files) > 300
    names = {f.name for f in files}
    assert {"os.py", "dataclasses.py", "__init__.py"} <= names
    assert not [f for f in files if "test" in f.parts or "site-packages" in f.parts]
    size = sum(f.stat().st_size for f in files)
    assert 5e6 < size < 40e6


def test_folder_source_with_glob(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.py").write_text("print(1)\n")
    (tmp_path / "b.txt").write_text("hello\n")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01\x02")
    for hidden in (".venv/lib/site.py", ".git/HEAD", "a/__pycache__/x.py"):  # never corpus text
        (tmp_path / hidden).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / hidden).write_text("ref: refs/heads/main\n")
    assert [f.name for f in resolve_sources(str(tmp_path))] == ["x.py", "b.txt"]
    assert [f.name for f in resolve_sources(str(tmp_path), "*.py")] == ["x.py"]


@pytest.mark.parametrize("make", ["missing", "empty_file", "empty_folder"])
def test_missing_or_empty_data_is_a_clear_error(tmp_path, make):
    path = tmp_path / "data"
    if make == "empty_file":
        path.write_text("")
    elif make == "empty_folder":
        path.mkdir()
    with pytest.raises(AttnlabError):
        resolve_sources(str(path))


def test_token_cache_split_is_deterministic_and_complete(tmp_path, corpus):
    tok = CharTokenizer.train([corpus.read_text()])
    folder = build_token_cache([corpus], tok, val_fraction=0.1, progress=False)
    data = TokenData(folder)
    n_train, n_val = len(data.splits["train"]), len(data.splits["val"])
    assert n_train + n_val == len(corpus.read_text()) + 1  # + the end-of-text token
    assert 0.05 < n_val / (n_train + n_val) < 0.15
    assert data.splits["train"].dtype == np.uint16
    # Built once: the same call returns the same folder without rebuilding.
    mtime = (folder / "train.bin").stat().st_mtime_ns
    assert build_token_cache([corpus], tok, 0.1, progress=False) == folder
    assert (folder / "train.bin").stat().st_mtime_ns == mtime
    assert not list((cache_root() / "tokens").glob("*.tmp-*"))


def test_batches_are_contiguous_blocks_shifted_by_one(corpus):
    tok = CharTokenizer.train([corpus.read_text()])
    data = TokenData(build_token_cache([corpus], tok, 0.1, progress=False))
    x, y = data.batch("train", 4, 16, np.random.default_rng(0))
    assert x.shape == y.shape == (4, 16)
    assert (x[:, 1:] == y[:, :-1]).all()
    windows = np.lib.stride_tricks.sliding_window_view(np.asarray(data.splits["train"]), 16)
    for row in x.numpy():
        assert (windows == row).all(axis=1).any()  # each row is a window of the train stream
    with pytest.raises(AttnlabError, match="block size"):
        data.check(10**6)


def test_interrupted_cache_build_leaves_nothing_that_looks_complete(corpus, monkeypatch):
    tok = CharTokenizer.train([corpus.read_text()])

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(CharTokenizer, "encode_array", boom)
    with pytest.raises(KeyboardInterrupt):
        build_token_cache([corpus], tok, 0.1, progress=False)
    leftovers = list((cache_root() / "tokens").glob("*"))
    assert not [p for p in leftovers if (p / "meta.json").exists() and ".tmp" in p.name]
    assert not [p for p in leftovers if ".tmp" in p.name]


def test_large_files_are_read_in_pieces_that_end_at_line_breaks(tmp_path):
    from attnlab.data.text import read_pieces

    path = tmp_path / "big.txt"
    lines = [f"line {i} é\n" for i in range(5000)]
    path.write_text("".join(lines))
    pieces = list(read_pieces([path], piece_bytes=1000))
    assert len(pieces) > 40 and all(len(t.encode()) <= 4000 for t, _, _ in pieces)
    assert "".join(t for t, _, _ in pieces) == "".join(lines)  # nothing lost or doubled
    assert all(t.endswith("\n") for t, _, last in pieces if not last and t)
    assert sum(size for _, size, _ in pieces) == path.stat().st_size
    assert [last for _, _, last in pieces].count(True) == 1


def test_cache_of_a_file_read_in_pieces_equals_the_whole_text(tmp_path, corpus, monkeypatch):
    """Reading in 200-byte pieces gives the same token stream as reading the file at once."""
    import functools

    import attnlab.data.tokens as tokens_mod
    from attnlab.data.text import read_pieces

    tok = CharTokenizer.train([corpus.read_text()])
    whole = TokenData(build_token_cache([corpus], tok, 0.0, progress=False))
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "other-cache"))
    monkeypatch.setattr(tokens_mod, "read_pieces", functools.partial(read_pieces, piece_bytes=200))
    pieces = TokenData(build_token_cache([corpus], tok, 0.0, progress=False))
    assert np.array_equal(whole.splits["train"], pieces.splits["train"])
    assert len(whole.splits["train"]) == len(corpus.read_text()) + 1


def test_char_tokenizer_trained_by_worker_processes_equals_one_process():
    texts = ["plain ascii\n", "naïve café\n", "emoji 🙂 and ümlauts\n", "more ascii text\n"] * 3
    serial, parallel = CharTokenizer.train(texts), CharTokenizer.train(texts, workers=2)
    assert parallel.chars == serial.chars == "".join(sorted(set("".join(texts))))


def test_ordered_map_keeps_order_and_propagates_errors():
    from attnlab.data.pool import ordered_map

    assert list(ordered_map(abs, range(-20, 0), workers=2)) == list(range(20, 0, -1))
    with pytest.raises(TypeError):
        list(ordered_map(abs, [1, "x", 3], workers=2))


def test_ascii_and_unicode_pieces_encode_alike():
    tok = CharTokenizer("abc é")
    # the ASCII fast path and the code-point path must give the same ids
    assert tok.encode("abc cab") == tok.encode("abc cabé")[:-1]
    assert tok.encode("z\x7f") == [tok.unk_id, tok.unk_id]  # unseen ASCII is <unk> too


def test_a_line_longer_than_pieces_is_cut_and_each_file_ends_once(tmp_path):
    from attnlab.data.text import read_pieces

    (tmp_path / "a.txt").write_text("short\n" * 30 + "no newline at end é", encoding="utf-8")
    (tmp_path / "b.txt").write_text("y" * 500, encoding="utf-8")  # one line of 500 bytes, pieces of 64
    pieces = list(read_pieces([tmp_path / "a.txt", tmp_path / "b.txt"], piece_bytes=64))
    assert "".join(t for t, _, _ in pieces) == "short\n" * 30 + "no newline at end é" + "y" * 500
    assert max(size for _, size, _ in pieces) <= 4 * 64  # a long line waits at most 3 extra reads
    assert [last for _, _, last in pieces].count(True) == 2


@pytest.mark.parametrize("val_fraction, total", [(0.05, 10**6), (0.1, 1000), (0.0, 10**5), (0.5, 5000)])
def test_split_runs_match_per_token_chunk_rule(val_fraction, total):
    from attnlab.data.tokens import _Splitter

    sp = _Splitter(total, val_fraction)
    ids, pos = np.arange(60000), 0
    got: dict[bool, list] = {True: [], False: []}
    for n in [1, 7, 300, 8191, 8192, 20000, 13309]:  # pieces of any length, cut anywhere
        for is_val, run in sp.split(ids[pos : pos + n]):
            got[is_val].append(run)
        pos += n
    chunk_of = np.arange(pos) // sp.chunk
    want_val = chunk_of % sp.period == sp.period - 1 if sp.period else np.zeros(pos, bool)
    val = np.concatenate(got[True]) if got[True] else np.zeros(0, int)
    assert np.array_equal(val, np.arange(pos)[want_val])
    assert np.array_equal(np.concatenate(got[False]), np.arange(pos)[~want_val])
