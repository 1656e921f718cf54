"""Bad inputs, tried as a hostile but realistic user would: each gives one line, exit code 2 (a 4xx
from the server), no traceback, and leaves every folder outside its --out as it was.

The table covers files, numbers, configs, run folders, CSV/TSV/JSONL/CoNLL, images, HuggingFace
folders and API requests; a property-based layer (hypothesis) throws random values at the config
parsers and random bodies at the API. A sentinel folder (a web project with its own config.json)
and four trained runs are checksummed before and after every case.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from attnlab.config import checked
from attnlab.data import parallel
from attnlab.errors import AttnlabError
from tests.conftest import code_file, flags, run_cli, shown

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

LM = (
    "--n-layer 1 --n-head 2 --d-model 16 --context 32 --batch-size 4 --max-steps 2 "
    "--eval-interval 2 --eval-batches 1 --device cpu --dtype float32"
).split()
SMALL = ["--max-steps", "2", "--eval-interval", "2", "--eval-batches", "1", "--device", "cpu"]


def train(args: list) -> None:
    """`attnlab ARGS` in-process, its output kept out of the test's (a module fixture has no capsys)."""
    from attnlab.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main([str(a) for a in args])
    assert code == 0, out.getvalue()


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """The world every case runs in: data files, a sentinel folder and four small trained runs."""
    root = tmp_path_factory.mktemp("bad")
    corpus = code_file(root)
    table = root / "reviews.csv"
    table.write_text(
        "text,label\n" + "".join(f"a fine film number {i},{'pos' if i % 2 else 'neg'}\n" for i in range(80))
    )
    sentinel = root / "project"  # someone's web project: has a config.json, is not a run
    (sentinel / "src").mkdir(parents=True)
    (sentinel / "config.json").write_text('{"name": "app"}')
    (sentinel / "src" / "main.js").write_text("console.log('hi')\n")
    train(["train", "lm", "--data", corpus, "--out", root / "lm", *LM])
    train(["train", "classify", "--data", table, "--model", "bow", "--out", root / "cls", *SMALL])
    tiny = flags(n_layer=1, d_model=16, n_head=2, batch_size=8)
    with pytest.MonkeyPatch.context() as mp:  # its test scores: 100 pairs decoded, not 2000
        mp.setattr(parallel, "TEST_SIZE", 100)
        train(["train", "translate", "--data", "reverse", "--n-train", "60", "--out", root / "tr", *tiny, *SMALL])
    train(["train", "image", "--model", "mlp", "--out", root / "img", "--batch-size", "16", *SMALL])
    runs = {name: root / name for name in ("lm", "cls", "tr", "img")}
    return SimpleNamespace(
        root=root, corpus=corpus, table=table, sentinel=sentinel, guarded=[sentinel, *runs.values()], **runs
    )


def checksum(folders: list[Path]) -> str:
    h = hashlib.sha256()
    for folder in folders:
        for p in sorted(folder.rglob("*")):
            h.update(str(p.relative_to(folder.parent)).encode())
            if p.is_file():
                h.update(p.read_bytes())
    return h.hexdigest()


def assert_one_line_error(code, err: str, fragment: str) -> None:
    assert "Traceback" not in err, err
    assert code == 2, err
    lines = [line for line in shown(err) if not line.startswith("attnlab: warning:")]  # progress left out
    assert len(lines) == 1, err
    assert lines[0].startswith("attnlab: error:"), lines[0]
    assert fragment in lines[0], lines[0]


# ---- helpers that make a bad input ------------------------------------------------------------


def copy_run(w, name: str, tmp: Path) -> Path:
    run = tmp / f"{name}-copy"
    shutil.copytree(getattr(w, name), run)
    return run


def spoiled(change: Callable[[Path], None]) -> Callable:
    """A copy of the lm run, changed by `change`."""

    def make(w, tmp):
        run = copy_run(w, "lm", tmp)
        change(run)
        return run

    return make


def nan_weights(run: Path) -> None:
    weights = load_file(run / "model.safetensors")
    name = next(iter(weights))
    weights[name] = torch.full_like(weights[name], float("nan"))
    save_file(weights, run / "model.safetensors")


