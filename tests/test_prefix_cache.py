"""The prefix cache (decoding/prefix_cache.py): earlier prompts' keys kept in blocks, least recently used
evicted, and reused by requests sharing a prefix, alone or prefilled together (admission.py), with every
request still getting the tokens of its prompt run alone (stream_rows)."""

from __future__ import annotations

import queue

import pytest
import torch

from attnlab.decoding.draw import Draw
from attnlab.decoding.engine import Engine
from attnlab.decoding.prefix_cache import PrefixCache
from attnlab.serve.app import create_app, running
from attnlab.serve.guard import Limits
from tests.conftest import extra, short_chat_lm
from tests.test_engine_prefill import together
from tests.test_serve_batching import SETTINGS, VOCAB, alone, concurrently, model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py


def blocks(n: int, value: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((2, 1, n, 3), value), torch.full((2, 1, n, 3), -value)


def test_a_lookup_finds_the_longest_kept_prefix_and_leaves_a_token_to_feed():
    cache = PrefixCache(10**6, block=4)
    ids = list(range(10))
    cache.insert(ids, lambda a, b: blocks(b - a, float(a)))  # two full blocks: tokens 0..7
    assert len(cache.blocks) == 2 and cache.bytes == 2 * 2 * (2 * 4 * 3 * 4)
    n, (k, v) = cache.lookup(ids[:8] + [99])
    assert n == 8 and k.shape == (2, 1, 8, 3) and bool((k[:, :, 4:] == 4.0).all()) and bool((v[:, :, :4] == 0).all())
    assert cache.lookup(ids[:8])[0] == 4  # a prompt all kept still feeds its last token (its logits)
    assert cache.lookup([0, 1, 2, 5, 9])[0] == 0  # another first block: nothing
    assert cache.lookup([7] * 4 + ids[4:8] + [1])[0] == 0  # the second block after another first one
    assert cache.report()["hits"] == 2 and cache.report()["misses"] == 2 and cache.report()["tokens reused"] == 12


def test_memory_is_bounded_and_the_least_recently_used_blocks_go_first():
    size = 2 * (2 * 4 * 3 * 4)  # one block's keys and values
    cache = PrefixCache(3 * size, block=4)
    a, b = [1] * 4 + [2] * 4, [3] * 4 + [4] * 4
    cache.insert(a + [0], lambda s, e: blocks(e - s, 1.0))
    cache.insert(b + [0], lambda s, e: blocks(e - s, 2.0))  # 4 blocks do not fit: a's last one goes
    assert cache.bytes <= 3 * size and cache.report()["evicted"] == 1
    assert cache.lookup(a + [0])[0] == 4 and cache.lookup(b + [0])[0] == 8
    for i in range(20):  # many distinct prompts: the memory stays within its bound
        cache.insert([10 + i] * 8 + [0], lambda s, e: blocks(e - s, 3.0))
        assert cache.bytes <= 3 * size


def prompts(shared: int, n: int) -> list[list[int]]:
    """n prompts: a `shared`-token prefix (a system prompt) and suffixes of 1 to 4 tokens of their own."""
    g = torch.Generator().manual_seed(5)
    head = torch.randint(VOCAB, (shared,), generator=g).tolist()
    return [head + torch.randint(VOCAB, (1 + i % 4,), generator=g).tolist() for i in range(n)]


def engine_with_cache(m, blocks_kept: int) -> Engine:
    engine = Engine(m, max_batch=8, dtype="float32", prefix_cache_mb=1)
    block = 2 * len(m.blocks) * m.cfg.d_model * 4 * 4  # keys and values of 4 tokens, float32
    engine.prefix = PrefixCache(blocks_kept * block, block=4)
    return engine


@pytest.mark.parametrize("draw", [Draw(0.0), Draw(*SETTINGS[3], seed=7), Draw(*SETTINGS[4], seed=8)], ids=str)
def test_requests_one_after_another_reuse_the_prefix_and_get_their_lone_tokens(draw):
    """Prompts sharing 8 tokens, run one at a time (alone): from the second on the prefix is reused;
    a cache of 3 blocks also evicts (another prefix comes between), and the tokens never change."""
    m = model()
    engine = engine_with_cache(m, blocks_kept=3)
    reqs = prompts(8, 4) + [[5] * 9] + prompts(8, 2)
    got = [[s.token for s in engine.generate(p, draw, 12)] for p in reqs]
    assert got == [alone(m, p, draw, 12) for p in reqs]
    report = engine.report()
    assert report["prefix hits"] >= 4 and report["prefix tokens reused"] >= 32 and report["prefix evicted"] > 0
    assert report["prefix bytes"] <= engine.prefix.max_bytes


@pytest.mark.parametrize("budget", [3, 64], ids=["chunked", "whole"])
def test_requests_prefilled_together_reuse_the_prefix_and_get_their_lone_tokens(budget):
    """A first request leaves the prefix's keys; 6 more with it, at once, different settings and seeds,
    are prefilled together from it: each gets stream_rows' tokens."""
    m, ps = model(), prompts(8, 7)
    engine = engine_with_cache(m, blocks_kept=8)
    engine.filling.budget = budget
    first = (ps[0], Draw(seed=1), 10)
    assert [s.token for s in engine.generate(*first)] == alone(m, *first)
    reqs = [(p, Draw(*SETTINGS[i % len(SETTINGS)], seed=20 + i), 6 + i) for i, p in enumerate(ps[1:])]
    assert together(engine, reqs) == [alone(m, *r) for r in reqs]
    assert engine.stats["prefill passes"] > 0 and engine.report()["prefix hits"] >= 6
    assert concurrently(engine, reqs) == [alone(m, *r) for r in reqs]  # and as threads send them


def test_a_model_that_reads_the_previous_token_keeps_no_prefix():
    m = model(bigram_vocab=128)
    engine = engine_with_cache(m, blocks_kept=8)
    for p in prompts(8, 3):
        assert [s.token for s in engine.generate(p, Draw(seed=2), 5)] == alone(m, p, Draw(seed=2), 5)
    assert engine.prefix.off and engine.report()["prefix hits"] == 0


def test_the_server_reuses_prefixes_and_counts_them_at_metrics(tmp_path):
    """`attnlab serve --prefix-cache-mb`: prompts sharing their first 16 characters, asked twice each,
    seeded: the same text every time, and /metrics counts the hits and the tokens reused."""
    httpx = extra("httpx", "httpx is a dev extra")
    app = create_app([short_chat_lm(tmp_path)], limits=Limits(prefix_cache_mb=1))
    prompts = ["def add(a, b):\n    return", "def add(a, b):\n    print"]
    body = {"model": "lm", "max_tokens": 8, "seed": 3, "temperature": 1.0, "ignore_eos": True}
    with running(app) as url:
        texts = [
            httpx.post(f"{url}/v1/completions", json={**body, "prompt": p}, timeout=60).json()["choices"][0]["text"]
            for p in prompts * 2
        ]
        metrics = httpx.get(f"{url}/metrics", timeout=60).text
    assert texts[:2] == texts[2:]
    counters = dict(line.rsplit(" ", 1) for line in metrics.splitlines())
    assert int(counters['attnlab_prefix_hits{run="lm"}']) >= 3
    assert int(counters['attnlab_prefix_tokens_reused{run="lm"}']) >= 48
    assert int(counters['attnlab_prefix_bytes{run="lm"}']) > 0


def test_a_failure_keeping_blocks_turns_the_cache_off_and_the_requests_go_on(monkeypatch):
    """Out of memory (say) while the cache keeps a prompt's blocks: that request still gets its tokens,
    the cache says it is off, and the engine's thread serves the next request."""
    m = model()
    e = engine_with_cache(m, 8)

    def full(*args, **kwargs):
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(e.prefix, "insert", full)
    with pytest.warns(UserWarning, match="prefix cache is off after RuntimeError"):
        first = [s.token for s in e.generate(prompts(8, 1)[0], Draw(0.0), 5)]
    assert first == alone(m, prompts(8, 1)[0], Draw(0.0), 5) and e.prefix.off.startswith("off after RuntimeError")
    second = prompts(8, 2)[1]
    assert [s.token for s in e.generate(second, Draw(0.0), 5)] == alone(m, second, Draw(0.0), 5)


def test_a_failure_outside_any_row_fails_every_sequence_and_the_engine_goes_on(monkeypatch):
    """A bug in admission (outside any one row's work): every sequence in the engine hears it, the
    engine's own thread lives on and serves the next request."""
    m = model()
    e = Engine(m, dtype="float32")
    real, calls = e._admit, []

    def once():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        real()

    monkeypatch.setattr(e, "_admit", once)
    first = queue.SimpleQueue()
    e.submit([1, 2, 3], Draw(0.0), 4, first.put)
    assert isinstance(first.get(timeout=30), RuntimeError)
    second = queue.SimpleQueue()
    e.submit([1, 2, 3], Draw(0.0), 4, second.put)
    got = [second.get(timeout=30) for _ in range(5)]
    assert [s.token for s in got[:4]] == alone(m, [1, 2, 3], Draw(0.0), 4) and got[4] is None
    e.close(wait=5)
