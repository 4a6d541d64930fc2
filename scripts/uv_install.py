"""`uv pip install ARGS` into this interpreter's venv, looking where pip looks on this machine.

    .venv/bin/python scripts/uv_install.py -c constraints.txt -e '.[test]'

`make install` installs with uv (parallel downloads and unpacking, bytecode compiled on every core; pip
takes about twice as long here), but uv reads no pip.conf and no PIP_* variable. This reads pip's own
merged configuration (`pip config list`: its files, then PIP_* variables, which win) and turns the package
locations and constraints into uv's flags: index-url, extra-index-url, find-links (each may hold several,
space-separated), constraint and no-index. A pip `cert` becomes --native-tls (uv then trusts the system's
certificates, as pip was told to). --index-strategy unsafe-best-match picks each version across every
index, as pip does. The exit code is uv's own.

Standard library only: it runs with the fresh venv's python, before anything is installed.
"""

from __future__ import annotations

import shlex
import subprocess
import sys

FLAGS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def pip_config() -> dict[str, str]:
    """pip's configured options, by name, as pip ranks them: an environment variable (`:env:`) over a file's
    `[install]` section over its `[global]` one."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    by_section: dict[str, dict[str, str]] = {"global": {}, "install": {}, ":env:": {}}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if sep and section in by_section:
            by_section[section][name] = value.strip().strip("'\"")
    return {**by_section["global"], **by_section["install"], **by_section[":env:"]}


def uv_flags(config: dict[str, str]) -> list[str]:
    flags: list[str] = []
    for name, flag in FLAGS.items():
        for value in config.get(name, "").split():
            flags += [flag, value]
    if config.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        flags.append("--no-index")  # pip may not reach an index here: neither may uv
    if config.get("cert"):
        flags.append("--native-tls")
    return flags


def main(args: list[str]) -> int:
    uv = [sys.executable, "-m", "uv", "pip", "install", "--quiet", "--python", sys.executable, "--compile-bytecode"]
    command = [*uv, "--index-strategy", "unsafe-best-match", *uv_flags(pip_config()), *args]
    print(shlex.join(["uv", *command[3:]]), flush=True)
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
