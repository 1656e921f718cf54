"""Baselines: the classic text models a Transformer is compared with.

Legend: B batch, T time (tokens), E embedding width, C channels or hidden width, W words kept
by the bag of words, L labels, D directions (1 or 2).

Every model reads right-padded token ids (B, T) whose padding id is PAD_ID (0), and returns
logits: (B, L) for task "classify" (one label per sequence) or (B, T, L) for task "tag" (one
label per token); with labels also the mean cross-entropy, ignoring labels equal to -100.
Padding never changes the outputs for real tokens: it is masked out of every pooling step.

    bow     multi-hot over the W most frequent words -> MLP          (classify only)
    pooled  embeddings -> mean over real tokens -> linear
    conv1d  embeddings -> 2 x (conv k=5, ReLU, max-pool 2) -> mean over real positions -> linear
    rnn     embeddings -> RNN / GRU / LSTM -> last real state or mean of states -> linear
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnlab.config import names, option
from attnlab.data.batches import IGNORE, PAD_ID  # padding id; the label of positions with no loss
from attnlab.models.protocols import OneSequence, WordEmbedded

# What a labelled-text model predicts, by task: one label per sequence (its tokens pooled), or one per token.
POOLED = {"classify": True, "tag": False}


@dataclass
class BaselineConfig:
    """The fields every baseline shares; each family adds its sizes."""

    vocab_size: int = option(10000, "vocabulary size (set from the tokenizer when training)")
    n_labels: int = option(2, "number of classes")
    task: str = option("classify", "one label per sequence (classify) or per token (tag)", names(POOLED))
    context: int = option(256, "longest sequence the model accepts")
    dropout: float = option(0.0, "dropout probability before each linear layer")

    def __post_init__(self):
        for name, least in (("vocab_size", 2), ("n_labels", 2), ("context", 1)):
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be at least {least}, got {getattr(self, name)}")
        if self.task not in POOLED:
            raise ValueError(f"task must be one of {tuple(POOLED)}, got {self.task!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def pooled(self) -> bool:
        """One label per sequence (the tokens pooled), rather than one per token."""
        return POOLED[self.task]

    def _at_least_one(self, *fields: str) -> None:
        for name in fields:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


class Baseline(OneSequence, WordEmbedded, nn.Module):
    """forward(), the length check and the loss; a subclass defines `logits(ids, mask)`."""

    cfg: BaselineConfig

    @property
    def word_embedding(self) -> nn.Embedding | None:
        return self.embed  # every baseline but the bag of words embeds its words

    def _embedded_with_head(self, cfg: BaselineConfig, d_embed: int) -> None:
        """What the pooled and the attention baselines build alike: word embeddings (PAD's row zero),
        dropout, and a linear head from d_embed to the labels."""
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, d_embed, padding_idx=PAD_ID)
        self.drop = nn.Dropout(cfg.dropout)
        self.head = nn.Linear(d_embed, cfg.n_labels)

    def logits(self, ids: Tensor, mask: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, ids: Tensor, labels: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """ids (B, T) -> logits (B, L) or (B, T, L); with labels (B,) or (B, T) also the loss."""
        if ids.shape[1] > self.cfg.context:
            raise ValueError(f"sequence of {ids.shape[1]} tokens exceeds the context of {self.cfg.context}")
        logits = self.logits(ids, ids != PAD_ID)
        if labels is None:
            return logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORE)
        return logits, loss


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x (B, T, C) over the positions where mask (B, T) is true -> (B, C).

    A sequence with no real position gets zeros rather than NaN."""
    mask = mask.unsqueeze(-1).to(x.dtype)  # (B, T, 1)
    return (x * mask).sum(1) / mask.sum(1).clamp(min=1)


@dataclass
class BagOfWordsConfig(BaselineConfig):
    n_words: int = option(10000, "the most frequent words kept: ids in [1, n_words); the others are ignored")
    counts: bool = option(False, "count each word's occurrences instead of a 0/1 multi-hot vector")
    hidden: int = option(16, "width of each hidden layer")
    layers: int = option(2, "number of hidden ReLU layers")
    dropout: float = option(0.5, "dropout probability after each hidden layer")

    def __post_init__(self):
        super().__post_init__()
        self._at_least_one("n_words", "hidden", "layers")
        if not self.pooled:
            raise ValueError("the bag of words has no token order: it can only classify (task 'classify')")

    @property
    def width(self) -> int:
        """Length of the input vector: word ids beyond the vocabulary can never occur."""
        return min(self.n_words, self.vocab_size)


class BagOfWords(Baseline):
    """Multi-hot (or count) vector over the most frequent words -> ReLU MLP -> logits (B, L)."""

    word_embedding = None  # it reads counts of words, not their vectors

    def __init__(self, cfg: BagOfWordsConfig):
        super().__init__()
        self.cfg = cfg
        layers, width = [], cfg.width
        for _ in range(cfg.layers):
            layers += [nn.Linear(width, cfg.hidden), nn.ReLU(), nn.Dropout(cfg.dropout)]
            width = cfg.hidden
        self.mlp = nn.Sequential(*layers, nn.Linear(width, cfg.n_labels))

    def features(self, ids: Tensor) -> Tensor:
        """ids (B, T) -> (B, W): how often each kept word occurs (0/1 unless cfg.counts)."""
        keep = (ids != PAD_ID) & (ids < self.cfg.width)  # (B, T)
        # Ignored tokens add 0 to column 0 (the padding id), which therefore stays 0.
        x = torch.zeros(ids.shape[0], self.cfg.width, device=ids.device)
        x.scatter_add_(1, torch.where(keep, ids, PAD_ID), keep.float())
        return x if self.cfg.counts else x.clamp(max=1)

    def logits(self, ids: Tensor, mask: Tensor) -> Tensor:
        return self.mlp(self.features(ids))


@dataclass
class PooledConfig(BaselineConfig):
    d_embed: int = option(64, "embedding width")

    def __post_init__(self):
        super().__post_init__()
        self._at_least_one("d_embed")


class Pooled(Baseline):
    """Embeddings averaged over the real tokens -> linear (classify); or linear per token (tag)."""

    def __init__(self, cfg: PooledConfig):
        super().__init__()
        self._embedded_with_head(cfg, cfg.d_embed)

    def logits(self, ids: Tensor, mask: Tensor) -> Tensor:
        x = self.embed(ids)  # (B, T, E)
        if self.cfg.pooled:
            x = masked_mean(x, mask)  # (B, E)
        return self.head(self.drop(x))


@dataclass
class Conv1DConfig(BaselineConfig):
    d_embed: int = option(64, "embedding width")
    channels: int = option(64, "channels of each convolution")
    kernel: int = option(5, "width of each convolution (odd, so 'same' padding is symmetric)")

    def __post_init__(self):
        super().__post_init__()
        self._at_least_one("d_embed", "channels", "kernel")
        if self.kernel % 2 == 0:
            raise ValueError(f"kernel must be odd, got {self.kernel}")


class Conv1D(Baseline):
    """Embeddings -> two convolutions (ReLU, then max-pooling by 2 when classifying) -> mean over
    the real positions -> linear; when tagging, the length is kept and a linear reads each token.

    Positions past a sequence's end are zeroed before every convolution, which is exactly the
    zero padding a 'same' convolution of the unpadded sequence sees, so padding changes nothing.
    """

    def __init__(self, cfg: Conv1DConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_embed, padding_idx=PAD_ID)
        self.convs = nn.ModuleList(
            [nn.Conv1d(n_in, cfg.channels, cfg.kernel, padding="same") for n_in in (cfg.d_embed, cfg.channels)]
        )
        self.drop = nn.Dropout(cfg.dropout)
        self.head = nn.Linear(cfg.channels, cfg.n_labels)

    def logits(self, ids: Tensor, mask: Tensor) -> Tensor:
        x = self.embed(ids).transpose(1, 2)  # (B, E, T): channels first for Conv1d
        m = mask.unsqueeze(1).to(x.dtype)  # (B, 1, T)
        for conv in self.convs:
            x = F.relu(conv(x * m)) * m  # (B, C, T)
            if self.cfg.pooled:
                # ceil_mode keeps a last odd position as its own window, so even a one-token
                # sequence keeps one position. After ReLU and masking every value is >= 0, so a
                # window half in padding takes the max of its real value: the padding's 0 never wins.
                x = F.max_pool1d(x, 2, ceil_mode=True)  # (B, C, ceil(T/2))
                m = F.max_pool1d(m, 2, ceil_mode=True)  # (B, 1, ceil(T/2)): windows with a real position
        x = x.transpose(1, 2)  # (B, T', C)
        if self.cfg.pooled:
            x = masked_mean(x, m.squeeze(1).bool())  # (B, C)
        return self.head(self.drop(x))


CELLS = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}


