"""Every fenced code block of README.md and docs/**/*.md, checked, so that none goes stale; and every relative
link between those files resolves.

What a block is checked for depends on its info string:

- `yaml`: a Railyard config. A whole one (every required section) is validated as `railyard validate` does
  (`load_config`); a fragment (some sections) is merged into the embedded default, include/config/railyard.yaml
  (lists of named items by their name or id), and the result validated.
- `yaml-sizing`: a `railyard size --input` file, validated by the sizing input's own models.
- `yaml-helm`, `yaml-other`: not Railyard's; parsed with yaml.safe_load.
- `sh`, `console` (only its `$ ` lines): every `railyard ...` command parses with the CLI's own argparse
  parser, every `make` target exists in the Makefile, an `AIRFLOW_CONN_*` JSON value parses; `sh` also passes
  `bash -n`. The cheap read-only commands (validate, schema, plan, drift, ...) are run, on a simulator of
  the test's own where they read the fleet, and must exit 0.
- `bash`: a script; `bash -n`.
- `python`: compiled; the DAG file (`railyard_dags(...)`) is run on the demo config and must build DAGs.
- `dockerfile`: every instruction is one Docker knows, and the first is FROM.
- `text`: sample output, not checked. Any other info string, or none, fails.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from railyard.cli import build_parser
from railyard.devstack.stack import free_port
from railyard.domain.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
DEFAULT_CONFIG = ROOT / "include" / "config" / "railyard.yaml"
RAILYARD = Path(sys.executable).parent / "railyard"

NOT_CHECKED = {"text"}  # sample output: what a command printed, nothing to run
CHECKED = {"yaml", "yaml-sizing", "yaml-helm", "yaml-other", "sh", "console", "bash", "python", "dockerfile"}
REQUIRED_SECTIONS = {"components", "releases", "domains", "trains", "buffers"}
NAMED_LISTS = {"components": "name", "releases": "id", "domains": "name", "trains": "id", "job_stacks": "name"}
# Subcommands cheap and side-effect free enough to run: they read the config, the ledger (a fresh one in the
# test's home) or the fleet (a simulator of the test's own). Lines with placeholders or output files are only
# parsed.
RUNNABLE = {"validate", "schema", "plan", "drift", "ops", "size", "host", ("release", "list"), ("freeze", "status")}
READS_FLEET = {"plan", "drift", "host", "release"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*$|\.\.\.")
DOCKER_INSTRUCTIONS = {"FROM", "RUN", "COPY", "ADD", "ENV", "ARG", "USER", "WORKDIR", "LABEL", "EXPOSE", "CMD",
                       "ENTRYPOINT", "VOLUME", "SHELL", "HEALTHCHECK", "ONBUILD", "STOPSIGNAL"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    info: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


def blocks_of(path: Path) -> list[Block]:
    """The fenced blocks of one Markdown file, dedented by their fence's indent (blocks in list items)."""
    out: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"].strip()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            close = lines[j].strip()
            if close.startswith(fence[0] * len(fence)) and set(close) == {fence[0]}:
                break
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        else:
            pytest.fail(f"{path.relative_to(ROOT)}:{i + 1}: a code block that is never closed")
        out.append(Block(path, i + 1, info.split()[0] if info else "", "\n".join(body) + "\n"))
        i = j + 1
    return out


BLOCKS = [b for p in DOCS for b in blocks_of(p)]


def of_kind(*kinds: str) -> list[Block]:
    return [b for b in BLOCKS if b.info in kinds]


def ids(blocks: list[Block]) -> list[str]:
    return [b.where for b in blocks]


# ---- info strings -----------------------------------------------------------------------------------------------
def test_there_are_blocks_of_every_checked_kind() -> None:
    assert len(BLOCKS) >= 20, [b.where for b in BLOCKS]
    for kind in ("yaml", "sh", "console", "python", "text", "yaml-sizing", "yaml-helm", "bash", "dockerfile"):
        assert of_kind(kind), f"no ```{kind} block left: is this test still reading the docs?"


def test_every_block_says_what_it_is() -> None:
    unknown = [f"{b.where}: ```{b.info}" for b in BLOCKS if b.info not in CHECKED | NOT_CHECKED]
    assert not unknown, ("blocks whose info string this test does not check (give them one it does, or `text` "
                         f"for sample output): {unknown}")


def test_the_readme_starts_with_make_demo_and_make_test() -> None:
    """CI and users take the README's first two commands to be these."""
    first = next(b for b in BLOCKS if b.path.name == "README.md")
    assert first.info == "sh"
    assert [ln.split("#")[0].strip() for ln in first.text.splitlines()] == ["make demo", "make test"]


# ---- YAML -------------------------------------------------------------------------------------------------------
def merge(base: Any, part: Any, *, top: bool = False) -> Any:
    """`part` laid over `base`: mappings merged key by key; at the top level, lists of named items (components,
    releases, domains, trains, job stacks) merged item by item on their name or id; anything else replaced."""
    if isinstance(base, dict) and isinstance(part, dict):
        out = dict(base)
        for key, value in part.items():
            if key not in base:
                out[key] = value
            elif top and key in NAMED_LISTS and isinstance(base[key], list) and isinstance(value, list):
                out[key] = merge_named(base[key], value, NAMED_LISTS[key])
            else:
                out[key] = merge(base[key], value)
        return out
    return part


