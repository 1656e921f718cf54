"""Training from a notebook: inside a Jupyter kernel attnlab.train shows its loss curve, one picture
redrawn in place; elsewhere nothing is shown."""

from __future__ import annotations

import base64

import pytest

from attnlab.engine.notebook import in_notebook
from tests.conftest import code_file, run_notebook

nbformat = pytest.importorskip("nbformat", reason="the notebook extra")
nbclient = pytest.importorskip("nbclient", reason="the notebook extra")
PNG = b"\x89PNG"

CELL = """
import attnlab
attnlab.train({out!r}, attnlab.GPTConfig(n_layer=1, n_head=2, d_model=16, context=32),
              attnlab.TrainConfig(max_steps=6, batch_size=4, warmup_steps=1, eval_interval=3, eval_batches=1,
                                  device="cpu"),
              attnlab.DataConfig(data={data!r}))
"""


class Recording(nbclient.NotebookClient):
    """A client that keeps every message the kernel sent (the notebook keeps only the end state)."""

    messages: list[dict]

    def process_message(self, msg, cell, cell_index):
        self.messages.append(msg)
        return super().process_message(msg, cell, cell_index)


def test_train_in_a_notebook_updates_one_loss_picture(tmp_path, notebook_kernel):
    out, data = tmp_path / "run", code_file(tmp_path)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(CELL.format(out=str(out), data=str(data)))]
    client = Recording(nb, km=notebook_kernel, timeout=120, kernel_name="python3")
    client.messages = []
    run_notebook(client)
    kinds = [m["msg_type"] for m in client.messages]
    shown = [m for m in client.messages if m["msg_type"] == "display_data" and "image/png" in m["content"]["data"]]
    updates = [m for m in client.messages if m["msg_type"] == "update_display_data"]
    assert len(shown) == 1, kinds  # one picture, not one per step
    assert updates and all("image/png" in m["content"]["data"] for m in updates), kinds
    display_id = shown[0]["content"]["transient"]["display_id"]
    assert {m["content"]["transient"]["display_id"] for m in updates} == {display_id}
    last = base64.b64decode(updates[-1]["content"]["data"]["image/png"])
    assert last.startswith(PNG) and last != base64.b64decode(shown[0]["content"]["data"]["image/png"])
    (cell,) = nb.cells  # the saved notebook holds the last picture, in the one output the display made
    pictures = [o for o in cell.outputs if o.output_type == "display_data" and "image/png" in o.data]
    assert len(pictures) == 1 and base64.b64decode(pictures[0].data["image/png"]) == last
    assert (out / "model.safetensors").is_file()


def test_outside_a_notebook_nothing_is_shown():
    """pytest's process has no kernel (IPython may be imported, its shell is not the kernel's)."""
    assert in_notebook() is False
