"""Model families: a front end, the shared stack of blocks (nn/), and a head.

FAMILIES (models/families.py) maps the family name stored in a run's config.json to its (config
class, model class). A new family is one file here plus one line there.

Its names load on first use (attnlab/lazy.py), so that a torch-free module of this package (the
cluster plan of `attnlab size --help`, models/cluster.py) imports without the families' torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnlab.lazy import lazy_names

if TYPE_CHECKING:
    from attnlab.models.families import FAMILIES, build_model, family_classes
    from attnlab.models.gpt import GPT, PRESETS, GPTConfig

FAMILY = dict.fromkeys(("FAMILIES", "build_model", "family_classes"), "attnlab.models.families")
GPT_ = dict.fromkeys(("GPT", "PRESETS", "GPTConfig"), "attnlab.models.gpt")
__getattr__, __dir__ = lazy_names(__name__, FAMILY | GPT_)

__all__ = ["FAMILIES", "GPT", "PRESETS", "GPTConfig", "build_model", "family_classes"]
