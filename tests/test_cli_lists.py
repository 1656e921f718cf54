"""Every list- or tuple-valued option of the generated command line takes several values, space-separated
(`--lora-targets q v`) and, where the option takes commas, comma-separated (`--lora-targets q,v`).

The real parser is walked (every command and sub-command): each argument made from a list or tuple
field (cli/generate.py tags every argument with its field) is parsed in both forms and the value
checked where it arrives, the options dataclass or the settings section; a list option added later is
tested here without a line of this file changing."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field

import pytest

from attnlab.cli.generate import MADE_FROM, Several, add_options, add_section, given, is_list, read_options
from attnlab.cli.main import build_parser
from attnlab.config import field_type, from_dict, option
from attnlab.errors import AttnlabError
from attnlab.nn.lora import LoRAConfig
from attnlab.runs.converters import lora_of
from attnlab.tasks import TASKS
from attnlab.tasks.base import TrainOptions
from attnlab.tasks.request import SECTIONS, resolve


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, parser, argument) for every argument of every (sub-)command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, (*path, name))
        else:
            yield path, parser, action


def list_arguments() -> list[tuple[tuple[str, ...], argparse.ArgumentParser, argparse.Action]]:
    found = []
    for path, parser, action in walk(build_parser()):
        made = getattr(action, MADE_FROM, None)
        if made is not None and is_list(field_type(*made)[0]):
            found.append((path, parser, action))
    return found


LISTS = list_arguments()


def test_the_walk_finds_the_list_options_we_know():
    seen = {(path, action.dest) for path, _, action in LISTS}
    known = {
        (("train", "sft"), "lora__targets"),
        (("train", "dpo"), "lora__targets"),
        (("serve",), "cors_origin"),
        (("serve",), "runs"),
        (("vectors",), "neighbors"),
        (("runs", "compare"), "runs"),
    }
    assert known <= seen
    by_hand = [
        (p, a.dest)
        for p, _, a in walk(build_parser())
        if getattr(a, MADE_FROM, None) is None
        and (a.nargs not in (None, "?", 0) or isinstance(a, argparse._AppendAction | argparse._ExtendAction))
    ]
    assert by_hand == []  # an argument written by hand that takes several values would escape this test


WORDS = {int: ["3", "5", "7"], float: ["0.5", "1.5", "2.5"], str: ["a1", "b2", "c3"]}
VALID = {(LoRAConfig, "targets"): ["q", "v"]}  # values a config's own checks take (LoRAConfig knows its targets)


def sample(action: argparse.Action, f: dataclasses.Field, element: type) -> list[str]:
    """Words of a valid value: the field's own choices, else words of its element type."""
    count = action.nargs if isinstance(action.nargs, int) else 2
    cls = getattr(action, MADE_FROM)[0]
    return [str(c) for c in f.metadata.get("choices") or VALID.get((cls, f.name)) or WORDS[element]][:count]


def rest_of(parser: argparse.ArgumentParser, skip: argparse.Action) -> list[str]:
    """Words for the parser's other required arguments (a required flag, a positional)."""
    words = []
    for a in parser._actions:
        if a is skip or isinstance(a, argparse._HelpAction):
            continue
        value = str(a.choices[0]) if a.choices else "1"
        if a.option_strings and a.required:
            words += [a.option_strings[0], value]
        elif not a.option_strings and a.nargs not in ("?", "*"):
            words += [value] * (a.nargs if isinstance(a.nargs, int) else 1)
    return words


def forms(action: argparse.Action, words: list[str]) -> dict[str, list[str]]:
    """The ways to give `words`: space-separated; repeated (a repeatable flag); comma-separated."""
    flag = action.option_strings[:1]
    if action.nargs is None:  # a repeatable flag: one value a use
        ways = {"repeated": [w for word in words for w in (*flag, word)]}
    else:
        ways = {"spaces": [*flag, *words]}
    if action.commas:
        ways["commas"] = [*flag, ", ".join(words)]
    return ways


