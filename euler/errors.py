"""The one exception type the CLI turns into a one-line message (no traceback)."""


class EulerError(Exception):
    """A user-facing error: bad input, a bad file, a bad flag. The message names the culprit."""
