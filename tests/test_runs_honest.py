"""Resume, convert, export, inspect and progress: no refusal of honest use, no silent case.

1. the original command with --resume appended works; only a real change is refused, by name
2. a --max-steps the run has reached is refused before the run is touched
3. inspect --on is refused where it would be ignored
4. convert refuses a folder whose run could not load or decode, and writes nothing
5. export --to hf says what GPT-2 and Llama each cannot express (char-level round trip: test_convert_gpt2)
6. convert --help lists every architecture the converters read
7. decoding a test set shows a progress bar
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict

import pytest
import torch

from attnlab.cli.main import build_parser
from attnlab.errors import AttnlabError
from attnlab.interop.convert import convert_from_hf, export_hf
from attnlab.interop.hf import architectures
from attnlab.models import build_model
from attnlab.models.encoder import PRESETS as ENCODER_PRESETS
from attnlab.models.seq2seq import Seq2SeqConfig
from attnlab.tasks import TASKS
from attnlab.tasks.translate import translate_ids
from tests.conftest import TEXT, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.py

ARCH = ["--preset", "gpt-nano", "--n-layer", "1", "--n-head", "2", "--d-model", "16", "--context", "32"]
TRAIN = ["--batch-size", "4", "--eval-interval", "2", "--eval-batches", "1", "--device", "cpu", "--dtype", "float32"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny run, trained for 4 steps, and the command that made it."""
    root = tmp_path_factory.mktemp("honest")
    (root / "code.txt").write_text(TEXT * 30)
    command = ["train", "lm", "--data", root / "code.txt", "--out", root / "run", *ARCH, *TRAIN]
    from attnlab.cli.main import main

    assert main([str(a) for a in [*command, "--max-steps", "4"]]) == 0
    return root / "run", command


def one_line_error(code: int, err: str, *parts: str) -> None:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("attnlab: error: "), err
    for part in parts:
        assert part in lines[0], lines[0]


# ---- 1. resume ------------------------------------------------------------------------------------
def test_the_original_command_with_resume_appended_continues_and_says_from_where(made, capsys):
    run, command = made
    code, _, err = run_cli([*command, "--max-steps", "6", "--resume"], capsys)
    assert code == 0, err
    assert f"resuming {run} from step 4 of 6" in err
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 6


@pytest.mark.parametrize(
    "change, said",
    [
        (["--n-layer", "2"], "--n-layer 2 differs from the run's 1"),
        (["--preset", "gpt-micro"], "--preset gpt-micro differs from the run's gpt-nano"),
        (["--tokenizer", "bpe"], "--tokenizer bpe differs from the run's char"),
    ],
)
def test_a_real_change_on_resume_is_refused_by_name(made, capsys, change, said):
    run, command = made
    before = (run / "config.json").read_bytes()
    code, _, err = run_cli([*command, "--max-steps", "20", "--resume", *change], capsys)
    one_line_error(code, err, said, "cannot change when resuming")
    assert (run / "config.json").read_bytes() == before


def test_a_run_without_a_recorded_preset_compares_the_presets_fields(made, tmp_path, capsys):
    """Runs made from Python (or before presets were recorded): --preset is compared field by field."""
    run, command = made
    old = tmp_path / "old"
    shutil.copytree(run, old)
    config = json.loads((old / "config.json").read_text())
    del config["preset"]
    (old / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli(
        ["train", "lm", "--out", old, "--resume", "--max-steps", "20", "--preset", "gpt-nano"], capsys
    )
    one_line_error(code, err, "--preset gpt-nano (its --n-head 4) differs from the run's 2")


def test_every_task_compares_the_flags_given_again():
    """A task of the shared base (classify): its model flags and preset are compared, not refused."""
    task = TASKS["classify"]
    model = {**asdict(ENCODER_PRESETS["encoder-tiny"]), "n_layer": 1, "vocab_size": 50, "n_labels": 2}
    saved = {"family": "encoder", "model": model, "task": {"kind": "classify"}, "preset": "encoder-tiny"}
    task.check_resumed(saved, None, "encoder-tiny", {"n_layer": 1})  # the run's own: passes
    with pytest.raises(AttnlabError, match="--n-layer 2 differs from the run's 1"):
        task.check_resumed(saved, None, None, {"n_layer": 2})
    with pytest.raises(AttnlabError, match="--model bow differs from the run's encoder"):
        task.check_resumed(saved, "bow", None, {})


# ---- 2. a --max-steps already reached -----------------------------------------------------------
@pytest.mark.parametrize("steps, said", [("2", "beyond --max-steps 2"), (None, "has trained its")])
def test_resume_to_a_step_already_reached_is_refused_and_touches_nothing(made, capsys, steps, said):
    run, _ = made
    done = json.loads((run / "config.json").read_text())["train"]["max_steps"]
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    code, _, err = run_cli(["train", "lm", "--out", run, "--resume", "--max-steps", steps or str(done)], capsys)
    one_line_error(code, err, said, f"give a --max-steps above {done}")
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


# ---- 3. inspect --on ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, said",
    [
        (["def x(a):", "--what", "lens", "--on", "val"], "--on val does not apply to --what lens"),
        (["def x(a):", "--what", "heads", "--on", "val"], "--on val does not apply to --what heads"),
        (["--what", "over-training", "--on", "val"], "does not apply to --what over-training"),
        (["def x(a):", "--what", "ablate", "--on", "val"], "give the text or --on, not both"),
    ],
)
def test_inspect_on_is_refused_where_it_would_be_ignored(made, capsys, args, said):
    run, _ = made
    code, _, err = run_cli(["inspect", run, *args], capsys)
    one_line_error(code, err, said)