def write(tmp: Path, name: str, content: str | bytes) -> Path:
    p = tmp / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


def png(tmp: Path, size: tuple[int, int], mode: str = "1") -> Path:
    path = tmp / f"big-{size[0]}x{size[1]}.png"
    Image.new(mode, size).save(path)
    return path


def hf_dir(tmp: Path, index: dict | None = None) -> Path:
    d = tmp / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    if index is not None:
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d


# ---- the table: (name, arguments from (world, tmp folder), what the one line says) -------------


@dataclass
class Case:
    name: str
    args: Callable[[SimpleNamespace, Path], list]
    says: str


def lm(*extra) -> Callable:
    return lambda w, tmp: ["train", "lm", "--data", w.corpus, "--out", tmp / "run", *LM, *extra]


def cls(data: Callable, *extra) -> Callable:
    return lambda w, tmp: [
        "train",
        "classify",
        "--data",
        data(w, tmp),
        "--model",
        "bow",
        "--out",
        tmp / "run",
        *SMALL,
        *extra,
    ]


def vectors(*extra) -> Callable:
    return lambda w, tmp: [
        "train",
        "vectors",
        "--data",
        w.corpus,
        "--out",
        tmp / "run",
        "--min-count",
        "1",
        "--epochs",
        "1",
        *extra,
    ]


def family(name: str) -> Callable[[Path], None]:
    """A change for `spoiled`: config.json names a model family attnlab does not have."""

    def change(run: Path) -> None:
        config = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps({**config, "family": name}))

    return change


def toml(text: str) -> Callable:
    return lambda w, tmp: [
        "train",
        "lm",
        "--data",
        w.corpus,
        "--out",
        tmp / "run",
        *LM,
        "--config",
        write(tmp, "c.toml", text),
    ]