@dataclass
class RNNConfig(BaselineConfig):
    d_embed: int = option(64, "embedding width")
    cell: str = option("lstm", "recurrent cell", ("rnn", "gru", "lstm"))
    hidden: int = option(64, "hidden state width (per direction)")
    layers: int = option(1, "stacked recurrent layers")
    bidirectional: bool = option(False, "also read each sequence right to left")
    pool: str = option("last", "sequence summary: the last real state, or the mean of all states", ("last", "mean"))

    def __post_init__(self):
        super().__post_init__()
        self._at_least_one("d_embed", "hidden", "layers")
        if self.cell not in CELLS:
            raise ValueError(f"cell must be one of {', '.join(CELLS)}, got {self.cell!r}")
        if self.pool not in ("last", "mean"):
            raise ValueError(f"pool must be 'last' or 'mean', got {self.pool!r}")


class RNNClassifier(Baseline):
    """Embeddings -> recurrent layers -> the last real state or the mean of the states -> linear;
    when tagging, a linear reads each token's output.

    Sequences are packed with their lengths, so padding never enters the recurrence: the "last"
    state is that of the last real token, not of the last padding position.
    """

    def __init__(self, cfg: RNNConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_embed, padding_idx=PAD_ID)
        between = cfg.dropout if cfg.layers > 1 else 0.0  # PyTorch drops between layers only
        self.rnn = CELLS[cfg.cell](
            cfg.d_embed, cfg.hidden, cfg.layers, batch_first=True, dropout=between, bidirectional=cfg.bidirectional
        )
        self.drop = nn.Dropout(cfg.dropout)
        self.head = nn.Linear(cfg.hidden * (2 if cfg.bidirectional else 1), cfg.n_labels)

    def logits(self, ids: Tensor, mask: Tensor) -> Tensor:
        B, T = ids.shape
        # An all-padding sequence is read as one (padding) token: packing needs lengths >= 1.
        lengths = mask.sum(1).clamp(min=1).cpu()
        packed = pack_padded_sequence(self.embed(ids), lengths, batch_first=True, enforce_sorted=False)
        out, h_n = self.rnn(packed)
        if self.cfg.pooled and self.cfg.pool == "last":
            h_n = h_n[0] if isinstance(h_n, tuple) else h_n  # the LSTM also returns its cells
            # h_n: (layers * D, B, C); the top layer's forward state is at its last real token,
            # its backward state (when bidirectional) at position 0, having read the whole sequence.
            D = 2 if self.cfg.bidirectional else 1
            x = h_n[-D:].transpose(0, 1).reshape(B, -1)  # (B, D * C)
        else:
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=T)  # (B, T, D * C), zeros at padding
            x = masked_mean(out, mask) if self.cfg.pooled else out
        return self.head(self.drop(x))


# name -> (config class, model class), for the command line and the comparison scripts.
BASELINES: dict[str, tuple[type[BaselineConfig], type[Baseline]]] = {
    "bow": (BagOfWordsConfig, BagOfWords),
    "pooled": (PooledConfig, Pooled),
    "conv1d": (Conv1DConfig, Conv1D),
    "rnn": (RNNConfig, RNNClassifier),
}
