"""Tokenizing a corpus larger than memory should stream: MB/s and peak memory.

Generates a corpus of --size-gb gigabytes (the standard library's sources, each file copied
with a numbered header, written as 64 MB files) into --dir, then times the two passes that
`attnlab train lm` makes over it: training the tokenizer and writing the token cache. Peak
memory is the process's maximum resident set size, which must stay far below the corpus size.

    .venv/bin/python benchmarks/tokenize_speed.py --size-gb 1 --dir /tmp/attnlab-corpus
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import time
from pathlib import Path

from attnlab.data import build_token_cache, read_texts, resolve_sources, stdlib_files, workers_for
from attnlab.data.tokenizers import train_tokenizer

FILE_BYTES = 64 << 20


def generate(folder: Path, size_bytes: int) -> int:
    """Write about size_bytes of Python source into folder; returns the bytes written."""
    folder.mkdir(parents=True, exist_ok=True)
    sources = [p.read_text(encoding="utf-8", errors="replace") for p in stdlib_files()]  # 12 MB
    written, n_file, copy = 0, 0, 0
    while written < size_bytes:
        with open(folder / f"part-{n_file:04d}.py", "w", encoding="utf-8") as f:
            in_file = 0
            while in_file < FILE_BYTES and written + in_file < size_bytes:
                text = f"# copy {copy}\n{sources[copy % len(sources)]}\n"
                f.write(text)
                in_file += len(text.encode())
                copy += 1
        written += in_file
        n_file += 1
    return written


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gb", type=float, default=1.0, help="corpus size in GB (10^9 bytes)")
    p.add_argument("--dir", default="/tmp/attnlab-corpus", help="where to write the corpus and the cache")
    p.add_argument("--tokenizer", default="char", choices=("char", "bpe"))
    p.add_argument("--keep", action="store_true", help="keep the corpus and cache afterwards")
    args = p.parse_args()
    root = Path(args.dir)
    corpus = root / "corpus"
    os.environ["ATTNLAB_CACHE"] = str(root / "cache")
    t = time.perf_counter()
    size = generate(corpus, int(args.size_gb * 1e9))
    print(f"generated {size / 1e9:.2f} GB in {time.perf_counter() - t:.0f} s ({len(list(corpus.iterdir()))} files)")
    files = resolve_sources(str(corpus))
    print(f"memory before tokenizing (Python, torch, numpy, tokenizers loaded): {peak_rss_mb():.0f} MB")
    t = time.perf_counter()
    tok = train_tokenizer(args.tokenizer, read_texts(files, "reading"), vocab_size=4096, workers=workers_for(files))
    t_tok = time.perf_counter() - t
    print(f"tokenizer ({args.tokenizer}, {tok.vocab_size} tokens): {t_tok:.1f} s, {size / 1e6 / t_tok:.1f} MB/s")
    t = time.perf_counter()
    folder = build_token_cache(files, tok, 0.05, progress=True)
    t_cache = time.perf_counter() - t
    cache_bytes = sum(f.stat().st_size for f in folder.iterdir())
    print(f"token cache: {t_cache:.1f} s, {size / 1e6 / t_cache:.1f} MB/s, {cache_bytes / 1e9:.2f} GB on disk")
    t = time.perf_counter()
    build_token_cache(files, tok, 0.05, progress=False)
    print(f"second run reuses the cache: {time.perf_counter() - t:.2f} s")
    print(f"peak memory (max RSS): {peak_rss_mb():.0f} MB for a {size / 1e6:.0f} MB corpus, {os.cpu_count()} cores")
    if not args.keep:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
