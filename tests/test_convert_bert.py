"""HuggingFace BERT <-> attnlab's encoder: the same hidden states, logits and attention.

HuggingFace models are built locally from small random configs (nothing is downloaded), every
parameter is perturbed off its trivial init, and both models read the same padded batch in
float32: HuggingFace through attention_mask, attnlab through pad id 0. attnlab's pad queries
output zeros, so per-token outputs and attention rows are compared at real positions only.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from attnlab.errors import AttnlabError
from attnlab.interop.hf import module_for
from attnlab.interop.hf.bert import config_from_hf, config_to_hf, weights_from_hf, weights_to_hf
from attnlab.interop.hf.io import write_hf_dir
from attnlab.models.encoder import Encoder, EncoderConfig
from tests.conftest import extra, random_hf_model

transformers = extra("transformers", "transformers, the reference here, is a dev extra")

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

CONFIGS = {
    "2x32": dict(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    ),
    "3x48": dict(
        vocab_size=150,
        hidden_size=48,
        num_hidden_layers=3,
        num_attention_heads=6,
        intermediate_size=96,
        max_position_embeddings=40,
        num_labels=3,
        type_vocab_size=3,
    ),
    # ReLU, one token type, the more common epsilon
    "relu-1type": dict(
        vocab_size=90,
        hidden_size=24,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=40,
        max_position_embeddings=32,
        num_labels=4,
        hidden_act="relu",
        type_vocab_size=1,
        layer_norm_eps=1e-6,
    ),
}
ARCHS = ["BertModel", "BertForMaskedLM", "BertForSequenceClassification", "BertForTokenClassification"]
LENGTHS = (12, 9, 5, 2)  # a padded batch: rows of 12, 9, 5 and 2 real tokens


def hf_model(kind: str, seed: int = 0, **config) -> torch.nn.Module:
    return random_hf_model("BertConfig", kind, seed, **config)


def padded_ids(vocab: int, lengths=LENGTHS, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (len(lengths), max(lengths)), generator=g)
    for row, n in enumerate(lengths):
        ids[row, n:] = 0  # pad id 0, as both models use
    return ids


def saved(model, path) -> tuple[dict, dict[str, torch.Tensor]]:
    """config.json and the safetensors as save_pretrained writes them (the Hub's names)."""
    model.save_pretrained(path)
    return json.loads((path / "config.json").read_text()), load_file(str(path / "model.safetensors"))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def hf_outputs(hf, ids: torch.Tensor):
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=(ids != 0).long(), output_attentions=True, output_hidden_states=True)


