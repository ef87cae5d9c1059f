"""The one exception type for mistakes a user can fix: the CLI prints it as one line, exit 2."""


class NmtError(Exception):
    """A user-facing error: bad config, bad data file, bad checkpoint. Never a bug."""


def not_utf8(name: object, line: int, raw: bytes, start: int) -> NmtError:
    """The one line for undecodable text, shared by configs and data files. `raw`: the line's
    bytes (or more, from the line's start); `start`: the bad byte in it."""
    return NmtError(
        f"{name}: line {line} is not valid UTF-8 (byte 0x{raw[start]:02x} at column {start + 1})"
    )


def not_utf8_in(name: object, data: bytes, exc: UnicodeDecodeError) -> NmtError:
    """`not_utf8` for a whole file's `data` that failed to decode with `exc`."""
    line_start = data.rfind(b"\n", 0, exc.start) + 1
    line = data.count(b"\n", 0, exc.start) + 1
    return not_utf8(name, line, data[line_start:], exc.start - line_start)
