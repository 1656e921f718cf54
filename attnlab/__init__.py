"""attnlab: a from-scratch Transformer toolkit on PyTorch.

import attnlab
run = attnlab.load("runs/demo")                 # model, tokenizer, config
print(run.generate("def ", max_new_tokens=80, temperature=0.8))
attnlab.train("runs/mine", attnlab.GPTConfig.from_preset("gpt-nano"),
              attnlab.TrainConfig(max_steps=500), attnlab.DataConfig(data="stdlib"))
"""

from attnlab.errors import ArgumentTypeError, ArgumentValueError, AttnlabError, interrupt_quietly_at_start

with interrupt_quietly_at_start():  # `attnlab ...` spends its first seconds here, importing torch
    from attnlab.data import DataConfig
    from attnlab.engine.config import TrainConfig
    from attnlab.interop import adapter_runs  # noqa: F401  registers the readers --init takes: HF and PEFT folders
    from attnlab.interpret.trace import Trace, trace
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.nn.hooks import hooks, zero_head
    from attnlab.runs.run import Run, load
    from attnlab.tasks import train

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "ArgumentTypeError",
    "ArgumentValueError",
    "AttnlabError",
    "DataConfig",
    "GPTConfig",
    "Run",
    "Trace",
    "TrainConfig",
    "hooks",
    "load",
    "trace",
    "train",
    "zero_head",
    "__version__",
]
