"""Batching concurrent generations (decoding/engine.py, slots.py, exact.py): a batched step computes
what each row computes alone, a draw from the batch's logits is never one a lone request would not
make, and every request decoded in the batch gets the tokens stream_rows gives it alone."""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from attnlab.decoding import exact as batching  # the engine's exactness: its race check and tolerance floor
from attnlab.decoding.draw import Draw
from attnlab.decoding.engine import Ask, Engine
from attnlab.decoding.exact import certain_draws
from attnlab.decoding.sampling import next_tokens, stream_rows
from attnlab.decoding.slots import Slots
from attnlab.models.gpt import GPT
from tests.conftest import perturb, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

VOCAB = 64
SETTINGS = [(0.0, None, None), (1.0, None, None), (0.8, 5, None), (1.0, None, 0.9), (1.2, 8, 0.7)]


def model(**kw) -> GPT:
    torch.manual_seed(0)
    return perturb(GPT(tiny_model(vocab_size=VOCAB, context=16, **kw)), 0.3)


def alone(m: GPT, ids: list[int], d: Draw, n: int) -> list[int]:
    """The tokens a lone request draws: stream_rows with one row, as `attnlab sample` decodes."""
    return [int(t[0]) for t in stream_rows(m, ids, 1, n, d, dtype="float32")]


def requests(n: int = 8) -> list[tuple[list[int], Draw, int]]:
    """n requests with different prompts, settings and lengths (some outgrow the context of 16)."""
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        ids = torch.randint(VOCAB, (1 + 3 * i % 11,), generator=g).tolist()
        out.append((ids, Draw(*SETTINGS[i % len(SETTINGS)], seed=100 + i), 6 + 7 * i))
    return out


def concurrently(b: Engine, reqs) -> list[list[int]]:
    start = threading.Barrier(len(reqs))

    def one(r):
        start.wait()
        return [s.token for s in b.generate(*r)]

    with ThreadPoolExecutor(len(reqs)) as pool:
        return list(pool.map(one, reqs))


# ---- the draw -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings", SETTINGS, ids=str)
def test_a_sure_draw_from_perturbed_logits_is_the_lone_draw(settings):
    """Logits full of exact ties, moved by up to the tolerance: every draw certain_draws accepts is
    next_tokens' draw on the unmoved logits; the generator of a row in doubt is back where it was."""
    tolerance, rows = 1e-3, 256
    g = torch.Generator().manual_seed(0)
    z = (torch.randn(rows, VOCAB, generator=g) * 2).round(decimals=1)  # many ties
    z[::3, :4] = z[::3, :1]  # a four-way tie at the top of every third row
    bound = tolerance * (1 + z.abs().amax(-1, keepdim=True))
    moved = z + (torch.rand(rows, VOCAB, generator=g) * 2 - 1) * bound * 0.99
    draws = [Draw(*settings, seed=i) for i in range(rows)]
    gens = [torch.Generator().manual_seed(i) for i in range(rows)]
    got = certain_draws(moved, draws, gens, tolerance)
    for i, token in enumerate(got):
        lone = torch.Generator().manual_seed(i)
        want = int(next_tokens(z[i : i + 1], settings[0], settings[1], settings[2], lone)[0])
        if token is None:
            assert torch.equal(gens[i].get_state(), torch.Generator().manual_seed(i).get_state())
        else:
            assert token == want, i
            assert torch.equal(gens[i].get_state(), lone.get_state())  # advanced as multinomial leaves it
    assert 0 < got.count(None) < rows // 4  # ties are caught, and most draws still stand


# ---- the batched step -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"positions": "rope"},
        {"positions": "alibi"},
        {"positions": "sinusoidal"},
        {"bigram_vocab": 128},
        {"n_kv_head": 1},
        {"feedforward": "moe", "n_experts": 2, "experts_per_token": 1},
    ],
    ids=["learned", "rope", "alibi", "sinusoidal", "bigram", "gqa", "moe"],
)
def test_a_step_over_rows_of_different_lengths_is_each_row_alone(kw):
    """Slot caches with per-row positions and key masks: each row's logits are its lone logits (up to
    float rounding), step after step, with rows of 1, 4 and 9 tokens."""
    m = model(**kw)
    with torch.no_grad():
        slots, lone = Slots(len(m.blocks), 4, 16, torch.device("cpu")), []
        for slot, n in enumerate([1, 4, 9]):
            caches = m.new_caches()
            m(torch.arange(n)[None] % VOCAB, caches=caches)
            slots.put(slot, caches)
            lone.append(caches)
        for step in range(5):
            ids = torch.tensor([[5 + step], [7 * step % VOCAB], [step]])  # (3, 1)
            offsets = slots.table.begin(3)
            batched = m(ids, caches=slots.caches, offset=offsets)[:, -1]
            slots.table.end()
            for b, caches in enumerate(lone):
                want = m(ids[b : b + 1], caches=caches, offset=caches[0].length)[:, -1]
                torch.testing.assert_close(batched[b : b + 1], want, atol=1e-5, rtol=1e-5)


# ---- the batcher ----------------------------------------------------------------------------------------