CASES = [
    # data files
    Case("missing_data", lambda w, tmp: ["train", "lm", "--data", tmp / "nope.txt", "--out", tmp / "r"], "not found"),
    Case("empty_data", lambda w, tmp: ["train", "lm", "--data", write(tmp, "e.txt", ""), "--out", tmp / "r"], "empty"),
    Case(
        "binary_data",
        lambda w, tmp: ["train", "lm", "--data", write(tmp, "x.bin", b"\0\1\2" * 100), "--out", tmp / "r"],
        "not a text file",
    ),
    Case(
        "folder_without_text",
        lambda w, tmp: ["train", "lm", "--data", write(tmp, "d/x.bin", b"\0").parent, "--out", tmp / "r"],
        "no text files",
    ),
    Case(
        "glob_matches_nothing",
        lambda w, tmp: ["train", "lm", "--data", w.root, "--glob", "*.rs", "--out", tmp / "r"],
        "no text files",
    ),
    # numbers
    Case("lr_nan", lm("--lr", "nan"), "finite"),
    Case("lr_inf", lm("--lr", "inf"), "finite"),
    Case("lr_negative", lm("--lr", "-1"), "lr must be"),
    Case("lr_zero", lm("--lr", "0"), "lr must be"),
    Case("lr_word", lm("--lr", "fast"), "expected float"),
    Case("weight_decay_nan", lm("--weight-decay", "nan"), "finite"),
    Case("weight_decay_negative", lm("--weight-decay", "-0.1"), "weight_decay"),
    Case("grad_clip_nan", lm("--grad-clip", "nan"), "finite"),
    Case("grad_clip_negative", lm("--grad-clip", "-1"), "grad_clip"),
    Case("beta1_above_1", lm("--beta1", "1.5"), "beta1"),
    Case("beta2_nan", lm("--beta2", "NaN"), "finite"),
    Case("min_lr_inf", lm("--min-lr=-inf"), "finite"),
    Case("val_fraction_nan", lm("--val-fraction", "nan"), "finite"),
    Case("val_fraction_1", lm("--val-fraction", "1"), "val_fraction"),
    Case("dropout_nan", lm("--dropout", "nan"), "finite"),
    Case("dropout_1", lm("--dropout", "1"), "dropout"),
    Case("batch_size_0", lm("--batch-size", "0"), "at least 1"),
    Case("max_steps_negative", lm("--max-steps", "-1"), "max_steps"),
    Case("warmup_negative", lm("--warmup-steps", "-5"), "warmup_steps"),
    Case("eval_interval_0", lm("--eval-interval", "0"), "at least 1"),
    Case("n_layer_0", lm("--n-layer", "0"), "at least 1"),
    Case("n_layer_fraction", lm("--n-layer", "2.5"), "expected int"),
    Case("d_model_word", lm("--d-model", "wide"), "expected int"),
    Case("grad_accum_split", lm("--batch-size", "5", "--grad-accum", "2"), "divisible"),
    Case("dtype_unknown", lm("--dtype", "float8"), "is not one of"),
    Case("huge_context", lm("--context", "100000000", "--block-size", "32"), "needs ~"),
    Case("block_beyond_data", lm("--context", "100000", "--block-size", "100000"), "fewer than block size"),
    Case("vocab_size_0", lm("--tokenizer", "bpe", "--vocab-size", "0"), "vocab_size"),
    # config files
    Case("config_missing", lm("--config", "/nonexistent/c.toml"), "not found"),
    Case("toml_syntax", toml("[model\nn_layer = "), "not valid TOML"),
    Case("toml_nan", toml("[train]\nlr = nan\n"), "finite"),
    Case("toml_inf", toml("[train]\nweight_decay = inf\n"), "finite"),
    Case("toml_unknown_key", toml("[train]\nlearning_rate = 0.1\n"), "unknown option"),
    Case("toml_wrong_type", toml("[model]\ndropout = 'none'\n"), "expected float"),
    Case("toml_bool_for_int", toml("[train]\nwarmup_steps = true\n"), "expected int"),
    # run folders
    Case(
        "out_is_foreign",
        lambda w, tmp: ["train", "lm", "--data", w.corpus, "--out", w.sentinel, *LM],
        "not an attnlab run",
    ),
    Case(
        "force_on_foreign",
        lambda w, tmp: ["train", "lm", "--data", w.corpus, "--out", w.sentinel, "--force", *LM],
        "refusing to replace",
    ),
    Case(
        "force_on_foreign_subfolder",
        lambda w, tmp: ["train", "lm", "--data", w.corpus, "--out", w.sentinel / "src", "--force", *LM],
        "not an attnlab run",
    ),
    Case(
        "out_is_a_file",
        lambda w, tmp: ["train", "lm", "--data", w.corpus, "--out", w.sentinel / "config.json", "--force", *LM],
        "not an attnlab run",
    ),
    Case("existing_run", lambda w, tmp: ["train", "lm", "--data", w.corpus, "--out", w.lm, *LM], "already exists"),
    Case("resume_missing", lambda w, tmp: ["train", "lm", "--out", tmp / "none", "--resume"], "not found"),
    Case("resume_foreign", lambda w, tmp: ["train", "lm", "--out", w.sentinel, "--resume"], "not an attnlab run"),
    Case(
        "resume_unstarted",
        lambda w, tmp: ["train", "lm", "--out", write(tmp, "u/attnlab.json", '{"attnlab": "run"}').parent, "--resume"],
        "without --resume",
    ),
    Case("resume_with_init", lambda w, tmp: ["train", "lm", "--out", w.lm, "--resume", "--init", w.lm], "only one"),
    Case("resume_lr_nan", lambda w, tmp: ["train", "lm", "--out", w.lm, "--resume", "--lr", "nan"], "finite"),
    Case(
        "init_missing",
        lambda w, tmp: ["train", "lm", "--data", w.corpus, "--out", tmp / "r", "--init", tmp / "none"],
        "not found",
    ),
    Case("sample_missing", lambda w, tmp: ["sample", tmp / "none"], "not found"),
    Case("sample_foreign", lambda w, tmp: ["sample", w.sentinel], "missing"),
    Case(
        "sample_truncated_weights",
        lambda w, tmp: [
            "sample",
            spoiled(lambda r: (r / "model.safetensors").write_bytes((r / "model.safetensors").read_bytes()[:100]))(
                w, tmp
            ),
        ],
        "corrupt",
    ),
    Case("sample_nan_weights", lambda w, tmp: ["sample", spoiled(nan_weights)(w, tmp)], "NaN"),
    Case(
        "sample_corrupt_config",
        lambda w, tmp: ["sample", spoiled(lambda r: (r / "config.json").write_text("{"))(w, tmp)],
        "corrupt",
    ),
    Case(
        "sample_config_not_tables",
        lambda w, tmp: ["sample", spoiled(lambda r: (r / "config.json").write_text("[1, 2]"))(w, tmp)],
        "corrupt",
    ),
    Case(
        "sample_no_tokenizer",
        lambda w, tmp: ["sample", spoiled(lambda r: (r / "tokenizer.json").unlink())(w, tmp)],
        "tokenizer",
    ),
    Case("sample_temperature_nan", lambda w, tmp: ["sample", w.lm, "--temperature", "nan"], "finite"),
    Case("sample_temperature_negative", lambda w, tmp: ["sample", w.lm, "--temperature", "-1"], "temperature"),
    Case("sample_top_p_2", lambda w, tmp: ["sample", w.lm, "--top-p", "2"], "top_p"),
    Case("sample_top_k_0", lambda w, tmp: ["sample", w.lm, "--top-k", "0"], "top_k"),
    Case("sample_zero_samples", lambda w, tmp: ["sample", w.lm, "--num-samples", "0"], "at least 1"),
    Case("sample_negative_length", lambda w, tmp: ["sample", w.lm, "--max-new-tokens", "-1"], "max_new_tokens"),
    Case("sample_a_classifier", lambda w, tmp: ["sample", w.cls], "not a language model"),
    Case("eval_missing_data", lambda w, tmp: ["eval", w.lm, "--data", tmp / "none.txt"], "not found"),
    Case("eval_zero_tokens", lambda w, tmp: ["eval", w.lm, "--max-tokens", "0"], "at least 1"),
    Case("predict_on_lm", lambda w, tmp: ["predict", w.lm, "hello"], "sample"),
    # CSV / TSV / JSONL / CoNLL
    Case("csv_missing_column", cls(lambda w, tmp: write(tmp, "t.csv", "review,stars\ngood,5\n")), "no column"),
    Case(
        "csv_one_class", cls(lambda w, tmp: write(tmp, "t.csv", "text,label\n" + "nice film,pos\n" * 40)), "one label"
    ),
    Case("csv_only_commas", cls(lambda w, tmp: write(tmp, "t.csv", "text,label\n" + ",\n" * 40)), "empty"),
    Case(
        "jsonl_not_json", cls(lambda w, tmp: write(tmp, "t.jsonl", '{"text": "a", "label": "b"}\n{oops\n')), "not JSON"
    ),
    Case("jsonl_not_object", cls(lambda w, tmp: write(tmp, "t.jsonl", "[1, 2]\n")), "JSON object"),
    Case("tsv_missing", cls(lambda w, tmp: tmp / "none.tsv"), "not found"),
    Case("split_fraction_nan", cls(lambda w, tmp: w.table, "--split-fraction", "nan"), "finite"),
    Case("max_len_0", cls(lambda w, tmp: w.table, "--max-len", "0"), "max_len"),
    Case(
        "conll_one_field",
        lambda w, tmp: ["train", "tag", "--data", write(tmp, "t.conll", "word\n"), "--out", tmp / "r", *SMALL],
        "expected 'token label'",
    ),
    # translation
    Case("translate_empty", lambda w, tmp: ["translate", w.tr, ""], "empty"),
    Case("translate_blank", lambda w, tmp: ["predict", w.tr, "   "], "empty"),
    Case("translate_beam_0", lambda w, tmp: ["translate", w.tr, "abc", "--beam", "0"], "at least 1"),
    Case("translate_beam_word", lambda w, tmp: ["translate", w.tr, "abc", "--beam", "wide"], "whole number"),
    Case(
        "translate_missing_data",
        lambda w, tmp: ["train", "translate", "--data", tmp / "none.tsv", "--out", tmp / "r"],
        "not found",
    ),
    Case(
        "translate_split_nan",
        lambda w, tmp: ["train", "translate", "--split-fraction", "nan", "--out", tmp / "r"],
        "finite",
    ),
    # images
    Case("image_not_an_image", lambda w, tmp: ["predict", w.img, write(tmp, "x.png", "not a png")], "cannot read"),
    Case("image_missing", lambda w, tmp: ["predict", w.img, tmp / "none.png"], "cannot read"),
    Case("image_too_many_pixels", lambda w, tmp: ["predict", w.img, png(tmp, (6000, 6000))], "over the limit"),
    Case("image_size_huge", lambda w, tmp: ["train", "image", "--image-size", "100000", "--out", tmp / "r"], "needs ~"),
    Case("image_size_0", lambda w, tmp: ["train", "image", "--image-size", "0", "--out", tmp / "r"], "image_size"),
    Case(
        "image_folder_missing",
        lambda w, tmp: ["train", "image", "--data", tmp / "none", "--out", tmp / "r"],
        "not found",
    ),
    Case(
        "image_npz_objects",
        lambda w, tmp: ["train", "image", "--data", npz_of_objects(tmp), "--out", tmp / "r"],
        "cannot read",
    ),
    Case(
        "image_val_fraction_inf",
        lambda w, tmp: ["train", "image", "--val-fraction", "inf", "--out", tmp / "r"],
        "finite",
    ),
    # HuggingFace folders
    Case(
        "convert_no_config",
        lambda w, tmp: ["convert", "--from-hf", write(tmp, "hf/x.txt", "").parent, "--out", tmp / "r"],
        "no config.json",
    ),
    Case(
        "convert_shard_outside",
        lambda w, tmp: [
            "convert",
            "--from-hf",
            hf_dir(tmp, {"weight_map": {"wte.weight": "../../../../etc/hostname"}}),
            "--out",
            tmp / "r",
        ],
        "outside",
    ),
    Case(
        "convert_index_without_map",
        lambda w, tmp: ["convert", "--from-hf", hf_dir(tmp, {"files": []}), "--out", tmp / "r"],
        "weight_map",
    ),
    Case(
        "convert_over_foreign",
        lambda w, tmp: ["convert", "--from-hf", hf_dir(tmp, {}), "--out", w.sentinel, "--force"],
        "not an attnlab run",
    ),
    Case(
        "export_over_foreign",
        lambda w, tmp: ["export", "--to", "hf", w.lm, w.sentinel, "--force"],
        "not a HuggingFace model directory",
    ),
    Case(
        "onnx_over_foreign_file",
        lambda w, tmp: ["export", "--to", "onnx", w.lm, w.sentinel / "config.json", "--force"],
        "not an .onnx file",
    ),
    Case(
        "onnx_over_existing",
        lambda w, tmp: ["export", "--to", "onnx", w.lm, write(tmp, "m.onnx", "x")],
        "already exists",
    ),
    Case("export_missing_run", lambda w, tmp: ["export", "--to", "hf", tmp / "none", tmp / "out"], "not found"),
    Case("size_unknown_preset", lambda w, tmp: ["size", "--preset", "gpt-9"], "unknown preset"),
    # issue 32: tracebacks, numbers, keys
    Case("seed_negative", lm("--seed", "-5"), "seed must be a whole number from 0"),
    Case("seed_23_digits", lm("--seed", "1" * 23), "seed must be a whole number from 0"),
    Case("sample_seed_negative", lambda w, tmp: ["sample", w.lm, "--seed", "-1"], "seed must be"),
    Case("vectors_seed_negative", vectors("--seed", "-5"), "seed must be"),
    Case("vectors_buckets_0", vectors("--method", "fasttext", "--buckets", "0"), "buckets must be at least 1"),
    Case("vectors_dim_huge", vectors("--dim", str(10**12)), "needs ~"),
    Case("vectors_glove_dim_huge", vectors("--method", "glove", "--dim", str(10**12)), "needs ~"),
    Case("vectors_threads_negative", vectors("--threads", "-2"), "threads must be 0 or more"),
    Case("vectors_eta_0", vectors("--method", "glove", "--eta", "0"), "eta must be above 0"),
    Case("vectors_min_alpha_above_alpha", vectors("--min-alpha", "0.5"), "min_alpha"),
    Case("vectors_top_negative", lambda w, tmp: ["vectors", w.lm, "--neighbors", "a", "--top", "-3"], "at least 1"),
    Case("vectors_top_words_0", lambda w, tmp: ["vectors", w.lm, "--top-words", "0"], "at least 1"),
    Case(
        "plot_tokens_0",
        lambda w, tmp: ["plot", w.lm, "--what", "embeddings", "--tokens", "0", "--out", tmp / "e.png"],
        "at least 1",
    ),
    Case(
        "family_unknown_resume",
        lambda w, tmp: ["train", "lm", "--out", spoiled(family("zorro"))(w, tmp), "--resume"],
        "model family 'zorro'",
    ),
    Case("serve_port_70000", lambda w, tmp: ["serve", w.lm, "--port", "70000"], "--port must be from 0 to 65535"),
    Case("serve_port_negative", lambda w, tmp: ["serve", w.lm, "--port", "-1"], "--port must be from 0 to 65535"),
    Case("serve_timeout_nan", lambda w, tmp: ["serve", w.lm, "--request-timeout", "nan"], "finite"),
    Case("serve_timeout_inf", lambda w, tmp: ["serve", w.lm, "--request-timeout", "inf"], "finite"),
    Case(
        "serve_one_letter_key_public",
        lambda w, tmp: ["serve", w.lm, "--host", "0.0.0.0", "--api-key", "k"],
        "at least 16 characters",
    ),
    Case("serve_blank_key", lambda w, tmp: ["serve", w.lm, "--api-key", " "], "blank"),
    Case("serve_blank_key_public", lambda w, tmp: ["serve", w.lm, "--host", "0.0.0.0", "--api-key", "   "], "blank"),
    Case("flag_mistyped", lambda w, tmp: ["sample", w.lm, "--temprature", "1"], "did you mean --temperature?"),
    Case("train_flag_mistyped", lm("--lerning-rate", "0.1"), "unrecognized arguments"),
    Case("train_flag_mistyped_near", lm("--warmup-step", "3", "--wramup-steps", "2"), "did you mean --warmup-steps"),
    Case("command_mistyped", lambda w, tmp: ["smaple", w.lm], "did you mean 'sample'?"),
    Case("task_mistyped", lambda w, tmp: ["train", "lmm", "--out", tmp / "run"], "did you mean 'lm'?"),
    Case("choice_mistyped", lambda w, tmp: ["plot", w.lm, "--what", "los", "--out", tmp / "l.png"], "'loss'?"),
    Case("toml_key_mistyped", toml("[train]\nwarmup_step = 3\n"), "did you mean warmup_steps?"),
]


