"""Reading a worker's log: its size, its text from an offset, and the compilers' error lines in it (the parent
reports them; the worker's compile pass reads its own log the same way)."""
from __future__ import annotations

import os
import re
from typing import List, Optional

LOG_TAIL = 4000  # characters of a failing reference's compiler output kept in the JSON

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ERROR_LINE = re.compile(r"\berror\b:? *(.*)")


def without_colors(text: str) -> str:
    return _ANSI.sub("", text)


def log_size(path: Optional[str]) -> int:
    """Bytes in the log file ``path`` (0 where there is none)."""
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


def read_log(path: Optional[str], offset: int = 0) -> str:
    """The log file ``path`` from byte ``offset`` on ("" where there is none)."""
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def error_lines(log: str) -> List[str]:
    """What follows ``error`` on each line of a compiler's (or CUDA's) output, colors removed, 160 characters
    at most."""
    return [without_colors(e).strip()[:160] for e in _ERROR_LINE.findall(log)]


def compile_reason(log: str) -> Optional[str]:
    """"compile failed: <the compiler's first error line>", or None when the log holds no error line."""
    first = error_lines(log)
    return f"compile failed: {first[0]}"[:160] if first else None


def compile_error(reason: str, log: Optional[str]) -> str:
    """A failed compile's one-line reason: the compiler's first error line rather than jittor's "Run cmd
    failed: <the whole command>"."""
    if not log or reason.startswith("compile failed") or not any(m in reason for m in ("Check failed", "Compile",
                                                                                       "compil")):
        return reason
    return compile_reason(log) or reason
