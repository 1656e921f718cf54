"""HuggingFace ViT -> attnlab's ViT: the same logits and attention from small random models.

HuggingFace models are built locally from small configs (nothing is downloaded), every
parameter is perturbed so that biases and LayerNorm gains are not their trivial init, and
the two models are compared on the same pixels in float32.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from attnlab.data.images import read_image
from attnlab.errors import AttnlabError
from attnlab.interop.hf.vit import (
    config_from_hf,
    config_to_hf,
    fold_pixel_normalization,
    pixels_from_hf,
    processor_to_hf,
    weights_from_hf,
    weights_to_hf,
)
from attnlab.models.vit import ViT, ViTConfig
from tests.conftest import extra, perturb, random_hf_model

transformers = extra("transformers", "transformers, the reference here, is a dev extra")

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

CONFIGS = {
    "rgb-16": dict(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_channels=3,
        num_labels=5,
    ),
    "gray-8": dict(
        image_size=8,
        patch_size=2,
        hidden_size=24,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=48,
        num_channels=1,
        num_labels=3,
        hidden_act="gelu",
    ),
    # not square, tanh GELU, no query/key/value biases, the paper's epsilon
    "wide-tanh-noqkvbias": dict(
        image_size=[12, 8],
        patch_size=4,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=40,
        num_channels=3,
        num_labels=4,
        hidden_act="gelu_pytorch_tanh",
        qkv_bias=False,
        layer_norm_eps=1e-6,
    ),
}


def hf_model(kind: str = "ViTForImageClassification", seed: int = 0, **config) -> torch.nn.Module:
    return random_hf_model("ViTConfig", kind, seed, **config)


def images_for(hf_cfg, batch: int = 4) -> torch.Tensor:
    size = hf_cfg.image_size
    h, w = (size, size) if isinstance(size, int) else size
    return torch.rand(batch, hf_cfg.num_channels, h, w)


def saved(model, path) -> tuple[dict, dict[str, torch.Tensor]]:
    """config.json and the safetensors as save_pretrained writes them (the Hub's names)."""
    model.save_pretrained(path)
    return json.loads((path / "config.json").read_text()), load_file(str(path / "model.safetensors"))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("source", ["saved", "in_memory"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_converted_vit_gives_huggingface_logits_and_attention(name, source, tmp_path):
    hf = hf_model(**CONFIGS[name])
    if source == "saved":
        hf_dict, tensors = saved(hf, tmp_path)
    else:  # transformers 5's in-memory names (layers.i.attention.q_proj, mlp.fc1, ...)
        hf_dict, tensors = hf.config.to_dict(), hf.state_dict()
    family, cfg, task = config_from_hf(hf_dict)
    assert family == "vit" and task["kind"] == "image" and "head" not in task
    assert task["labels"] == [f"LABEL_{i}" for i in range(CONFIGS[name]["num_labels"])]
    assert task["channels"] == CONFIGS[name]["num_channels"] and task["size"] == list(cfg.size)
    model = ViT(cfg).eval()
    model.load_state_dict(weights_from_hf(tensors, cfg), strict=True)

    x = images_for(hf.config)
    with torch.no_grad():
        want = hf(pixel_values=x, output_attentions=True)
        got = model(x)
    diff = max_diff(got, want.logits)
    print(f"{name} ({source}): logits max abs diff {diff:.3g}")
    assert got.shape == want.logits.shape
    assert diff < 1e-4, f"{name} ({source}): logits differ by {diff:.3g}"

    weights = model.attention(x)
    assert len(weights) == len(want.attentions) == cfg.n_layer
    attn_diff = max(max_diff(a, b) for a, b in zip(weights, want.attentions, strict=True))
    print(f"{name} ({source}): attention max abs diff {attn_diff:.3g}")
    assert attn_diff < 1e-5, f"{name} ({source}): attention differs by {attn_diff:.3g}"


def test_labels_come_from_id2label_in_index_order(tmp_path):
    labels = {"0": "cat", "1": "dog", "2": "bird"}
    hf = hf_model(**{**CONFIGS["gray-8"], "id2label": labels, "label2id": {v: int(k) for k, v in labels.items()}})
    hf_dict, _ = saved(hf, tmp_path)
    _, cfg, task = config_from_hf(hf_dict)
    assert task["labels"] == ["cat", "dog", "bird"] and cfg.n_labels == 3


def test_vit_model_maps_every_body_tensor_and_gives_a_zero_head(tmp_path):
    body = {k: v for k, v in CONFIGS["rgb-16"].items() if k != "num_labels"}
    hf = hf_model("ViTModel", **body)  # with its pooler, which is dropped
    hf_dict, tensors = saved(hf, tmp_path)
    assert any(k.startswith("pooler.") for k in tensors) and not any(k.startswith("vit.") for k in tensors)
    _, cfg, task = config_from_hf(hf_dict)
    assert task["head"] == "untrained" and cfg.n_labels == len(task["labels"]) == 2  # HF's default labels
    model = ViT(cfg).eval()
    weights = weights_from_hf(tensors, cfg)
    model.load_state_dict(weights, strict=True)
    assert not weights["out.weight"].any() and not weights["out.bias"].any()  # ViT's own zero head

    x = images_for(hf.config)
    with torch.no_grad():
        want = hf(pixel_values=x).last_hidden_state
        got, _ = model.hidden(x)
    diff = max_diff(got, want)
    print(f"ViTModel: final hidden states max abs diff {diff:.3g}")
    assert diff < 1e-4, f"ViTModel: hidden states differ by {diff:.3g}"


def test_a_tensor_of_the_wrong_shape_is_named(tmp_path):
    hf_dict, tensors = saved(hf_model(**CONFIGS["rgb-16"]), tmp_path)
    _, cfg, _ = config_from_hf(hf_dict)
    name = "vit.encoder.layer.1.intermediate.dense.weight"
    tensors[name] = torch.zeros(63, 32)
    with pytest.raises(AttnlabError, match=rf"{name} has shape \[63, 32\], expected \[64, 32\]"):
        weights_from_hf(tensors, cfg)
    tensors.pop(name)
    with pytest.raises(AttnlabError, match=rf"no tensor {name} \(expected shape \[64, 32\]\)"):
        weights_from_hf(tensors, cfg)


def test_a_checkpoint_deeper_than_its_config_is_refused(tmp_path):
    hf_dict, tensors = saved(hf_model(**CONFIGS["rgb-16"]), tmp_path)
    _, cfg, _ = config_from_hf({**hf_dict, "num_hidden_layers": 1})
    with pytest.raises(AttnlabError, match="tensors a 1-layer ViT does not use: vit.encoder.layer.1"):
        weights_from_hf(tensors, cfg)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_act": "swish"}, "hidden_act 'swish' is not supported"),
        ({"patch_size": [4, 2]}, "square patches only"),
        ({"image_size": 18}, "cannot build"),  # 18 does not cut into patches of 4
        ({"architectures": ["ViTForMaskedImageModeling"]}, "not one of ViTForImageClassification"),
    ],
)
def test_configs_attnlab_cannot_represent_are_refused(change, message):
    hf_dict = transformers.ViTConfig(**CONFIGS["rgb-16"]).to_dict()
    with pytest.raises(AttnlabError, match=message):
        config_from_hf({**hf_dict, **change})


def test_folded_pixel_normalization_takes_images_in_0_1(tmp_path):
    hf = hf_model(**CONFIGS["rgb-16"])
    hf_dict, tensors = saved(hf, tmp_path)
    _, cfg, _ = config_from_hf(hf_dict)
    processor = {
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
    }
    mean, std = pixels_from_hf(processor, 3)
    model = ViT(cfg).eval()
    model.load_state_dict(fold_pixel_normalization(weights_from_hf(tensors, cfg), mean, std), strict=True)
    x = images_for(hf.config)  # in [0, 1], as attnlab's image data
    normalized = (x - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    with torch.no_grad():
        diff = max_diff(model(x), hf(pixel_values=normalized).logits)
    print(f"folded normalization: logits max abs diff {diff:.3g}")
    assert diff < 1e-4, f"folded normalization: logits differ by {diff:.3g}"
    assert pixels_from_hf({"do_normalize": False}, 3) is None


def test_exported_vit_loads_in_transformers_with_the_same_logits(tmp_path):
    torch.manual_seed(0)
    images = dict(image_size=12, image_width=8, channels=3, patch_size=4, n_labels=3)
    cfg = ViTConfig(n_layer=2, n_head=2, d_model=16, d_ff=40, activation="gelu_tanh", ln_eps=1e-6, **images)
    model = perturb(ViT(cfg))
    labels = ["a", "b", "c"]
    (tmp_path / "config.json").write_text(json.dumps(config_to_hf(cfg, labels)))
    save_file(weights_to_hf(model.state_dict(), cfg), str(tmp_path / "model.safetensors"))
    hf = transformers.ViTForImageClassification.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert hf.config.id2label == {0: "a", 1: "b", 2: "c"}
    x = torch.rand(4, 3, 12, 8)
    with torch.no_grad():
        diff = max_diff(model(x), hf(pixel_values=x).logits)
    print(f"export: logits max abs diff {diff:.3g}")
    assert diff < 1e-4, f"export: logits differ by {diff:.3g}"

    back = weights_from_hf(load_file(str(tmp_path / "model.safetensors")), cfg)  # and back, exactly
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())
    with pytest.raises(AttnlabError, match="needs pooling=cls"):
        config_to_hf(ViTConfig(**{**vars(cfg), "pooling": "mean"}))


def test_exported_processor_reads_an_image_as_attnlab_does(tmp_path):
    cfg = ViTConfig(n_layer=1, n_head=2, d_model=16, image_size=12, image_width=8, channels=3, patch_size=4)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor_to_hf(cfg)))
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path)
    rgb = np.random.default_rng(0).integers(0, 256, (30, 20, 3), dtype=np.uint8)  # 30 high, 20 wide
    Image.fromarray(rgb).save(tmp_path / "image.png")
    theirs = processor(Image.open(tmp_path / "image.png"), return_tensors="pt")["pixel_values"][0]
    ours = torch.from_numpy(read_image(tmp_path / "image.png", cfg.size, cfg.channels))
    assert theirs.shape == ours.shape == (3, 12, 8)
    diff = max_diff(theirs, ours)
    print(f"processor: pixels max abs diff {diff:.3g}")
    assert diff < 0.01, f"processor: pixels differ by {diff:.3g}"  # both bilinear; rounding differs


def test_convert_a_vit_directory_with_its_preprocessor_then_predict(tmp_path, capsys):
    """attnlab convert on a saved ViTForImageClassification with a normalizing processor: the run
    reads [0, 1] pixels and gives HF's logits on the processor's (x - 0.5) / 0.5."""
    from attnlab import load
    from attnlab.cli.main import main

    hf = hf_model(**CONFIGS["gray-8"])
    hf.config.id2label = {0: "zero", 1: "one", 2: "two"}
    hf.save_pretrained(tmp_path / "hf")
    processor = {
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5],
        "image_std": [0.5],
    }
    (tmp_path / "hf" / "preprocessor_config.json").write_text(json.dumps(processor))
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 0
    run = load(tmp_path / "run", device="cpu")
    x = torch.rand(4, 1, 8, 8)
    with torch.no_grad():
        diff = (run.model(x) - hf(pixel_values=(x - 0.5) / 0.5).logits).abs().max().item()
    print(f"converted ViT with folded processor: logits max abs diff {diff:.3g}")
    assert diff < 1e-4, diff
    png = tmp_path / "x.png"
    Image.fromarray((x[0, 0].numpy() * 255).astype(np.uint8)).save(png)
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "run"), str(png), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["label"] in ("zero", "one", "two")
