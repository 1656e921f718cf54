"""Speculative decoding (decoding/speculate.py): drafts checked in one pass give a greedy row the tokens
of plain decoding (across jumps past the context, a stop or the length inside the drafts) and a sampled
row the same distribution (the rejection rule, chi-square tests); drafting backs off where it fails."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from attnlab import load
from attnlab.cli.main import main
from attnlab.decoding import speculate
from attnlab.decoding.adapters import LMDecoder
from attnlab.decoding.drafts import PromptLookup, use_draft
from attnlab.decoding.draw import Draw
from attnlab.decoding.engine import Engine
from attnlab.decoding.rows import Ask
from attnlab.decoding.sampling import read_in_turn, stream_text
from attnlab.decoding.speculate import Rate, Speculate, accept, best_length, measure
from attnlab.errors import AttnlabError
from attnlab.models.gpt import GPT
from tests.conftest import TEXT, cli_lm, nano_flags, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

PROMPTS = ["def add(a, b):\n    return", "class Point:\n    def __init__(self, x, y):\n", "self.x = x\n", "zq"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 2-layer character LM trained on TEXT and a 1-layer draft trained on the same text."""
    root = tmp_path_factory.mktemp("speculate")
    lm = cli_lm(root, [*nano_flags(2, 2, 150), "--warmup-steps", "10"], TEXT * 40, name="lm")
    draft = cli_lm(root, [*nano_flags(1, 2, 30), "--warmup-steps", "10"], TEXT * 40, name="draft")
    return lm, draft


@pytest.fixture(scope="module")
def paired(runs):
    run, draft = load(runs[0], "cpu"), load(runs[1], "cpu")
    use_draft(run.model, draft.model, "float32", tokenizers=(run.tokenizer, draft.tokenizer))
    return run


def tokens(engine: Engine, ids: list[int], n: int, temperature: float = 0.0, seed: int = 0, **ask) -> list[int]:
    return [step.token for step in engine.generate(ids, Draw(temperature, seed=seed), n, **ask)]


@pytest.mark.parametrize("mode", ["prompt", "draft", "auto"])
def test_greedy_rows_get_the_tokens_of_plain_decoding(paired, mode):
    """Four prompts, 80 tokens each through a context of 32 (two jumps ahead), drafts always taken."""
    engine = Engine(paired.model, dtype="float32")
    for prompt in PROMPTS:
        ids = paired.tokenizer.encode(prompt)
        plain = tokens(engine, ids, 80)
        assert tokens(engine, ids, 80, speculate=Speculate(mode, 4, backoff=False)) == plain, prompt
    assert engine.stats["accepted"] > 40, dict(engine.stats)  # drafts were kept, many of them
    assert engine.stats["accepted"] < engine.stats["drafted"], dict(engine.stats)  # ...and some refused


def test_a_speculating_row_joins_a_batch_and_leaves_it(paired):
    """A speculating greedy row, then a second row read in turn with it (the two step batched), which
    ends first: both get the tokens they get alone."""
    engine = Engine(paired.model, dtype="float32")
    a, b = (paired.tokenizer.encode(p) for p in PROMPTS[:2])
    plain_a, plain_b = tokens(engine, a, 70), tokens(engine, b, 20)
    fast = engine.generate(a, Draw(0.0), 70, speculate=Speculate("auto", 4, backoff=False))
    first = [next(fast).token for _ in range(10)]  # alone: drafts
    other = engine.generate(b, Draw(0.0), 20)
    both = read_in_turn([fast, other])
    assert first + [s.token for s in both[0]] == plain_a
    assert [s.token for s in both[1]] == plain_b
    assert engine.stats["batched rows"] > 0 and engine.stats["accepted"] > 0, dict(engine.stats)


def test_the_length_ends_inside_the_drafts(paired):
    """max_tokens 1..12: each a prefix of the plain tokens, never a token more."""
    engine = Engine(paired.model, dtype="float32")
    ids = paired.tokenizer.encode(TEXT[:40])
    plain = tokens(engine, ids, 12)
    for n in range(1, 13):
        assert tokens(engine, ids, n, speculate=Speculate("auto", 6, backoff=False)) == plain[:n]