@pytest.mark.parametrize("source", ["saved", "in_memory"])
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_converted_bert_gives_huggingface_outputs_on_a_padded_batch(name, arch, source, tmp_path):
    hf = hf_model(arch, **CONFIGS[name])
    if source == "saved":
        hf_dict, tensors = saved(hf, tmp_path)
    else:  # the in-memory state dict: the tied decoder's weight and bias stored a second time
        hf_dict, tensors = {**hf.config.to_dict(), "architectures": [arch]}, hf.state_dict()
    family, cfg, task = config_from_hf(hf_dict)
    assert family == "encoder" and cfg.norm == "post" and cfg.type_vocab_size == hf.config.type_vocab_size
    model = Encoder(cfg).eval()
    weights = weights_from_hf(tensors, cfg)
    model.load_state_dict(weights, strict=True)

    ids = padded_ids(hf.config.vocab_size)
    real = ids != 0  # (B, T)
    want = hf_outputs(hf, ids)
    with torch.no_grad():
        hidden, attn = model.hidden(ids, return_weights=True)
        logits = model(ids)
    label = f"{name} {arch} ({source})"
    diffs = {"hidden": max_diff(hidden[real], want.hidden_states[-1][real])}
    if arch == "BertForMaskedLM":
        assert task == {"kind": "mlm"} and cfg.head == "mlm"
        diffs["mlm logits"] = max_diff(logits[real], want.logits[real])
    elif arch == "BertForTokenClassification":
        assert task["kind"] == "tag" and cfg.head == "tag" and not cfg.pooler
        diffs["tag logits"] = max_diff(logits[real], want.logits[real])
    elif arch == "BertForSequenceClassification":
        assert task["kind"] == "classify" and "head" not in task and cfg.pooler
        diffs["classify logits"] = max_diff(logits, want.logits)
    else:  # BertModel: the pooler is read, the classifier is a zero, untrained one
        assert task["head"] == "untrained" and cfg.head == "classify" and cfg.pooler
        assert not weights["out.weight"].any() and not weights["out.bias"].any()
        with torch.no_grad():
            pooled = torch.tanh(model.pooler(hidden[:, 0]))
        diffs["pooler"] = max_diff(pooled, want.pooler_output)
    if cfg.head != "mlm":
        assert (
            task["labels"] == [f"LABEL_{i}" for i in range(hf.config.num_labels)]
            and cfg.n_labels == hf.config.num_labels
        )
    assert len(attn) == len(want.attentions) == cfg.n_layer
    rows = real[:, None, :, None]  # real query rows, every head and key
    diffs["attention"] = max(max_diff(a * rows, b * rows) for a, b in zip(attn, want.attentions, strict=True))
    print(f"{label}: " + ", ".join(f"{k} max abs diff {v:.3g}" for k, v in diffs.items()))
    for what, diff in diffs.items():
        limit = 1e-5 if what == "attention" else 1e-4
        assert diff < limit, f"{label}: {what} differs by {diff:.3g}"


def test_padding_does_not_change_real_positions():
    hf = hf_model("BertForMaskedLM", **CONFIGS["2x32"])
    _, cfg, _ = config_from_hf({**hf.config.to_dict(), "architectures": ["BertForMaskedLM"]})
    model = Encoder(cfg).eval()
    model.load_state_dict(weights_from_hf(hf.state_dict(), cfg))
    ids = padded_ids(120)
    with torch.no_grad():
        alone = model(ids[2:3, : LENGTHS[2]])
        batched = model(ids)[2:3, : LENGTHS[2]]
    assert max_diff(alone, batched) < 1e-5


def test_labels_come_from_id2label_and_architecture_is_found():
    labels = {"0": "neg", "1": "neu", "2": "pos"}
    hf = {**CONFIGS["2x32"], "architectures": ["BertForSequenceClassification"], "id2label": labels}
    assert module_for("BertForSequenceClassification").__name__ == "attnlab.interop.hf.bert"
    _, cfg, task = config_from_hf(hf)
    assert task == {"kind": "classify", "labels": ["neg", "neu", "pos"]} and cfg.n_labels == 3
    with pytest.raises(AttnlabError, match="position_embedding_type 'relative_key'"):
        config_from_hf({**hf, "position_embedding_type": "relative_key"})
    with pytest.raises(AttnlabError, match="hidden_act 'swish'"):
        config_from_hf({**hf, "hidden_act": "swish"})


def test_a_tensor_of_the_wrong_shape_or_missing_is_named(tmp_path):
    hf_dict, tensors = saved(hf_model("BertForSequenceClassification", **CONFIGS["2x32"]), tmp_path)
    _, cfg, _ = config_from_hf(hf_dict)
    for name, bad, want in [
        ("bert.encoder.layer.1.intermediate.dense.weight", (63, 32), r"\(64, 32\)"),
        ("bert.encoder.layer.0.attention.self.key.weight", (32, 31), r"\[32, 32\]"),
        ("classifier.bias", (3,), r"\(2,\)"),
    ]:
        broken = {**tensors, name: torch.zeros(bad)}
        with pytest.raises(AttnlabError, match=rf"{name} has shape [\[(]{bad[0]}.*implies {want}"):
            weights_from_hf(broken, cfg)
    name = "bert.encoder.layer.1.attention.self.value.bias"
    with pytest.raises(AttnlabError, match=rf"no tensor {name}"):
        weights_from_hf({k: v for k, v in tensors.items() if k != name}, cfg)
    _, shallow, _ = config_from_hf({**hf_dict, "num_hidden_layers": 1})
    with pytest.raises(AttnlabError, match="no place for: .*bert.encoder.layer.1"):
        weights_from_hf(tensors, shallow)


