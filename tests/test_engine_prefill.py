"""Prompts prefilled together, in chunks, between the engine's steps (decoding/prefill.py, engine.py):
a chunk over rows of different lengths computes each row's lone logits and keys, and every request
admitted so gets the tokens of its prompt prefilled whole, alone (stream_rows)."""

from __future__ import annotations

import pytest
import torch

from attnlab.decoding import admission
from attnlab.decoding.adapters import LMDecoder
from attnlab.decoding.draw import Draw
from attnlab.decoding.engine import Engine
from attnlab.decoding.prefill import Prefill
from attnlab.decoding.rows import Row, Step
from attnlab.decoding.seats import Seats
from tests.test_serve_batching import VOCAB, alone, concurrently, model, requests

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py


@pytest.mark.parametrize(
    "kw",
    [{}, {"positions": "rope"}, {"positions": "alibi"}, {"bigram_vocab": 128}, {"n_kv_head": 1}],
    ids=["learned", "rope", "alibi", "bigram", "gqa"],
)
def test_chunks_over_prompts_of_different_lengths_give_each_prompt_s_lone_logits_and_keys(kw):
    """Prompts of 2, 11, 5 and 16 tokens (the context) fed 6 tokens a turn into slots of the one table,
    so that they are cut at different places and padded: each one's logits at its last token are its
    lone logits, and once seated where its keys are, a batched step gives the lone next logits."""
    decoder = LMDecoder(model(**kw), "float32")
    seats = Seats(decoder.slots(4))
    prefill = Prefill(seats, budget=6)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(VOCAB, (n,), generator=g).tolist() for n in (2, 11, 5, 16)]
    for ids in prompts:
        prefill.add(Row(ids, Draw(), 1, lambda step: None, decoder.device), decoder.vocab)
    done, passes = {}, 0
    with torch.inference_mode():
        while len(prefill):
            for row, logits in prefill.step(decoder):
                seats.join(row)
                done[tuple(row.window)] = row, logits
            passes += 1
        assert passes == 6  # 34 tokens, 6 a turn
        # A model that does not read the previous token gets none (the compiled batched step is traced
        # without one: compiled_rows.py).
        assert (seats.slots.table.last is None) == ("bigram_vocab" not in kw)
        assert [row.slot for row in seats.rows] == list(range(4)) and not seats.held
        lone = {}
        for ids in prompts:
            lone[tuple(ids)] = decoder.start(None)
            want, _ = decoder.feed(lone[tuple(ids)], ids, 0)
            torch.testing.assert_close(done[tuple(ids)][1], want, atol=1e-5, rtol=1e-5)
        for row in [row for row in list(seats.rows) if len(row.window) == decoder.context]:
            seats.leave(row)  # full: one more token would not fit
        short = list(seats.rows)
        for row in short:
            row.window.append(3)
        step = seats.logits(decoder)  # (3, V) one more token of each row, from the keys in the table
        for row in short:
            want, _ = decoder.feed(lone[tuple(row.window[:-1])], [3], len(row.window) - 1)
            torch.testing.assert_close(step[row.slot : row.slot + 1], want, atol=1e-5, rtol=1e-5)


def long_requests(n: int) -> list[tuple[list[int], Draw, int]]:
    """requests() with prompts up to the context (16): longer than the chunks of 5 tokens below."""
    g = torch.Generator().manual_seed(3)
    return [
        (torch.randint(VOCAB, (1 + 5 * i % 16,), generator=g).tolist(), d, k) for i, (_, d, k) in enumerate(requests(n))
    ]


def together(engine: Engine, reqs) -> list[list[int]]:
    """The requests submitted at once and stepped here: the first turn admits them all together."""
    got, ended = [[] for _ in reqs], []

    def emit(tokens: list[int]):
        return lambda step: tokens.append(step.token) if isinstance(step, Step) else ended.append(step)

    for (ids, d, n), tokens in zip(reqs, got):
        engine.submit(ids, d, n, emit(tokens), start=False)
    while len(ended) < len(reqs):
        engine._step_once()
    assert ended == [None] * len(reqs)  # no request failed
    return got


@pytest.mark.parametrize("budget", [5, 64], ids=["chunked", "whole"])
def test_prefilled_together_every_request_gets_the_tokens_of_its_prompt_alone(budget):
    """8 requests at once (greedy, temperature, top-k, top-p; prompts of 1 to 16 tokens), their prompts
    prefilled together 5 tokens a turn (cut across turns) or whole: each gets stream_rows' tokens."""
    m, reqs = model(), long_requests(8)
    engine = Engine(m, max_batch=8, dtype="float32", prefill=budget)
    assert together(engine, reqs) == [alone(m, *r) for r in reqs]
    assert engine.stats["prefill passes"] > 0
    assert concurrently(engine, reqs) == [alone(m, *r) for r in reqs]  # and as threads send them
    assert not engine.rows and not len(engine.filling)
    engine.close(wait=5)


