"""Just enough Dockerfile reading to check what an image installs: instructions with their build
stage, and the targets of every ``pip install`` in a ``RUN``."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

# pip install options that take a value (as a separate word); their values are not install targets.
PIP_VALUE_OPTIONS = {
    "-c", "--constraint", "-i", "--index-url", "--extra-index-url", "-f", "--find-links",
    "-t", "--target", "--prefix", "--root", "--platform", "--python-version", "--implementation",
    "--abi", "--upgrade-strategy", "--progress-bar", "--root-user-action", "--cache-dir", "--log",
    "--python", "--src", "--trusted-host", "--timeout", "--retries",
}  # fmt: skip
# Targets no test can check: a requirements file or an editable source tree.
PIP_UNCHECKABLE_OPTIONS = {"-r", "--requirement", "-e", "--editable"}
SEPARATORS = {"&&", "||", ";", "|", "&"}
PINNED = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==\S+$")


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, USER, ENTRYPOINT ...
    arguments: str
    stage: int  # 0 for the first FROM's stage


def parse(text: str) -> list[Instruction]:
    """The instructions of a Dockerfile, continuation lines joined and comments dropped."""
    instructions, pending, stage = [], "", -1
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, arguments = pending.strip().partition(" ")
        pending = ""
        keyword = keyword.upper()
        stage += keyword == "FROM"
        instructions.append(Instruction(keyword, arguments.strip(), stage))
    return instructions


def exec_form(arguments: str) -> list[str] | None:
    """The JSON array of an exec-form ENTRYPOINT/CMD/RUN, or None for the shell form."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def pip_install_targets(instruction: Instruction) -> list[str]:
    """Every ``pip install`` target of a RUN: wheel paths, requirement strings, directories.

    Raises ValueError for a target this module cannot check (``-r`` file, ``-e`` tree).
    """
    words = exec_form(instruction.arguments)
    if words is None:
        lexer = shlex.shlex(instruction.arguments, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    targets, i = [], 0
    while i < len(words):
        if words[i] == "install" and i > 0 and words[i - 1].rsplit("/", 1)[-1] in ("pip", "pip3"):
            i += 1
            while i < len(words) and words[i] not in SEPARATORS:
                word = words[i]
                if word in PIP_UNCHECKABLE_OPTIONS:
                    value = words[i + 1] if i + 1 < len(words) else ""
                    raise ValueError(f"pip install {word} {value}: install built wheels instead")
                if word in PIP_VALUE_OPTIONS:
                    i += 1
                elif not word.startswith("-"):
                    targets.append(word)
                i += 1
        i += 1
    return targets
