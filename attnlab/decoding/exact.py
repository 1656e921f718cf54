"""Drawing from a batch's logits the tokens a lone request draws, or saying when that is in doubt.

Legend: B rows, V vocabulary, z a row's logits, T its temperature.

A matrix product over B rows rounds differently from the same product over one row (BLAS
libraries pick other kernels by shape), so the logits a row gets in a batch differ from those
it gets alone by a few units in the last place. A draw uses them only through comparisons, so it
is the lone request's draw unless two of its candidates are closer than that difference. Given a
bound delta on |z_batch - z_alone| (`tolerance` x (1 + max |z|), calibrated by the engine),
each row's draw is accepted when no logits within delta could change it:

- greedy (T = 0): the best logit leads the second by more than 2 delta;
- sampling: next_tokens draws with torch.multinomial, which (one sample) takes
  argmax_i p_i / q_i with q ~ Exp(1) drawn from the row's generator, V of them whatever p is.
  The same q are drawn here from the same generator, so it ends where multinomial leaves it, and
  the winner must beat the runner-up's p / q by more than exp(2 delta / T); the top-k boundary
  (k-th against (k+1)-th logit) and the top-p boundary (the mass before the first dropped token,
  and the order of the tokens on either side of it) must also be further than the bound can move.

A row in doubt gets None, and its generator is put back as it was; the engine then computes its
logits exactly as a lone request does and draws from them with next_tokens.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Sequence

import torch
from torch import Tensor

from attnlab.decoding.draw import Draw, constrained, filter_logits, next_tokens
from attnlab.decoding.prefill import prefill_gap
from attnlab.decoding.rows import Row

ROUNDING = 1e-6  # the draw's own float32 arithmetic (softmax, division, logs): a slack on log p / q
ULP = 1.2e-7  # float32 rounding of one term of a sum of probabilities
REPLAYS = 2  # a row in doubt this often finishes alone
SAFETY = 32.0  # the engine's tolerance is this many times the largest difference measured
FLOOR = 1e-6  # and never below this (relative to 1 + the largest logit)


def certain_draws(
    logits: Tensor, draws: Sequence[Draw], generators: Sequence[torch.Generator], tolerance: float
) -> list[int | None]:
    """Each row's token from batched logits (B, V), or None where a lone request might draw another."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, d in enumerate(draws):  # rows with the same settings are checked as one batch
        groups[d.temperature, d.top_k, d.top_p].append(i)
    out: list[int | None] = [None] * len(draws)
    for (temperature, top_k, top_p), rows in groups.items():
        z = logits[torch.tensor(rows, device=logits.device)]  # (b, V)
        # (b,) the bound on |z_batch - z_alone|; a structured output's -inf (masked, the same both ways) left out
        delta = tolerance * (1 + z.float().abs().nan_to_num(posinf=0.0).amax(-1))
        if temperature <= 0:
            tokens, sure = greedy(z, delta)
        else:
            gens = [generators[i] for i in rows]
            states = [g.get_state() for g in gens]
            q = torch.cat([torch.empty(1, z.shape[-1], device=z.device).exponential_(1, generator=g) for g in gens])
            tokens, sure = sampled(z.float() / temperature, q, delta / temperature, top_k, top_p)
            for g, state, ok in zip(gens, states, sure.tolist()):
                if not ok:  # the exact draw will make the same q again
                    g.set_state(state)
        for i, token, ok in zip(rows, tokens.tolist(), sure.tolist()):
            out[i] = token if ok else None
    return out


def greedy(z: Tensor, delta: Tensor) -> tuple[Tensor, Tensor]:
    """argmax of each row (as next_tokens takes it) and whether it leads the rest by more than 2 delta."""
    tokens = torch.argmax(z, dim=-1)
    if z.shape[-1] < 2:
        return tokens, torch.ones_like(tokens, dtype=torch.bool)
    top = z.float().topk(2, dim=-1).values  # (b, 2)
    return tokens, top[:, 0] - top[:, 1] > 2 * delta