def test_a_stop_text_inside_accepted_drafts_ends_the_text_where_plain_decoding_does(paired):
    prompt, kw = TEXT[:30], {"max_new_tokens": 60, "temperature": 0.0, "dtype": "float32"}
    plain = "".join(stream_text(paired.model, paired.tokenizer, prompt, **kw))
    stop = plain[20:23]  # text the model copies from the prompt: inside a run of kept drafts
    cut = "".join(stream_text(paired.model, paired.tokenizer, prompt, stop=stop, **kw))
    fast = "".join(stream_text(paired.model, paired.tokenizer, prompt, stop=stop, speculate="prompt", **kw))
    assert fast == cut == plain[: plain.index(stop)]


def test_logprobs_come_with_every_kept_draft(paired):
    engine = Engine(paired.model, dtype="float32")
    ids = paired.tokenizer.encode(TEXT[:40])
    plain = list(engine.generate(ids, Draw(0.0), 30, logprobs=2))
    fast = list(engine.generate(ids, Draw(0.0), 30, logprobs=2, speculate=Speculate("auto", 4, backoff=False)))
    assert [s.token for s in fast] == [s.token for s in plain]
    assert engine.stats["accepted"] > 10, dict(engine.stats)
    for a, b in zip(fast, plain):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [t for t, _ in a.top] == [t for t, _ in b.top]


def test_the_rejection_rule_draws_from_the_model_distribution():
    """accept() on fixed logits, a point-mass draft (prompt lookup) and drafts drawn from a distribution
    q: the first and second tokens it hands over follow p (chi-square, 6 tokens, 20,000 draws each)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, generator=g) * 1.5  # (k + 1, V), k = 2
    draw = Draw(0.9, seed=0)
    p = torch.softmax(logits / 0.9, -1)
    q = torch.softmax(torch.randn(2, 6, generator=g), -1)
    for qs in (None, q):
        gen = torch.Generator().manual_seed(1)
        first, second = torch.zeros(6), torch.zeros(6)
        for _ in range(20000):
            drafts = [2, 4] if qs is None else torch.multinomial(qs, 1, generator=gen)[:, 0].tolist()  # x ~ q
            kept, token = accept(logits, drafts, qs, draw, gen, None)
            out = drafts[:kept] + [token]
            first[out[0]] += 1
            if len(out) > 1 and out[0] == drafts[0]:  # the second token, given the first draft kept
                second[out[1]] += 1
        for counts, probs in ((first, p[0]), (second, p[1])):
            expected = probs.double() / probs.double().sum() * counts.sum()
            assert stats.chisquare(counts.double().numpy(), expected.numpy()).pvalue > 1e-3, (counts, expected)


def test_sampled_rows_through_the_engine_draw_as_plain_ones():
    """Tokens 2 to 5 of 400 rows of an 8-token model, with and without a draft model's drafts (a
    perturbed copy: most drafts kept, some refused): one distribution (two-sample chi-square), though
    not the same tokens."""
    torch.manual_seed(0)
    model = GPT(tiny_model(vocab_size=8, context=32)).eval()
    draft = GPT(tiny_model(vocab_size=8, context=32)).eval()
    draft.load_state_dict(model.state_dict())
    with torch.no_grad():
        draft.head.weight.add_(0.02 * torch.randn_like(draft.head.weight))
    use_draft(model, draft, "float32")
    engine = Engine(model, dtype="float32")
    plain, fast = torch.zeros(4, 8), torch.zeros(4, 8)
    for seed in range(400):
        for table, ask in ((plain, {}), (fast, {"speculate": Speculate("draft", 3, backoff=False)})):
            torch.manual_seed(seed)  # unseeded rows (a seeded one never speculates): their seeds from torch's
            out = tokens(engine, [1, 2, 3, 4], 5, temperature=1.0, seed=None, **ask)
            for i, t in enumerate(out[1:]):
                table[i, t] += 1
    assert 0.3 * engine.stats["drafted"] < engine.stats["accepted"] < engine.stats["drafted"], dict(engine.stats)
    for i in range(4):
        seen = torch.stack([plain[i], fast[i]])
        seen = seen[:, seen.sum(0) > 0]
        assert stats.chi2_contingency(seen.numpy()).pvalue > 1e-3, seen


def test_drafting_backs_off_where_drafts_fail():
    """best_length: no drafts at a low acceptance rate, several at a high one; a rate that fell fades
    back towards the prior, so drafting is tried again later."""
    costs = [1.0, 1.3, 1.4, 1.5, 1.6]
    assert best_length(0.1, costs, 4, 0.0) == 0
    assert best_length(0.9, costs, 4, 0.0) == 4
    assert best_length(0.9, costs, 4, 1.0) == 0  # a draft model as slow as the model never pays
    rate = Rate()
    for _ in range(20):
        rate.add(4, 0)
    assert rate.value < 0.2
    for _ in range(100):
        rate.fade()
    assert rate.value > 0.4


def test_pass_costs_are_measured_for_every_draft_length():
    """costs[0] a plain step, costs[k] a pass over k + 1 tokens: positive, a longer pass never cheaper."""
    decoder = LMDecoder(GPT(tiny_model(vocab_size=50, context=32)).eval(), "float32")
    with torch.inference_mode():
        costs = measure(decoder, most=4, repeats=2)
    assert len(costs) == 5 and all(c > 0 for c in costs)
    assert costs[1:] == sorted(costs[1:])


def test_open_ended_text_drafts_little():
    """An untrained model's text rarely repeats its prompt: with back-off, few passes draft at all."""
    torch.manual_seed(0)
    model = GPT(tiny_model(vocab_size=64, context=64)).eval()
    engine = Engine(model, dtype="float32")
    plain = tokens(engine, list(range(10, 30)), 40, temperature=1.0, seed=3)
    assert len(plain) == 40
    fast = tokens(engine, list(range(10, 30)), 40, temperature=1.0, seed=3, speculate=Speculate("prompt", 4))
    assert len(fast) == 40 and engine.stats["verify passes"] < 20, dict(engine.stats)