def npz_of_objects(tmp: Path) -> Path:
    path = tmp / "objects.npz"
    np.savez(path, images=np.array([{"a": 1}], dtype=object), labels=np.array([1]))
    return path


def test_the_table_is_large_enough():
    assert len(CASES) >= 60 and len({c.name for c in CASES}) == len(CASES)


@pytest.mark.filterwarnings("ignore:.*rows have an empty text or label")  # the CSV of commas: expected
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_line_exit_2_and_touches_nothing(case, w, tmp_path, capsys):
    args = case.args(w, tmp_path)
    before = checksum(w.guarded)
    code, _, err = run_cli(args, capsys)
    assert_one_line_error(code, err, case.says)
    assert checksum(w.guarded) == before  # nothing outside --out changed: not the sentinel, not the runs
    assert not (tmp_path / "run").exists() and not (tmp_path / "r").exists()  # a failed start leaves no folder


# ---- the server: a 4xx with one line, never a 500 ------------------------------------------------


@pytest.fixture(scope="module")
def client(w):
    pytest.importorskip("httpx", reason="fastapi's TestClient needs httpx, a dev extra: pip install -e .[dev]")
    from fastapi.testclient import TestClient

    from attnlab.serve.app import create_app

    return TestClient(create_app([w.lm, w.cls, w.tr, w.img], device="cpu"), raise_server_exceptions=False)


