"""`attnlab chat RUN` (a conversation in the terminal) and what `attnlab sample RUN --chat` shares with
it: a run that generates, and its chat template."""

from __future__ import annotations

import sys

from attnlab.cli.options import ChatOptions
from attnlab.cli.quantize import note_quantized
from attnlab.data.chat import ChatTemplate
from attnlab.decoding.dialogue import COMMANDS, Dialogue, talk
from attnlab.errors import AttnlabError
from attnlab.runs.adapted import CHAT_TEMPLATE, run_template
from attnlab.runs.folder import check_run_dir, read_run_config
from attnlab.runs.kind import kind_of
from attnlab.runs.run import Run, load


def generating_run(path: str, device: str, command: str, quantize: str | None = None, compiled: bool = False) -> Run:
    """The run at `path`, which must be a language model (one line naming its kind otherwise); its
    weights quantized for decoding when asked (the note on stderr)."""
    if quantize is not None and not kind_of(read_run_config(check_run_dir(path))).generates:
        raise AttnlabError(f"{path} is not a language model run: --quantize is for decoding")
    run = load(path, device=device, quantize=quantize, compiled=compiled)
    if not run.task.generates:
        raise AttnlabError(f"{path} is not a language model run (it is {run.task.name}): attnlab {command} needs "
                           "a gpt run")  # fmt: skip
    return note_quantized(run)


def template_of(run: Run) -> ChatTemplate:
    """The run's chat template; on stderr, a note when it has none of its own (a run trained on plain
    text knows no template: its answers show what the built-in one makes of it)."""
    if not (run.path / CHAT_TEMPLATE).is_file():
        print(f"[{run.path.name} has no chat template of its own ({CHAT_TEMPLATE}): using attnlab's built-in "
              "ChatML]", file=sys.stderr)  # fmt: skip
    return run_template(run.path)


def run_chat(opts: ChatOptions) -> int:
    run = generating_run(opts.run, opts.device, "chat", opts.quantize, opts.compile)
    dialogue = Dialogue(run.model, run.tokenizer, template_of(run), opts.system, opts.seed,
                        max_new_tokens=opts.max_new_tokens, temperature=opts.temperature, top_k=opts.top_k,
                        top_p=opts.top_p, compile=opts.compile)  # fmt: skip
    print(f"[chatting with {run.path.name}: " + "; ".join(f"{k} to {v}" for k, v in COMMANDS.items()) + "]",
          file=sys.stderr)  # fmt: skip
    talk(dialogue)
    return 0
