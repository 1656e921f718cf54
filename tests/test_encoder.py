"""Encoder model, masked-LM collator, labelled data, and the classify/tag/mlm/predict/compare commands."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnlab.data.batches import IGNORE, mask_tokens
from attnlab.data.labeled import LabeledDataConfig, load_splits, read_conll, read_table
from attnlab.data.tokenizers import WordTokenizer, load_tokenizer
from attnlab.errors import AttnlabError
from attnlab.models.encoder import PAPER_PARAMS, PRESETS, Encoder, EncoderConfig
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.tasks.metrics import confusion, scores
from tests.conftest import flags, run_cli

TINY = dict(n_layer=2, n_head=2, d_model=32, context=24, vocab_size=40)


def tiny_encoder(**kw) -> Encoder:
    return Encoder(EncoderConfig(**{**TINY, **kw})).eval()


@pytest.mark.parametrize("head, pooling", [("classify", "cls"), ("classify", "mean"), ("tag", "cls"), ("mlm", "cls")])
def test_padding_never_changes_real_outputs(head, pooling):
    model = tiny_encoder(head=head, pooling=pooling, norm="post")
    with torch.no_grad():
        model.tok.weight[0].normal_()  # a [PAD] row that is not zero: only the mask can hide it
    ids = torch.randint(1, 40, (3, 9))
    padded = torch.cat([ids, torch.zeros(3, 6, dtype=torch.long)], dim=1)
    short, long = model(ids), model(padded)
    if head == "classify":
        torch.testing.assert_close(short, long, atol=1e-5, rtol=0)
    else:
        torch.testing.assert_close(short, long[:, :9], atol=1e-5, rtol=0)


def test_padding_gives_no_attention_and_receives_none():
    model = tiny_encoder()
    ids = torch.tensor([[5, 6, 7, 0, 0]])
    for w in model.attention(ids):  # (B, H, T, T)
        assert w[..., 3:].abs().max() == 0  # nobody attends to padding
        assert w[..., 3:, :].abs().max() == 0  # padding attends to nothing
        torch.testing.assert_close(w[..., :3, :].sum(-1), torch.ones(1, 2, 3))


def test_encoder_is_bidirectional_unlike_gpt():
    enc = tiny_encoder(head="tag")
    gpt = GPT(GPTConfig(n_layer=2, n_head=2, d_model=32, context=24, vocab_size=40)).eval()
    ids = torch.randint(1, 40, (1, 8))
    later = ids.clone()
    later[0, -1] = (ids[0, -1] % 39) + 1  # change only the last token
    assert (enc(ids)[0, 0] - enc(later)[0, 0]).abs().max() > 1e-4  # the first position sees it
    torch.testing.assert_close(gpt(ids)[0, :-1], gpt(later)[0, :-1])  # a causal model does not


def test_mlm_head_is_tied_and_loss_only_on_chosen_positions():
    model = tiny_encoder(head="mlm")
    assert model.out.weight is model.tok.weight
    ids = torch.randint(5, 40, (2, 10))
    labels = torch.full_like(ids, IGNORE)
    labels[0, 3], labels[1, 7] = 11, 12
    _, loss = model(ids, labels)
    logits = model(ids)  # (B, T, V)
    want = torch.nn.functional.cross_entropy(torch.stack([logits[0, 3], logits[1, 7]]), torch.tensor([11, 12]))
    torch.testing.assert_close(loss, want)


def test_bert_base_parameter_count_is_within_two_percent():
    with torch.device("meta"):  # shapes only: no 110 M weights drawn
        n = sum(p.numel() for p in Encoder(PRESETS["bert-base"]).parameters())
    assert abs(n / PAPER_PARAMS["bert-base"] - 1) < 0.02, n


def test_masking_statistics_are_15_percent_and_80_10_10():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (200, 500))
    ids[:, ::50] = 3  # special tokens are never chosen
    inputs, labels = mask_tokens(ids, mask_id=4, n_special=5, vocab_size=1000, rate=0.15, g=g)
    chosen = labels != IGNORE
    assert not chosen[ids == 3].any()
    assert abs(chosen.float().mean().item() / (1 - 1 / 50) - 0.15) < 0.005
    assert torch.equal(labels[chosen], ids[chosen])
    masked = (inputs[chosen] == 4).float().mean().item()
    kept = (inputs[chosen] == ids[chosen]).float().mean().item()
    assert abs(masked - 0.8) < 0.01 and abs(kept - 0.1 - 0.1 / 995) < 0.01  # a random token may repeat itself
    assert torch.equal(inputs[~chosen], ids[~chosen])


def test_word_tokenizer_keeps_specials_and_frequency_order(tmp_path):
    tok = WordTokenizer.train(["b a a c a b [MASK]"], vocab_size=7)
    assert tok.itos[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert tok.itos[5:] == ["a", "b"]  # the two most frequent, most frequent first
    assert tok.encode("a [MASK] c") == [5, tok.mask_id, tok.unk_id]
    (tmp_path / "tokenizer.json").write_text(tok.to_json())
    assert load_tokenizer(tmp_path).itos == tok.itos


def test_word_tokenizer_keeps_line_breaks_as_one_token():
    # In code a line break ends a statement: one token, blank lines and indentation folded in.
    assert WordTokenizer.split("import os\n\n   \nx = [MASK]\n") == ["import", "os", "\n", "x", "=", "[MASK]", "\n"]
    tok = WordTokenizer.train(["a\nb\n"], vocab_size=10)
    assert tok.decode(tok.encode("a\n\nb")) == "a \n b"


def test_help_shows_the_defaults_each_command_uses():
    from attnlab.cli.main import build_parser

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    mlm = " ".join(train._subparsers._group_actions[0].choices["mlm"].format_help().split())
    assert "word tokens (default: word)" in mlm and "(default: 4000)" in mlm and "(default: 8192)" in mlm
    tr = " ".join(train._subparsers._group_actions[0].choices["translate"].format_help().split())
    assert "model width (embedding size) (default: 64)" in tr  # transformer-tiny's, not the class default


def test_tables_and_conll_are_read_and_bad_columns_are_clear(tmp_path):
    (tmp_path / "a.csv").write_text('text,label\n"good, really",pos\nbad,neg\n')
    (tmp_path / "a.tsv").write_text("body\tlabel\ngood\tpos\n")
    (tmp_path / "a.jsonl").write_text('{"text": "good", "label": 1}\n\n{"text": "bad", "label": 0}\n')
    (tmp_path / "a.conll").write_text("the DET\nfish NOUN\n\nwe PRON\nfish VERB\n")
    assert read_table(tmp_path / "a.csv", "text", "label") == [("good, really", "pos"), ("bad", "neg")]
    assert read_table(tmp_path / "a.jsonl", "text", "label") == [("good", "1"), ("bad", "0")]
    assert read_conll(tmp_path / "a.conll") == [(["the", "fish"], ["DET", "NOUN"]), (["we", "fish"], ["PRON", "VERB"])]
    with pytest.raises(AttnlabError, match="no column 'text'.*--text-column"):
        read_table(tmp_path / "a.tsv", "text", "label")


def test_splits_cut_from_one_file_are_deterministic_and_disjoint(tmp_path):
    rows = "".join(f"text {i},{i % 2}\n" for i in range(100))
    (tmp_path / "d.csv").write_text("text,label\n" + rows)
    cfg = LabeledDataConfig(data=str(tmp_path / "d.csv"))
    a, b = load_splits(cfg, "classify"), load_splits(cfg, "classify")
    assert a == b and [len(a[k]) for k in ("train", "val", "test")] == [80, 10, 10]
    texts = [{t for t, _ in a[k]} for k in ("train", "val", "test")]
    assert not (texts[0] & texts[1]) and not (texts[0] & texts[2]) and not (texts[1] & texts[2])


def test_metrics_from_a_confusion_matrix():
    m = confusion(np.array([0, 0, 1, 1, 1]), np.array([0, 1, 1, 1, 0]), 2)
    assert m.tolist() == [[1, 1], [1, 2]]
    s = scores(m, ["a", "b"])
    assert s["accuracy"] == pytest.approx(0.6)
    assert s["per_class"]["b"]["precision"] == pytest.approx(2 / 3)
    assert s["macro_f1"] == pytest.approx((0.5 + 2 / 3) / 2)


FAST = ["--max-steps", "60", "--eval-interval", "30", "--eval-batches", "2", "--device", "cpu"]


def train_pooled(tmp_path, capsys, *more) -> tuple[int, str]:
    """`attnlab train classify` of a pooled model on tmp_path/train.csv into tmp_path/run; (code, stdout)."""
    args = ["train", "classify", "--data", tmp_path / "train.csv", "--out", tmp_path / "run", "--model", "pooled"]
    code, out, _ = run_cli([*args, *more, *FAST], capsys)
    return code, out


def test_classify_file_predict_and_eval_files(tmp_path, capsys):
    rows = [(f"the food was {w}", lab) for w, lab in [("good", "pos"), ("bad", "neg")] for _ in range(60)]
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
    run = tmp_path / "run"
    code, out = train_pooled(tmp_path, capsys, "--lr", "0.03")
    assert code == 0 and "test: accuracy 1.0000" in out
    result = json.loads((run / "eval.json").read_text())
    assert result["accuracy"] == 1.0 and result["labels"] == ["neg", "pos"]
    assert (run / "confusion.png").stat().st_size > 1000
    code, out, _ = run_cli(["predict", run, "the food was bad", "--json"], capsys)
    assert json.loads(out)["label"] == "neg"
    (tmp_path / "other.csv").write_text("text,label\nthe food was good,pos\nthe food was bad,pos\n")
    code, out, _ = run_cli(["eval", run, "--data", tmp_path / "other.csv", "--json"], capsys)
    result = json.loads(out)
    assert (result["examples"], result["accuracy"], result["confusion"]) == (2, 0.5, [[0, 0], [1, 1]])


def test_unknown_label_and_wrong_flag_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "train.csv").write_text("text,label\n" + "a b,x\nb a,y\n" * 20)
    (tmp_path / "test.csv").write_text("text,label\na,z\n")
    args = ["train", "classify", "--data", tmp_path / "train.csv", "--test", tmp_path / "test.csv", *FAST]
    code, _, err = run_cli([*args, "--out", tmp_path / "r1"], capsys)
    assert code == 2 and "unknown label 'z' in the test split" in err and "Traceback" not in err
    code, _, err = run_cli([*args[:-8], "--out", tmp_path / "r2", "--model", "bow", "--cell", "gru"], capsys)
    assert code == 2 and "--cell does not apply to --model bow" in err


def test_tagging_with_rnn_and_long_texts_are_truncated_with_a_warning(tmp_path, capsys):
    (tmp_path / "t.conll").write_text(
        "".join("the DET\nfish NOUN\nswim VERB\n\nwe PRON\nfish VERB\n\n" for _ in range(30))
    )
    run = tmp_path / "tag"
    rnn = [*flags(model="rnn", max_len=2, lr="0.03"), "--bidirectional"]
    with pytest.warns(UserWarning, match="truncated"):
        code, out, _ = run_cli(["train", "tag", "--data", tmp_path / "t.conll", "--out", run, *rnn, *FAST], capsys)
    assert code == 0
    code, out, _ = run_cli(["predict", run, "we fish", "--json"], capsys)
    assert [t["tag"] for t in json.loads(out)["tokens"]] == ["PRON", "VERB"]


def test_mlm_pretraining_then_finetuning_with_init(tmp_path, corpus, capsys):
    mlm = tmp_path / "mlm"
    code, out, _ = run_cli(
        [
            "train",
            "mlm",
            "--data",
            corpus,
            "--out",
            mlm,
            *flags(preset="encoder-tiny", context=48, block_size=16, batch_size=8),
            *FAST,
        ],
        capsys,
    )
    assert code == 0 and "validation loss" in out
    losses = [json.loads(line) for line in (mlm / "metrics.jsonl").read_text().splitlines()]
    val = [r["val_loss"] for r in losses if "val_loss" in r]
    assert val[-1] < val[0]  # learning
    code, out, _ = run_cli(["predict", mlm, "def [MASK](self):", "--json"], capsys)
    assert len(json.loads(out)["masks"][0]["candidates"]) == 5
    (tmp_path / "c.csv").write_text("text,label\n" + "self . x,a\ndef add,b\n" * 20)
    args = ["train", "classify", "--data", tmp_path / "c.csv", "--init", mlm, *FAST]
    code, _, err = run_cli([*args, "--out", tmp_path / "long"], capsys)  # --max-len 128 > the pretrained 48
    assert code == 2 and "beyond the pretrained encoder's context of 48" in err
    code, out, _ = run_cli([*args, "--out", tmp_path / "ft", "--max-len", "48"], capsys)
    assert code == 0
    ft = Encoder(EncoderConfig(**json.loads((tmp_path / "ft" / "config.json").read_text())["model"]))
    assert (ft.cfg.d_model, ft.cfg.context, ft.cfg.head) == (64, 48, "classify")


def test_word_vectors_flag_loads_rows(tmp_path, capsys):
    (tmp_path / "train.csv").write_text("text,label\n" + "good food,a\nbad food,b\n" * 20)
    (tmp_path / "vec.txt").write_text("good " + " ".join(["0.5"] * 64) + "\nfood " + " ".join(["-1"] * 64) + "\n")
    run = tmp_path / "run"
    code, out = train_pooled(tmp_path, capsys, "--word-vectors", tmp_path / "vec.txt", "--freeze-vectors")
    assert code == 0 and "2 of 3 vocabulary words found" in out
    from attnlab.runs.run import load

    model = load(run).model
    food = load_tokenizer(run).stoi["food"]
    assert torch.all(model.word_embedding.weight[food] == -1)  # frozen: still the file's values


def test_compare_prints_a_table_and_writes_a_chart(tmp_path, capsys, monkeypatch):
    import attnlab.tasks.labeled as classify

    for name in ("pooled", "conv1d"):  # a short budget: this checks the command, not the scores
        monkeypatch.setitem(
            classify.TRAIN_DEFAULTS,
            name,
            dict(max_steps=30, batch_size=32, eval_interval=30, eval_batches=1, lr=0.01, device="cpu"),
        )
    code, out, _ = run_cli(["compare", "--task", "sentiment", "--models", "pooled,conv1d", "--out", tmp_path], capsys)
    assert code == 0 and "pooled" in out and "conv1d" in out and "accuracy" in out
    rows = json.loads((tmp_path / "compare.json").read_text())["rows"]
    assert [r["model"] for r in rows] == ["pooled", "conv1d"] and all(0 <= r["accuracy"] <= 1 for r in rows)
    assert (tmp_path / "compare.png").stat().st_size > 1000