def png_bytes(size: tuple[int, int], mode: str = "L") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size).save(buf, format="PNG")
    return buf.getvalue()


def chunks(total: int, size: int = 1 << 16):
    """A body sent without a Content-Length (chunked), `total` bytes in all."""
    for start in range(0, total, size):
        yield b"x" * min(size, total - start)


def raw(text: str) -> dict:
    """A body sent as JSON, written by hand (NaN, Infinity, broken JSON)."""
    return {"content": text, "headers": {"content-type": "application/json"}}


IMG = {"data": {"run": "img"}}
# fmt: off
API = [  # (name, method, path, request keywords, status, what the one line says)
    ("generate_nan", "post", "/api/generate", raw('{"run": "lm", "temperature": NaN}'), 422, "temperature"),
    ("generate_inf", "post", "/api/generate", raw('{"run": "lm", "top_p": Infinity}'), 422, "top_p"),
    ("generate_zero_tokens", "post", "/api/generate", {"json": {"run": "lm", "max_new_tokens": 0}}, 422, "max_new"),
    ("generate_too_many", "post", "/api/generate", {"json": {"run": "lm", "max_new_tokens": 10**9}}, 422, "max_new"),
    ("generate_seed_negative", "post", "/api/generate", {"json": {"run": "lm", "seed": -1}}, 422, "seed"),
    ("generate_unknown_run", "post", "/api/generate", {"json": {"run": "nope"}}, 404, "unknown run"),
    ("generate_on_classifier", "post", "/api/generate", {"json": {"run": "cls"}}, 400, "/api/predict"),
    ("generate_long_prompt", "post", "/api/generate", {"json": {"run": "lm", "prompt": "x" * 5000}}, 422, "prompt"),
    ("generate_not_json", "post", "/api/generate", raw("{run: lm"), 422, "not valid JSON"),
    ("generate_list_body", "post", "/api/generate", {"json": [1, 2]}, 422, "object"),
    ("body_2mb", "post", "/api/generate", {"content": b"x" * 2_000_000}, 413, "over"),
    ("body_chunked", "post", "/api/predict", {"content": chunks(3_000_000)}, 413, "over"),
    ("predict_on_lm", "post", "/api/predict", {"json": {"run": "lm", "text": "hi"}}, 400, "/api/generate"),
    ("predict_top_k_0", "post", "/api/predict", {"json": {"run": "cls", "text": "hi", "top_k": 0}}, 422, "top_k"),
    ("translate_empty", "post", "/api/predict", {"json": {"run": "tr", "text": ""}}, 400, "empty"),
    ("translate_beam_99", "post", "/api/predict", {"json": {"run": "tr", "text": "ab", "beam": 99}}, 422, "beam"),
    ("image_not_image", "post", "/api/predict_image", {**IMG, "files": {"image": ("a.png", b"no")}}, 400,
     "cannot read"),
    ("image_13000px", "post", "/api/predict_image",
     {**IMG, "files": {"image": ("big.png", png_bytes((13000, 13000), "1"))}}, 400, "over the limit"),
    ("image_11mb", "post", "/api/predict_image", {**IMG, "files": {"image": ("a.png", b"x" * 11_000_000)}}, 413,
     "over"),
    ("image_no_file", "post", "/api/predict_image", IMG, 422, "image"),
    ("image_on_lm", "post", "/api/predict_image", {"data": {"run": "lm"}, "files": {"image": ("a.png", b"x")}}, 400,
     "/api/generate"),
    ("attention_on_image_run", "post", "/api/attention", {"json": {"run": "img", "text": "x"}}, 400, "predict_image"),
    ("metrics_unknown_run", "get", "/api/runs/nope/metrics", {}, 404, "unknown run"),
    ("no_such_page", "get", "/api/nothing", {}, 404, "Not Found"),
    ("wrong_method", "get", "/api/generate", {}, 405, "Method Not Allowed"),
]
# fmt: on


