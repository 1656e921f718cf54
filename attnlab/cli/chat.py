"""`attnlab chat RUN` (a conversation in the terminal) and what `attnlab sample RUN --chat` shares with
it: a run that generates, and its chat template.

The chat keeps the answer as much room in the context as the run's answers need: the longest answer
of a bounded sample of its training data (a fine-tuned run records which data it learned from), or
--reserve N; older turns are dropped when a prompt leaves less. In a terminal, input() gets GNU
readline's line editing and history (~/.attnlab_history) and takes a paste of several lines as one
message. A message of several lines is one history entry, newlines kept: Up brings it back whole,
drawn on as many lines, and Enter sends it as it was (macOS's libedit is not covered).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from attnlab.cli.options import ChatOptions
from attnlab.cli.quantize import note_quantized
from attnlab.data.chat import ChatTemplate
from attnlab.data.conversations import Conversation, Preference, conversation, kind_of, preference, rows
from attnlab.data.finetune import BUILTIN
from attnlab.decoding.dialogue import BLOCK, COMMANDS, Dialogue, answer_tokens, next_message, talk
from attnlab.decoding.drafts import use_draft
from attnlab.decoding.settings import compiling
from attnlab.errors import AttnlabError
from attnlab.runs.adapted import CHAT_TEMPLATE, run_template
from attnlab.runs.folder import check_run_dir, read_run_config
from attnlab.runs.kind import kind_of as run_kind
from attnlab.runs.run import Run, load

SAMPLE = 2000  # training rows read to measure a run's answers: each built-in kind ~200 times, a file's first ones
HISTORY = "~/.attnlab_history"  # the chat's input history; ATTNLAB_HISTORY names another file ("" keeps none)
HISTORY_LENGTH = 1000
FINE_TUNED = ("sft", "dpo")  # the tasks whose data holds the answers a run learned to give


def generating_run(path: str, device: str, command: str, quantize: str | None = None, compiled: bool = False) -> Run:
    """The run at `path`, which must be a language model (one line naming its kind otherwise); its
    weights quantized for decoding when asked (the note on stderr)."""
    if quantize is not None and not run_kind(read_run_config(check_run_dir(path))).generates:
        raise AttnlabError(f"{path} is not a language model run: --quantize is for decoding")
    run = load(path, device=device, quantize=quantize, compiled=compiling(compiled))
    if not run.task.generates:
        raise AttnlabError(
            f"{path} is not a language model run (it is {run.task.name}): attnlab {command} needs a gpt run"
        )
    return note_quantized(run)


def with_draft(run: Run, draft: str | None, speculate: str, compiled: bool = False, command: str = "sample") -> Run:
    """The run with its draft model (--draft RUN) paired for speculative decoding (decoding/speculate.py)."""
    if draft is None:
        if speculate == "draft":
            raise AttnlabError("--speculate draft needs a draft model: give --draft RUN (or --speculate prompt)")
        return run
    if speculate not in ("draft", "auto"):
        raise AttnlabError("--draft is read by --speculate draft or auto: give one of them")
    drafter = generating_run(draft, str(run.device), f"{command} --draft")
    use_draft(run.model, drafter.model, compiled=compiling(compiled), tokenizers=(run.tokenizer, drafter.tokenizer))
    return run


def template_of(run: Run) -> ChatTemplate:
    """The run's chat template; on stderr, a note when it has none of its own (a run trained on plain
    text knows no template: its answers show what the built-in one makes of it)."""
    if not (run.path / CHAT_TEMPLATE).is_file():
        print(
            f"[{run.path.name} has no chat template of its own ({CHAT_TEMPLATE}): using attnlab's built-in ChatML]",
            file=sys.stderr,
        )
    return run_template(run.path)


def answers_of(row: Conversation | Preference) -> list[str]:
    """The assistant's turns of a training row (both answers of a preference pair); none of a plain text."""
    messages = (*row.chosen, *row.rejected) if isinstance(row, Preference) else () if row.plain else row.messages
    return [m.content for m in messages if m.role == "assistant"]


def trained_answers(config: dict[str, Any]) -> tuple[list[str], str] | None:
    """The answers a fine-tuned run learned to give, at most SAMPLE rows of its training data, and where
    they come from; None for a run that names no such data (pretrained, converted, merged)."""
    data, task = (value if isinstance(value, dict) else {} for value in (config.get("data"), config.get("task")))
    source, examples = data.get("data"), data.get("examples")
    if task.get("kind") not in FINE_TUNED or not isinstance(source, str):
        return None
    if source in BUILTIN:  # generated again as training made them: the same seed, the same first rows
        n = examples if isinstance(examples, int) and 0 < examples < SAMPLE else SAMPLE
        return [a for row in BUILTIN[source]("train", n, 0) for a in answers_of(row)], f"the built-in {source}"
    found = []
    for _, raw in islice(rows(source), SAMPLE):
        with contextlib.suppress(ValueError, TypeError, AttnlabError):  # a row training left out too
            found += answers_of(preference(raw) if kind_of(raw) == "preference" else conversation(raw))
    return found, f"the first {SAMPLE:,} rows of {source}"


