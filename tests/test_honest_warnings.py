"""Cases that were silent (a wrong result, exit 0, no word) and now say what happened: one
`attnlab: error: ...` line, or an `attnlab: warning: ...` line beside the result (issue 32).

Each row of CASES is (name, what is run, exit code, the fragment of the error or warning it
must print); a few cases also check what was (not) written. Four tiny runs are trained once for
the module: a character LM, a bag-of-words classifier, a masked LM and a digits MLP.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from attnlab.data.text import read_pieces
from attnlab.errors import AttnlabError
from attnlab.runs.run import load
from attnlab.tasks.image import load_image
from attnlab.tasks.metrics import confusion, scores
from tests.conftest import TEXT, code_file, extra, flags

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

SMALL = ["--max-steps", "2", "--warmup-steps", "1", "--eval-interval", "2", "--eval-batches", "1", "--device", "cpu"]
LM = [*flags(n_layer=1, n_head=2, d_model=16, context=32, batch_size=4, dtype="float32"), *SMALL]
ENCODER = ["--n-layer", "1", "--n-head", "2", "--d-model", "16"]


def attnlab(call: list | Callable[[], object]) -> tuple[int, str]:
    """`attnlab ARGS` in-process (or a library call): (exit code, stdout + stderr), every warning
    written as the command line writes it, `attnlab: warning: ...` (each time, not once per place)."""
    from attnlab.cli.main import main

    out = io.StringIO()
    with (
        warnings.catch_warnings(record=True) as caught,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(out),
    ):
        warnings.simplefilter("always")
        try:
            if isinstance(call, list):
                code = main([str(a) for a in call])
            else:
                call()
                code = 0
        except AttnlabError as e:  # a library call: what the command line would print
            print(f"attnlab: error: {e}")
            code = 2
        except SystemExit as e:  # argparse's --help and usage errors
            code = e.code
    said = [f"attnlab: warning: {w.message}" for w in caught if issubclass(w.category, UserWarning)]
    return code, "\n".join(said) + "\n" + out.getvalue()


def trained(args: list) -> None:
    code, out = attnlab(args)
    assert code == 0, out


def csv_rows(n: int, words: tuple[str, str] = ("fine", "dull")) -> str:
    return "text,label\n" + "".join(f"a {words[i % 2]} film {i},{'pos' if i % 2 else 'neg'}\n" for i in range(n))


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    root = tmp_path_factory.mktemp("honest")
    corpus = code_file(root)
    table = root / "reviews.csv"
    table.write_text(csv_rows(80))
    trained(["train", "lm", "--data", corpus, "--out", root / "lm", *LM])
    trained(["train", "classify", "--data", table, "--model", "bow", "--out", root / "cls", *SMALL])
    encoder = [*ENCODER, *flags(context=32, block_size=32, batch_size=4, vocab_size=200)]
    trained(["train", "mlm", "--data", corpus, "--out", root / "mlm", *encoder, *SMALL])
    trained(["train", "image", "--model", "mlp", "--out", root / "img", "--batch-size", "16", *SMALL])
    return SimpleNamespace(root=root, corpus=corpus, table=table, **{n: root / n for n in ("lm", "cls", "mlm", "img")})


def write(tmp: Path, name: str, content: str | bytes) -> Path:
    p = tmp / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


def black_on_white_digit(tmp: Path) -> Path:
    """A 64x64 grayscale seven drawn black on white, as a user draws one."""
    x = np.full((64, 64), 255, dtype=np.uint8)
    x[12:18, 14:50] = 0  # the bar
    for row in range(18, 54):  # the stroke down to the left
        col = 48 - (row - 18) * 3 // 4
        x[row, col - 3 : col + 3] = 0
    path = tmp / "my-seven.png"
    Image.fromarray(x).save(path)
    return path


NUL_AT = len(TEXT) * 200  # where the NULs start in the padded file: past the first 8 KB, read on its own


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[SimpleNamespace, Path], list | Callable]  # (world, tmp) -> argv or a library call
    code: int
    fragment: str  # in the error line (code 2) or a warning line (code 0)
    check: Callable[[SimpleNamespace, Path], None] | None = None  # what else must hold afterwards


def _no_run_and_no_cache(w, tmp: Path) -> None:
    """Neither the run nor a token cache of the padded file is left behind."""
    assert not (tmp / "x").exists()
    size = (tmp / "padded.txt").stat().st_size
    cached = [json.loads(m.read_text())["bytes"] for m in (Path(w.root).parent / "cache").glob("tokens/*/meta.json")]
    assert size not in cached
    assert not [p for p in (Path(w.root).parent / "cache").glob("tokens/*") if not (p / "meta.json").is_file()]


def _trained_on_tagging(w, tmp: Path) -> None:
    assert json.loads((tmp / "tags" / "config.json").read_text())["data"]["data"] == "tagging"


def _budget_kept(w, tmp: Path) -> None:
    config = json.loads((tmp / "cmp" / "bow" / "config.json").read_text())
    assert config["train"]["time_budget"] == "1s"


def _seven_inverted(w, tmp: Path) -> None:
    """What the model reads is the user's image resized and inverted: light strokes on black."""
    path = black_on_white_digit(tmp)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = load_image(load(w.img), path)
    plain = np.asarray(Image.open(path).convert("F").resize((8, 8), Image.Resampling.BILINEAR)) / 255
    np.testing.assert_allclose(x[0], 1 - plain, atol=1e-5)