def test_an_untied_mlm_decoder_is_refused():
    hf = hf_model("BertForMaskedLM", **CONFIGS["2x32"])
    _, cfg, _ = config_from_hf({**hf.config.to_dict(), "architectures": ["BertForMaskedLM"]})
    tensors = dict(hf.state_dict())
    tensors["cls.predictions.decoder.weight"] = tensors["cls.predictions.decoder.weight"] + 1
    with pytest.raises(AttnlabError, match="decoder.weight differs from bert.embeddings.word_embeddings.weight"):
        weights_from_hf(tensors, cfg)


@pytest.mark.parametrize("arch", ARCHS[1:])
def test_exported_encoder_loads_in_transformers_with_the_same_logits(arch, tmp_path):
    hf_dict, tensors = saved(hf_model(arch, **CONFIGS["3x48"]), tmp_path / "src")
    _, cfg, task = config_from_hf(hf_dict)
    model = Encoder(cfg).eval()
    model.load_state_dict(weights_from_hf(tensors, cfg))
    exported = config_to_hf(cfg, task.get("labels"))
    assert exported["architectures"] == [arch]
    write_hf_dir(tmp_path / "out", exported, weights_to_hf(model.state_dict(), cfg), None)
    back = getattr(transformers, arch).from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    ids = padded_ids(cfg.vocab_size)
    real = ids != 0
    with torch.no_grad():
        got, want = model(ids), hf_outputs(back, ids).logits
    diff = max_diff(got, want) if cfg.head == "classify" else max_diff(got[real], want[real])
    print(f"export {arch}: logits max abs diff {diff:.3g}")
    assert diff < 1e-4, f"export {arch}: logits differ by {diff:.3g}"


def test_an_encoder_without_token_types_exports_a_zero_type_row(tmp_path):
    torch.manual_seed(0)
    sizes = dict(n_layer=2, n_head=4, d_model=32, d_ff=64, context=24, vocab_size=70)
    cfg = EncoderConfig(**sizes, norm="post", head="classify", n_labels=3, pooler=True)
    model = Encoder(cfg).eval()
    hf = weights_to_hf(model.state_dict(), cfg)
    assert not hf["bert.embeddings.token_type_embeddings.weight"].any()
    write_hf_dir(tmp_path, config_to_hf(cfg, ["a", "b", "c"]), hf, None)
    back = transformers.BertForSequenceClassification.from_pretrained(tmp_path, attn_implementation="eager")
    assert back.config.id2label == {0: "a", 1: "b", 2: "c"}
    ids = padded_ids(70, (10, 4, 7))
    with torch.no_grad():
        diff = max_diff(model(ids), hf_outputs(back.eval(), ids).logits)
    print(f"export without token types: logits max abs diff {diff:.3g}")
    assert diff < 1e-4, f"logits differ by {diff:.3g}"


def test_what_bert_cannot_express_is_said_before_export():
    pre = EncoderConfig(n_layer=1, n_head=2, d_model=16, vocab_size=30, norm="pre", head="tag")
    with pytest.raises(AttnlabError, match="norm 'pre' \\(BERT is post-norm\\)"):
        config_to_hf(pre)
    no_pooler = EncoderConfig(n_layer=1, n_head=2, d_model=16, vocab_size=30, norm="post", head="classify")
    with pytest.raises(AttnlabError, match="without pooler"):
        config_to_hf(no_pooler)