def test_eight_concurrent_requests_get_their_lone_tokens():
    """8 requests at once (greedy, temperature, top-k, top-p; prompts of 1 to 10 tokens; lengths up
    to 55 tokens, past the context of 16, so rows jump ahead and leave at different steps): each gets
    stream_rows' tokens for its seed, and they were decoded together."""
    m, reqs = model(), requests(8)
    b = Engine(m, max_batch=8, dtype="float32")
    got = concurrently(b, reqs)
    assert got == [alone(m, *r) for r in reqs]
    assert b.stats["batched rows"] > 2 * b.stats["steps"] > 0  # several rows per forward pass
    assert not b.rows and not b.slotted  # every row retired
    b.close(wait=5)


def test_rows_in_doubt_are_replayed_and_still_exact(monkeypatch):
    """With a tolerance so wide that every batched draw is in doubt, each row is replayed alone, then
    finishes alone: the tokens are still stream_rows'."""
    monkeypatch.setattr(Engine, "calibrate", lambda self: 10.0)
    m, reqs = model(positions="rope"), requests(4)
    b = Engine(m, max_batch=4, dtype="float32")
    assert concurrently(b, reqs) == [alone(m, *r) for r in reqs]
    assert b.stats["replays"] > 0 and b.stats["solo rows"] > 0
    b.close(wait=5)


def test_without_a_batched_step_every_row_is_decoded_alone(monkeypatch):
    """Where multinomial is not the race exact.py reproduces (no such torch backend is known; on the
    CPU it is), the batcher decodes each row alone: slower, still every request's own tokens."""
    assert batching.multinomial_is_a_race(torch.device("cpu"))
    monkeypatch.setattr(batching, "multinomial_is_a_race", lambda device: False)
    m, reqs = model(), requests(4)
    b = Engine(m, max_batch=4, dtype="float32")
    assert concurrently(b, reqs) == [alone(m, *r) for r in reqs]
    assert not b.batched and b.stats["steps"] == 0
    b.close(wait=5)


def test_more_requests_than_slots_wait_their_turn():
    m, reqs = model(), requests(6)
    b = Engine(m, max_batch=2, dtype="float32")
    assert concurrently(b, reqs) == [alone(m, *r) for r in reqs]
    b.close(wait=5)


def test_cancel_frees_the_row_and_the_others_go_on():
    m = model()
    b = Engine(m, max_batch=4, dtype="float32")
    exits = []
    long = b.generate([1, 2], Draw(seed=1), 10_000)
    first = [next(long).token for _ in range(3)]
    long.close()  # the reader goes away: the row is cancelled
    (ids, draw, n), gone = requests(1)[0], threading.Event()
    row = b.submit([3], Draw(seed=2), 10_000, lambda item: None, Ask(on_exit=lambda: (exits.append(1), gone.set())))
    row.cancel()
    assert gone.wait(5) and exits == [1]  # on_exit ran once for the cancelled row
    assert [s.token for s in b.generate(ids, draw, n)] == alone(m, ids, draw, n)
    assert first == alone(m, [1, 2], Draw(seed=1), 3)
    assert not b.rows
    b.close(wait=5)


def test_a_failing_reader_and_the_time_limit_end_only_their_row():
    m = model()
    b = Engine(m, max_batch=4, dtype="float32")
    failed = threading.Event()

    def broken(item):
        if item is not None and not isinstance(item, Exception):
            raise RuntimeError("the reader is gone")
        failed.set()

    b.submit([1], Draw(seed=3), 50, broken)
    with pytest.raises(TimeoutError, match="time limit"):
        list(itertools.islice(timed(b), 10_000))
    (ids, draw, n) = requests(1)[0]
    assert [s.token for s in b.generate(ids, draw, n)] == alone(m, ids, draw, n)
    assert failed.wait(5)
    b.close(wait=5)


def timed(b: Engine):
    """A generation that cannot finish within its time limit of 0.05 s."""
    import queue

    steps: queue.Queue = queue.Queue()
    b.submit([1, 2, 3], Draw(seed=4), 10**9, steps.put, Ask(seconds=0.05))
    while (item := steps.get(timeout=10)) is not None:
        if isinstance(item, Exception):
            raise item
        yield item


def test_logprobs_are_the_model_s_own():
    m = model()
    b = Engine(m, max_batch=2, dtype="float32")
    ids = [1, 2, 3]
    steps = list(b.generate(ids, Draw(seed=5), 6, logprobs=3))
    tokens = [s.token for s in steps]
    with torch.no_grad():
        lp = torch.log_softmax(m(torch.tensor([ids + tokens]))[0].float(), -1)  # (T, V)
    for t, s in enumerate(steps):
        row = lp[len(ids) - 1 + t]
        assert s.logprob == pytest.approx(float(row[s.token]), abs=1e-4)
        assert [i for i, _ in s.top] == row.topk(3).indices.tolist()
    b.close(wait=5)


def test_the_calibrated_tolerance_is_small_and_finds_a_broken_step(monkeypatch):
    """The tolerance measures the batched step against lone ones: tiny for a correct step (float
    rounding), large when the step computes something else (here: every row at position 0)."""
    m = model(positions="rope")
    b = Engine(m, max_batch=4, dtype="float32")
    with torch.no_grad():
        assert batching.FLOOR <= b.calibrate() < 1e-3
        begin = b.slots.table.begin
        monkeypatch.setattr(b.slots.table, "begin", lambda rows: begin(rows) * 0)  # positions all 0
        assert b.calibrate() > 1e-2