def answer_room(run: Run, template: ChatTemplate, opts: ChatOptions) -> tuple[int | None, str]:
    """The tokens a prompt leaves the answer (None: the dialogue's default) and what they follow, said
    to the user: --reserve, or the longest trained answer (at most --max-new-tokens and half the context)."""
    if opts.reserve is not None:
        return opts.reserve, f"{opts.reserve} tokens kept for each answer (--reserve)"
    default = min(opts.max_new_tokens, run.model.cfg.context // 2)
    try:
        found = trained_answers(run.config)
    except (AttnlabError, OSError) as e:  # the data is on another machine, or gone
        return None, f"{default} tokens kept for each answer (the training data is not readable here: {e})"
    if not found or not found[0]:
        return None, f"{default} tokens kept for each answer (min(--max-new-tokens, half the context))"
    answers, where = found
    longest = answer_tokens(run.tokenizer, template, answers)
    room = min(longest, opts.max_new_tokens, run.model.cfg.context // 2)
    return room, f"{room} tokens kept for each answer (the longest answer in {where}: {longest} tokens)"


def history_file() -> Path | None:
    """The history file, created readable by its owner alone, or None (none asked for, or not usable: a
    link or another user's file in its place is not written through; said on stderr)."""
    name = os.environ.get("ATTNLAB_HISTORY", HISTORY)
    if not name:
        return None
    path = Path(name).expanduser()
    try:  # O_NOFOLLOW: a link planted where the file goes is refused, not followed
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o600))
        if hasattr(os, "getuid") and path.stat().st_uid != os.getuid():
            raise OSError(f"{path} belongs to another user")
    except OSError as e:
        print(f"[no input history kept: {e}]", file=sys.stderr)
        return None
    return path


def history_entry(text: str) -> str:
    """A message as its history entry: the text itself, newlines kept, which input() hands back whole
    when it is recalled and sent again; between \"\"\" when next_message would read that otherwise (a
    text that opens with \"\"\" or ends with a backslash would wait for more lines)."""
    lines = iter([text])
    with contextlib.suppress(StopIteration):
        if next_message(lambda prompt: next(lines)) == text:
            return text
    return f"{BLOCK}{text}{BLOCK}"


# The history file: an entry a line, as readline writes it; an entry of several lines as one JSON string
# ("first\nsecond"), where readline's own file would split it into an entry a line (so is one that
# starts with a quote, which would otherwise be read as such a string).
def _entry(line: str) -> str:
    if line.startswith('"'):
        with contextlib.suppress(ValueError):  # not JSON: a line as readline (or an older attnlab) wrote it
            value = json.loads(line)
            if isinstance(value, str):
                return value
    return line


def read_history(readline: Any, path: Path) -> None:
    """The file's entries into readline's history, oldest first."""
    for line in path.read_text(encoding="utf-8", errors="surrogateescape").split("\n"):
        if line:
            readline.add_history(_entry(line))


def write_history(readline: Any, path: Path) -> None:
    """The last HISTORY_LENGTH entries into the file history_file() made (a link there is refused)."""
    n = readline.get_current_history_length()
    entries = [readline.get_history_item(i) for i in range(max(1, n - HISTORY_LENGTH + 1), n + 1)]
    lines = [json.dumps(e, ensure_ascii=False) if "\n" in e or e.startswith('"') else e for e in entries if e]
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0))
    with open(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write("".join(line + "\n" for line in lines))


@contextlib.contextmanager
def terminal() -> Iterator[Callable[[str], None] | None]:
    """While the chat reads a terminal: readline behind input() (line editing, history kept in
    history_file()), GNU readline's bracketed paste on, so that a paste of several lines is one message;
    without readline, the terminal's own paste markers, which talk() joins. Nothing when stdin is not a
    terminal. Yields what records a message in the history (talk()'s `remember`), or None."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        yield None
        return
    try:
        import readline  # optional: not every Python has it (Windows)
    except ImportError:
        readline = None
    if readline is None:
        print("\x1b[?2004h", end="", flush=True)  # the terminal marks pastes: PASTE_START ... PASTE_END
        try:
            yield None
        finally:
            print("\x1b[?2004l", end="", flush=True)
        return
    if "GNU readline" in (readline.__doc__ or ""):  # (macOS's libedit has none: a paste comes line by line)
        readline.parse_and_bind("set enable-bracketed-paste on")  # CPython turns it off; a paste is then one line
    path = history_file()
    if path is not None:
        with contextlib.suppress(OSError):
            read_history(readline, path)
    # input() would add each line it reads; a message of several lines (\"\"\" block, backslash) would be
    # as many entries, and Up would bring back its last line alone. talk() adds each message instead.
    readline.set_auto_history(False)
    try:
        yield lambda text: readline.add_history(history_entry(text))
    finally:
        readline.set_auto_history(True)
        if path is not None:
            with contextlib.suppress(OSError):
                write_history(readline, path)


def run_chat(opts: ChatOptions) -> int:
    run = generating_run(opts.run, opts.device, "chat", opts.quantize, opts.compile)
    with_draft(run, opts.draft, opts.speculate, opts.compile, "chat")
    template = template_of(run)
    reserve, said = answer_room(run, template, opts)
    dialogue = Dialogue(
        run.model,
        run.tokenizer,
        template,
        opts.system,
        opts.seed,
        reserve,
        max_new_tokens=opts.max_new_tokens,
        temperature=opts.temperature,
        top_k=opts.top_k,
        top_p=opts.top_p,
        compile=compiling(opts.compile),
        speculate=opts.speculate,
        draft_tokens=opts.draft_tokens,
    )
    print(
        f"[chatting with {run.path.name}, context {run.model.cfg.context} tokens, {said}]\n["
        + "; ".join(f"{k} to {v}" for k, v in COMMANDS.items())
        + f"; {BLOCK} opens and closes a message of several lines]",
        file=sys.stderr,
    )
    try:
        with terminal() as remember:
            talk(dialogue, remember=remember)
    except KeyboardInterrupt:  # a Ctrl-C that lands while the chat is leaving (history written): it leaves
        print(file=sys.stderr)
    return 0
