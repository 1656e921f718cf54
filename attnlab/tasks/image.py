"""Image classification: a Vision Transformer or the MLP baseline, through the shared training loop.

train_image("runs/digits", "vit", data=ImageDataConfig(data="digits"))
  -> images cut into train/val/test (or a given test set), the model sized to them
  -> the shared engine (engine/train.py), as for every task
  -> test scores in eval.json, confusion.png, predictions.png (a grid of test images) and,
     for the ViT, attention.png ([CLS]'s attention to the patches of one test image)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attnlab.config import from_dict
from attnlab.data.images import (
    IMAGE_SPLITS,
    ImageDataConfig,
    Images,
    ImageSet,
    load_images,
    load_source,
    read_image,
    resize,
)
from attnlab.data.polarity import background, fit_polarity
from attnlab.engine.session import Session
from attnlab.engine.train import Prepared, TrainRequest, run
from attnlab.errors import AttnlabError
from attnlab.interpret.patches import cls_maps, plot_patch_attention
from attnlab.interpret.views import numpy_weights
from attnlab.models import build_model
from attnlab.models.mlp import MLPConfig
from attnlab.models.vit import PRESETS as VIT_PRESETS
from attnlab.models.vit import ViT, ViTConfig
from attnlab.runs.marker import record
from attnlab.runs.run import Run
from attnlab.runtime.distributed import Dist
from attnlab.tasks.base import ModelChoice, Task, load_body
from attnlab.tasks.common import build_config, config_json, preset_fields
from attnlab.tasks.labeled import show_scores
from attnlab.tasks.metrics import confusion, scores, warn_small_split
from attnlab.tasks.request import python_request
from attnlab.viz.confusion import plot_confusion
from attnlab.viz.html import AttentionView
from attnlab.viz.patches import plot_prediction_grid

CPU_PRESETS = ("vit-nano", "vit-micro")  # their patch size follows the data; the paper's keep theirs
# The CPU presets' patch size follows the image: patches of at least 4 x 4 pixels (on 8 x 8 digits,
# 4 patches reach 98% where 16 patches of 2 x 2 reach 96%: a 2 x 2 patch is too little to embed
# alone), and at most 8 x 8 of them, so attention stays cheap.
MIN_PATCH, MAX_PATCHES = 4, 64
# Settings that train each model well on `digits` within a few minutes on a laptop CPU.
_TRAIN = dict(batch_size=64, warmup_steps=100, beta2=0.99, eval_interval=250, eval_batches=5)
TRAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "vit": dict(_TRAIN, max_steps=3000, lr=2e-3, weight_decay=0.05),
    "mlp": dict(_TRAIN, max_steps=1500, lr=1e-3, weight_decay=0.01),
}


def model_config(name: str, images: ImageSet, overrides: dict) -> Any:
    """The model's config: its defaults (the ViT: a preset), the user's overrides, and the image
    size, channels and classes of the data."""
    overrides = dict(overrides)
    h, w = images.size
    sizes = {
        "image_size": h,
        "image_width": None if w == h else w,
        "channels": images.channels,
        "n_labels": len(images.classes),
    }
    base: dict[str, Any] = {}
    choice = ImageClassification.models[name]
    if choice.presets:  # the ViT
        preset = overrides.pop("preset", None) or choice.default_preset
        base = preset_fields(choice.presets, preset, choice.default_preset, "ViT")
        if preset in CPU_PRESETS and "patch_size" not in overrides:
            base["patch_size"] = patch_for(h, w)
    return build_config(name, choice.config, base, overrides, sizes)


def patch_for(h: int, w: int) -> int:
    """The CPU presets' patch side: the smallest of at least MIN_PATCH pixels that cuts both sides
    into 4 to MAX_PATCHES patches (8 x 8 digits: 4, 28 x 28: 4, 224 x 224: 28); for images too
    small for that, the smallest that gives 2 to MAX_PATCHES."""
    common = math.gcd(h, w)
    sides = [p for p in range(1, common + 1) if common % p == 0 and 2 <= (h // p) * (w // p) <= MAX_PATCHES]
    preferred = [p for p in sides if p >= MIN_PATCH and (h // p) * (w // p) >= 4]
    if preferred or sides:
        return (preferred or sides)[0]
    raise AttnlabError(
        f"no patch size divides {h}x{w} images into at most {MAX_PATCHES} patches: "
        "set --patch-size, or --image-size to resize them"
    )


class ImageClassification(Task):
    name = "image"
    help = "images: a Vision Transformer or an MLP on the pixels"
    description = (
        "Train an image classifier on digits (built in), a folder with one sub-folder per class, "
        "or a .npz; then score its test split and draw confusion.png, predictions.png and, "
        "for the ViT, attention.png."
    )
    models = {
        "vit": ModelChoice("vit", ViTConfig, presets=VIT_PRESETS, default_preset="vit-nano"),
        "mlp": ModelChoice("mlp", MLPConfig),
    }
    default_model = "vit"
    data_config = ImageDataConfig
    tokenized = False
    noun = "an image"
    endpoint = "/api/predict_image"
    reads_images = True
    set_by_data = frozenset({"image_size", "image_width", "channels", "n_labels", "context"})
    tuned = TRAIN_DEFAULTS

    def prepare(self, req: TrainRequest, d: Dist) -> Prepared:
        if req.saved is not None:  # the classes, size and channels the run was built for
            task = req.saved["task"]
            images = load_images(req.data, task["labels"], tuple(task["size"]), task["channels"])
        else:
            images = load_images(req.data)
        cfg = model_config(req.model, images, self.model_fields(req))
        task = {
            "kind": self.name,
            "labels": images.classes,
            "size": list(images.size),
            "channels": images.channels,
            "background": background(images.splits["train"][0]),
        }  # what predict makes a user's image look like
        config = config_json(req, req.model, cfg, task)

        def build() -> nn.Module:
            net = build_model(req.model, cfg)
            if req.init is not None and not req.resume:
                load_body(net, req.init, ("out.",))  # a new head: the classes may differ
            return net

        return Prepared(Images(images, req.data.augment), build, config, state=images)

    def test_scores(self, s: Session, prepared: Prepared, req: TrainRequest) -> dict[str, Any]:
        images = prepared.state
        gold, probs = predict_split(s.raw, images, "test", s.device)
        prepared.state = images, gold, probs  # for draw_test
        m = confusion(gold, probs.argmax(1), len(images.classes))
        warn_small_split("test", len(gold), m, images.classes)
        return {"examples": len(gold), **scores(m, images.classes)}

    def draw_test(self, s: Session, prepared: Prepared, req: TrainRequest, test: dict[str, Any]) -> None:
        pictures(s.run, s.raw, *prepared.state, f"{req.model} on {req.data.data}")

    def test_line(self, t: dict[str, Any]) -> str:
        return f"test: accuracy {t['accuracy']:.2%}, macro-F1 {t['macro_f1']:.4f}"

    def next_step(self, out: str) -> str:
        return f"; pictures in {out}. Try: attnlab predict {out} IMAGE.png --attention overlay.png"

    # ---- a trained run ------------------------------------------------------------------------
    def predict(self, run, text: str, options: dict[str, Any]) -> dict[str, Any]:
        result = predict_image(run, text, options.get("top_k") or 3)
        if options.get("attention"):
            image_attention(run, text, options["attention"])
            result["attention"] = options["attention"]
        return result

    def show_prediction(self, result: dict[str, Any]) -> str:
        lines = [
            f"{result['label']}  ({result['probability']:.3f})",
            "  top: " + "  ".join(f"{r['label']} {r['probability']:.3f}" for r in result["top"]),
        ]
        if result.get("attention"):
            lines.append(f"attention: {result['attention']}")
        return "\n".join(lines)

    def evaluate(self, run, data: str | None, split: str | None, options: dict[str, Any]) -> dict[str, Any]:
        plot = options.get("confusion")
        if not plot:  # the run's own picture, listed among its files
            record(Path(run.path), "eval_confusion.png")
            plot = str(Path(run.path) / "eval_confusion.png")
        return {**evaluate_image(run, data, split or "test", plot), "confusion_png": plot}

    def show_evaluation(self, r: dict[str, Any]) -> str:

        return show_scores(r, "images") + f"\nconfusion matrix: {r['confusion_png']}"

    def image(self, run: Run, path: str | Path) -> np.ndarray:
        return load_image(run, path)

    def answer_image(self, run: Run, pixels: np.ndarray, name: str | None) -> dict[str, Any]:
        """The label, the 3 most probable classes, and [CLS]'s attention over the patches (null for the MLP)."""
        return {**predict_image(run, pixels, top=3, name=name), "attention": cls_attention(run, pixels)}

    @torch.no_grad()
    def views(self, run: Run, path: str) -> list[AttentionView]:
        """A ViT run's self-attention on the image file `path`: [CLS] first, then the patches row by row."""
        if not isinstance(run.model, ViT):
            raise AttnlabError(f"{run.path} is a {run.config['family']} model: it has no attention to follow")
        x = torch.from_numpy(load_image(run, path))[None].to(run.device)  # (1, C, H, W)
        run.model.eval()
        weights = numpy_weights(run.model.attention(x))  # (L, H, T, T)
        gh, gw = run.model.cfg.grid
        labels = ["[CLS]"] + [f"patch {r + 1},{c + 1}" for r in range(gh) for c in range(gw)]
        return [AttentionView("self-attention", labels, labels, weights)]

    def picture(self, run, source: str, out: Path) -> str:
        label = image_attention(run, source, out)
        return f"{out}: [CLS] attention over the patches of {Path(source).name} (predicted {label})"


