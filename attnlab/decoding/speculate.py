"""Speculative decoding: a row decoded alone drafts k tokens cheaply, the model checks them all in one
forward pass, and every draft it agrees with is a token gained (Leviathan et al. 2023; Chen et al. 2023).

Legend: V vocabulary, k tokens drafted, n the row's window length, C the model's context.

A row asks for it (rows.Ask.speculate: a Speculate) and the engine does it, in its step for a row on
its own state (engine.py `_step`): `speculated` takes that step instead of the one-token one.

    draft      prompt lookup or a draft model (drafts.py); `auto`: prompt lookup where the window has
               a match, else the draft model if the served model has one (drafts.use_draft)
    verify     [newest token, d1..dk] fed at the row's position in one pass: the k + 1 next-token
               logits (adapters.LMDecoder.verify: compiled ahead of time where the row's one-token
               steps are, compiled_verify.py, about two steps' cost for 4 drafts; else the eager forward)
    accept     greedy: drafts while they are the argmax; sampled: the rejection rule, d_i kept with
               probability min(1, p(d_i) / q(d_i)), else a token drawn from norm(max(0, p - q)) (prompt
               lookup's q is a point mass: p without d_i); all kept: one more drawn from the last p.
               So a sampled row draws from the distribution it draws from without drafts (not the
               same tokens), and a greedy row gets the same tokens
    roll back  the caches cut to the kept positions (they are indexed by position: later writes go
               over the rest); the kept drafts handed over one by one, the last token left to the
               engine as a row's sure draw (rows.Row.sure) with its logits, so a stop, the length
               or a jump ahead past the context happen where they happen without drafts
    back off   each row's acceptance rate a (a decaying count) and the cost of verifying k drafts
               against one plain step, measured once per decoder: k drafts pay when the expected
               tokens a pass, (1 - a^(k+1)) / (1 - a), beat that cost; otherwise the row takes plain
               steps, while its count decays back towards the prior, which probes again later

Greedy rows stay token-identical although a pass over k + 1 tokens rounds differently from one-token
steps: a greedy draw stands only where the best logit leads the next by more than the engine's
tolerance allows (exact.py's rule); in doubt, the row's caches are rebuilt alone as the engine's
replay does, and the token is drawn from those exact logits.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.decoding.adapters import LMDecoder
from attnlab.decoding.drafts import DraftModel, PromptLookup, draft_of
from attnlab.decoding.draw import Draw, filter_logits
from attnlab.decoding.exact import FLOOR, greedy
from attnlab.errors import AttnlabError

MODES = ("off", "prompt", "draft", "auto")
DECAY = 0.9  # a row's acceptance counts fade by this each pass: about the last ten count
FORGET = 0.97  # ...and by this each plain step while backed off, back to the prior (a later probe)
PRIOR = 0.75  # the acceptance rate a row's drafter is credited with before it has drafted
MARGIN = 1.05  # drafts must beat a plain step by this much, for the measurement's noise


@dataclass
class Speculate:
    """What a row asks: `mode` prompt, draft or auto (module docstring), up to `tokens` drafts a pass;
    backoff=False drafts whenever it can (tests, measurements)."""

    mode: str = "auto"
    tokens: int = 4
    backoff: bool = True

    def __post_init__(self):
        if self.mode not in MODES[1:]:
            raise ValueError(f"speculate must be one of {', '.join(MODES[1:])}, got {self.mode!r}")
        if self.tokens < 1:
            raise ValueError(f"draft tokens must be at least 1, got {self.tokens}")

    def start(self) -> Drafting:
        return Drafting(self)


def speculation(mode: str, tokens: int = 4) -> Speculate | None:
    """The ask of a command's --speculate and --draft-tokens: None for off."""
    return None if mode == "off" else Speculate(mode, tokens)


class Rate:
    """A decaying count of drafts kept and drafts tried, over a prior of PRIOR kept, worth two drafts:
    hopeful, so that a drafter is tried at all (at one in two a draft model's drafts never looked
    worth a pass, so nothing was ever learnt of them)."""

    def __init__(self):
        self.kept, self.tried = 0.0, 0.0

    @property
    def value(self) -> float:
        return (self.kept + 2 * PRIOR) / (self.tried + 2)

    def add(self, drafted: int, kept: int) -> None:
        """One pass: `kept` of `drafted` (the first rejected one ends the count)."""
        self.kept = DECAY * self.kept + kept
        self.tried = DECAY * self.tried + kept + (kept < drafted)

    def fade(self) -> None:
        self.kept, self.tried = FORGET * self.kept, FORGET * self.tried