@pytest.mark.parametrize("name,method,path,kw,status,says", API, ids=[a[0] for a in API])
def test_bad_request_is_a_4xx_with_one_line(name, method, path, kw, status, says, client, w):
    before = checksum(w.guarded)
    r = getattr(client, method)(path, **kw)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert isinstance(error, str) and "\n" not in error and "Traceback" not in error
    assert says in error, error
    assert checksum(w.guarded) == before


# ---- property-based: random values and bodies ------------------------------------------------------


def hypothesis():
    """hypothesis is a dev extra: without it the property-based tests skip, the rest run."""
    return pytest.importorskip("hypothesis", reason="hypothesis is a dev extra: pip install -e .[dev]")


def any_value(st):
    return st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-(2**70), 2**70),
        st.booleans(),
        st.none(),
        st.text(max_size=12),
        st.sampled_from(["nan", "inf", "-inf", "1e999", "0x10", "", " 3 ", "True", "none"]),
    )


def config_classes() -> list[type]:
    from attnlab.data import DataConfig
    from attnlab.data.images import ImageDataConfig
    from attnlab.data.labeled import LabeledDataConfig
    from attnlab.data.parallel import ParallelDataConfig
    from attnlab.decoding.sampling import GenerateConfig
    from attnlab.engine.config import TrainConfig
    from attnlab.models.gpt import GPTConfig

    return [TrainConfig, GenerateConfig, DataConfig, LabeledDataConfig, ParallelDataConfig, ImageDataConfig, GPTConfig]


