"""The standard CMUdict train and test lists (``task.split=standard`` of ``g2p``), read from the package.

The lists are microsoft/CNTK's ``Examples/SequenceToSequence/CMUDict/Data/cmudict-0.7b.train`` and
``cmudict-0.7b.test`` (CMUdict 0.7b, stress removed, one ``WORD  PH ON ES`` line per pronunciation, a
word with several pronunciations on several lines, CRLF line endings), committed gzip-compressed
(``gzip -n -9``) under ``harness/tasks/data/cmudict_standard/`` with their source, licence and
checksums (its README.md). :data:`LISTS` holds the SHA-256 of each original (uncompressed) file, and
:func:`read_list` refuses a file whose content does not match it, so the words scored are the ones
published figures use (Yao & Zweig 2015 §5 report 106,837 / 12,000 words; these files hold
106,794 / 11,994: docs/tasks.md, "The standard split").
"""
from __future__ import annotations

import gzip
import hashlib
from importlib import resources

#: list name -> (file under ``data/cmudict_standard/``, SHA-256 of the uncompressed file, its lines, its words).
LISTS: dict[str, tuple[str, str, int, int]] = {
    "train": ("cmudict-0.7b.train.gz", "58cba5cd56d28bcb529c85e752123b00c1f748f8163eacbe368ab844d7f8d6a6",
              114399, 106794),
    "test": ("cmudict-0.7b.test.gz", "f216624c0432a201179d22a6ef9fb7ebd25ff65342ac2a0214a0752c6b6d3550",
             12855, 11994),
}


def list_bytes(name: str) -> bytes:
    """The uncompressed bytes of list ``name`` (``train`` or ``test``), as the CNTK repository holds them.

    Raises:
        RuntimeError: the packaged file is missing or its SHA-256 is not :data:`LISTS`'s (a damaged install).
    """
    file, digest = LISTS[name][:2]
    path = resources.files(__package__).joinpath("data", "cmudict_standard", file)
    try:
        raw = gzip.decompress(path.read_bytes())
    except (OSError, EOFError) as e:
        raise RuntimeError(f"the standard CMUdict {name} list {file} cannot be read from the installed package: "
                           f"{e}") from e
    if hashlib.sha256(raw).hexdigest() != digest:
        raise RuntimeError(f"the standard CMUdict {name} list {file} has SHA-256 {hashlib.sha256(raw).hexdigest()}, "
                           f"expected {digest}: the packaged file is damaged")
    return raw


def read_list(name: str) -> dict[str, list[tuple[str, ...]]]:
    """List ``name`` as word -> its pronunciations in file order (phoneme tuples, stress-free ARPAbet),
    words as written in the file (upper case; apostrophes kept), in file order.

    Raises:
        RuntimeError: see :func:`list_bytes`; a line that is not ``WORD  PHONES``.
    """
    out: dict[str, list[tuple[str, ...]]] = {}
    for line in list_bytes(name).decode("ascii").splitlines():
        word, sep, phones = line.partition("  ")
        if not sep or not word or not phones.split():
            raise RuntimeError(f"the standard CMUdict {name} list has a line that is not 'WORD  PHONES': {line!r}")
        out.setdefault(word, []).append(tuple(phones.split()))
    return out