def test_new_options_are_off_by_default():
    cfg = EncoderConfig()
    assert cfg.type_vocab_size == 0 and not cfg.pooler
    keys = set(Encoder(EncoderConfig(n_layer=1, n_head=2, d_model=16, vocab_size=30)).state_dict())
    assert not any(k.startswith(("token_type", "pooler")) for k in keys)
    with pytest.raises(ValueError, match="pooler applies to head classify only"):
        EncoderConfig(head="mlm", pooler=True)


def wordpiece_json(vocab_size: int) -> str:
    """A WordPiece tokenizer.json as BERT ships one, built locally: specials at BERT's ids (0 is
    [PAD]), then letters and "##" continuations up to vocab_size."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    letters = "abcdefghijklmnopqrstuvwxyz"
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *letters, *(f"##{c}" for c in letters)]
    tokens += [f"w{i}" for i in range(vocab_size - len(tokens))]
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(tokens)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.add_special_tokens(tokens[:5])  # as BERT's: "[MASK]" in a text is one token
    return tok.to_str()


@pytest.mark.parametrize("arch", ["BertForSequenceClassification", "BertForMaskedLM", "BertModel"])
def test_a_bert_directory_converts_to_a_run_and_exports_back(arch, tmp_path):
    from attnlab.interop.convert import convert_from_hf, export_hf
    from attnlab.runs.run import load

    hf = hf_model(arch, **CONFIGS["2x32"])
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_text(wordpiece_json(120))
    summary = convert_from_hf(tmp_path / "hf", tmp_path / "run")
    assert summary["family"] == "encoder" and summary["architecture"] == arch
    run = load(tmp_path / "run", device="cpu")
    assert run.tokenizer.kind == "wordpiece"  # HuggingFace's tokenizer.json, kept as is
    ids = padded_ids(120)
    real = ids != 0
    with torch.no_grad():
        got = run.model.eval()(ids)
        want = hf_outputs(hf, ids)
    if arch == "BertModel":  # no head to compare: the body, through the run's model
        got, want_t = run.model.hidden(ids)[0][real], want.last_hidden_state[real]
    else:
        want_t = want.logits if arch != "BertForMaskedLM" else want.logits[real]
        got = got if arch != "BertForMaskedLM" else got[real]
    diff = max_diff(got, want_t)
    print(f"convert_from_hf {arch}: max abs diff {diff:.3g}")
    assert diff < 1e-4, f"convert_from_hf {arch}: outputs differ by {diff:.3g}"

    out = export_hf(tmp_path / "run", tmp_path / "back")
    assert out["tokenizer"] == "tokenizer.json" and (tmp_path / "back" / "tokenizer.json").is_file()
    kind = "BertForMaskedLM" if arch == "BertForMaskedLM" else "BertForSequenceClassification"
    assert out["architecture"] == kind
    back = getattr(transformers, kind).from_pretrained(tmp_path / "back", attn_implementation="eager").eval()
    with torch.no_grad():
        again = hf_outputs(back, ids)
    if arch == "BertForMaskedLM":
        diff = max_diff(again.logits[real], want.logits[real])
    elif arch == "BertModel":  # exported with its zero classifier: the body must match
        diff = max_diff(again.hidden_states[-1][real], want.last_hidden_state[real])
    else:
        diff = max_diff(again.logits, want.logits)
    print(f"export_hf {arch}: max abs diff {diff:.3g}")
    assert diff < 1e-4, f"export_hf {arch}: outputs differ by {diff:.3g}"


def test_predict_and_attention_on_a_converted_bert_read_cls_text_sep(tmp_path, capsys):
    """The converted run reads "[CLS] pieces [SEP]" as BERT does: predict's probabilities equal
    HuggingFace's on the same framed ids, and the attention picture shows that framing."""
    from attnlab.cli.main import main
    from attnlab.data.tokenizers import tokenizer_from_json
    from attnlab.interop.convert import convert_from_hf

    hf = hf_model("BertForSequenceClassification", **CONFIGS["2x32"])
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_text(wordpiece_json(120))
    convert_from_hf(tmp_path / "hf", tmp_path / "run")
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "run"), "Abc def", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["probabilities"]
    tok = tokenizer_from_json(wordpiece_json(120))
    ids = torch.tensor([[tok.cls_id, *tok.encode("abc def"), tok.sep_id]])
    with torch.no_grad():
        want = hf(input_ids=ids).logits.softmax(-1)[0]
    diff = max(abs(p - float(q)) for p, q in zip(got.values(), want))
    assert diff < 1e-5, diff
    html = tmp_path / "a.html"
    assert main(["attention", str(tmp_path / "run"), "abc def", "--out", str(html)]) == 0
    from attnlab.interpret.views import views
    from attnlab.runs.run import load

    (view,) = views(load(tmp_path / "run", device="cpu"), "abc def")
    assert view.queries == ["[CLS]", "a", "##b", "##c", "d", "##e", "##f", "[SEP]"]


