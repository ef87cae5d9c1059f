"""The one exception type for mistakes a user can fix: the CLI prints it as one line, exit 2."""


class NmtError(Exception):
    """A user-facing error: bad config, bad data file, bad checkpoint. Never a bug."""