MODELS = ImageClassification.models  # model name -> ModelChoice


def train_image(out: str | Path, model: str = "vit", model_overrides: dict | None = None, **request: Any) -> dict:
    """Train an image classifier into run directory `out` (or continue it: resume=True); returns
    the final losses and the test-set scores. `request`: the other TrainRequest fields (train,
    data, force, init, progress)."""

    task = ImageClassification()
    return run(task, python_request(task, out, model, model_overrides, **request))


@torch.no_grad()
def predict_split(model: nn.Module, images: ImageSet, split: str, device, batch_size: int = 256):
    """(gold labels (N,), class probabilities (N, K)) over a whole split, unaugmented."""
    model.eval()
    x, y = images.splits[split]
    probs = [
        model(torch.from_numpy(x[i : i + batch_size]).to(device)).float().softmax(-1).cpu()
        for i in range(0, len(x), batch_size)
    ]
    return y, torch.cat(probs).numpy() if probs else np.zeros((0, len(images.classes)), dtype=np.float32)


def pictures(run: Path, model: nn.Module, images: ImageSet, gold: np.ndarray, probs: np.ndarray, title: str) -> None:
    """confusion.png and predictions.png of the test split; for a ViT also attention.png."""
    record(run, "confusion.png", "predictions.png", "attention.png")
    classes = images.classes
    pred = probs.argmax(1)
    plot_confusion(confusion(gold, pred, len(classes)), classes, run / "confusion.png", f"{title}: test")
    x = images.splits["test"][0]
    named = [classes[i] for i in gold], [classes[i] for i in pred]
    plot_prediction_grid(x, *named, run / "predictions.png", f"{title}: test images", probs.max(1))
    if isinstance(model, ViT) and len(x):
        attention_picture(model, x[0], run / "attention.png", f"test image 0 (true {named[0][0]})", classes)