def test_prompt_lookup_proposes_what_followed_the_latest_match():
    lookup = PromptLookup()
    window = [5, 6, 7, 8, 9, 5, 6, 7, 1, 2, 6, 7]
    assert lookup.propose(window, 3) == [1, 2, 6]  # (6, 7) last ended before 1
    window += [1]
    assert lookup.propose(window, 2) == [2, 6]  # (6, 7, 1): the trigram
    assert lookup.propose([4, 3, 2], 3) == []  # a new window: nothing repeats
    assert lookup.propose([4, 7, 0, 0, 0], 3) == [0, 0, 0]  # a copy that reads itself: a run goes on
    assert lookup.propose([1, 2, 1, 2], 3) == [1, 2, 1]


def test_a_draft_model_needs_the_same_vocabulary():
    model, draft = GPT(tiny_model(vocab_size=50)), GPT(tiny_model(vocab_size=60))
    with pytest.raises(AttnlabError, match="vocabulary"):
        use_draft(model, draft)


def test_sample_speculates_from_the_command_line(runs, capsys):
    """`attnlab sample --speculate draft --draft RUN`: the greedy text of plain sampling; --speculate
    draft without a draft run is one line."""
    lm, draft = map(str, runs)
    common = [lm, "--prompt", "def add", "--temperature", "0", "--max-new-tokens", "40", "--device", "cpu"]
    assert main(["sample", *common]) == 0
    plain = capsys.readouterr().out
    assert main(["sample", *common, "--speculate", "draft", "--draft", draft, "--draft-tokens", "3"]) == 0
    assert capsys.readouterr().out == plain
    assert main(["sample", *common, "--speculate", "draft"]) != 0
    assert "--draft RUN" in capsys.readouterr().err


