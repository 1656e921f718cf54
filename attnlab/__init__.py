"""attnlab: a from-scratch Transformer toolkit on PyTorch.

import attnlab
run = attnlab.load("runs/demo")                 # model, tokenizer, config
print(run.generate("def ", max_new_tokens=80, temperature=0.8))
vectors = attnlab.embed(run, ["a text", "another"])  # (2, C), unit length
attnlab.train("runs/mine", attnlab.GPTConfig.from_preset("gpt-nano"),
              attnlab.TrainConfig(max_steps=500), attnlab.DataConfig(data="stdlib"))

The public names are loaded on first use (PEP 562): `import attnlab` alone, and `attnlab --help`,
`attnlab runs`, do not pay for importing torch (seconds: docs/cpu.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnlab.errors import ArgumentTypeError, ArgumentValueError, AttnlabError
from attnlab.lazy import REGISTRARS, lazy_names
from attnlab.version import __version__

if TYPE_CHECKING:  # what a type checker and an editor see; at run time they load on first use
    from attnlab.data import DataConfig
    from attnlab.engine.config import TrainConfig
    from attnlab.interpret.trace import Trace, trace
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.nn.hooks import hooks, zero_head
    from attnlab.runs.embed import embed
    from attnlab.runs.run import Run, load
    from attnlab.tasks import train

# Each lazy name -> the module that defines it. The registrars (lazy.REGISTRARS) are imported by the
# lower floor that reads a registry they fill, when it first needs them.
LAZY = {
    "DataConfig": "attnlab.data",
    "TrainConfig": "attnlab.engine.config",
    "Trace": "attnlab.interpret.trace",
    "trace": "attnlab.interpret.trace",
    "GPT": "attnlab.models.gpt",
    "GPTConfig": "attnlab.models.gpt",
    "hooks": "attnlab.nn.hooks",
    "zero_head": "attnlab.nn.hooks",
    "Run": "attnlab.runs.run",
    "embed": "attnlab.runs.embed",
    "load": "attnlab.runs.run",
    "train": "attnlab.tasks",
}
REGISTRARS.extend(["attnlab.interop.adapter_runs", "attnlab.tasks.registry", "attnlab.wordvec.keyed"])
__getattr__, __dir__ = lazy_names(__name__, LAZY)

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
    "embed",
    "hooks",
    "load",
    "trace",
    "train",
    "zero_head",
    "__version__",
]
