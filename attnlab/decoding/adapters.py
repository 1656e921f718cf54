"""What the decoding engine (engine.py) drives: a model that continues a sequence from caches, seen
through the protocol it offers (models/protocols.py).

Legend: B rows, T tokens fed, V vocabulary, L layers, H heads, Tk keys, S source positions.

    LMDecoder     a CausalLM (GPT): rows batched into slots (slots.py), a row that outgrows the
                  context jumping ahead as sampling.stream_rows does
    StepDecoder   a StepDecoding model (the captioners, the translation models): each row encoded
                  from its own source (an image) and decoded alone, a token at a time
Both give a row's next-token logits from tokens fed at an offset, and, when the row asks, where the
newest query looked: an LM's (L, Tk) mean over heads of its self-attention, a captioner's (L, H, S)
cross-attention.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.data.batches import EOS_ID
from attnlab.decoding.compiled import CompiledStep
from attnlab.decoding.compiled_rows import CompiledRows
from attnlab.decoding.compiled_verify import CompiledVerify
from attnlab.decoding.slots import Slots
from attnlab.errors import AttnlabError
from attnlab.models.protocols import CausalLM, StepDecoding
from attnlab.runtime.device import autocast, pick_dtype

DECIMALS = 3  # attention rows as they are sent on (a web page shows them)


class LMDecoder:
    """A decoder-only language model: one row's caches are its blocks' KV caches."""

    batched = True  # rows can share a forward pass (slots.py)

    def __init__(self, model: CausalLM, dtype: str = "auto", compiled: bool = False):
        self.model = model.eval()
        self.context, self.vocab = model.cfg.context, model.cfg.vocab_size
        self.device = next(model.parameters()).device
        self.precision = pick_dtype(dtype, self.device, model.cfg.d_model, use="decode")
        # A lone row's one-token steps compiled (compiled.py: ahead of time, else torch.compile), when asked.
        self.compiled = CompiledStep(model, self.context, self.device) if compiled else None
        self.compiled_rows = CompiledRows(model, self.device) if compiled else None  # the batched steps'
        self.compiled_verify = CompiledVerify(model, self.context, self.device) if compiled else None

    def start(self, source: Tensor | None) -> list:
        # A compiled step reads the first L keys of its buffers, L symbolic: one position more than the
        # context keeps L below the buffers' length, or the last position would compile again (L == C).
        return self.model.new_caches(self.context + (self.compiled is not None))

    def outgrown(self, length: int) -> bool:
        """A window longer than the context jumps ahead (engine.py), as stream_rows does."""
        return length > self.context

    def feed(
        self, state: list, ids: list[int], offset: int, attention: bool = False, hooked: bool = False
    ) -> tuple[Tensor, list | None]:
        """(1, V) next-token logits of `ids` fed at `offset` alone, and (attention) each layer's row of
        the newest query over the keys so far, mean of the heads (L, Tk). One token of a row without
        attention or hooks (`hooked`) takes the compiled step when there is one."""
        step = self.compiled
        if (
            step is not None
            and len(ids) == 1
            and not (attention or hooked)
            and step.usable(state)
            and state[0].length == offset
        ):
            with autocast(self.device, self.precision):
                logits = step.feed(state, ids[0])
            if logits is not None:
                return logits, None
        x = torch.tensor([ids], device=self.device)  # (1, T)
        with autocast(self.device, self.precision):
            if not attention:
                return self.model(x, caches=state, offset=offset)[:, -1], None
            hidden, weights = self.model.hidden(x, state, offset, return_weights=True)  # L x (1, H, T, Tk)
            logits = self.model.logits(hidden)[:, -1]
        rows = [[round(float(w), DECIMALS) for w in layer[0, :, -1].float().mean(0)] for layer in weights]
        return logits, rows

    def verify(self, state: list, ids: list[int], offset: int) -> Tensor:
        """(T, V) logits after each of `ids` fed at `offset` alone, one forward pass: how a speculative
        step checks its drafted tokens (speculate.py). Compiled where the lone row's step is (its caches
        made for it: compiled_verify.py), else the eager forward."""
        step = self.compiled_verify
        if step is not None and step.usable(state, len(ids), offset):
            with autocast(self.device, self.precision):
                logits = step.feed(state, ids)
            if logits is not None:
                return logits
        x = torch.tensor([ids], device=self.device)  # (1, T)
        with autocast(self.device, self.precision):
            return self.model(x, caches=state, offset=offset)[0]

    def rollback(self, state: list, length: int, last: int) -> None:
        """Keep the first `length` positions of a row's caches (later ones are written over, as the
        caches are indexed by position); `last`: the newest token kept, which a bigram model reads."""
        for cache in state:
            cache.length = length
        if state[0].last_token is not None:
            state[0].last_token = torch.tensor([[last]], device=self.device)

    def slots(self, max_batch: int) -> Slots:
        # The compiled step reads the first L positions, L symbolic: one more than the context keeps L
        # below the buffers' length, as start() does for a lone row.
        room = self.context + (self.compiled_rows is not None)
        return Slots(len(self.model.blocks), max_batch, self.context, self.device, room)

    def feed_slots(self, slots: Slots, ids: Tensor, offsets: Tensor) -> Tensor:
        """(B, V) logits of each slotted row's newest token ids (B, 1), each at its own position,
        through the compiled batched step when there is one (compiled_rows.py)."""
        with autocast(self.device, self.precision):
            logits = None if self.compiled_rows is None else self.compiled_rows.feed(slots, ids, offsets)
            return logits if logits is not None else self.model(ids, caches=slots.caches, offset=offsets)[:, -1]

    def feed_chunks(self, slots: Slots, ids: Tensor, offsets: Tensor, last: Tensor) -> Tensor:
        """(B, V) logits at each row's last real token `last` (B,) of prompt chunks ids (B, T), right-padded,
        each row at its own position (decoding/prefill.py): the head only where it is read."""
        with autocast(self.device, self.precision):
            hidden, _ = self.model.hidden(ids, slots.caches, offsets)  # (B, T, C)
            return self.model.logits(hidden[torch.arange(ids.shape[0], device=ids.device), last])  # (B, V)

    def mask(self, logits: Tensor) -> Tensor:
        return logits


class StepDecoder:
    """An encoder-decoder: a row's state is its encoded source and caches (model.start)."""

    batched = False  # each row has its own source: decoded alone

    def __init__(self, model: StepDecoding, dtype: str = "float32"):
        self.model = model.eval()
        self.vocab = model.cfg.tgt_vocab
        self.device = next(model.parameters()).device

    def outgrown(self, length: int) -> bool:
        return False  # a caption or translation ends within its max_tokens

    def start(self, source: Tensor | None):
        if source is None:
            raise AttnlabError("an encoder-decoder decodes from a source: give one")
        return self.model.start(source.to(self.device))

    def feed(
        self, state, ids: list[int], offset: int, attention: bool = False, hooked: bool = False
    ) -> tuple[Tensor, list | None]:
        """The ids one at a time (the model steps a token at a time); the last one's logits (1, V) and
        (attention) where it looked, (L, H, S)."""
        for token in ids:
            tokens = torch.tensor([token], device=self.device)
            if attention:
                logits, _, weights = self.model.step_weights(tokens, state)
            else:
                logits, _ = self.model.step(tokens, state)
        rows = weights[0].float().cpu().numpy() if attention else None  # (L, H, S)
        return logits, rows

    def mask(self, logits: Tensor) -> Tensor:
        """PAD and BOS are never written (as decoding/beam.py decodes)."""
        logits = logits.clone()
        logits[:, :EOS_ID] = float("-inf")
        return logits


def decoder_for(model, dtype: str = "auto", compiled: bool = False) -> LMDecoder | StepDecoder:
    """The decoder for a model, by the protocol it offers (compiled: a language model's one-token steps
    compiled: compiled.py)."""
    if isinstance(model, CausalLM):
        return LMDecoder(model, dtype, compiled)
    if isinstance(model, StepDecoding):
        return StepDecoder(model)
    raise AttnlabError(
        f"a {type(model).__name__} does not generate: it is neither a language model nor an encoder-decoder"
    )