@pytest.mark.parametrize("path,parser,action", LISTS, ids=[f"{' '.join(p)} {a.dest}" for p, _, a in LISTS])
def test_every_list_option_takes_its_values_space_and_comma_separated(path, parser, action):
    cls, f = getattr(action, MADE_FROM)
    base = field_type(cls, f)[0]
    element, into = typing.get_args(base)[0], typing.get_origin(base)
    assert isinstance(action, Several), "a list field must be generated as one (cli/generate.py's several)"
    words = sample(action, f, element)
    expected = into(element(w) for w in words)
    if action.option_strings and not isinstance(action.nargs, int):  # commas, unless the field says no
        assert action.commas == f.metadata.get("commas", True)
    for how, argv in forms(action, words).items():
        positional = [] if action.option_strings else argv
        args = build_parser().parse_args([*path, *rest_of(parser, action), *([] if positional else argv), *positional])
        value = getattr(args, action.dest)
        assert value == expected and type(value) is into, how
        if "__" in action.dest:  # a settings section: given() passes it on, the config reads it back
            section, name = action.dest.split("__")
            assert from_dict(cls, {name: given(args, section)[name]}).__dict__[name] == expected
        else:
            assert getattr(read_options(args, cls), f.name) == expected, how
    if not action.commas and action.option_strings:  # a value may hold a comma: kept whole
        argv = [action.option_strings[0], "x,y", *words[1:]]
        assert getattr(build_parser().parse_args([*path, *rest_of(parser, action), *argv]), action.dest)[0] == "x,y"


@dataclass
class Toy:
    """Lists of every kind a generated option can take: whole numbers, choices, a repeatable flag."""

    sizes: tuple[int, ...] = option((2, 4), "sizes", at_least=1)
    names: list[str] | None = option(None, "names", ("q", "k", "v"))
    seen: list[str] = field(default_factory=list, metadata={"help": "repeatable", "repeat": True})
    ratios: list[float] = option((0.5,), "ratios", nargs="*")


def toy_parser(section: bool = False) -> argparse.ArgumentParser:
    """Toy's fields as a command's options, or as a settings section's flags (default None)."""
    p = argparse.ArgumentParser(prog="toy")
    add_section(p, "toy", Toy, "toy settings") if section else add_options(p, Toy)
    return p


@pytest.mark.parametrize("section", [False, True], ids=["options", "section"])
def test_elements_are_converted_checked_and_gathered_in_the_fields_container(section, capsys):
    args = toy_parser(section).parse_args(
        ["--sizes", "3,5", "8", "--names", "q", "v", "--seen", "a,b", "--seen", "c", "--ratios", "0.25, 1"]
    )
    got = given(args, "toy") if section else vars(args)
    assert {k: got[k] for k in ("sizes", "names", "seen", "ratios")} == {
        "sizes": (3, 5, 8),
        "names": ["q", "v"],
        "seen": ["a", "b", "c"],
        "ratios": [0.25, 1.0],
    }
    if section:
        assert from_dict(Toy, {"sizes": given(args, "toy")["sizes"]}).sizes == (3, 5, 8)  # as train's sections
    else:
        assert read_options(args, Toy) == Toy((3, 5, 8), ["q", "v"], ["a", "b", "c"], [0.25, 1.0])
    assert "(several: 2 4, or 2,4)" in " ".join(toy_parser(section).format_help().split())
    for bad, says in (
        (["--sizes", "0"], "at least 1"),
        (["--names", "q,x"], "invalid choice: 'x'"),
        (["--sizes", "3,,5"], "an empty value"),
        (["--sizes", "x"], "expected a whole number"),
        (["--ratios", "nan"], "finite"),
    ):
        with pytest.raises(SystemExit):
            toy_parser(section).parse_args(bad)
        assert says in capsys.readouterr().err


@pytest.mark.parametrize("targets", [["q", "v"], ["q,v"], ["q, k", "v"], ["q,k,v,out"]])
def test_train_sft_lora_targets_reach_the_lora_config(targets, tmp_path):
    """`attnlab train sft --lora-targets q v` (and q,v): the targets reach the run's adapter section,
    through the request the command builds (nothing is trained)."""
    task = TASKS["sft"]
    args = build_parser().parse_args(
        ["train", "sft", "--out", str(tmp_path / "run"), "--lora-rank", "4", "--lora-targets", *targets]
    )
    req = resolve(task, read_options(args, TrainOptions), {name: given(args, name) for name in SECTIONS}, None)
    wanted = tuple(t.strip() for word in targets for t in word.split(","))
    assert lora_of(req.converters).targets == wanted


def test_an_unknown_lora_target_is_one_line(tmp_path):
    task = TASKS["sft"]
    args = build_parser().parse_args(
        ["train", "sft", "--out", str(tmp_path), "--lora-rank", "4", "--lora-targets", "q", "query"]
    )
    flags = {name: given(args, name) for name in SECTIONS}
    with pytest.raises(AttnlabError, match="unknown LoRA target 'query'; choose from q, k, v"):
        resolve(task, read_options(args, TrainOptions), flags, None)
