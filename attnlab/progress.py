"""The progress bar every long job shows: tqdm's notebook widget where Jupyter can draw one, its text
bar everywhere else.

tqdm.auto picks the widget whenever it runs in a notebook kernel, and without ipywidgets installed it
then warns ("IProgress not found") in the learner's first cell before falling back to text. Asking
first whether ipywidgets is there keeps the fallback and drops the warning; installing ipywidgets
(`pip install ipywidgets`) brings the widget back.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
else:
    from tqdm.std import tqdm

__all__ = ["tqdm"]