def sampled(scaled: Tensor, q: Tensor, eps: Tensor, top_k: int | None, top_p: float | None) -> tuple[Tensor, Tensor]:
    """The multinomial draw of softmax(filter(scaled)) with exponentials q (b, V), and whether every
    scaled logits within eps (b,) of these draw it too.

    The winner w must stay kept by top-k and top-p, and beat by the margin every token that could be
    kept (in the top k, or before the top-p mass runs out, for some logits within eps): a token that
    may enter or leave the kept set changes the others' probabilities by a common factor only, which
    leaves their race p / q in the same order."""
    probs = torch.softmax(filter_logits(scaled, top_k, top_p), dim=-1)
    tokens = torch.argmax(probs / q, dim=-1)  # multinomial's own formula
    w = tokens[:, None]  # (b, 1)
    e = eps[:, None]
    logp = scaled - torch.logsumexp(filter_logits(scaled, top_k, None), -1, keepdim=True)  # as if kept by top-p
    maybe = torch.ones_like(scaled, dtype=torch.bool)  # may be kept, for logits within eps
    stays = torch.ones_like(tokens, dtype=torch.bool)  # the winner is kept for all of them
    shift = torch.zeros_like(eps)  # the most mass that tokens entering or leaving the top k move
    if top_k is not None and 0 < top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k + 1, dim=-1).values  # (b, k + 1)
        maybe &= scaled >= kth[:, top_k - 1 : top_k] - 2 * e
        stays &= scaled.gather(-1, w)[:, 0] - kth[:, top_k] > 2 * eps
        unsure = maybe & (scaled <= kth[:, top_k : top_k + 1] + 2 * e)  # on the boundary
        shift = torch.where(unsure, logp.exp(), 0).sum(-1)
    if top_p is not None and 0 < top_p < 1:
        nucleus, winner_kept = nucleus_bounds(logp, w, 4 * eps + shift, eps, top_p, maybe)
        maybe &= nucleus
        stays &= winner_kept
    race = logp - torch.log(q)  # log p / q, every token as if kept (a common shift changes no order)
    rivals = maybe & (race > race.gather(-1, w) - (2 * e + ROUNDING))
    rivals.scatter_(-1, w, False)
    return tokens, stays & ~rivals.any(-1)


def nucleus_bounds(
    logp: Tensor, w: Tensor, slack: Tensor, eps: Tensor, top_p: float, maybe: Tensor
) -> tuple[Tensor, Tensor]:
    """Top-p for logits within eps: (b, V) which tokens may be kept, and (b,) whether the winner w
    (b, 1) surely is. A token is kept while the mass of the tokens ranked above it is below top_p;
    each log-probability moves by at most 2 eps, so a token surely ranks above another when its
    log-probability leads by more than 4 eps, and may when it trails by less; masses move by at most
    `slack` (b,), plus the float sum's rounding (one unit in the last place per term)."""
    p = logp.exp()  # (b, V)
    e4 = 4 * eps[:, None]
    ranked = torch.sort(p, dim=-1).values  # ascending, (b, V)
    # The mass of the tokens surely above each token: the smallest "before" it can have.
    above = p.shape[-1] - torch.searchsorted(ranked, p * torch.exp(e4), right=True)  # how many
    cum = torch.cumsum(ranked.flip(-1), dim=-1)  # the largest first
    least = torch.where(above > 0, cum.gather(-1, (above - 1).clamp(min=0)), 0)
    nucleus = least - slack[:, None] - ULP * (above + 2) < top_p
    # The most mass that may rank above the winner: every token within 4 eps of it or above.
    near = maybe & (logp >= logp.gather(-1, w) - e4)
    near.scatter_(-1, w, False)
    most = (p * near).sum(-1) + slack + ULP * (near.sum(-1) + 2)
    return nucleus, most < top_p


def multinomial_is_a_race(device: torch.device, vocab: int = 50) -> bool:
    """Whether torch.multinomial draws one sample on `device` as exact.py reproduces it (argmax of
    p / q, q ~ Exp(1) from the same generator): true of torch's CPU and CUDA kernels; if a backend
    differs, the engine decodes every row alone rather than draw other tokens than a lone request."""
    g = torch.Generator().manual_seed(0)
    for seed in range(8):
        p = torch.softmax(torch.randn(1, vocab, generator=g) * 3, -1).to(device)
        a, b = torch.Generator(device=device).manual_seed(seed), torch.Generator(device=device).manual_seed(seed)
        drawn = torch.multinomial(p, 1, generator=a)[0, 0]
        raced = torch.argmax(p / torch.empty_like(p).exponential_(1, generator=b), dim=-1)[0]
        if int(drawn) != int(raced) or not torch.equal(a.get_state(), b.get_state()):
            return False
    return True


def calibrate(decoder, slots, rows: int = 4, steps: int = 6) -> float:
    """The largest difference between a batched step's logits and the same rows' lone ones (relative to
    1 + the largest logit), over `steps` steps of `rows` random sequences of different lengths: what
    the engine's tolerance is made from (decoder: adapters.LMDecoder, slots: its slots.Slots)."""
    steps = min(steps, decoder.context - 2)
    if steps < 1:
        return 0.0
    g = torch.Generator().manual_seed(0)
    lengths = [1 + (7 * i) % max(1, decoder.context - steps - 1) for i in range(rows)]
    alone = []
    for slot, n in enumerate(lengths):
        state = decoder.start(None)
        decoder.feed(state, torch.randint(decoder.vocab, (n,), generator=g).tolist(), 0)
        slots.put(slot, state)
        alone.append(state)
    worst = 0.0
    for _ in range(steps):
        ids = torch.randint(decoder.vocab, (rows, 1), generator=g)
        offsets = slots.table.begin(rows)
        batched = decoder.feed_slots(slots, ids.to(decoder.device), offsets).float()
        slots.table.end()
        for b, state in enumerate(alone):
            lone, _ = decoder.feed(state, ids[b].tolist(), state[0].length)
            lone = lone.float()
            worst = max(worst, float((batched[b] - lone[0]).abs().max()) / (1 + float(lone.abs().max())))
    slots.table.lengths = [0] * slots.table.slots
    slots.table.last = None
    return worst