# ---- a trained run on new images ---------------------------------------------------------------


def _task(run) -> dict:
    if run.task.tokenized:
        raise AttnlabError(f"{run.path} is not an image run (it reads {run.task.name} text)")
    return run.config["task"]


def load_image(run, path: str | Path) -> np.ndarray:
    """One image file as the run's model reads it: (C, H, W) in [0, 1] at the run's size and channels,
    inverted when its background is the opposite of the training images' (said in a warning)."""
    task = _task(run)
    x = read_image(path, None, task["channels"])  # (C, H, W) at its own size, which the warning names
    size = tuple(task["size"])
    return fit_polarity(resize(x, size), x.shape[1:], size, task.get("background"), path)  # runs before: None


@torch.no_grad()
def predict_image(run, image: str | Path | np.ndarray, top: int = 3, name: str | None = None) -> dict:
    """The label of an image (a file, or pixels (C, H, W) that load_image read) and the `top` most
    probable classes."""
    labels = _task(run)["labels"]
    pixels = load_image(run, image) if not isinstance(image, np.ndarray) else image
    x = torch.from_numpy(pixels)[None].to(run.device)  # (1, C, H, W)
    run.model.eval()
    probs = run.model(x).float().softmax(-1)[0].cpu()  # (K,)
    p, best = probs.topk(min(top, len(labels)))
    ranked = [{"label": labels[int(i)], "probability": float(q)} for q, i in zip(p, best)]
    shown = name if name is not None or isinstance(image, np.ndarray) else str(image)
    return {
        "kind": "image",
        "image": shown,
        "label": ranked[0]["label"],
        "probability": ranked[0]["probability"],
        "top": ranked,
    }