def test_inspect_on_val_ablates_on_the_validation_split(made, capsys):
    run, _ = made
    code, out, err = run_cli(["inspect", run, "--what", "ablate", "--on", "val"], capsys)
    assert code == 0, err and "loss change when zeroed" in out


# ---- 4. convert validates the run before writing it ---------------------------------------------
def test_a_masked_lm_with_padding_rows_beyond_its_tokenizer_proposes_only_its_tokens(tmp_path, capsys):
    """A converted BERT whose embedding has 30 rows more than its tokenizer (padding, accepted): the
    [MASK] candidates are tokens, even when the padding rows score highest (an IndexError before)."""
    from tests.test_convert_bert import CONFIGS, hf_model, wordpiece_json

    hf = hf_model("BertForMaskedLM", **{**CONFIGS["2x32"], "vocab_size": 150})
    with torch.no_grad():
        hf.cls.predictions.bias[120:] = 100.0  # the padding rows win every [MASK]
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").write_text(wordpiece_json(120))
    convert_from_hf(tmp_path / "hf", tmp_path / "run")
    code, out, err = run_cli(["predict", tmp_path / "run", "abc [MASK] d", "--json"], capsys)
    assert code == 0, err
    candidates = json.loads(out)["masks"][0]["candidates"]
    assert len(candidates) == 5 and all(c["token"] and c["probability"] < 1e-6 for c in candidates)


# ---- 5. export says what each HuggingFace target needs --------------------------------------------
def test_export_of_a_fast_recipe_run_names_what_gpt2_and_llama_each_lack(made, tmp_path, capsys):
    _, command = made
    fast = tmp_path / "fast"
    args = [*command[:4], "--out", fast, "--preset", "gpt-nano-fast", *ARCH[2:], *TRAIN, "--max-steps", "1"]
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    with pytest.raises(AttnlabError) as e:
        export_hf(fast, tmp_path / "hf")
    said = str(e.value)
    assert "\n" not in said and f"{fast} does not fit HuggingFace's GPT-2: " in said
    assert "positions 'rope' (GPT-2's are learned)" in said and "nor does it fit HuggingFace's Llama: " in said
    assert "bias True (Llama has no biases" in said
    assert "--to onnx" in said and not (tmp_path / "hf").exists()


# ---- 6. convert --help ------------------------------------------------------------------------------
def test_convert_help_lists_every_architecture_it_reads():
    text = build_parser()._subparsers._group_actions[0].choices["convert"].format_help()
    flat = " ".join(text.split())
    readable = set(architectures())
    assert {"LlamaForCausalLM", "MixtralForCausalLM", "GPT2LMHeadModel", "BertModel", "ViTModel"} <= readable
    for arch in architectures():
        assert arch in flat, arch


# ---- 7. progress ------------------------------------------------------------------------------------
@pytest.mark.parametrize("beam", [1, 3])
def test_decoding_a_set_shows_progress_on_stderr(capsys, beam):
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(src_vocab=30, tgt_vocab=25, d_model=16, n_head=2, n_layer=1, d_ff=32, context=12)
    model = build_model("seq2seq", cfg).eval()
    sources = [torch.randint(4, 30, (5,)).numpy() for _ in range(7)]
    quiet = translate_ids(model, sources, 6, beam, batch_size=3)
    assert capsys.readouterr().err == ""  # progress=False: nothing
    shown = translate_ids(model, sources, 6, beam, batch_size=3, progress=True)
    err = capsys.readouterr().err
    assert shown == quiet
    how = "greedy" if beam == 1 else f"beam {beam}"
    assert f"decoding ({how}): 7/7 " in err  # over the 7 sources (stderr is not a terminal here: a line, no bar)