class Drafting:
    """One row's speculation: what it asked, its drafters and how well each does."""

    def __init__(self, ask: Speculate):
        self.ask = ask
        self.lookup = PromptLookup()
        self.model: DraftModel | None = None
        self.rates = {"prompt": Rate(), "draft": Rate()}
        self.drifted: object = None  # the caches a verify pass wrote (not as one-token steps write them)

    def propose(self, row, decoder, room: int) -> tuple[str, list[int], Tensor | None]:
        """(source, drafts, their q or None) for this step; no drafts where none pays (back-off)."""
        costs = costs_of(decoder)
        mode = self.ask.mode
        if self.ask.backoff and not best_length(1.0, costs, room, 0.0):  # not even drafts all kept would pay
            return mode, [], None
        if mode in ("prompt", "auto"):
            drafts = self.lookup.propose(row.window, room)
            k = self._worth("prompt", costs, len(drafts), 0.0)
            if k:
                return "prompt", drafts[:k], None
            if mode == "prompt":
                return "prompt", [], None
        draft = draft_of(decoder.model)
        if draft is None:
            if mode == "draft":
                raise AttnlabError("--speculate draft needs a draft model: give --draft RUN")
            return "draft", [], None
        k = self._worth("draft", costs, room, costs_of(draft)[0] / costs[0] if costs[0] else 1.0)
        if not k:
            return "draft", [], None
        if self.model is None:
            self.model = DraftModel(draft)
        drafts, q = self.model.propose(row.window, k, row.draw, row.generator)
        return "draft", drafts, q

    def _worth(self, source: str, costs: list[float], most: int, per_draft: float) -> int:
        """How many drafts pay best (0: none) at this source's acceptance rate."""
        if not self.ask.backoff:
            return most
        rate = self.rates[source]
        k = best_length(rate.value, costs, most, per_draft)
        if not k and most:
            rate.fade()
        return k