def attention_picture(model: ViT, image: np.ndarray, path: Path, title: str, labels: list[str]) -> str:
    """Draw [CLS]'s attention to each patch (per layer and head, and the rollout) over `image`
    (C, H, W); returns the predicted label."""

    model.eval()
    x = torch.from_numpy(np.ascontiguousarray(image))[None].to(next(model.parameters()).device)
    with torch.no_grad():
        label = labels[int(model(x).argmax(-1))]
    weights = [w[0].float().cpu().numpy() for w in model.attention(x)]  # L x (H, T, T)
    plot_patch_attention(image, weights, model.cfg.grid, path, f"{title}: predicted {label}")
    return label


def image_attention(run, path: str | Path, out: str | Path) -> str:
    """attention_picture for an image file and a ViT run; returns the predicted label."""
    if not isinstance(run.model, ViT):
        raise AttnlabError(f"{run.path} is a {run.config['family']} model: it has no attention to draw")
    image = load_image(run, path)
    return attention_picture(run.model, image, Path(out), Path(path).name, _task(run)["labels"])


def evaluate_image(run, data: str | None = None, split: str = "test", plot: str | Path | None = None) -> dict:
    """Scores of an image run on a split of its own data, or on all of `data` (a folder or .npz,
    read at the run's size and channels, labels matched by class name); plot: confusion PNG."""
    task = _task(run)
    cfg = from_dict(ImageDataConfig, run.config["data"], where="data config")
    if split not in IMAGE_SPLITS:
        raise AttnlabError(f"unknown split {split!r}: use {', '.join(IMAGE_SPLITS)}")
    labels, size, channels = task["labels"], tuple(task["size"]), task["channels"]
    if data is not None and data != cfg.data:  # a new source is scored whole, as the test split
        images = ImageSet({"test": load_source(data, labels, size, channels)}, labels)
        name, split = data, "test"
    else:
        images = load_images(cfg, labels, size, channels)
        name = cfg.test if split == "test" and cfg.test else cfg.data
    gold, probs = predict_split(run.model, images, split, run.device)
    m = confusion(gold, probs.argmax(1), len(labels))
    warn_small_split(split, len(gold), m, labels)
    result = scores(m, labels)
    if plot:
        title = f"{run.path.name} on {Path(name).name} ({split}): accuracy {result['accuracy']:.2%}"
        plot_confusion(np.array(result["confusion"]), labels, Path(plot), title)
    return {"data": name, "split": split, "examples": len(gold), **result}


@torch.no_grad()
def cls_attention(run: Run, pixels: np.ndarray) -> dict | None:
    """[CLS]'s attention over the patches of a ViT, {grid: [rows, cols], weights (L, H, rows, cols)};
    None for the MLP, which has none."""
    if not isinstance(run.model, ViT):
        return None
    x = torch.from_numpy(pixels)[None].to(run.device)  # (1, C, H, W)
    grid = run.model.cfg.grid
    weights = cls_maps([w[0] for w in run.model.attention(x)], grid)  # (L, H, rows, cols)
    return {"grid": list(grid), "weights": weights.tolist()}