class Exactness:
    """The engine's draws (engine.py inherits them): a batched row's token where certain_draws finds it
    sure, else its caches rebuilt alone (a replay) and its token drawn from the lone logits; and the
    tolerance those checks use (calibrate), measured once before rows are first batched (_prepare)."""

    def warm(self) -> None:
        """Prepare batching now, not when a second request arrives: a server calls it before it listens,
        so that compiling the decode steps (calibrate runs both) is paid at start, said on stderr."""
        with self._turns, torch.inference_mode():
            self._prepare()

    def _prepare(self) -> None:
        """Once, before rows are first batched: whether they can be exactly, and the tolerance. Until then
        (one row at a time: `attnlab sample`) the batched step is neither built nor compiled, its
        table not allocated."""
        if self._prepared:
            return
        self._prepared = True
        if self.batched:
            try:
                self.batched = multinomial_is_a_race(self.device)
                self.tolerance = self.calibrate()
            except Exception as e:  # a model the batched step cannot run: decode every row alone, exactly
                warnings.warn(f"attnlab: batching is off for this model ({type(e).__name__}: {e})", stacklevel=1)
                self.batched, self.tolerance = False, FLOOR

    def calibrate(self, rows: int = 4, steps: int = 6) -> float:
        """SAFETY x the largest difference between a batched step's logits and the same rows' lone ones
        (exact.calibrate, prefill.prefill_gap), never below FLOOR."""
        worst = calibrate(self.decoder, self.slots, min(rows, self.max_batch), steps)
        if self.filling is not None:
            worst = max(worst, prefill_gap(self.decoder, self.slots))
        return max(SAFETY * worst, FLOOR)

    def _draw_batched(self, logits: Tensor) -> dict[int, tuple[int, Tensor]]:
        """{id(row): (token, its logits)} for the slotted rows whose draw is sure; the others get their
        exact logits (a replay), drawn in _draw_exact."""
        live = [row for row in self.slotted if not row.cancelled]
        index = {id(row): i for i, row in enumerate(self.slotted)}  # before a replay moves any slot
        z = logits[[index[id(row)] for row in live]]  # (b, V)
        masked = constrained(z, [row.matcher for row in live])  # structured outputs: as _draw_exact masks
        picks = certain_draws(masked, [row.draw for row in live], [row.generator for row in live], self.tolerance)
        out = {}
        for i, (row, token) in enumerate(zip(live, picks)):
            if token is not None:
                out[id(row)] = (token, z[i : i + 1])
            else:
                self._replay(row, z[i : i + 1])
        return out

    def _draw_exact(self, row: Row) -> tuple[int, Tensor]:
        """The row's token from logits computed as alone, with next_tokens itself."""
        logits, row.exact = row.exact, None
        if logits is None:  # cancelled before its draw: nothing to draw
            return -1, logits
        if row.sure is not None:  # drawn when its prompt was prefilled in a batch (_prefill)
            token, row.sure = row.sure, None
            return token, logits
        d, logits = row.draw, self.decoder.mask(logits)
        drawn = constrained(logits, [row.matcher])  # the same mask as a batched draw's: the same token
        return int(next_tokens(drawn, d.temperature, d.top_k, d.top_p, row.generator)[0]), logits

    def _rebuilt(self, row: Row) -> None:
        """The row's caches alone, as stream_rows fed them since its last refill: its prompt (or refill)
        at once, then one token at a time; its next logits (row.exact) are then exactly the lone ones."""
        row.state = self.decoder.start(row.ask.source)
        self._alone(row, row.window[: row.base], 0)
        for j in range(row.base, len(row.window)):
            self._alone(row, row.window[j : j + 1], j)

    def _replay(self, row: Row, batched: Tensor) -> None:
        """Rebuild the row's caches alone, as stream_rows fed them since its last refill: its prompt (or
        refill) at once, then one token at a time; its next logits are then exactly the lone ones."""
        self._rebuilt(row)
        logits = row.exact
        seen = float((batched.float() - logits.float()).abs().max()) / (1 + float(logits.float().abs().max()))
        self.tolerance = max(self.tolerance, SAFETY * seen)  # a larger difference than calibrated: widen
        row.replays += 1
        self.stats["replays"] += 1
        if row.replays >= REPLAYS:  # in doubt too often: finish alone, from these exact caches
            self.seats.leave(row)
            row.solo = True
            self.stats["solo rows"] += 1
        else:  # exact caches from here on
            self.seats.reseat(row)