def best_length(a: float, costs: list[float], most: int, per_draft: float) -> int:
    """The k of at most `most` with the most expected tokens per unit of cost, if that beats a plain
    step by MARGIN (else 0); costs[k]: a pass over k + 1 tokens, costs[0] the plain step's."""
    best, gain = 0, MARGIN
    for k in range(1, min(most, len(costs) - 1) + 1):
        tokens = (1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1
        g = tokens * costs[0] / (costs[k] + k * per_draft * costs[0])
        if g > gain:
            best, gain = k, g
    return best


def speculated(engine, row) -> bool:
    """The row's step taken here (engine.py `_step`, a row alone on its own state): drafts verified in
    one pass, the kept ones handed over, the next token left as row.sure with its logits in row.exact;
    or a greedy row's step checked after a verify pass. False: the engine takes its plain step."""
    spec, decoder = row.spec, engine.decoder
    if spec is None or row.ask.attention or row.hooks or row.matcher is not None or not isinstance(decoder, LMDecoder):
        return False
    greedy = row.draw.temperature <= 0
    if not greedy and row.draw.seed is not None:  # a seed's tokens are a promise; drafts draw other ones
        return False
    if decoder.precision != torch.float32:  # bf16's passes round apart from its steps by more than the
        return False  # greedy check's floor, and a lone row's engine has no measured tolerance
    n = len(row.window)
    room = min(spec.ask.tokens, decoder.context - n, row.left - 1)  # no jump ahead, no token past the length
    source, drafts, q = spec.propose(row, decoder, room) if room > 0 else ("prompt", [], None)
    if not drafts:
        if not (greedy and spec.drifted is row.state):
            return False
        engine._alone(row, row.window[-1:], n - 1)
        if not _certain(row.exact.float(), engine.tolerance)[0]:
            _rebuild(engine, row)
        return True
    fed = [row.window[-1], *drafts]
    logits = decoder.verify(row.state, fed, n - 1).float()  # (k + 1, V)
    sure = _certain(logits, engine.tolerance) if greedy else None
    kept, token = accept(logits, drafts, q, row.draw, row.generator, sure)
    spec.rates[source].add(len(drafts), kept)
    engine.stats["verify passes"] += 1
    engine.stats["drafted"] += len(drafts)
    engine.stats["accepted"] += kept
    decoder.rollback(row.state, n + kept, fed[kept])
    spec.drifted = row.state
    for i in range(kept):
        engine._advance(row, drafts[i], logits[i : i + 1])
        if row.state is None:  # done (its length, a reader gone)
            return True
    if token is None:  # a greedy draw in doubt: the lone logits decide it
        engine.stats["speculative replays"] += 1
        _rebuild(engine, row)
    else:
        row.exact, row.sure = logits[kept : kept + 1], token
    return True


def accept(
    logits: Tensor, drafts: list[int], q: Tensor | None, draw: Draw, generator: torch.Generator, sure: Tensor | None
) -> tuple[int, int | None]:
    """(how many drafts are kept, the token after them) from the verify pass's logits (k + 1, V). q: the
    draft's distributions (k, V), None for a point mass (prompt lookup); sure (greedy, (k + 1,)):
    whether each position's argmax is certain; the token is None where the first uncertain one is."""
    k = len(drafts)
    if draw.temperature <= 0:
        tokens = logits.argmax(-1).tolist()
        for i in range(k + 1):
            if not sure[i]:
                return i, None
            if i == k or tokens[i] != drafts[i]:
                return i, tokens[i]
    p = torch.softmax(filter_logits(logits / draw.temperature, draw.top_k, draw.top_p), -1)  # (k + 1, V)
    for i, x in enumerate(drafts):
        qx = 1.0 if q is None else float(q[i, x])
        if float(torch.rand((), generator=generator, device=p.device)) * qx < float(p[i, x]):
            continue  # kept with probability min(1, p / q)
        rest = p[i].clone()
        if q is None:
            rest[x] = 0.0
        else:
            rest = (rest - q[i].to(rest)).clamp(min=0.0)
        if float(rest.sum()) <= 0.0:  # p == q: a rejection had probability 0 (rounding): draw from p
            rest = p[i]
        return i, int(torch.multinomial(rest / rest.sum(), 1, generator=generator))
    return k, int(torch.multinomial(p[k], 1, generator=generator))


def _certain(logits: Tensor, tolerance: float | None) -> Tensor:
    """(T,) whether each row's best logit leads the next by more than twice the bound on how far the
    lone logits may lie (exact.py's greedy rule)."""
    delta = max(tolerance or 0.0, FLOOR) * (1 + logits.abs().nan_to_num(posinf=0.0).amax(-1))
    return greedy(logits, delta)[1]


def _rebuild(engine, row) -> None:
    """The row's caches alone, as one-token steps write them from its last refill (engine._replay's
    rebuild): its next logits (row.exact) are then exactly the lone ones."""
    engine._rebuilt(row)
    row.sure = None


# ---- what a pass costs ------------------------------------------------------------------------------

_COSTS: weakref.WeakKeyDictionary[LMDecoder, list[float]] = weakref.WeakKeyDictionary()
MOST = 8  # verify passes measured up to this many drafts


def costs_of(decoder: LMDecoder) -> list[float]:
    """Seconds of a plain one-token step (costs[0]) and of a verify pass over k + 1 tokens (costs[k]),
    measured once per decoder on a short sequence, through the step and pass its rows take (compiled
    where the decoder is)."""
    if decoder not in _COSTS:
        _COSTS[decoder] = measure(decoder)
    return _COSTS[decoder]


def measure(decoder: LMDecoder, most: int = MOST, repeats: int = 9) -> list[float]:
    """costs_of's measurement: `repeats` rounds, each timing every pass once in turn at the same position
    (rolled back), so that a neighbour's burst falls on all of them alike; each pass's fastest time (a
    burst only ever slows), and a pass never dearer than a longer one (it does no more work)."""
    most = min(most, decoder.context // 2 - 1)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(decoder.vocab, (min(16, decoder.context // 2),), generator=g).tolist()
    state = decoder.start(None)
    decoder.feed(state, prompt, 0)
    n = len(prompt)
    passes = [lambda: decoder.feed(state, prompt[-1:], n)]
    passes += [lambda k=k: decoder.verify(state, prompt[-1:] * (k + 1), n) for k in range(1, most + 1)]
    costs = [float("inf")] * len(passes)
    # One thread: its CPU time, which a busy machine's other processes do not lengthen (its wall time
    # does: docs/serving.md, "Speculative decoding"); several: the wall time (their waits are the cost).
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    for round_ in range(repeats + 1):  # the first round warms up (a compiled step may compile there)
        for k, call in enumerate(passes):
            begin = clock()
            call()
            if round_:
                costs[k] = min(costs[k], clock() - begin)
            decoder.rollback(state, n, prompt[-1])
    for k in range(most - 1, 0, -1):
        costs[k] = min(costs[k], costs[k + 1])
    return costs