def merge_named(base: list[Any], part: list[Any], key: str) -> list[Any]:
    out = list(base)
    at = {item.get(key): i for i, item in enumerate(out) if isinstance(item, dict)}
    for item in part:
        i = at.get(item.get(key)) if isinstance(item, dict) else None
        if i is None:
            out.append(item)
        else:
            out[i] = merge(out[i], item)
    return out


@pytest.mark.parametrize("block", of_kind("yaml"), ids=ids(of_kind("yaml")))
def test_yaml_configs_validate(block: Block, tmp_path: Path) -> None:
    data = yaml.safe_load(block.text)
    assert isinstance(data, dict), f"{block.where}: a ```yaml block is a Railyard config (or part of one)"
    config = tmp_path / "railyard.yaml"
    if REQUIRED_SECTIONS <= data.keys():
        config.write_text(block.text)  # a whole config: exactly what `railyard validate` reads
    else:
        merged = merge(yaml.safe_load(DEFAULT_CONFIG.read_text()), data, top=True)
        config.write_text(yaml.safe_dump(merged, sort_keys=False))
    try:
        load_config(config)
    except ConfigError as exc:
        pytest.fail(f"{block.where}: the config does not validate:\n{exc}")


@pytest.mark.parametrize("block", of_kind("yaml-sizing"), ids=ids(of_kind("yaml-sizing")))
def test_sizing_inputs_validate(block: Block) -> None:
    from railyard.tools.sizing import SizingError, parse_input

    try:
        parse_input(yaml.safe_load(block.text), block.where)
    except SizingError as exc:
        pytest.fail(f"{block.where}: the sizing input does not validate: {exc}")


@pytest.mark.parametrize("block", of_kind("yaml-helm", "yaml-other"), ids=ids(of_kind("yaml-helm", "yaml-other")))
def test_other_yaml_parses(block: Block) -> None:
    assert isinstance(yaml.safe_load(block.text), dict | list), block.where


# ---- shell --------------------------------------------------------------------------------------------------------
def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {t for line in re.findall(r"^([A-Za-z0-9_.\- ]+):(?!=)", text, re.M) for t in line.split()}


def command_lines(block: Block) -> list[str]:
    """The commands of a block: every line of `sh` (continuations joined), the `$ ` lines of `console`."""
    raw = block.text.replace("\\\n", " ").splitlines()
    if block.info == "console":
        return [ln[2:] for ln in raw if ln.startswith("$ ")]
    return [ln for ln in raw if ln.strip() and not ln.lstrip().startswith("#")]