@pytest.mark.parametrize("cls", config_classes(), ids=lambda c: c.__name__)
def test_config_parsers_give_a_config_or_one_user_error(cls):
    """Whatever values a flag, a TOML file or a config.json holds: a config whose floats are all
    finite, or an AttnlabError; never another exception."""
    h, names = hypothesis(), [f.name for f in fields(cls)] + ["unknown_key"]
    st = h.strategies

    @h.settings(max_examples=150, deadline=None, suppress_health_check=[h.HealthCheck.too_slow])
    @h.given(st.dictionaries(st.sampled_from(names), any_value(st), max_size=4))
    def check(values):
        try:
            cfg = checked(cls, values, "test")
        except AttnlabError as e:
            assert "\n" not in str(e)
            return
        for f in fields(cfg):
            v = getattr(cfg, f.name)
            assert not isinstance(v, float) or math.isfinite(v), (f.name, v)

    check()


def test_toml_files_read_or_say_why(tmp_path):
    from attnlab.config import read_toml

    h = hypothesis()

    @h.settings(max_examples=60, deadline=None, suppress_health_check=[h.HealthCheck.too_slow])
    @h.given(h.strategies.text(max_size=60))
    def check(text):
        path = tmp_path / "c.toml"
        path.write_text(text, encoding="utf-8")
        try:
            assert isinstance(read_toml(path), dict)
        except AttnlabError as e:
            assert str(e).count("\n") <= 1  # TOML's own message may name a line and column

    check()


def bodies(st):
    """Request bodies of the fields the endpoints read, each a value of any kind."""
    names = ["run", "prompt", "text", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "beam"]
    values = st.one_of(
        st.sampled_from(["lm", "cls", "tr", "img", "x"]),
        st.integers(-5, 40),
        st.floats(-2, 3),
        st.text(max_size=20),
        st.none(),
        st.booleans(),
    )
    return st.dictionaries(st.sampled_from(names), values, max_size=6)


def test_random_api_bodies_never_break_the_server(client):
    h = hypothesis()
    st = h.strategies

    @h.settings(max_examples=80, deadline=None, suppress_health_check=[h.HealthCheck.too_slow])
    @h.given(path=st.sampled_from(["/api/generate", "/api/predict", "/api/attention"]), body=bodies(st))
    def check(path, body):
        r = client.post(path, json=body)
        assert r.status_code in (200, 400, 404, 422), (r.status_code, r.text)
        if r.status_code != 200:
            error = r.json()["error"]
            assert isinstance(error, str) and "\n" not in error

    check()
