"""Files of a finished case handed on to the next writer, so that writing a large input or output reuses memory
pages the system has already given out rather than asking for new ones.

The grader's files live in /dev/shm, where a new file's pages are allocated (and zeroed) as it is written: a
new 256 MB file took 114 ms to write on a 2-core host, the same bytes into the pages of an existing file 39 ms.
On an H100 host the worker spent ~40 s of a 250 s run writing our outputs back (2026-11-27).

The parent puts the files of a judged case here (``keep``), up to a byte limit, the oldest leaving first; whoever
writes an .npy file next (the parent a case's inputs, the worker our outputs) takes one of a fitting size
(``save``). Taking is a rename, atomic: the parent's threads and the worker never hold the same file. Only
NumPy and the standard library: both processes import it.
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from typing import List, Optional, Tuple

import numpy as np

# A spare serves a write of at most this factor fewer bytes (a larger one would be cut down, its pages freed
# only to be asked for again by the next large write).
FIT = 2
MIN_BYTES = 1 << 20  # smaller files are written new and not kept: their pages cost little
_names = itertools.count()
_lock = threading.Lock()  # the parent's threads keep files at once: one eviction at a time


def _spares(folder: str) -> List[Tuple[float, int, str]]:
    """(modification time, size, path) of every spare, oldest first."""
    found = []
    try:
        with os.scandir(folder) as entries:
            for e in entries:
                try:
                    st = e.stat()
                except OSError:  # taken meanwhile
                    continue
                found.append((st.st_mtime, st.st_size, e.path))
    except OSError:
        return []
    return sorted(found)


def _take(folder: str, need: int, path: str) -> bool:
    """Rename the smallest spare of ``need`` to ``FIT * need`` bytes to ``path``; False where none fits."""
    for _, size, spare in sorted(_spares(folder), key=lambda s: s[1]):
        if need <= size <= FIT * need:
            try:
                os.rename(spare, path)
                return True
            except OSError:  # another writer took it first
                continue
    return False


def save(path: str, array: np.ndarray, folder: Optional[str]) -> None:
    """``np.save(path, array)``, into the pages of a spare from ``folder`` where one fits."""
    if folder and array.nbytes >= MIN_BYTES and _take(folder, array.nbytes, path):
        with open(path, "r+b") as f:
            np.lib.format.write_array(f, np.asanyarray(array), allow_pickle=False)
            f.truncate()
        return
    np.save(path, array)


def keep(files: List[str], folder: str, limit: int) -> None:
    """Move ``files`` (those of MIN_BYTES or more) into ``folder``, the largest first, and evict the oldest spares
    so that the folder holds at most ``limit`` bytes; files that do not fit are deleted."""
    os.makedirs(folder, exist_ok=True)
    sized = []
    for path in files:
        try:
            sized.append((os.path.getsize(path), path))
        except OSError:
            continue
    with _lock:
        held = _spares(folder)
        total = sum(s for _, s, _ in held)
        for size, path in sorted(sized, reverse=True):
            if size < MIN_BYTES or size > limit:
                _remove(path)
                continue
            while held and total + size > limit:
                _, old, oldest = held.pop(0)
                _remove(oldest)  # (taken meanwhile: it no longer counts either way)
                total -= old
            spare = os.path.join(folder, f"{os.getpid()}-{next(_names)}.npy")
            try:
                os.rename(path, spare)
                os.utime(spare)  # its age as a spare starts now
            except OSError:
                _remove(path)
                continue
            held.append((time.time(), size, spare))
            total += size


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
