"""Shared fixtures: a private token cache, small text corpora, tiny model settings."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from types import ModuleType

import pytest
import torch

from attnlab.data import DataConfig
from attnlab.engine.config import TrainConfig
from attnlab.io import write_json, write_text
from attnlab.models import build_model
from attnlab.models.captioner import CaptionerConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.nn.lora import LoRAConfig, lora_parameters, lora_state_dict
from attnlab.runs.adapted import build_adapted
from attnlab.runs.folder import CONFIG, TOKENIZER, WEIGHTS, fresh_dir, read_run_config
from attnlab.runs.marker import record
from attnlab.runs.weights import save_weights, write_weights

TEXT = (
    "def add(a, b):\n    return a + b\n\n"
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
)


def int4_rows_exact(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """What attnlab's int4 row operator computes (csrc/q4_products.cpp), in float64: x (M, I) rounded to
    int8 per block of 32 (d = absmax / 127, ties to even), w = q * s + lo with lo = z - 8 s (s and z
    rounded to bfloat16): y = (d xq) @ (q s)^T + (the blocks' float sums of x) @ lo^T."""
    blocks = x.float().reshape(x.shape[0], -1, 32)  # (M, G, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))  # float32, as the kernel's
    xq = torch.round(blocks * inv).double() * (amax / 127).double()  # (M, G, 32)
    s, z = (t.to(torch.bfloat16).double() for t in (scales, zeros))  # (O, G)
    q = torch.stack((codes & 15, codes >> 4), dim=2).view(codes.shape[0], -1, 32).double()  # (O, G, 32)
    return torch.einsum("mgj,ogj->mo", xq, q * s[..., None]) + blocks.double().sum(-1) @ (z - 8 * s).T


# The hostile-input tests' hypothesis settings: the same examples on every run, nothing kept between runs.
REPEATABLE = dict(deadline=None, derandomize=True, database=None)


def make_run(out, cfg: GPTConfig, tok, seed: int = 0, scale: float = 0.2):
    """A GPT run written as training writes one, its weights moved off their initial values (so every
    weight matters and greedy decoding takes a varied path)."""
    torch.manual_seed(seed)
    cfg.vocab_size = tok.vocab_size
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    fresh_dir(out)
    record(out, CONFIG, WEIGHTS, TOKENIZER)
    write_json(
        out / CONFIG,
        {
            "family": "gpt",
            "model": asdict(cfg),
            "train": asdict(TrainConfig()),
            "data": asdict(DataConfig(tokenizer=tok.kind, vocab_size=tok.vocab_size)),
        },
    )
    save_weights(model, out / WEIGHTS, {"step": "0"})
    write_text(out / TOKENIZER, tok.to_json())
    return out


def moved_peft(hf: torch.nn.Module, config) -> torch.nn.Module:
    """PEFT's LoRA `config` on `hf`, every B drawn off zero (seed 2) so that the adapters change the model."""
    import peft

    theirs = peft.get_peft_model(hf, config)
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return theirs


def flags(**options) -> list[str]:
    """CLI flags from keywords, in order: flags(n_layer=1, json=True) == ["--n-layer", "1", "--json"]."""
    out = []
    for name, value in options.items():
        out += [f"--{name.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return out


def code_file(folder, repeats: int = 30):
    """folder/code.txt: TEXT repeated (Python-like code, ~4 KB at 30), the corpus of a module's tiny runs."""
    path = folder / "code.txt"
    path.write_text(TEXT * repeats)
    return path


class Extra:
    """A dev extra, imported when a test first reads one of its names (see `extra`)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("_"):  # pytest asks every module-level object for markers: not a use
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)


def extra(name: str, why: str) -> ModuleType:
    """The optional library `name` for a test module: the module skips (with `why`) where it is not
    installed, and it is imported when a test first uses it, not while the suite is collected.
    Collecting imports every test module in every worker: transformers' models alone take 5 s each."""
    if importlib.util.find_spec(name.split(".")[0]) is None or importlib.util.find_spec(name) is None:
        pytest.skip(why, allow_module_level=True)
    return Extra(name)  # type: ignore[return-value]


# The modules whose tests take longest, slowest first (summed by file in a run of the whole suite on a
# 2-core AMD EPYC, issue 52). `make test` hands each worker whole modules (--dist loadfile): started last,
# a module of a minute keeps one worker busy while the other has finished; started first, the many short
# modules fill in around it (longest first is the classic rule for balancing two machines).
SLOWEST_FIRST = (
    "test_docs_site",
    "test_compiled_decode",
    "test_translate",
    "test_seams",
    "test_startup",
    "test_distributed",
    "test_image_task",
    "test_fast_recipe",
    "test_chat_terminal",
    "test_onnx",
    "test_baselines",
    "test_finetune",
    "test_bad_inputs",
    "test_convert_bert",
    "test_hostile_serve",
)


def pytest_configure(config):
    """Under pytest-xdist (make test runs `-n 2`), each worker process keeps to one core: two
    workers with two threads each would fight over the two cores of a laptop or a CI runner. And the
    modules go out in the order pytest_collection_modifyitems gives them, not xdist's own (most tests
    first, which put the site's 19 slow tests near the end)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
    if getattr(config.option, "loadscopereorder", None):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    """The slowest modules first (SLOWEST_FIRST), each module's tests kept together and in order."""
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


@pytest.fixture(autouse=True)
def _isolated(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    # The threads a test sets stay set: another test process busy here must not lower them, nor add a
    # line to the stderr a test reads (runtime/threads.py; tests/test_threads.py checks the sharing).
    monkeypatch.setenv("ATTNLAB_THREADS", "0")
    # Commands compile their decode step by default (a minute for each new shape); a test that wants
    # the compiled step asks for it (compiled_steps, or compile=True in code).
    monkeypatch.setenv("ATTNLAB_COMPILE", "0")
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: extra threads only add synchronization, which on a busy machine costs 10-30x
    (measured: 150 Adam steps of the bag of words take 0.7 s on one thread, 20 s on two).
    Modules of tiny models use it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def compiled_steps(monkeypatch) -> list:
    """The decode steps taken through decoding/compiled.py's CompiledStep (one item each), with
    torch.compile replaced by the function itself and the ahead-of-time step off: the step's own code
    runs, nothing is compiled. For tests that a command or the server reaches the compiled step without
    paying for a compilation."""
    from attnlab.decoding import compiled

    fed = []
    monkeypatch.delenv("ATTNLAB_COMPILE")  # the commands' default: compiled
    monkeypatch.setattr(compiled, "EXPORT", False)
    monkeypatch.setattr(compiled.torch, "compile", lambda fn, **kw: fn)
    real = compiled.CompiledStep.feed
    monkeypatch.setattr(compiled.CompiledStep, "feed", lambda self, *a: fed.append(1) or real(self, *a))
    return fed


LESSONS = Path(__file__).resolve().parent.parent / "lessons"


def lessons_execute() -> ModuleType:
    """lessons/execute.py, imported by its path (lessons/ is not a package; it imports nbclient)."""
    spec = importlib.util.spec_from_file_location("lessons_execute", LESSONS / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def notebook_kernel():
    """One Jupyter kernel for every notebook a test process executes (the lessons, the notebook tests),
    where each started its own: a kernel's start and its first `import attnlab` cost 5-10 s on 2 cores.
    Started in lessons/ (the lessons import their checks from there); each use empties its namespace
    first (run_notebook, lessons/execute.py)."""
    pytest.importorskip("nbclient", reason="notebooks run in a kernel: pip install -e '.[notebook]'")
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="python3")
    # no compiled decode step unless a test asks for one (as _isolated; lesson 4 samples from its GPT)
    km.start_kernel(cwd=str(LESSONS), env={**os.environ, "ATTNLAB_COMPILE": "0"})
    yield km
    km.shutdown_kernel(now=True)


def run_notebook(client, timeout: int = 120) -> None:
    """Execute nbclient `client`'s notebook in its kernel (made with km=notebook_kernel), cell by cell,
    as lessons/execute.py runs a lesson: the namespace emptied first; the test's own ATTNLAB_* settings
    (conftest._isolated: its cache, threads, no compiled step) set in the kernel while it runs, and the
    kernel's own put back after."""
    env = {k: v for k, v in os.environ.items() if k.startswith("ATTNLAB_")}
    with client.setup_kernel():
        client.kc.execute_interactive(lessons_execute()._FRESH, timeout=timeout)
        client.kc.execute_interactive(f"import os as _os\n_saved = dict(_os.environ)\n_os.environ.update({env!r})")
        try:
            for index, cell in enumerate(client.nb.cells):
                client.execute_cell(cell, index)
        finally:
            client.kc.execute_interactive("_os.environ.clear()\n_os.environ.update(_saved)", timeout=timeout)


@pytest.fixture
def corpus(tmp_path):
    """A small text file of Python-like code (about 5 KB)."""
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT * 40)
    return path


def run_cli(args, capsys) -> tuple[int, str, str]:
    """Run `attnlab ARGS` in-process: (exit code, stdout, stderr); argparse's own errors give 2."""
    from attnlab.cli.main import main

    try:
        code = main([str(a) for a in args])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def shown(err: str) -> list[str]:
    """The lines of a command's stderr that say something, as a reader sees them: without progress, a
    terminal's redrawn bar (only its last state after a carriage return) or a log's progress lines."""
    from attnlab.progress import LINE

    lines = [line.rsplit("\r", 1)[-1] for line in err.split("\n")]
    return [line for line in lines if line.strip() and not LINE.match(line)]


def losses(run: Path) -> list[float]:
    """The training loss of every step of the run folder `run`, in order (RUN/metrics.jsonl)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def perturb(model: torch.nn.Module, scale: float = 0.1) -> torch.nn.Module:
    """Move every parameter off its initial value (LayerNorm gains != 1, biases != 0), so that a
    comparison of two implementations sees every weight; eval mode."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    return model.eval()


@torch.no_grad()
def decode_stepwise(model: torch.nn.Module, ids: torch.Tensor, prompt: int) -> tuple[torch.Tensor, list]:
    """The logits of `ids` (B, T) computed as decoding does: the first `prompt` tokens in one call,
    then one token at a time through the key/value caches; returns them (B, T, V) and the caches."""
    caches = model.new_caches()
    steps = [model(ids[:, :prompt], caches=caches)]
    steps += [model(ids[:, t : t + 1], caches=caches, offset=t) for t in range(prompt, ids.shape[1])]
    return torch.cat(steps, dim=1), caches


# The stack of the tiny Llama-style HuggingFace models the conversion tests build (dict(TINY_LLAMA, ...)).
TINY_LLAMA = dict(num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64, tie_word_embeddings=False)


def random_hf_model(config_name: str, kind: str, seed: int = 0, **config) -> torch.nn.Module:
    """A HuggingFace `kind` model built locally from transformers.`config_name`(**config), perturbed,
    on the eager attention path (the one that returns attention probabilities)."""
    import transformers

    torch.manual_seed(seed)
    hf_cfg = getattr(transformers, config_name)(**config)
    hf_cfg._attn_implementation = "eager"
    return perturb(getattr(transformers, kind)(hf_cfg))


def tiny_model(**kw) -> GPTConfig:
    return GPTConfig(**{"n_layer": 2, "n_head": 2, "d_model": 32, "context": 32, **kw})


# The captioners' images in the tests: one channel, 8x16, in 4x4 patches.
TINY_IMAGES = dict(image_size=8, image_width=16, channels=1, patch_size=4)


def tiny_captioner(**kw) -> torch.nn.Module:
    """A seeded, perturbed captioner of TINY_IMAGES, 20 target tokens (the caption tests')."""
    torch.manual_seed(0)
    sizes = dict(n_layer=2, n_head=2, d_model=16, d_ff=32, context=12, dropout=0.0, tgt_vocab=20)
    cfg = CaptionerConfig(**sizes, **TINY_IMAGES, **kw)
    return perturb(build_model("captioner", cfg), 0.5)


def tiny_train(**kw) -> TrainConfig:
    base = {
        "max_steps": 20,
        "batch_size": 4,
        "lr": 3e-3,
        "warmup_steps": 5,
        "eval_interval": 10,
        "eval_batches": 2,
        "device": "cpu",
        "dtype": "float32",
    }
    return TrainConfig(**{**base, **kw})


def quick_stages(monkeypatch, demo: ModuleType, names: tuple[str, ...], eval_interval: int) -> None:
    """The chat demo's training stages `names` (cli/demo_chat.py) cut to two steps on the CPU."""
    steps = dict(max_steps=2, time_budget=None, min_steps=0, batch_size=4, eval_batches=1, warmup_steps=1)
    for name in names:
        stage = {**getattr(demo, name), **steps, "eval_interval": eval_interval, "device": "cpu", "dtype": "float32"}
        monkeypatch.setattr(demo, name, stage)


def tiny_reward_model(out: Path, base: Path, examples: int = 24, **options) -> Path:
    """A reward model (tasks/reward.py) trained from `base` for two steps on `examples` preference pairs."""
    import attnlab
    from attnlab.data.finetune import PreferenceData

    pairs = PreferenceData(examples=examples, test_examples=4)
    cfg = tiny_train(max_steps=2, eval_interval=2)
    attnlab.train(out, None, cfg, pairs, init=base, task="reward", progress=False, **options)
    return out


def tiny_data(path, **kw) -> DataConfig:
    return DataConfig(data=str(path), **kw)


def tiny_chat_base(folder, dropout: float = 0.1):
    """A tiny GPT run pretrained for a step on rendered instructions (so its character tokenizer knows
    them), with a context that fits them: the base the fine-tuning tasks' tests start from."""
    import attnlab
    from attnlab.data.chat import ChatTemplate
    from attnlab.data.instructions import instructions

    corpus = folder / "chats.txt"
    corpus.write_text("".join(ChatTemplate().render(c.messages) for c in instructions("train", 300, 5)))
    model = tiny_model(n_layer=1, d_model=16, context=256, dropout=dropout)
    attnlab.train(
        folder / "base", model, tiny_train(max_steps=1), DataConfig(data=str(corpus), tokenizer="char"), progress=False
    )
    return folder / "base"


def write_lora_run(base, out, lora: LoRAConfig, quantize: str | None = None, seed: int = 1, kind: str = "sft") -> Path:
    """A LoRA run over run `base`, written by hand as the sft task writes one (runs/adapted.py): config.json
    with its adapter section, the adapters alone in model.safetensors (A and B drawn away from zero, so
    the adapters change the model), the base's tokenizer.json; every file in the marker. Returns `out`."""
    base, out = Path(base), Path(out)
    based = read_run_config(base)
    config = {
        **{k: based[k] for k in ("family", "model", "train", "data")},
        "task": {"kind": kind},
        "init": str(base),
        "adapter": {"base": str(base), "lora": asdict(lora), "quantize_base": quantize, "also": []},
    }
    net = build_adapted(config)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in lora_parameters(net):
            p.normal_(0, 0.1)
    fresh_dir(out)
    record(out, CONFIG, WEIGHTS, TOKENIZER)
    write_json(out / CONFIG, config)
    write_weights(lora_state_dict(net), out / WEIGHTS, {"step": "0"})
    shutil.copyfile(base / TOKENIZER, out / TOKENIZER)
    return out


# A chat template short enough for a context of 32 (tests/test_chat.py has Llama 3's and ChatML): each
# turn a line "u:TEXT", the answer after "a:" ending at the newline (its eos_token).
SHORT = (
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)


def tiny_code_lm(root: Path, **model) -> Path:
    """root/run: a 2-layer tiny_model(**model) trained 30 steps on short Python-like lines, its own
    token cache (module scope runs before _isolated's): the run whose activations SAEs and transcoders
    are trained on in their tests."""
    import attnlab

    corpus = root / "corpus.txt"
    corpus.write_text("def add(a, b):\n    return a + b\n\nclass Point:\n    x = 1\n" * 200)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNLAB_CACHE", str(root / "cache"))
        train = tiny_train(max_steps=30, eval_interval=30)
        attnlab.train(root / "run", tiny_model(n_layer=2, **model), train, tiny_data(corpus), progress=False)
    return root / "run"


def nano_flags(n_layer: int = 1, n_head: int = 2, steps: int = 5) -> list[str]:
    """`attnlab train lm`'s flags for a character gpt-nano of width and context 32, `steps` steps on the CPU."""
    model = flags(preset="gpt-nano", n_layer=n_layer, n_head=n_head, d_model=32, context=32, tokenizer="char")
    return model + flags(max_steps=steps, batch_size=4, eval_interval=steps, eval_batches=1, device="cpu")


ADD = "def add(a, b):\n    return a + b\n"


def cli_lm(root: Path, args: list, text: str = ADD * 200, name: str = "lm") -> Path:
    """root/NAME: `attnlab train lm ARGS` on `text` (written to root/corpus.txt), its token cache under
    root (a module-scoped fixture runs before _isolated's per-test cache)."""
    from attnlab.cli.main import main

    (root / "corpus.txt").write_text(text)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNLAB_CACHE", str(root / "cache"))
        assert main([str(a) for a in ["train", "lm", "--data", root / "corpus.txt", "--out", root / name, *args]]) == 0
    return root / name


def short_chat_lm(root: Path, steps: int = 5, repeats: int = 200) -> Path:
    """root/lm: a 1-layer character GPT of context 32 trained `steps` steps through `attnlab train lm`,
    with the SHORT chat template: the run the server's API tests talk to."""
    from attnlab.data.chat import ChatTemplate
    from attnlab.runs.adapted import CHAT_TEMPLATE

    cli_lm(root, nano_flags(steps=steps), ADD * repeats)
    record(root / "lm", CHAT_TEMPLATE)
    write_json(root / "lm" / CHAT_TEMPLATE, ChatTemplate(SHORT, eos_token="\n").to_dict())
    return root / "lm"


@contextlib.contextmanager
def ctrl_c_at(monkeypatch, step: int, command: str | None = None) -> Iterator[None]:
    """Inside the block, a training (of the task `command`; None: any) is interrupted, as by Ctrl-C,
    before it trains step `step` + 1."""
    import attnlab.engine.loop as loop

    real = loop.train_step

    def train_step(s):
        if s.step == step and command in (None, s.command):
            raise KeyboardInterrupt
        return real(s)

    with monkeypatch.context() as m:
        m.setattr(loop, "train_step", train_step)
        yield