def test_v1_completions_speculate_when_the_server_says_so(runs, monkeypatch):
    """`attnlab serve --speculate auto --draft RUN`: a greedy /v1 completion is the text served without
    it, its drafts verified."""
    httpx = pytest.importorskip("httpx", reason="httpx, the client here, is a dev extra: pip install -e .[dev]")
    from attnlab.serve.app import create_app, running  # fastapi: the server's extra
    from attnlab.serve.guard import Limits

    passes = []
    monkeypatch.setattr(speculate, "accept", lambda *a: passes.append(1) or accept(*a))

    body = {"model": "lm", "prompt": TEXT[:30], "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    texts = []
    for limits in (Limits(), Limits(speculate=Speculate("auto", 4, backoff=False), draft=str(runs[1]))):
        with running(create_app([runs[0]], limits=limits)) as url:
            texts.append(httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"])
    assert texts[0] == texts[1] and len(texts[0]) > 10
    assert len(passes) > 3


def test_serve_options_pair_speculate_draft_with_a_draft_run():
    from attnlab.cli.options import ServeOptions

    with pytest.raises(ValueError, match="--draft RUN"):
        ServeOptions(runs=["lm"], speculate="draft")
    with pytest.raises(ValueError, match="--draft RUN"):
        ServeOptions(runs=["lm"], draft="small")
    assert ServeOptions(runs=["lm"], speculate="auto", draft="small").draft_tokens == 4


@pytest.mark.parametrize("mode", ["prompt", "draft"])
def test_greedy_rows_on_the_compiled_path_get_the_tokens_of_plain_decoding(runs, compiled_steps, monkeypatch, mode):
    """The default path: the lone row's step and its verify pass compiled ahead of time (the draft model's
    too), the pass's costs measured through them; the tokens are plain decoding's."""
    from attnlab.decoding import compiled

    monkeypatch.setattr(compiled, "EXPORT", True)  # compiled_steps turns the ahead-of-time steps off
    run, draft = load(runs[0], "cpu"), load(runs[1], "cpu")
    use_draft(run.model, draft.model, "float32", compiled=True)
    engine = Engine(run.model, dtype="float32", compiled=True)
    for prompt in PROMPTS[:2]:
        ids = run.tokenizer.encode(prompt)
        plain = tokens(Engine(run.model, dtype="float32"), ids, 60)
        assert tokens(engine, ids, 60, speculate=Speculate(mode, 4, backoff=False)) == plain, prompt
    verify = engine.decoder.compiled_verify
    assert verify.exported is not None, verify.failed
    assert compiled_steps and engine.stats["accepted"] > 20, dict(engine.stats)
    costs = speculate.costs_of(engine.decoder)  # the compiled pass over 2 tokens costs less than 3 steps
    assert costs[1] < 3 * costs[0], costs


def test_a_cancelled_speculating_row_leaves_the_others_their_tokens():
    """Two rows decoded alone (batching off, as on a device without exact batched draws), both
    speculating; the first is cancelled mid-way: the second still gets plain decoding's tokens (it
    was skipped once when the first left the list being walked, and drew token -1)."""
    torch.manual_seed(0)
    m = GPT(tiny_model(context=64, vocab_size=16)).eval()  # its greedy text repeats: drafts are kept
    ids = [1, 2, 3, 4] * 4
    want = tokens(Engine(m, dtype="float32"), ids[::-1], 20)
    e = Engine(m, dtype="float32")
    e._prepared, e.batched = True, False
    got: dict[str, list] = {"a": [], "b": []}
    ask = dict(speculate=Speculate("prompt", 4, backoff=False))
    a = e.submit(ids, Draw(0.0), 20, got["a"].append, Ask(**ask), start=False)
    e.submit(ids[::-1], Draw(0.0), 20, got["b"].append, Ask(**ask), start=False)
    for turn in range(40):
        if turn == 3:
            a.cancel()
        e._step_once()
    assert got["b"][-1] is None and [s.token for s in got["b"][:-1]] == want


def test_seeded_sampled_rows_and_bf16_rows_do_not_speculate():
    """A seed promises its tokens whatever else the server runs, and drafts would draw others; bf16's
    verify passes round apart from its steps (found: greedy text changed at token 36 of 60): neither
    drafts, so each gets exactly plain decoding's tokens."""
    torch.manual_seed(0)
    m = GPT(tiny_model(context=64, vocab_size=16)).eval()
    ids, ask = [1, 2, 3, 4] * 4, dict(speculate=Speculate("prompt", 4, backoff=False))
    seeded = Engine(m, dtype="float32")
    assert tokens(seeded, ids, 30, 1.0, seed=5, **ask) == tokens(seeded, ids, 30, 1.0, seed=5)
    half = Engine(m, dtype="bfloat16")
    assert tokens(half, ids, 30, **ask) == tokens(half, ids, 30)
    assert seeded.stats["verify passes"] == half.stats["verify passes"] == 0