def test_a_prefill_draw_in_doubt_runs_the_prompt_again_alone(monkeypatch):
    """With every draw from a batched prefill in doubt, each prompt is run again alone: still exact."""
    sure = admission.certain_draws
    monkeypatch.setattr(admission, "certain_draws", lambda z, draws, *a: [None] * len(draws))
    m, reqs = model(positions="rope"), long_requests(4)
    engine = Engine(m, max_batch=4, dtype="float32", prefill=5)
    assert concurrently(engine, reqs) == [alone(m, *r) for r in reqs]
    assert engine.stats["prefill replays"] > 0
    monkeypatch.setattr(admission, "certain_draws", sure)
    engine.close(wait=5)


def test_budget_zero_admits_each_prompt_alone():
    m, reqs = model(), long_requests(4)
    engine = Engine(m, max_batch=4, dtype="float32", prefill=0)
    assert concurrently(engine, reqs) == [alone(m, *r) for r in reqs]
    assert engine.stats["prefill passes"] == 0
    engine.close(wait=5)


@pytest.mark.parametrize(("budget", "same"), [(5, 6), (64, 6), (64, 8)], ids=["chunked", "whole", "alone"])
def test_requests_with_one_prompt_share_its_prefill_and_draw_their_own_tokens(budget, same):
    """`same` of 8 requests with one 12-token prompt, the others with another, different settings and
    seeds (all 8 the same: the prompt is run alone, its copies are the lone keys): the prompt is
    computed once for its twins, and each request still gets stream_rows' tokens."""
    m = model()
    g = torch.Generator().manual_seed(4)
    shared, other = (torch.randint(VOCAB, (12,), generator=g).tolist() for _ in range(2))
    reqs = [(shared if i < same else other, d, k) for i, (_, d, k) in enumerate(requests(8))]
    engine = Engine(m, max_batch=8, dtype="float32", prefill=budget)
    assert concurrently(engine, reqs) == [alone(m, *r) for r in reqs]
    assert engine.stats["twins"] > 0
    engine.close(wait=5)


def test_the_twins_of_a_cancelled_prompt_are_still_served():
    """Three requests with one 14-token prompt, 5 tokens a turn: the first is prefilled, the others wait
    as its twins; the first is cancelled midway, and the twins still get stream_rows' tokens."""
    m, ids = model(), list(range(1, 15))
    engine = Engine(m, max_batch=4, dtype="float32", prefill=5)
    draws = [Draw(1.0, seed=s) for s in range(3)]
    got, ended = [[] for _ in draws], []

    def emit(i):
        return lambda step: got[i].append(step.token) if isinstance(step, Step) else ended.append(i)

    rows = [engine.submit(ids, d, 6, emit(i), start=False) for i, d in enumerate(draws)]
    engine._step_once()  # the prompt's first chunk
    assert len(engine.filling) == 1 and len(rows[0].twins) == 2
    rows[0].cancel()
    while len(ended) < 2:
        engine._step_once()
    assert got[1:] == [alone(m, ids, d, 6) for d in draws[1:]] and not got[0]
    assert not engine.rows and not len(engine.filling)


def test_a_failed_prefill_pass_fails_its_prompts_and_the_engine_goes_on(monkeypatch):
    """Three prompts in one turn, their prefill pass failing: each request hears the error, the slots
    they held are free again, and the engine serves the next requests their lone tokens."""
    m, reqs = model(), long_requests(3)
    engine = Engine(m, max_batch=4, dtype="float32", prefill=64)
    with torch.inference_mode():
        engine._prepare()  # calibrated with the pass that works
    monkeypatch.setattr(LMDecoder, "feed_chunks", lambda *a: (_ for _ in ()).throw(MemoryError("no room")))
    heard = [[] for _ in reqs]
    for (ids, d, n), got in zip(reqs, heard):  # submitted together, stepped here: one turn admits all three
        engine.submit(ids, d, n, got.append, start=False)
    engine._step_once()
    assert all(len(got) == 1 and isinstance(got[0], MemoryError) for got in heard)
    assert not engine.rows and not len(engine.filling) and not engine.seats.held
    monkeypatch.undo()
    assert concurrently(engine, reqs) == [alone(m, *r) for r in reqs]
    engine.close(wait=5)