def lm(w, t, *more) -> list:
    return ["train", "lm", "--data", w.corpus, "--out", t / "x", *LM, *more]


def bow(t, data: Path, *more) -> list:
    return ["train", "classify", "--model", "bow", "--data", data, "--out", t / "x", *SMALL, *more]


PADDED = (TEXT * 200).encode() + b"\0" * (3 << 20)  # text, then 3 MB of NUL bytes
OPEN_QUOTE = csv_rows(4) + 'a good film,"pos\n' + csv_rows(40).removeprefix("text,label\n")  # row 5, line 6

# fmt: off
CASES = [
    # 1. the schedule
    Case("min_lr above lr", lambda w, t: lm(w, t, "--lr", "1e-3", "--min-lr", "0.01"), 2,
         "min_lr 0.01 is above lr 0.001: the decay would raise the rate"),
    Case("warmup beyond max_steps", lambda w, t: lm(w, t, "--warmup-steps", "100", "--lr", "3e-3"), 0,
         "warmup_steps 100 is more than max_steps 2: the learning rate is still warming up when training ends "
         "and peaks at 6e-05, 2% of lr 0.003"),
    # 2. NULs past the first 8 KB
    Case("text then NUL bytes", lambda w, t: ["train", "lm", "--data", write(t, "padded.txt", PADDED),
                                              "--out", t / "x", *LM], 2,
         f"padded.txt is not text: it holds a run of NUL bytes from byte {NUL_AT:,}", _no_run_and_no_cache),
    # 3. CSV
    Case("unterminated CSV quote", lambda w, t: bow(t, write(t, "q.csv", OPEN_QUOTE)), 2,
         "q.csv: row 5 (line 6): a quote opened on this line is never closed"),
    # 4. unknown characters and words
    Case("eval --data mostly unknown characters",
         lambda w, t: ["eval", w.lm, "--data", write(t, "alien.txt", "a\u017d\u017d\u017d" * 1000)], 0,
         "alien.txt: 3,000 of 4,000 characters (75%) are not in the run's vocabulary and are read as <unk> "
         "(most often '\u017d')"),
    Case("eval --data of a classifier, unknown words",
         lambda w, t: ["eval", w.cls, "--data", write(t, "other.csv", csv_rows(40, ("zorg", "blip")))], 0,
         "are not in the run's vocabulary and are read as [UNK] (most often 'zorg', 'blip'"),
    Case("predict on unknown words", lambda w, t: ["predict", w.cls, "zorg blip quux"], 0,
         "the text: 3 of 3 words (100%) are not in the run's vocabulary and are read as [UNK] "
         "(most often 'zorg', 'blip', 'quux')"),
    Case("fine-tune a masked LM's vocabulary on other words",
         lambda w, t: ["train", "classify", "--init", w.mlm, "--data", w.table, "--max-len", "32", "--out", t / "x",
                      *SMALL], 0,
         "fine-tuning from {} learns from [UNK] in their place"),
    # 5. a tiny test split
    Case("tiny test split", lambda w, t: bow(t, write(t, "twenty.csv", csv_rows(20))), 0,
         "the test split has only 2 examples"),
    # 6. a user's own image
    Case("image of another size and polarity", lambda w, t: ["predict", w.img, black_on_white_digit(t)], 0,
         "my-seven.png: resized 64x64 to 8x8; the image is dark on light while the training images were light on "
         "dark: inverted it", _seven_inverted),
    # 7. tag's default data
    Case("train tag without --data", lambda w, t: ["train", "tag", "--out", t / "tags", *ENCODER, *SMALL], 0,
         "test: accuracy", _trained_on_tagging),
    # 8. compare's budget
    Case("compare --help says what --budget is", lambda w, t: ["compare", "--help"], 0,
         "training time of EACH model"),
    Case("compare --budget on sentiment", lambda w, t: ["compare", "--task", "sentiment", "--models", "bow",
                                                        "--budget", "1s", "--out", t / "cmp"], 0,
         "== bow", _budget_kept),
]
# fmt: on


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_silent_case_now_says_it(case: Case, w, tmp_path):
    code, out = attnlab(case.run(w, tmp_path))
    assert "Traceback" not in out, out
    assert code == case.code, out
    fragment = case.fragment.replace("{}", str(w.mlm))
    if code == 2:
        errors = [line for line in out.splitlines() if line.startswith("attnlab: error:")]
        assert len(errors) == 1 and fragment in errors[0], out
    else:
        assert fragment in out, out
    if case.check is not None:
        case.check(w, tmp_path)


