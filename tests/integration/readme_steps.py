"""The runnable steps of README.md, in the order a reader meets them (for test_readme.py).

A *section* is a ``## `` heading. Its steps are:

- ``shell``: each line of an indented (4-space) block or a ```` ``` ```` block that is not
  ``python``, with its trailing ``# comment`` kept apart (the comment says what to expect);
- ``transcript``: an indented block starting with ``$ nc HOST PORT`` (the lines after it
  alternate commands and the answers the README prints);
- ``python``: a ```` ```python ```` block;
- ``shell`` too: an inline ```kill -9 $(cat data/NODE/mesh.lock)``` in the prose (the
  failover demo is told in a sentence, not a block).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Step", "Section", "sections", "split_comment"]

_INLINE_KILL = re.compile(r"`(kill -9 \$\(cat data/\w+/mesh\.lock\))`")


@dataclass
class Step:
    kind: str            # shell | transcript | python
    text: str            # the command line (comment removed), transcript or snippet
    comment: str = ""    # a shell line's trailing comment
    pos: int = 0         # character offset in the README (the order)


@dataclass
class Section:
    title: str
    steps: list[Step] = field(default_factory=list)


def split_comment(line: str) -> tuple[str, str]:
    """``cmd   # comment`` -> (cmd, comment); a ``#`` inside quotes is part of the command."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] == " "):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def _blocks(body: str, base: int):
    """(kind, text, pos) of every code block of a section body, and its inline kills."""
    lines = body.splitlines(keepends=True)
    pos = base
    i = 0
    prev_blank = True
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            lang = line[3:].strip()
            start = pos
            j = i + 1
            chunk = []
            while j < len(lines) and not lines[j].startswith("```"):
                chunk.append(lines[j])
                j += 1
            yield ("python" if lang == "python" else "shell-block"), "".join(chunk), start
            pos += sum(len(x) for x in lines[i:j + 1])
            i = j + 1
            prev_blank = False
            continue
        if prev_blank and line.startswith("    ") and line.strip():
            start = pos
            j = i
            chunk = []
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                if not lines[j].strip() and (j + 1 >= len(lines) or not lines[j + 1].startswith("    ")):
                    break
                chunk.append(lines[j][4:] if lines[j].strip() else "\n")
                j += 1
            yield "shell-block", "".join(chunk), start
            pos += sum(len(x) for x in lines[i:j])
            i = j
            prev_blank = False
            continue
        for m in _INLINE_KILL.finditer(line):
            yield "inline", m.group(1), pos + m.start()
        prev_blank = not line.strip()
        pos += len(line)
        i += 1


def _shell_steps(text: str, pos: int) -> list[Step]:
    blocks: list[list[str]] = [[]]
    for line in text.splitlines():          # a blank line inside a block starts another
        if line.strip():
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    steps = []
    for k, block in enumerate(b for b in blocks if b):
        if block[0].startswith("$ nc "):
            steps.append(Step("transcript", "\n".join(block), pos=pos + k))
            continue
        for line in block:
            cmd, comment = split_comment(line.strip())
            if not cmd:
                if steps and steps[-1].kind == "shell":      # a comment continued on the next line
                    steps[-1].comment += " " + comment
                continue
            steps.append(Step("shell", cmd, comment, pos + k))
    return steps


def sections(readme: str) -> list[Section]:
    out: list[Section] = []
    heads = [(m.start(), m.group(1).strip()) for m in re.finditer(r"^## (.+)$", readme, re.M)]
    for n, (start, title) in enumerate(heads):
        end = heads[n + 1][0] if n + 1 < len(heads) else len(readme)
        sec = Section(title)
        for kind, text, pos in _blocks(readme[start:end], start):
            if kind == "python":
                sec.steps.append(Step("python", text, pos=pos))
            elif kind == "inline":
                sec.steps.append(Step("shell", text, pos=pos))
            else:
                sec.steps.extend(_shell_steps(text, pos))
        sec.steps.sort(key=lambda s: s.pos)
        out.append(sec)
    return out
