"""User-facing errors.

An `AttnlabError` is a mistake a user can fix (bad path, unknown preset, ...). The command
line prints its message on one line and exits with status 2, without a traceback.
"""


class AttnlabError(Exception):
    """A problem with the user's input, reported as one line by the CLI (exit code 2)."""
