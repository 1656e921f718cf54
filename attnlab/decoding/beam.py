"""Greedy and beam-search decoding for every sequence-to-sequence model.

A model decodes through two calls (the Transformer in models/seq2seq.py, the RNNs in models/rnn.py):
    state = model.start(src)                   # encode the sources (B, S) once
    logits, state = model.step(tokens, state)  # tokens (B,) -> next-token logits (B, V)
and `state.select(rows)` keeps (and reorders) batch rows, which beam search uses to follow its
hypotheses and both decoders use to drop the sources that are finished.

Ids: BOS starts every target, EOS ends it; returned sequences hold neither.

Beam search keeps the `beam` best partial translations of each source by total log-probability.
A hypothesis that emits EOS is finished; its score is divided by the length penalty of GNMT
(Wu et al., 2016), lp = ((5 + length) / 6) ** alpha, so longer translations are not punished
just for having more factors below one. A source is done when it has `beam` finished
hypotheses that no live one can still beat (or at max_len); the best finished one wins.
Stopping at the first `beam` finished ones instead would let short, improbable hypotheses
that end early crowd out the likely one still being written.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.data.batches import BOS_ID, EOS_ID


@torch.no_grad()
def greedy(model: nn.Module, src: Tensor, max_len: int) -> list[list[int]]:
    """The most probable next token at every step, for each source row of src (B, S)."""
    state = model.start(src)
    b = src.shape[0]
    out: list[list[int]] = [[] for _ in range(b)]
    alive = torch.arange(b, device=src.device)  # which sources the state's rows belong to
    tokens = torch.full((b,), BOS_ID, dtype=torch.long, device=src.device)
    for _ in range(max_len):
        logits, state = _step(model, tokens, state)
        tokens = logits.argmax(-1)  # (B_alive,)
        for row, tok in zip(alive.tolist(), tokens.tolist()):
            if tok != EOS_ID:
                out[row].append(tok)
        keep = (tokens != EOS_ID).nonzero().squeeze(1)
        if len(keep) == 0:
            break
        if len(keep) < len(alive):
            alive, tokens, state = alive[keep], tokens[keep], state.select(keep)
    return out


def _step(model: nn.Module, tokens: Tensor, state):
    logits, state = model.step(tokens, state)
    logits[:, :EOS_ID] = float("-inf")  # PAD and BOS are never produced
    return logits, state


def length_penalty(length: int, alpha: float) -> float:
    return ((5 + length) / 6) ** alpha


@torch.no_grad()
def beam_search(
    model: nn.Module, src: Tensor, beam: int = 4, max_len: int = 128, alpha: float = 0.6
) -> list[list[int]]:
    """The best of `beam` hypotheses per source row of src (B, S); beam=1 is greedy decoding."""
    b, k, dev = src.shape[0], beam, src.device
    state = model.start(src.repeat_interleave(k, dim=0))  # rows: source 0's k beams, source 1's, ...
    scores = torch.full((b, k), float("-inf"), device=dev)
    scores[:, 0] = 0.0  # every beam starts identical: expand only the first
    seqs: list[list[list[int]]] = [[[] for _ in range(k)] for _ in range(b)]
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
    alive = list(range(b))  # sources still searching, in the order of the state's row groups
    tokens = torch.full((b * k,), BOS_ID, dtype=torch.long, device=dev)
    for step in range(1, max_len + 1):
        logits, state = _step(model, tokens, state)
        logp = torch.log_softmax(logits.float(), dim=-1)  # (A * K, V)
        v = logp.shape[-1]
        cand = (scores[:, :, None] + logp.view(len(alive), k, v)).view(len(alive), k * v)  # (A, K * V)
        top_scores, top_idx = cand.topk(min(2 * k, k * v), dim=-1)  # 2K: enough to keep K alive after EOS
        new_scores = torch.full((len(alive), k), float("-inf"), device=dev)
        rows, next_tokens, still = [], [], []
        for a, src_i in enumerate(alive):
            candidates = zip(top_scores[a].tolist(), top_idx[a].tolist())
            kept = _advance(candidates, k, v, seqs[src_i], finished[src_i], length_penalty(step, alpha))
            for j, (_, _, _, seq) in enumerate(kept):
                seqs[src_i][j] = seq
            if step == max_len or not kept or _done(finished[src_i], k, kept[0][0], max_len, alpha):
                continue
            for j, (score, beam_i, tok, _) in enumerate(kept):
                new_scores[len(still), j] = score
                rows.append(a * k + beam_i)
                next_tokens.append(tok)
            rows += [rows[-1]] * (k - len(kept))  # pad to K rows; their -inf score keeps them out
            next_tokens += [next_tokens[-1]] * (k - len(kept))
            still.append(src_i)
        if not still:
            break
        alive, scores = still, new_scores[: len(still)]
        state = state.select(torch.tensor(rows, device=dev))
        tokens = torch.tensor(next_tokens, device=dev)
    return [_best(finished[i], seqs[i], alpha) for i in range(b)]


def _advance(candidates, k: int, v: int, seqs: list[list[int]], done: list, penalty: float) -> list:
    """Sort one source's candidates, (score, beam * V + token) best first, into its finished hypotheses
    `done` (scores divided by this step's length `penalty`) and up to K live ones, from its beams `seqs`."""
    kept = []
    for score, flat in candidates:
        if score == float("-inf") or len(kept) == k:
            break
        beam_i, tok = divmod(flat, v)
        seq = seqs[beam_i]
        if tok == EOS_ID:
            done.append((score / penalty, seq))
            if len(done) > k:  # keep the k best
                done.remove(min(done, key=lambda f: f[0]))
        else:
            kept.append((score, beam_i, tok, seq + [tok]))
    return kept


def _done(finished: list, k: int, best_live: float, max_len: int, alpha: float) -> bool:
    """No live hypothesis can still beat the k finished ones: a live score only falls as it grows,
    and its length penalty is at most that of max_len."""
    if len(finished) < k:
        return False
    return min(f[0] for f in finished) >= best_live / length_penalty(max_len if alpha > 0 else 1, alpha)


def _best(finished: list[tuple[float, list[int]]], live: list[list[int]], alpha: float) -> list[int]:
    if finished:
        return max(finished, key=lambda f: f[0])[1]
    return live[0]  # max_len reached with nothing finished: the best live hypothesis
