"""How the engine (engine.py) starts sequences: admission, prefill and its joining, twins, expiry.

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

import torch
from torch import Tensor

from attnlab.decoding.draw import constrained
from attnlab.decoding.exact import certain_draws
from attnlab.decoding.prefill import Prefill
from attnlab.decoding.rows import Row
from attnlab.decoding.slots import copied


class Admission:
    """The half of Engine that starts sequences (see the module's docstring). Engine inherits it: these
    methods use the engine's rows, inbox, filling (prefill.py), decoder, stats and tolerance."""

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
                pending += 1
            else:
                self._start_alone(row)
        if filling is not None and len(filling):
            self._prefill(filling)

    def _start_alone(self, row: Row) -> None:
        """The prompt run alone, as stream_rows runs it (an encoder-decoder's source encoded first)."""
        try:
            row.state = self.decoder.start(row.ask.source)
            self._alone(row, row.window, 0)
        except Exception as e:  # e.g. out of memory: this request fails, the others go on
            for twin in [*row.twins, row]:
                self._fail(twin, e)
            return
        self.rows.append(row)
        for twin in self._spread(row):
            twin.exact, twin.approx = row.exact.clone(), row.approx
            self.rows.append(twin)

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
        for row, _ in done:
            self.seats.join(row)
        twins = [(twin, z.clone()) for row, z in done for twin in row.twins]
        for row, _ in done:
            for twin in row.twins:
                self.seats.copy(twin, row)
            self.stats["twins"] += len(row.twins)
            row.twins = []
        done = done + twins
        z = constrained(torch.cat([z for _, z in done]), [row.matcher for row, _ in done])  # (b, V)
        picks = certain_draws(z, [row.draw for row, _ in done], [row.generator for row, _ in done], self.tolerance)
        for (row, logits), token in zip(done, picks):
            if token is None:  # in doubt: the prompt again, alone, for the lone logits
                self.stats["prefill replays"] += 1
                self.seats.leave(row)
                self._start_alone(row)
                continue
            row.exact, row.sure = logits, token
            self.rows.append(row)

    def _expire(self) -> None:
        """Fail the rows (running, prefilling or waiting) past their deadline."""
        now = time.monotonic()
        filling = [] if self.filling is None else [row for row in self.filling.rows if row.overdue(now)]
        for row in filling:
            self._orphan(row)
        for row in [row for row in self.rows if row.overdue(now)] + self.inbox.overdue(now) + filling:
            self._fail(row, TimeoutError("the generation ran past its time limit"))
