"""Model families: a front end, a stack of `nn.Block`s, and a head."""

from attnlab.models.gpt import GPT, PRESETS, GPTConfig

__all__ = ["GPT", "GPTConfig", "PRESETS"]
