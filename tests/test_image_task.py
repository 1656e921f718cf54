"""The image task and its commands: train image, predict, eval, compare, resume, pictures."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from attnlab.cli.main import main
from attnlab.errors import AttnlabError
from attnlab.tasks.image import patch_for
from tests.conftest import run_cli

FAST = ["--max-steps", "30", "--batch-size", "32", "--eval-interval", "30", "--eval-batches", "1", "--device", "cpu"]

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """A ViT trained briefly on digits (the commands are checked here, not the accuracy)."""
    run = tmp_path_factory.mktemp("img") / "vit"
    assert main([str(a) for a in ["train", "image", "--data", "digits", "--out", run, "--n-layer", "2", *FAST]]) == 0
    return run


def write_png(path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray((pixels * 255).astype(np.uint8)).save(path)


def digit(i: int) -> np.ndarray:
    from sklearn.datasets import load_digits

    return load_digits().images[i] / 16  # (8, 8) in [0, 1]


def test_train_image_writes_a_run_with_scores_and_pictures(digits_run):
    config = json.loads((digits_run / "config.json").read_text())
    assert config["family"] == "vit" and config["task"]["kind"] == "image"
    assert config["task"]["labels"] == [str(d) for d in range(10)] and config["task"]["size"] == [8, 8]
    assert config["model"]["patch_size"] == 4 and config["model"]["context"] == 5  # 2 x 2 patches + [CLS]
    result = json.loads((digits_run / "eval.json").read_text())
    assert result["examples"] == 359 and 0 <= result["accuracy"] <= 1
    assert np.array(result["confusion"]).sum() == 359
    for picture in ("confusion.png", "predictions.png", "attention.png", "loss.png"):
        assert (digits_run / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", picture
    assert not (digits_run / "tokenizer.json").exists()


def test_predict_an_image_file_gives_the_top_three(digits_run, tmp_path, capsys):
    png = tmp_path / "seven.png"
    write_png(png, digit(7))
    code, out, _ = run_cli(["predict", digits_run, png, "--json"], capsys)
    result = json.loads(out)
    assert code == 0 and result["kind"] == "image" and len(result["top"]) == 3
    probs = [t["probability"] for t in result["top"]]
    assert probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-6
    assert result["label"] == result["top"][0]["label"]
    overlay = tmp_path / "overlay.png"
    code, out, _ = run_cli(["predict", digits_run, png, "--attention", overlay], capsys)
    assert code == 0 and out.splitlines()[1].startswith("  top: ") and overlay.stat().st_size > 5000


def test_predict_reads_a_colour_image_of_another_size_as_the_model_needs(digits_run, tmp_path, capsys):
    png = tmp_path / "big.png"
    Image.fromarray(np.zeros((32, 24, 3), dtype=np.uint8)).save(png)
    code, out, _ = run_cli(["predict", digits_run, png], capsys)
    assert code == 0 and "top:" in out


def test_sample_refuses_an_image_run_in_one_line(digits_run, capsys):
    code, _, err = run_cli(["sample", digits_run], capsys)
    assert code == 2 and "not a language model run (it is image)" in err and len(err.strip().splitlines()) == 1


def test_predict_an_unreadable_image_is_one_line(digits_run, tmp_path, capsys):
    bad = tmp_path / "bad.png"
    bad.write_text("not an image")
    code, _, err = run_cli(["predict", digits_run, bad], capsys)
    assert code == 2 and "cannot read image" in err and len(err.strip().splitlines()) == 1


def test_eval_on_its_own_test_split_and_on_a_folder(digits_run, tmp_path, capsys):
    code, out, _ = run_cli(["eval", digits_run, "--json"], capsys)
    own = json.loads(out)
    assert code == 0 and own["examples"] == 359 and own["split"] == "test"
    assert (digits_run / "eval_confusion.png").is_file()
    folder = tmp_path / "new"
    for i in range(6):  # six images of classes 0..5, in folders named after the classes
        write_png(folder / str(i % 10) / f"{i}.png", digit(i))
    picture = tmp_path / "cm.png"
    code, out, _ = run_cli(["eval", digits_run, "--data", folder, "--confusion", picture], capsys)
    assert code == 0 and "6 images" in out and "accuracy" in out and picture.is_file()
    write_png(folder / "cat" / "0.png", digit(0))
    code, _, err = run_cli(["eval", digits_run, "--data", folder], capsys)
    assert code == 2 and "'cat' is not one of the known classes" in err


def test_mlp_baseline_trains_and_has_no_attention(tmp_path, capsys):
    run = tmp_path / "mlp"
    code, out, _ = run_cli(["train", "image", "--model", "mlp", "--out", run, *FAST], capsys)
    assert code == 0 and "test: accuracy" in out
    config = json.loads((run / "config.json").read_text())
    assert config["family"] == "mlp" and config["model"]["channels"] == 1
    png = tmp_path / "three.png"
    write_png(png, digit(3))
    code, _, err = run_cli(["predict", run, png, "--attention", tmp_path / "a.png"], capsys)
    assert code == 2 and "no attention" in err
    code, _, err = run_cli(["train", "image", "--model", "mlp", "--patch-size", "2", "--out", tmp_path / "x"], capsys)
    assert code == 2 and "--patch-size does not apply to --model mlp" in err


def test_train_image_on_an_npz_of_colour_images(tmp_path, capsys):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(40, 16, 16, 3), dtype=np.uint8)
    labels = np.array(["cat", "dog"] * 20)
    np.savez(tmp_path / "pets.npz", images=images, labels=labels)
    run = tmp_path / "pets"
    code, _, _ = run_cli(
        ["train", "image", "--data", tmp_path / "pets.npz", "--out", run, "--d-model", "32", *FAST], capsys
    )
    config = json.loads((run / "config.json").read_text())
    assert code == 0 and config["task"]["labels"] == ["cat", "dog"]
    assert config["model"]["channels"] == 3 and config["model"]["patch_size"] == 4  # 4 x 4 = 16 patches


def test_resume_continues_to_more_steps(tmp_path, capsys):
    run = tmp_path / "r"
    args = ["train", "image", "--out", run, "--n-layer", "1", "--d-model", "32", *FAST]
    assert run_cli(args, capsys)[0] == 0
    code, _, _ = run_cli(["train", "image", "--out", run, "--resume", "--max-steps", "40"], capsys)
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert code == 0 and max(steps) == 40 and steps.count(31) == 1
    code, _, err = run_cli(["train", "image", "--out", run, "--resume", "--d-model", "64"], capsys)
    assert code == 2 and "cannot change when resuming" in err


def test_compare_digits_table_and_chart(tmp_path, capsys, monkeypatch):
    import attnlab.tasks.image as image

    budget = dict(max_steps=20, batch_size=32, eval_interval=20, eval_batches=1, device="cpu")
    for name in image.MODELS:  # a short budget: this checks the command, not the scores
        monkeypatch.setitem(image.TRAIN_DEFAULTS, name, budget)
    code, out, _ = run_cli(["compare", "--task", "digits", "--out", tmp_path], capsys)
    assert code == 0 and "accuracy" in out
    rows = json.loads((tmp_path / "compare.json").read_text())["rows"]
    assert [r["model"] for r in rows] == ["vit", "mlp"] and all(0 <= r["accuracy"] <= 1 for r in rows)
    assert (tmp_path / "compare.png").stat().st_size > 1000


@pytest.mark.parametrize(
    "size, patch", [((8, 8), 4), ((28, 28), 4), ((32, 32), 4), ((224, 224), 28), ((12, 8), 4), ((7, 7), 1)]
)
def test_small_presets_pick_a_patch_size_for_the_images(size, patch):
    assert patch_for(*size) == patch


def test_no_patch_size_fits_a_prime_sized_image():
    with pytest.raises(AttnlabError, match="set --patch-size"):
        patch_for(31, 31)