def commands(line: str) -> list[list[str]]:
    """One line's simple commands: argv lists, split at `&&`, `||`, `;` and `|`, without leading VAR=value
    assignments and without redirections (`> FILE`)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    out: list[list[str]] = [[]]
    redirect = False
    for token in lex:
        if token in {"&&", "||", ";", "|", "&"}:
            out.append([])
            redirect = False
        elif token in {">", ">>", "<", "2>"}:
            redirect = True  # this token and what follows, up to the next command, are not arguments
        elif not redirect:
            out[-1].append(token)
    cmds = []
    for argv in out:
        while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
            argv = argv[1:]
        if argv:
            cmds.append(argv)
    return cmds


def assignments(line: str) -> dict[str, str]:
    """`export NAME=value` / `NAME=value` words of a line."""
    out = {}
    for word in shlex.split(line, comments=True):
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", word, re.S)
        if m:
            out[m[1]] = m[2]
    return out


SHELL_BLOCKS = of_kind("sh", "console")


def railyard_lines(block: Block) -> list[tuple[str, list[str]]]:
    """(the line, argv after `railyard`) for every `railyard` command of a shell block."""
    return [(line, argv[1:]) for line in command_lines(block) for argv in commands(line)
            if Path(argv[0]).name == "railyard"]


def subcommand(argv: list[str]) -> str | tuple[str, str]:
    if argv[0] in ("release", "freeze") and len(argv) > 1:
        return argv[0], argv[1]
    return argv[0]


def runnable(argv: list[str]) -> bool:
    """A read-only command with nothing to fill in: no placeholder, no output file, every file it names here."""
    if subcommand(argv) not in RUNNABLE or argv[:2] == ["host", "repaired"]:
        return False
    for a in argv[1:]:
        if PLACEHOLDER.search(a) or a in ("--png", "--write-config", "--input", "--config"):
            return False
        if a.endswith((".yaml", ".yml", ".json")) and not (ROOT / a).is_file():
            return False
    return True


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=ids(SHELL_BLOCKS))
def test_shell_blocks_name_real_commands(block: Block) -> None:
    parser, targets = build_parser(), make_targets()
    lines = command_lines(block)
    assert lines, f"{block.where}: a shell block with no command in it"
    for line in lines:
        for name, value in assignments(line).items():
            if name.startswith("AIRFLOW_CONN_") and value.startswith("{"):
                json.loads(value)  # an Airflow connection as JSON must be JSON
        for argv in commands(line):
            if Path(argv[0]).name != "make":
                continue
            named = [a for a in argv[1:] if not a.startswith("-") and "=" not in a]
            assert named, f"{block.where}: `{line.strip()}`: make with no target"
            missing = [t for t in named if t not in targets]
            assert not missing, f"{block.where}: `{line.strip()}`: no such make target {missing}"
    for line, argv in railyard_lines(block):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{block.where}: `{line.strip()}`: the CLI refuses it (exit {exc.code})")


@pytest.mark.parametrize("block", of_kind("sh", "bash"), ids=ids(of_kind("sh", "bash")))
def test_shell_blocks_are_shell(block: Block) -> None:
    r = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"{block.where}: bash -n: {r.stderr}"


@pytest.fixture(scope="module")
def fleet_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A simulator of this module's own, on the demo config, for the commands that read the fleet."""
    tmp = tmp_path_factory.mktemp("docs-sim")
    port = free_port()
    log = (tmp / "sim.log").open("wb")
    proc = subprocess.Popen([str(RAILYARD), "sim", "serve", "--port", str(port), "--db", str(tmp / "sim.db"),
                             "--config", str(DEFAULT_CONFIG)], env=fresh_env(tmp), stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp / "sim.log").read_text()
            try:
                if requests.get(f"{url}/healthz", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, (tmp / "sim.log").read_text()
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def fresh_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAILYARD_", "AIRFLOW")) or k == "RAILYARD_TEST_SESSION"}  # conftest.py: not config
    env["HOME"] = str(home)
    env["RAILYARD_HOME"] = str(home / "railyard")
    return env


def test_the_cheap_commands_run(fleet_url: str, tmp_path: Path) -> None:
    """The read-only `railyard` commands the docs show, run as a user would (a fresh home, the checkout's
    default config), on a simulator of the test's own where they read the fleet: each exits 0."""
    runs: dict[str, tuple[str, list[str]]] = {}  # each distinct command once
    for block in SHELL_BLOCKS:
        for _, argv in railyard_lines(block):
            if runnable(argv):
                runs.setdefault(shlex.join(argv), (block.where, argv))
    assert {"validate", "schema", "plan"} <= {argv[0] for _, argv in runs.values()}, sorted(runs)
    failed = []
    for where, argv in runs.values():
        extra = ["--fleet-url", fleet_url] if argv[0] in READS_FLEET and "--fleet-url" not in argv else []
        r = subprocess.run([str(RAILYARD), *argv, *extra], cwd=ROOT, env=fresh_env(tmp_path), capture_output=True,
                           text=True, timeout=120)
        if r.returncode != 0:
            failed.append(f"{where}: railyard {shlex.join(argv)}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
    assert not failed, "\n".join(failed)


# ---- Python, Dockerfiles ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block", of_kind("python"), ids=ids(of_kind("python")))
def test_python_blocks_compile(block: Block) -> None:
    compile(block.text, block.where, "exec")


def test_the_dag_file_builds_dags() -> None:
    """The README's whole DAG file, with its config path pointed at the demo config, builds every DAG."""
    from airflow.sdk import DAG

    files = [b for b in of_kind("python") if "railyard_dags(" in b.text]
    assert files, "no DAG file block left in the docs"
    for block in files:
        path = re.search(r"railyard_dags\((['\"])(.+?)\1\)", block.text)
        assert path, f"{block.where}: the DAG file names no config path"
        source = block.text.replace(path[0], f"railyard_dags({str(DEFAULT_CONFIG)!r})")
        namespace: dict[str, Any] = {"__name__": "docs_dag_file"}
        exec(compile(source, block.where, "exec"), namespace)  # noqa: S102 - the docs' own example
        dags = {k: v for k, v in namespace.items() if isinstance(v, DAG)}
        assert "railyard_emergency" in dags and "railyard_train_demo" in dags, sorted(dags)


@pytest.mark.parametrize("block", of_kind("dockerfile"), ids=ids(of_kind("dockerfile")))
def test_dockerfiles_use_known_instructions(block: Block) -> None:
    lines = [ln for ln in block.text.replace("\\\n", " ").splitlines() if ln.strip() and not ln.startswith("#")]
    words = [ln.split()[0].upper() for ln in lines]
    assert words and words[0] == "FROM", block.where
    assert set(words) <= DOCKER_INSTRUCTIONS, (block.where, set(words) - DOCKER_INSTRUCTIONS)


# ---- links --------------------------------------------------------------------------------------------------------
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"[`*]", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            in_code = not in_code
        if in_code:
            continue
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            s = slug(m[1])
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def test_relative_links_resolve() -> None:
    broken = []
    for path in DOCS:
        text = re.sub(r"^([ \t]*)(`{3,}|~{3,}).*?^\1\2[ \t]*$", "", path.read_text(), flags=re.M | re.S)
        for m in LINK.finditer(text):
            target = m[1] or m[2]
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            where = f"{path.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)
