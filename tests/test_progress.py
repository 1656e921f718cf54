"""Progress where nobody watches (attnlab/progress.py): written to a file or a pipe (a log, CI), a bar
is a few plain lines with the count, the rate and the time left, never carriage-return redraws; on a
terminal it stays a bar."""

from __future__ import annotations

import io
import re

import pytest

import attnlab
from attnlab import progress
from attnlab.progress import tqdm
from tests.conftest import tiny_data, tiny_model, tiny_train

pytestmark = pytest.mark.usefixtures("one_thread")

LINE = re.compile(r"^training: (\d+)/40 step \(\d+%\) \| \d\d:\d\d elapsed(, [\d,.]+ (step/s|s/step))?")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_training_logged_to_a_file_writes_a_few_plain_lines_with_its_steps(tmp_path, corpus, capsys):
    cfg = tiny_train(max_steps=40, eval_interval=40, batch_size=2)
    attnlab.train(tmp_path / "run", tiny_model(n_layer=1, d_model=16), cfg, tiny_data(corpus), progress=True)
    err = capsys.readouterr().err  # pytest's capture: a stream that is not a terminal
    assert "\r" not in err and "\x1b[" not in err
    lines = [line for line in err.splitlines() if line.startswith("training")]
    assert all(LINE.match(line) and progress.LINE.match(line) for line in lines), lines
    steps = [int(LINE.match(line)[1]) for line in lines]
    assert steps == sorted(set(steps)) and steps[-1] == 40  # counts that only go up, and where it ended
    assert len(lines) <= 11  # a tenth at a time (and one each EVERY seconds): tqdm redraws its bar at each of 40
    assert "loss=" in lines[-1]  # the postfix rides along


def test_lines_come_each_tenth_or_each_interval_and_once_at_the_end(monkeypatch):
    log = io.StringIO()
    bar = tqdm(total=100, desc="x", unit="step", file=log, mininterval=0)
    for _ in range(100):
        bar.update(1)
    bar.close()
    lines = log.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == [f"{n}/100" for n in range(10, 101, 10)]  # no repeat at close
    assert "left" in lines[0] and "left" not in lines[-1]
    # no total: a line each EVERY seconds, and the count at the end
    monkeypatch.setattr(progress, "EVERY", 3600.0)
    log = io.StringIO()
    for _ in tqdm((i for i in range(50)), desc="reading", unit=" rows", file=log, mininterval=0):
        pass
    assert log.getvalue().splitlines() == [log.getvalue().splitlines()[0]] and "reading: 50  rows" in log.getvalue()


def test_a_passing_bar_ends_on_one_line_in_a_log():
    """leave=False: a terminal wipes the bar; a log keeps one line, the record that the phase ran."""
    log = io.StringIO()
    for _ in tqdm(range(50), desc="encoding", leave=False, file=log):
        pass
    assert log.getvalue().startswith("encoding: 50/50 it (100%) | ") and log.getvalue().count("\n") == 1


def test_a_count_of_bytes_reads_as_the_bar_shows_it():
    log = io.StringIO()
    with tqdm(total=68140, desc="reading the corpus", unit="B", unit_scale=True, file=log) as bar:
        bar.update(68140)
    assert log.getvalue().startswith("reading the corpus: 68.1k/68.1k B (100%) | ")
    assert progress.LINE.match(log.getvalue()) and not progress.LINE.match("attnlab: error: 3/4 | 00:00 elapsed")


def test_a_terminal_keeps_the_redrawn_bar():
    screen = Terminal()
    for _ in tqdm(range(5), desc="training", file=screen, mininterval=0):
        pass
    assert "\r" in screen.getvalue() and "|" in screen.getvalue()
