"""Outside programs the tests drive (kcat, faketime, promtool, node with kafkajs).

``.ci/run`` and the Makefile install them. Where one is missing a test skips saying how to
install it, except under CI (``CI`` set), where a missing tool is a failure: a suite that
skips its Kafka clients in CI would pass without trying them.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

__all__ = ["kafkajs_modules", "need"]

ROOT = Path(__file__).resolve().parents[1]


def _missing(what: str, how: str):
    msg = f"{what} is not installed ({how})"
    if os.environ.get("CI"):
        pytest.fail(f"{msg}: CI must install it (.ci/run, Makefile)")
    pytest.skip(msg)


def need(tool: str, how: str = "") -> str:
    """The path of ``tool``, or skip (fail under CI) saying how to install it."""
    path = shutil.which(tool)
    if path is None:
        _missing(tool, how or f"apt-get install {tool}")
    return path


def kafkajs_modules() -> str:
    """A node_modules folder holding kafkajs (the Makefile installs it into .venv/node)."""
    need("node", "Node.js 20")
    for base in (os.environ.get("KAFKAJS_MODULES"), ROOT / ".venv" / "node" / "node_modules",
                 "/tmp/kjs/node_modules"):
        if base and (Path(base) / "kafkajs").is_dir():
            return str(base)
    _missing("kafkajs", "make installs it: npm install --prefix .venv/node kafkajs@2.2.4")
