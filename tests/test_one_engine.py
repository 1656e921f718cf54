"""One decoding engine: `attnlab sample`, run.generate, the explorer's /api/generate, /v1 and captions all
decode through the model's one engine (decoding/engine.py), so requests of different callers share
its batched steps and each still gets the tokens it gets alone."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from attnlab import load
from attnlab.cli.main import main
from attnlab.decoding.adapters import LMDecoder, StepDecoder
from attnlab.decoding.draw import Draw
from attnlab.decoding.engine import Engine, engine_for
from attnlab.decoding.sampling import sample_texts, stream, stream_rows, stream_text
from attnlab.models.gpt import GPT
from attnlab.nn.hooks import hooks, zero_head
from attnlab.serve.app import create_app, running
from tests.conftest import TEXT, flags, nano_flags, perturb, run_cli, tiny_captioner, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

TINY = nano_flags(1, 2, 3)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine")
    (root / "corpus.txt").write_text(TEXT * 40)
    with pytest.MonkeyPatch.context() as mp:  # module scope runs before conftest's per-test cache
        mp.setenv("ATTNLAB_CACHE", str(root / "cache"))
        assert main(["train", "lm", "--out", str(root / "lm"), "--data", str(root / "corpus.txt"), *TINY]) == 0
    return root / "lm"


def lone(model, ids: list[int], n: int, seed: int, temperature: float = 1.0) -> list[int]:
    """The tokens one request draws alone: stream_rows with one row."""
    return [int(t[0]) for t in stream_rows(model, ids, 1, n, Draw(temperature, seed=seed), dtype="float32")]


def test_the_explorer_and_v1_are_decoded_in_shared_steps(run_dir, monkeypatch):
    """Three /api/generate requests and three /v1 completions at once, through a real server: some
    batched step held rows of both, and every text is its seed's text alone."""
    httpx = pytest.importorskip("httpx", reason="httpx, the client here, is a dev extra: pip install -e .[dev]")
    seen: list[set[int]] = []  # the seeds of the rows of each batched step
    real = Engine._batched_logits

    def recorded(self):
        seen.append({row.draw.seed for row in self.slotted})
        return real(self)

    monkeypatch.setattr(Engine, "_batched_logits", recorded)
    app, explorer, v1 = create_app([run_dir]), [100, 101, 102], [200, 201, 202]
    run = load(run_dir, "cpu")
    start = threading.Barrier(6)

    def ask(url: str, seed: int) -> str:
        start.wait()
        if seed in explorer:
            body = {"run": "lm", "prompt": "def ", "seed": seed, "max_new_tokens": 60, "temperature": 1.0}
            answer = httpx.post(f"{url}/api/generate", json=body, timeout=60)
            return "".join(json.loads(line).get("text", "") for line in answer.text.splitlines() if line)
        body = {
            "model": "lm",
            "prompt": "class ",
            "seed": seed,
            "max_tokens": 60,
            "temperature": 1.0,
            "ignore_eos": True,
        }
        return httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]

    with running(app) as url, ThreadPoolExecutor(6) as pool:
        texts = dict(zip(explorer + v1, pool.map(lambda s: ask(url, s), explorer + v1)))
    assert any(step & set(explorer) and step & set(v1) for step in seen), seen  # one forward pass, both callers
    for seed, text in texts.items():
        prompt = "def " if seed in explorer else "class "
        ids = run.tokenizer.encode(prompt)
        assert text == run.tokenizer.decode(lone(run.model, ids, 60, seed))


def test_samples_of_the_command_line_are_rows_of_the_one_engine(run_dir, capsys):
    """`attnlab sample --num-samples 3`: three rows of the run's engine, each its seed + i's text."""
    run = load(run_dir, "cpu")
    engine = engine_for(run.model)
    assert engine is engine_for(run.model) and isinstance(engine.decoder, LMDecoder)  # one per model
    texts = sample_texts(run.model, run.tokenizer, "def ", num_samples=3, max_new_tokens=30, seed=5)
    for i, text in enumerate(texts):
        alone = "".join(stream_text(run.model, run.tokenizer, "def ", max_new_tokens=30, seed=5 + i, use_cache=False))
        assert text == alone
    code, out, err = run_cli(
        ["sample", run_dir, *flags(prompt="def ", num_samples=3, seed=5, max_new_tokens=30, device="cpu")],
        capsys,
    )
    assert code == 0, err
    assert out.split("\n" + "-" * 40 + "\n") == [f"def {t}\n" for t in texts]


def test_hooks_set_by_the_caller_run_in_the_engine_thread():
    """A head zeroed around a generation changes what the engine decodes for it, and only for it: the
    engine runs the caller's hooks on that row, alone."""
    torch.manual_seed(0)
    model = perturb(GPT(tiny_model(vocab_size=20, context=16)), 0.5)
    plain = list(stream(model, [1, 2, 3], 12, temperature=0, dtype="float32"))
    with hooks(model, {"blocks.0.attn.hook_head_out": zero_head(0), "blocks.1.attn.hook_head_out": zero_head(1)}):
        removed = list(stream(model, [1, 2, 3], 12, temperature=0, dtype="float32"))
        lone_removed = [int(t[0]) for t in stream_rows(model, [1, 2, 3], 1, 12, Draw(0.0), dtype="float32")]
    assert removed == lone_removed != plain
    assert list(stream(model, [1, 2, 3], 12, temperature=0, dtype="float32")) == plain  # gone with the with-block


def test_captions_are_decoded_by_the_engine_with_where_each_word_looked():
    """An encoder-decoder's rows: each from its own image, alone, each step with its cross-attention, the
    words greedy decoding's (decoding/beam.py)."""
    from attnlab.data.batches import BOS_ID, EOS_ID
    from attnlab.decoding.beam import greedy

    model = tiny_captioner()
    image = torch.rand(1, 1, 8, 16)
    engine = engine_for(model)
    assert isinstance(engine.decoder, StepDecoder)
    steps = list(engine.generate([BOS_ID], Draw(temperature=0.0), 10, attention=True, source=image))
    tokens = [s.token for s in steps]
    (expected,) = greedy(model, image, 10)
    assert tokens[: len(expected)] == expected and (len(tokens) == len(expected) or tokens[len(expected)] == EOS_ID)
    assert all(s.attention.shape == (2, 2, model.cfg.n_patches) for s in steps)  # (L, H, N): over the image's patches
    assert all(abs(float(s.attention.sum(-1).mean()) - 1) < 1e-4 for s in steps)  # each row a distribution