def test_mlm_on_a_converted_bert_fills_mask(tmp_path, capsys):
    from attnlab.cli.main import main
    from attnlab.interop.convert import convert_from_hf

    hf_model("BertForMaskedLM", **CONFIGS["2x32"]).save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_text(wordpiece_json(120))
    convert_from_hf(tmp_path / "hf", tmp_path / "run")
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "run"), "abc [MASK] d", "--json"]) == 0
    masks = json.loads(capsys.readouterr().out)["masks"]
    assert len(masks) == 1 and masks[0]["position"] == 4 and len(masks[0]["candidates"]) == 5  # after [CLS] a ##b ##c


@pytest.mark.parametrize("task", ["classify", "tag"])
def test_a_converted_bert_fine_tunes_with_init(task, tmp_path, capsys):
    """train classify|tag --init on a converted BERT: its WordPiece tokenizer frames the data as
    [CLS] pieces [SEP] (tags on first pieces), its body weights are the start, and predict reads it."""
    from attnlab.cli.main import main
    from attnlab.interop.convert import convert_from_hf
    from attnlab.runs.run import load

    hf_model("BertForMaskedLM", **CONFIGS["2x32"]).save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_text(wordpiece_json(120))
    convert_from_hf(tmp_path / "hf", tmp_path / "bert")
    data = "sentiment" if task == "classify" else "tagging"
    fast = ["--max-len", "64", "--max-steps", "3", "--batch-size", "8", "--eval-interval", "3", "--eval-batches", "1"]
    args = [
        "train",
        task,
        "--data",
        data,
        "--init",
        tmp_path / "bert",
        "--out",
        tmp_path / "ft",
        *fast,
        "--device",
        "cpu",
    ]
    with pytest.warns(UserWarning, match="were truncated"):  # the test vocabulary spells words letter by letter
        assert main([str(a) for a in args]) == 0
    run = load(tmp_path / "ft", device="cpu")
    assert run.tokenizer.kind == "wordpiece" and run.config["model"]["type_vocab_size"] == 2
    bert = load(tmp_path / "bert", device="cpu")
    moved = (run.model.tok.weight - bert.model.tok.weight).abs().max().item()
    assert 0 < moved < 0.05, moved  # started from the converted weights, then a few small steps
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "ft"), "the food was good", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == task


def test_eval_reads_a_converted_bert_within_its_context(tmp_path, capsys):
    """The default --max-len (128) is beyond this BERT's 64 positions: eval reads at most 64."""
    from attnlab.cli.main import main
    from attnlab.interop.convert import convert_from_hf

    hf = hf_model("BertForSequenceClassification", **CONFIGS["2x32"])
    hf.config.id2label = {0: "negative", 1: "positive"}
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_text(wordpiece_json(120))
    convert_from_hf(tmp_path / "hf", tmp_path / "run")
    capsys.readouterr()
    with pytest.warns(UserWarning, match="longer than 64 tokens"):
        assert main(["eval", str(tmp_path / "run"), "--data", "sentiment", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["examples"] == 2000 and 0 <= result["accuracy"] <= 1
