"""How sequences enter the engine (engine.py) and leave it: admission, prefill and its joining, twins,
the prefix cache, expiry, retirement.

Legend: V vocabulary, b rows joining at once.

Each turn the engine admits waiting sequences while there are free slots (`max_batch`). A prompt with
nothing else in the engine is run alone, exactly as sampling.stream_rows runs it (an encoder-decoder's
source encoded first), giving the first token's logits and the state the row decodes from. Prompts
that arrive together or while rows run are prefilled together (prefill.py): up to a budget of prompt
tokens a turn in one forward pass, a longer prompt over several turns, so the running rows keep
stepping. The same prompt twice is computed once: its twins take copies of its keys. A prefilled
prompt's first draw comes from the batch's logits only where exact.py finds it sure (_join);
otherwise the prompt is run again alone.
"""

from __future__ import annotations

import time
import warnings

import torch
from torch import Tensor

from attnlab.decoding.draw import constrained
from attnlab.decoding.exact import certain_draws
from attnlab.decoding.prefill import Prefill
from attnlab.decoding.prefix_cache import Block, PrefixCache, keys_of, write_state
from attnlab.decoding.rows import Row
from attnlab.decoding.slots import copied
from attnlab.errors import one_line


class Admission:
    """The half of Engine that starts and ends sequences (see the module's docstring). Engine inherits it:
    these methods use the engine's rows, inbox, seats, filling (prefill.py), prefix, decoder, stats and
    tolerance."""

    def _admit(self) -> None:
        """Start the waiting sequences that fit (the inbox collected by the caller): alone, or prefilled
        together in chunks when other rows or prompts share the turn; a prompt the same as one being
        prefilled is its twin, computed once (_spread)."""
        self._expire()
        filling = self.filling if self.filling is not None and self.batched and self._prepared else None
        prefilling = filling is not None and filling.budget > 0
        pending = 0 if filling is None else sum(1 + len(row.twins) for row in filling.rows)
        leaders = {} if filling is None else {tuple(row.window): row for row in filling.rows}
        while self.inbox and len(self.rows) + pending < self.max_batch:
            row = self.inbox.next()
            if row.cancelled:
                self._retire(row)
            elif prefilling and not row.solo and (self.rows or pending or self.inbox):
                if (leader := leaders.get(tuple(row.window))) is not None:
                    leader.twins.append(row)
                else:
                    filling.add(row, self.decoder.vocab)
                    leaders[tuple(row.window)] = row
                    self._reuse_in_slot(filling, row)
                pending += 1
            else:
                self._start_alone(row)
        if filling is not None and len(filling):
            self._prefill(filling)

    def _start_alone(self, row: Row, reuse: bool = True) -> None:
        """The prompt run alone, as stream_rows runs it (an encoder-decoder's source encoded first), after
        the keys of a prefix seen before where the prefix cache has them (reuse)."""
        try:
            row.state = self.decoder.start(row.ask.source)
            reused = self._reuse_alone(row) if reuse else 0
            self._alone(row, row.window[reused:], reused)
        except Exception as e:  # e.g. out of memory: this request fails, the others go on
            for twin in [*row.twins, row]:
                self._fail(twin, e)
            return
        if self.prefix is not None:  # its blocks past a reused prefix too (a conversation's next turn)
            self._remember(row, keys_of(row.state, 0), row.state[0].last_token)
        rows = [row, *self._spread(row)]
        for twin in rows[1:]:
            twin.exact = row.exact.clone()
        self.rows.extend(rows)
        if reused:  # keys of another pass: its caches are checked in a slot, as a batched prefill's
            for r in rows:
                r.approx = True
            for r in self._doubted(rows):
                self.stats["prefix replays"] += 1
                self.rows.remove(r)
                r.approx = False
                self._start_alone(r, reuse=False)

    def _spread(self, row: Row) -> list[Row]:
        """The row's twins (the same prompt), each with a copy of its caches: the same numbers as their
        own prompt run the same way, so a burst of one prompt costs one prefill."""
        twins, row.twins = row.twins, []
        for twin in twins:  # a row run alone: its own caches
            twin.state = copied(row.state, self.decoder.start(row.ask.source))
        self.stats["twins"] += len(twins)
        return twins

    def _orphan(self, row: Row) -> None:
        """A prompt leaves the prefill table unfinished: its twins wait at the front of the line again."""
        self.filling.remove(row)
        self.inbox.waiting.extendleft(reversed(row.twins))
        row.twins = []

    def _prefill(self, filling: Prefill) -> None:
        """One chunk of each prompt the budget reaches (one forward pass); the prompts all in join."""
        for row in [row for row in filling.rows if row.cancelled]:
            self._orphan(row)
            self._retire(row)
        first = filling.rows[0] if len(filling) == 1 else None
        if first is not None and filling.fed[id(first)] == 0 and len(first.window) <= filling.budget:
            filling.remove(first)  # one whole prompt this turn: alone is exact, at the same cost
            self._start_alone(first)
            return
        try:
            done = filling.step(self.decoder)
        except Exception as e:  # the pass failed: its prompts hear it, the engine goes on
            for row in list(filling.rows):
                filling.remove(row)
                for twin in [*row.twins, row]:
                    self._fail(twin, e)
            return
        self.stats["prefill passes"] += 1
        if done:
            self._join(done)

    def _join(self, done: list[tuple[Row, Tensor]]) -> None:
        """Prefilled rows (and their twins, given copies of their keys) are seated where their keys are,
        and draw their first token now: from the batch's logits (1, V) where exact.py finds the draw
        sure, else from their prompt run again alone."""
        rows = []
        for row, logits in done:
            self.seats.join(row)
            self._remember(row, keys_of(self.slots.caches, row.slot), self.slots.table.last)
            row.exact, twins, row.twins = logits, row.twins, []
            for twin in twins:
                self.seats.copy(twin, row)
                twin.exact = logits.clone()
            self.stats["twins"] += len(twins)
            rows += [row, *twins]
        doubted = self._doubted(rows)
        self.rows.extend(row for row in rows if row not in doubted)
        for row in doubted:  # in doubt: the prompt again, alone, for the lone logits
            self.stats["prefill replays"] += 1
            self.seats.leave(row)
            self._start_alone(row, reuse=False)

    def _doubted(self, rows: list[Row]) -> list[Row]:
        """Each row's first token drawn from its logits of a batched pass (row.exact, (1, V)) where
        exact.py finds the draw sure (Row.sure); the rows in doubt, their logits dropped."""
        z = constrained(torch.cat([row.exact for row in rows]), [row.matcher for row in rows])  # (b, V)
        picks = certain_draws(z, [row.draw for row in rows], [row.generator for row in rows], self.tolerance)
        for row, token in zip(rows, picks):
            row.sure = token
            if token is None:
                row.exact = None
        return [row for row, token in zip(rows, picks) if token is None]

    # ---- the prefix cache (prefix_cache.py) -------------------------------------------------------------

    def cache_prefixes(self, megabytes: float) -> None:
        """Keep up to `megabytes` of earlier prompts' keys for requests that share a prefix with them
        (0: none); a language model's engine only (an encoder-decoder's rows have their own sources)."""
        size = int(megabytes * 2**20)
        if self.prefix is not None and self.prefix.max_bytes == size:
            return
        self.prefix = PrefixCache(size) if size > 0 and self.decoder.batched else None

    def _reusable(self, row: Row) -> tuple[int, Block | None]:
        """The kept prefix of the row's prompt (tokens, keys and values), where its reuse can be checked:
        rows decoded alone to the end (hooks, attention) run their whole prompt."""
        if self.prefix is None or row.solo:
            return 0, None
        if not self._prepared and self.prefix.blocks:  # the first draw is checked against the tolerance
            self._prepare()
        if not self.batched:  # no checks here (exact.py): every prompt runs whole
            self.prefix.off = "rows are not batched exactly on this device"
        return self.prefix.lookup(row.window)

    def _reuse_alone(self, row: Row) -> int:
        """The kept prefix's keys into the row's fresh caches; how many tokens."""
        n, kv = self._reusable(row)
        if n:
            write_state(row.state, kv)
        return n

    def _reuse_in_slot(self, filling: Prefill, row: Row) -> None:
        """The kept prefix's keys into the slot the prompt holds, as if its first chunks were fed."""
        n, kv = self._reusable(row)
        if n:
            self.slots.write(row.slot, *kv)
            filling.fed[id(row)] = n

    def _remember(self, row: Row, keys_of, last: Tensor | None) -> None:
        """Keep the prompt's blocks (a model that reads the previous token: never)."""
        if self.prefix is None or row.solo:
            return
        if last is not None:
            self.prefix.off = "the model reads the previous token"
        try:
            self.prefix.insert(row.window, keys_of)
        except Exception as e:  # e.g. out of memory keeping the blocks: the cache goes off, the request goes on
            self.prefix.off = f"off after {type(e).__name__}: {one_line(str(e))}"
            warnings.warn(f"attnlab: the prefix cache is {self.prefix.off}", stacklevel=1)

    def _expire(self) -> None:
        """Fail the rows (running, prefilling or waiting) past their deadline."""
        now = time.monotonic()
        filling = [] if self.filling is None else [row for row in self.filling.rows if row.overdue(now)]
        for row in filling:
            self._orphan(row)
        for row in [row for row in self.rows if row.overdue(now)] + self.inbox.overdue(now) + filling:
            self._fail(row, TimeoutError("the generation ran past its time limit"))

    # ---- leaving ----------------------------------------------------------------------------------------

    def _fail(self, row: Row, error: Exception) -> None:
        """Drop the row and tell its reader (if it still listens): dropped first, so that a reader who
        hears of the end finds its stream freed."""
        self._retire(row)
        row.tell(error)

    def _finish(self, row: Row) -> None:
        self._retire(row)
        row.tell(None)

    def _retire(self, row: Row) -> None:
        self.seats.leave(row)
        if row in self.rows:
            self.rows.remove(row)
        row.state = row.exact = None
        row.exit()