def test_warmup_warning_is_given_once(w, tmp_path):
    """Once, though the command builds its training config more than once (other numbers than the table's:
    a warning is given once per process for the same settings)."""
    code, out = attnlab(lm(w, tmp_path, "--warmup-steps", "50", "--lr", "1e-3"))
    assert code == 0 and out.count("warmup_steps 50 is more than max_steps 2") == 1, out
    assert "peaks at 4e-05, 4% of lr 0.001" in out


def test_a_nul_run_across_two_pieces_is_found(tmp_path):
    """A run that starts 8 bytes before a piece ends and goes on into the next one."""
    path = write(tmp_path, "edge.txt", b"x" * 992 + b"\0" * 16 + b"tail\n")
    with pytest.raises(AttnlabError, match="from byte 992"):
        list(read_pieces([path], piece_bytes=1000))
    fine = write(tmp_path, "few.txt", b"a\0b" * 400)  # single NULs are not a run
    assert sum(len(text) for text, _, _ in read_pieces([fine], piece_bytes=1000)) == 1200


def test_a_quote_that_closes_rows_later_is_refused_with_its_lines(tmp_path):
    path = write(tmp_path, "late.csv", 'text,label\ngood,pos\nbad,"neg\nfine,pos\nawful,neg"\nok,pos\n')
    code, out = attnlab(["train", "classify", "--data", path, "--out", tmp_path / "x", "--model", "bow", *SMALL])
    assert code == 2 and "row 2 (line 3): its 'label' runs over lines 3-5" in out, out


def test_macro_f1_is_sklearns(tmp_path):
    """Over the classes in the gold labels or the predictions, as sklearn's f1_score(average='macro')."""
    f1_score = extra("sklearn.metrics", "the reference macro-F1").f1_score
    rng = random.Random(0)
    for _ in range(200):
        n_classes, n = rng.randint(2, 5), rng.randint(1, 12)
        gold = np.array([rng.randrange(n_classes) for _i in range(n)])
        pred = np.array([rng.randrange(n_classes) for _i in range(n)])
        ours = scores(confusion(gold, pred, n_classes), [str(i) for i in range(n_classes)])["macro_f1"]
        assert ours == pytest.approx(f1_score(gold, pred, average="macro", zero_division=0)), (gold, pred)
    # the case: a 2-row test split, both positive, one predicted negative
    two = scores(confusion(np.array([1, 1]), np.array([1, 0]), 2), ["neg", "pos"])
    assert two["accuracy"] == 0.5 and two["macro_f1"] == pytest.approx(1 / 3)
