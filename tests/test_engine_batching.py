"""When the engine (decoding/engine.py) builds its batched step: only once a second row could share
it, so that a lone generation (`attnlab sample` with one sample) pays for no batched step, no
calibration and no key/value table."""

from __future__ import annotations

import pytest

from attnlab.decoding.adapters import LMDecoder
from attnlab.decoding.draw import Draw
from attnlab.decoding.engine import Engine
from tests.test_serve_batching import alone, concurrently, model, requests

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py


@pytest.fixture
def counted(monkeypatch):
    """How often the batched step runs and the engine calibrates."""
    calls = {"feed_slots": 0, "calibrate": 0}
    feed_slots, calibrate = LMDecoder.feed_slots, Engine.calibrate

    def counting(name, real):
        def call(*a, **kw):
            calls[name] += 1
            return real(*a, **kw)

        return call

    monkeypatch.setattr(LMDecoder, "feed_slots", counting("feed_slots", feed_slots))
    monkeypatch.setattr(Engine, "calibrate", counting("calibrate", calibrate))
    return calls


def test_one_row_builds_no_batched_step(counted):
    m = model()
    engine = Engine(m, max_batch=4, dtype="float32")
    ids, draw, n = requests(3)[2]
    assert [s.token for s in engine.generate(ids, draw, n)] == alone(m, ids, draw, n)
    assert [s.token for s in engine.generate([1, 2], Draw(seed=7), 5)] == alone(m, [1, 2], Draw(seed=7), 5)
    assert counted == {"feed_slots": 0, "calibrate": 0}
    assert engine.slots.bytes() == 0 and engine.tolerance is None  # no table allocated


def test_a_second_row_builds_it_once_and_warm_builds_it_before(counted):
    m, reqs = model(), requests(4)
    engine = Engine(m, max_batch=4, dtype="float32")
    assert concurrently(engine, reqs) == [alone(m, *r) for r in reqs]
    assert counted["calibrate"] == 1 and counted["feed_slots"] > 1 and engine.slots.bytes() > 0
    engine.close(wait=5)
    warmed = Engine(m, max_batch=4, dtype="float32")
    warmed.warm()  # a server, before it listens
    assert counted["calibrate"] == 2 and warmed.tolerance is not None
