"""The deployment files are checked offline: the `Dockerfile` (with `.dockerignore`),
`compose.yaml` and the systemd unit in the README's "Deploying" section.

Each file goes through a lint written here, on its instructions and keys: what the image
runs and as whom, where data lives, the health check, that every key is one the tool
knows. Each lint is also shown failing on a broken copy, so none passes vacuously. Where
Docker can check a file itself without the network (a daemon, the base image already
pulled; the Compose plugin), it does too.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from bot.cli.cli import parser
from bot.core.config import load_config
from tests.conftest import REPO

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
COMPOSE = REPO / "compose.yaml"
README = REPO / "README.md"
VOLUMES = {"/data", "/workspace"}
"""What must outlive the container: the database and the notes, the tools' files."""

INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
                "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK",
                "SHELL"}


# -- Dockerfile -----------------------------------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        out.append((keyword.upper(), " ".join(args.split())))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def exec_form(args: str) -> list[str] | None:
    """The JSON array of an exec-form instruction, or None for the shell form."""
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def _flags(args: str) -> tuple[dict[str, str], str]:
    """`--name=value` flags in front of an instruction's arguments, and the rest."""
    flags = {}
    words = args.split(" ")
    while words and words[0].startswith("--"):
        name, _, value = words.pop(0)[2:].partition("=")
        flags[name] = value
    return flags, " ".join(words)


def _env(args: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in shlex.split(args))


def ignore_rules(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore as (re-include?, pattern) in order: the last rule that matches a path
    or one of its parent folders decides."""
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = posixpath.normpath(line.removeprefix("!").lstrip("/"))
        assert "[" not in pattern and "\\" not in pattern, f"lint cannot read {line!r}"
        regex, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            else:
                regex += {"*": "[^/]*", "?": "[^/]"}.get(pattern[i], re.escape(pattern[i]))
                i += 1
        rules.append((negate, re.compile(regex + r"\Z")))
    return rules


def ignored(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    out = False
    for negate, regex in rules:
        if any(regex.match(p) for p in prefixes):
            out = not negate
    return out


class Image:
    """What a Dockerfile says about the image it builds."""

    def __init__(self, text: str) -> None:
        self.steps = instructions(text)
        self.copies: list[tuple[list[str], PurePosixPath]] = []
        self.env: dict[str, str] = {}
        workdir = PurePosixPath("/")
        for keyword, args in self.steps:
            if keyword == "WORKDIR":
                workdir = workdir / args
            elif keyword == "ENV":
                self.env.update(_env(args))
            elif keyword == "COPY":
                flags, rest = _flags(args)
                if "from" not in flags:
                    *sources, dest = exec_form(rest) or rest.split(" ")
                    self.copies.append((sources, self._dest(workdir, dest, sources)))

    @staticmethod
    def _dest(workdir: PurePosixPath, dest: str, sources: list[str]) -> PurePosixPath:
        """Where a COPY's sources land: into `dest` as a folder when it ends in "/" or
        there are several, else as `dest` itself (marked by a trailing "/" here)."""
        into = dest.endswith("/") or len(sources) > 1
        path = PurePosixPath(posixpath.normpath(str(workdir / dest)))
        return PurePosixPath(f"{path}/") if into else path

    def last(self, keyword: str) -> str | None:
        found = [args for k, args in self.steps if k == keyword]
        return found[-1] if found else None

    def placed(self, source: str, repo: Path) -> PurePosixPath:
        """Where the repository path `source` (a COPY source or inside one) lands: a
        folder's contents go into the destination, a file into it when it is a folder."""
        for sources, dest in self.copies:
            for src in sources:
                top = posixpath.normpath(src)
                if source != top and not source.startswith(top + "/") and top != ".":
                    continue
                rest = PurePosixPath(source).relative_to(top) if top != "." else source
                base = PurePosixPath(str(dest).rstrip("/") or "/")
                into = str(dest).endswith("/") and not (repo / top).is_dir()
                return (base / PurePosixPath(top).name if into else base) / rest
        raise KeyError(source)


def _base_problems(image: Image) -> list[str]:
    froms = [args for k, args in image.steps if k == "FROM"]
    problems = [f"unknown instruction {k}" for k, _ in image.steps if k not in INSTRUCTIONS]
    if not froms:
        return [*problems, "no FROM"]
    base = _flags(froms[-1])[1].split(" ")[0]
    if not re.fullmatch(r"python:3\.11\.\d+-slim(-[a-z]+)?", base):
        problems.append(f"FROM {base}: want a slim Python 3.11 tag pinned to a patch release")
    return problems


def _user_problems(image: Image) -> list[str]:
    keywords = [k for k, _ in image.steps]
    users = [(i, args) for i, (k, args) in enumerate(image.steps) if k == "USER"]
    if not users:
        return ["no USER: the image would run as root"]
    index, user = users[-1]
    problems = []
    if user.split(":")[0] in {"root", "0"}:
        problems.append(f"USER {user} is root")
    for keyword in ("ENTRYPOINT", "CMD"):
        if keyword not in keywords or keywords.index(keyword) < index:
            problems.append(f"{keyword} must come after USER")
    return problems


def _command_problems(image: Image) -> list[str]:
    entry = exec_form(image.last("ENTRYPOINT") or "")
    cmd = exec_form(image.last("CMD") or "") or []
    problems = []
    if entry != ["tandem"]:
        problems.append(f"ENTRYPOINT is {entry}, not [\"tandem\"]")
    args = tandem_args(cmd)
    if args is None or args.command != "run" or not getattr(args, "config", None):
        problems.append(f"CMD {cmd} must be `run --config PATH`")
    health = image.last("HEALTHCHECK") or ""
    probe = exec_form(health[health.find("CMD ") + 4:]) if "CMD " in health else None
    checks = tandem_args(probe[1:]) if probe and probe[0] == "tandem" else None
    if checks is None or checks.command != "doctor" or not checks.quick:
        problems.append(f"HEALTHCHECK runs {probe}, not `tandem doctor --quick --config …`")
    elif args is not None and getattr(checks, "config", None) != getattr(args, "config", None):
        problems.append("HEALTHCHECK checks another config than CMD runs")
    return problems


def tandem_args(argv: list[str]) -> argparse.Namespace | None:
    """`argv` as Tandem's own command line reads it, or None where it refuses it."""
    try:
        return parser().parse_args(argv)
    except SystemExit:
        return None


def _data_problems(image: Image, tmp: Path) -> list[str]:
    volumes = set(exec_form(image.last("VOLUME") or "") or [])
    problems = [f"VOLUME lacks {v}" for v in sorted(VOLUMES - volumes)]
    cwd = os.getcwd()
    os.chdir(tmp)  # no config.yaml or .env of the developer's
    try:
        config = load_config(None, environ=dict(image.env))
    finally:
        os.chdir(cwd)
    for key, path in (("store.path", config.store.path), ("persona.dir", config.persona.dir),
                      ("workspace.dir", config.workspace.dir)):
        if not any(path == v or path.startswith(v + "/") for v in volumes):
            problems.append(f"{key} is {path}, in no VOLUME")
    return problems


def _copy_problems(image: Image, rules: list[tuple[bool, re.Pattern[str]]],
                   repo: Path) -> list[str]:
    problems = []
    sources = [posixpath.normpath(s) for ss, _ in image.copies for s in ss]
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    for needed in ("pyproject.toml", project["readme"], project["license"]["file"]):
        if needed not in sources:
            problems.append(f"`pip install .` reads {needed}, which is not copied")
    for src in sources:
        if not (repo / src).exists():
            problems.append(f"COPY {src}: no such path in the repository")
        elif ignored(src, rules):
            problems.append(f"COPY {src}: excluded by .dockerignore")
        else:
            problems += _inside_problems(image, rules, repo, src)
    return problems


def _inside_problems(image: Image, rules: list[tuple[bool, re.Pattern[str]]], repo: Path,
                     src: str) -> list[str]:
    """Every module under a copied folder reaches the image, and every link in it still
    points at a copied file where it lands."""
    problems = []
    for folder, dirs, names in os.walk(repo / src):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not (Path(folder) / d).is_symlink()]
        links = [d for d in os.listdir(folder) if (Path(folder) / d).is_symlink()]
        for name in [*names, *links]:
            path = Path(folder) / name
            rel = path.relative_to(repo).as_posix()
            if name.endswith(".py") and ignored(rel, rules):
                problems.append(f"{rel} is excluded by .dockerignore")
            if path.is_symlink():
                problems += _link_problems(image, repo, path, rules)
    return problems


def _link_problems(image: Image, repo: Path, link: Path,
                   rules: list[tuple[bool, re.Pattern[str]]]) -> list[str]:
    rel = link.relative_to(repo).as_posix()
    target = Path(os.path.normpath(link.parent / os.readlink(link)))
    if not target.is_relative_to(repo):
        return [f"{rel} points outside the repository"]
    target_rel = target.relative_to(repo).as_posix()
    landed = PurePosixPath(posixpath.normpath(
        str(image.placed(rel, repo).parent / os.readlink(link))))
    try:
        where = image.placed(target_rel, repo)
    except KeyError:
        return [f"{rel} points at {target_rel}, which is not copied"]
    if where != landed or ignored(target_rel, rules):
        return [f"{rel} points at {landed} in the image, where {target_rel} is not"]
    return []


def dockerfile_problems(text: str, ignore_text: str, repo: Path, tmp: Path) -> list[str]:
    image = Image(text)
    rules = ignore_rules(ignore_text)
    return [*_base_problems(image), *_user_problems(image), *_command_problems(image),
            *_data_problems(image, tmp), *_copy_problems(image, rules, repo)]


# -- compose.yaml ---------------------------------------------------------------------------

SERVICE_KEYS = {
    "annotations", "attach", "blkio_config", "build", "cap_add", "cap_drop", "cgroup",
    "cgroup_parent", "command", "configs", "container_name", "cpu_count", "cpu_percent",
    "cpu_period", "cpu_quota", "cpu_rt_period", "cpu_rt_runtime", "cpu_shares", "cpus",
    "cpuset", "credential_spec", "depends_on", "deploy", "develop", "device_cgroup_rules",
    "devices", "dns", "dns_opt", "dns_search", "domainname", "entrypoint", "env_file",
    "environment", "expose", "extends", "external_links", "extra_hosts", "gpus", "group_add",
    "healthcheck", "hostname", "image", "init", "ipc", "isolation", "label_file", "labels",
    "links", "logging", "mac_address", "mem_limit", "mem_reservation", "mem_swappiness",
    "memswap_limit", "models", "network_mode", "networks", "oom_kill_disable",
    "oom_score_adj", "pid", "pids_limit", "platform", "ports", "post_start", "pre_stop",
    "privileged", "profiles", "provider", "pull_policy", "read_only", "restart", "runtime",
    "scale", "secrets", "security_opt", "shm_size", "stdin_open", "stop_grace_period",
    "stop_signal", "storage_opt", "sysctls", "tmpfs", "tty", "ulimits", "use_api_socket",
    "user", "userns_mode", "uts", "volumes", "volumes_from", "working_dir"}
KEYS: dict[str, set[str]] = {
    "": {"version", "name", "include", "services", "models", "networks", "volumes",
         "secrets", "configs"},
    "build": {"context", "dockerfile", "dockerfile_inline", "args", "ssh", "labels",
              "cache_from", "cache_to", "no_cache", "additional_contexts", "network", "pull",
              "target", "shm_size", "extra_hosts", "isolation", "privileged", "secrets",
              "tags", "ulimits", "platforms", "entitlements"},
    "healthcheck": {"disable", "interval", "retries", "test", "timeout", "start_period",
                    "start_interval"},
    "env_file": {"path", "required", "format"},
    "mount": {"type", "source", "target", "read_only", "consistency", "bind", "volume",
              "tmpfs", "image"},
    "bind": {"propagation", "create_host_path", "recursive", "selinux"},
    "volume": {"name", "driver", "driver_opts", "external", "labels"},
}
RESTARTS = {"always", "unless-stopped", "on-failure"}


def _unknown(where: str, node: Any, known: set[str]) -> list[str]:
    if not isinstance(node, dict):
        return []
    return [f"{where}: unknown key {k}" for k in node
            if k not in known and not str(k).startswith("x-")]


def _key_problems(data: dict[str, Any], service: dict[str, Any]) -> list[str]:
    problems = _unknown("top level", data, KEYS[""])
    problems += _unknown("services.tandem", service, SERVICE_KEYS)
    problems += _unknown("build", service.get("build"), KEYS["build"])
    problems += _unknown("healthcheck", service.get("healthcheck"), KEYS["healthcheck"])
    for item in service.get("env_file") or []:
        problems += _unknown("env_file", item, KEYS["env_file"])
    for mount in service.get("volumes") or []:
        problems += _unknown("volumes", mount, KEYS["mount"])
        if isinstance(mount, dict):
            problems += _unknown("volumes.bind", mount.get("bind"), KEYS["bind"])
    for name, volume in (data.get("volumes") or {}).items():
        problems += _unknown(f"volumes.{name}", volume, KEYS["volume"])
    return problems


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """target -> (source, read only), from the short and the long syntax."""
    out = {}
    for mount in service.get("volumes") or []:
        if isinstance(mount, str):
            source, target, *mode = mount.split(":")
            out[target] = (source, "ro" in mode)
        else:
            out[mount["target"]] = (mount.get("source", ""), bool(mount.get("read_only")))
    return out


def _service_problems(data: dict[str, Any], service: dict[str, Any], image: Image,
                      repo: Path) -> list[str]:
    problems = []
    build = service.get("build")
    context = build.get("context", ".") if isinstance(build, dict) else build
    if not context or not (repo / context / "Dockerfile").is_file():
        problems.append(f"build: {build!r} names no folder with a Dockerfile")
    if not service.get("image"):
        problems.append("no image name")
    mounts = _mounts(service)
    named = set(data.get("volumes") or {})
    for target in sorted(VOLUMES):
        if mounts.get(target, ("", False))[0] not in named:
            problems.append(f"{target} is not a named volume")
    cmd = exec_form(image.last("CMD") or "") or []
    config = cmd[cmd.index("--config") + 1] if "--config" in cmd else ""
    if mounts.get(config, ("", False)) != ("./config.yaml", True):
        problems.append(f"./config.yaml is not mounted read-only at {config}")
    if service.get("command", cmd) != cmd:
        problems.append("command differs from the image's CMD")
    return problems


def _run_problems(service: dict[str, Any]) -> list[str]:
    problems = []
    files = service.get("env_file") or []
    files = [files] if isinstance(files, str) else files
    if ".env" not in [f if isinstance(f, str) else f.get("path") for f in files]:
        problems.append("env_file does not read .env")
    restart = str(service.get("restart", "no"))
    if restart.split(":")[0] not in RESTARTS:
        problems.append(f"restart: {restart} does not bring Tandem back")
    test = (service.get("healthcheck") or {}).get("test") or []
    words = shlex.split(test) if isinstance(test, str) else list(test)
    if words[:1] == ["CMD-SHELL"]:
        words = ["CMD", *shlex.split(" ".join(words[1:]))]
    checks = tandem_args(words[2:]) if words[:2] == ["CMD", "tandem"] else None
    if checks is None or checks.command != "doctor" or not checks.quick:
        problems.append(f"healthcheck test {test!r} does not run `tandem doctor --quick`")
    return problems


def compose_problems(data: Any, image: Image, repo: Path) -> list[str]:
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict):
        return ["no services"]
    service = data["services"].get("tandem")
    if not isinstance(service, dict):
        return ["no service named tandem"]
    return [*_key_problems(data, service), *_service_problems(data, service, image, repo),
            *_run_problems(service)]


# -- the systemd unit in the README ---------------------------------------------------------

UNIT_KEYS = {
    "Unit": {"Description", "Documentation", "Wants", "Requires", "Requisite", "BindsTo",
             "PartOf", "Conflicts", "Before", "After", "OnFailure", "StartLimitIntervalSec",
             "StartLimitBurst", "ConditionPathExists", "AssertPathExists"},
    "Service": {"Type", "User", "Group", "WorkingDirectory", "Environment", "EnvironmentFile",
                "ExecStartPre", "ExecStart", "ExecStartPost", "ExecReload", "ExecStop",
                "Restart", "RestartSec", "TimeoutStartSec", "TimeoutStopSec", "KillMode",
                "KillSignal", "UMask", "NoNewPrivileges", "PrivateTmp", "PrivateDevices",
                "ProtectSystem", "ProtectHome", "ReadWritePaths", "ReadOnlyPaths",
                "StateDirectory", "LimitNOFILE", "MemoryMax", "SyslogIdentifier"},
    "Install": {"WantedBy", "RequiredBy", "Alias", "Also"},
}
UNIT_RESTARTS = {"on-success", "on-failure", "on-abnormal", "on-watchdog", "on-abort",
                 "always"}


def readme_unit(text: str) -> str:
    start = text.index("## Deploying\n")
    end = text.find("\n## ", start + 1)
    [unit] = re.findall(r"```ini\n(.*?)```", text[start:end], re.S)
    return unit


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
        elif "=" in line and current is not None:
            key, _, value = line.partition("=")
            current.setdefault(key.strip(), []).append(value.strip())
        else:
            raise ValueError(f"line {number} of the unit is not `Key=value`: {raw!r}")
    return sections


def unit_problems(text: str) -> list[str]:
    try:
        unit = parse_unit(text)
    except ValueError as exc:
        return [str(exc)]
    problems = []
    if set(unit) != set(UNIT_KEYS):
        problems.append(f"sections {sorted(unit)}, want {sorted(UNIT_KEYS)}")
    for section, keys in unit.items():
        problems += [f"[{section}] {k}: unknown key" for k in keys
                     if k not in UNIT_KEYS.get(section, set())]
    service = unit.get("Service", {})
    problems += _exec_problems(service)
    user = service.get("User", [""])[-1]
    if user in {"", "root", "0"}:
        problems.append(f"User={user}: want a user of its own")
    if service.get("Restart", ["no"])[-1] not in UNIT_RESTARTS:
        problems.append("Restart= does not bring Tandem back")
    if not unit.get("Install", {}).get("WantedBy"):
        problems.append("no WantedBy=: it would not start at boot")
    return problems


def _exec_problems(service: dict[str, list[str]]) -> list[str]:
    starts = service.get("ExecStart", [])
    if len(starts) != 1:
        return [f"want one ExecStart=, not {len(starts)}"]
    argv = shlex.split(starts[0])
    problems = []
    if not argv[0].startswith("/") or PurePosixPath(argv[0]).name != "tandem":
        problems.append(f"ExecStart runs {argv[0]}, not an absolute path to tandem")
    args = tandem_args(argv[1:])
    if args is None or args.command != "run" or not getattr(args, "config", "").startswith("/"):
        problems.append("ExecStart must be `tandem run --config /absolute/path`")
    home = service.get("WorkingDirectory", [""])[-1]
    writable = " ".join(service.get("ReadWritePaths", [])).split()
    if "strict" in service.get("ProtectSystem", []) and not any(
            home == w or home.startswith(w.rstrip("/") + "/") for w in writable):
        problems.append(f"ProtectSystem=strict leaves {home or 'the data'} read-only")
    return problems


# -- the tests ------------------------------------------------------------------------------


def test_the_dockerfile_builds_a_non_root_tandem_image_with_its_data_in_volumes(
        tmp_path: Path) -> None:
    problems = dockerfile_problems(DOCKERFILE.read_text(), DOCKERIGNORE.read_text(), REPO,
                                   tmp_path)
    assert problems == []


def test_the_build_context_keeps_secrets_and_data_out() -> None:
    rules = ignore_rules(DOCKERIGNORE.read_text())
    for path in (".env", "config.yaml", "data/tandem.db", "workspace/notes.txt", ".git/HEAD",
                 "persona/memory/conversations/x/USER.md", "bot/__pycache__/app.cpython.pyc"):
        assert ignored(path, rules), path
    for path in ("bot/run/app.py", "bot/_persona", "persona/RULES.md", "pyproject.toml"):
        assert not ignored(path, rules), path


def test_compose_runs_the_image_with_volumes_env_restart_and_health() -> None:
    image = Image(DOCKERFILE.read_text())
    assert compose_problems(yaml.safe_load(COMPOSE.read_text()), image, REPO) == []


def test_the_readme_systemd_unit_runs_tandem_as_its_own_user() -> None:
    assert unit_problems(readme_unit(README.read_text())) == []


def _swap(old: str, new: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        assert old in text, old
        return text.replace(old, new)
    return edit


DOCKERFILE_BREAKS = [
    (_swap("FROM python:3.11.", "FROM python:3.12."), "slim Python 3.11"),
    (_swap("-slim-bookworm", "-bookworm"), "slim Python 3.11"),
    (lambda t: re.sub(r"python:3\.11\.\d+-", "python:3.11-", t), "pinned"),
    (_swap("USER tandem", "USER root"), "is root"),
    (_swap("USER tandem", "LABEL user=tandem"), "no USER"),
    (_swap('VOLUME ["/data", "/workspace"]', 'VOLUME ["/data"]'), "lacks /workspace"),
    (_swap("TANDEM_STORE__PATH=/data/", "TANDEM_STORE__PATH=/srv/"), "store.path"),
    (_swap('"doctor", "--quick"', '"doctor"'), "HEALTHCHECK"),
    (_swap('"--quick", "--config", "/config/', '"--quick", "--config", "/etc/'),
     "another config"),
    (_swap('ENTRYPOINT ["tandem"]', 'ENTRYPOINT ["python", "-m", "bot"]'), "ENTRYPOINT"),
    (_swap('CMD ["run", "--config"', 'CMD ["chat", "--config"'), "must be `run"),
    (_swap("COPY bot ./bot", "COPY bot ./bot\nCOPY setup.cfg ./"), "no such path"),
    (_swap("COPY persona ./persona\n", ""), "not copied"),
    (_swap("COPY persona ./persona", "COPY persona ./defaults"), "points at"),
    (_swap("LICENSE ./", "./"), "reads LICENSE"),
    (_swap("USER tandem", "USERS tandem"), "unknown instruction"),
]


@pytest.mark.parametrize(("edit", "said"), DOCKERFILE_BREAKS)
def test_the_dockerfile_lint_catches(edit: Callable[[str], str], said: str,
                                     tmp_path: Path) -> None:
    problems = dockerfile_problems(edit(DOCKERFILE.read_text()), DOCKERIGNORE.read_text(),
                                   REPO, tmp_path)
    assert any(said in p for p in problems), problems


@pytest.mark.parametrize(("line", "said"), [("bot/", "COPY bot: excluded"),
                                            ("**/*.py", "excluded by .dockerignore")])
def test_the_dockerignore_lint_catches(line: str, said: str, tmp_path: Path) -> None:
    problems = dockerfile_problems(DOCKERFILE.read_text(), DOCKERIGNORE.read_text() + line,
                                   REPO, tmp_path)
    assert any(said in p for p in problems), problems


COMPOSE_BREAKS: list[tuple[Callable[[dict[str, Any]], object], str]] = [
    (lambda d: d["services"]["tandem"].pop("build"), "no folder with a Dockerfile"),
    (lambda d: d["services"]["tandem"].pop("image"), "no image name"),
    (lambda d: d["services"]["tandem"].__setitem__("restart", "no"), "restart"),
    (lambda d: d["services"]["tandem"].pop("env_file"), "env_file"),
    (lambda d: d["services"]["tandem"]["healthcheck"].__setitem__(
        "test", ["CMD", "tandem", "doctor"]), "healthcheck test"),
    (lambda d: d["services"]["tandem"]["healthcheck"].__setitem__("intervall", "1m"),
     "unknown key intervall"),
    (lambda d: d["services"]["tandem"].__setitem__("restart_policy", "always"),
     "unknown key restart_policy"),
    (lambda d: d["services"]["tandem"]["volumes"].remove("data:/data"), "/data is not"),
    (lambda d: d["services"]["tandem"]["volumes"][0].__setitem__("read_only", False),
     "read-only"),
    (lambda d: d["services"]["tandem"].__setitem__("command", ["chat"]), "command differs"),
    (lambda d: d.__setitem__("service", {}), "unknown key service"),
]


@pytest.mark.parametrize(("edit", "said"), COMPOSE_BREAKS)
def test_the_compose_lint_catches(edit: Callable[[dict[str, Any]], object],
                                  said: str) -> None:
    data = yaml.safe_load(COMPOSE.read_text())
    edit(data)
    problems = compose_problems(data, Image(DOCKERFILE.read_text()), REPO)
    assert any(said in p for p in problems), problems


UNIT_BREAKS = [
    (_swap("[Install]", "[Installation]"), "sections"),
    (_swap("User=tandem\n", ""), "User="),
    (_swap("User=tandem", "User=root"), "User=root"),
    (_swap("Restart=on-failure", "Restart=no"), "Restart="),
    (_swap(" run --config", " chat --config"), "tandem run --config"),
    (_swap(" --config /srv/tandem/config.yaml", ""), "tandem run --config"),
    (_swap("/srv/tandem/venv/bin/tandem", "tandem"), "absolute path"),
    (_swap("RestartSec=", "RestartSecs="), "RestartSecs: unknown key"),
    (_swap("ReadWritePaths=/srv/tandem", "ReadWritePaths=/var/lib/other"), "read-only"),
    (_swap("WantedBy=multi-user.target", ""), "WantedBy"),
    (_swap("Type=simple", "Type simple"), "not `Key=value`"),
]


@pytest.mark.parametrize(("edit", "said"), UNIT_BREAKS)
def test_the_unit_lint_catches(edit: Callable[[str], str], said: str) -> None:
    problems = unit_problems(edit(readme_unit(README.read_text())))
    assert any(said in p for p in problems), problems


# -- Docker's own checks, where Docker can make them offline --------------------------------


def _docker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str] | None:
    if shutil.which("docker") is None:
        return None
    try:
        return subprocess.run(["docker", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return None


def test_docker_build_check_accepts_the_dockerfile() -> None:
    info = _docker("info", "--format", "{{.ServerVersion}}", timeout=20)
    if info is None or info.returncode != 0:
        pytest.skip("no Docker daemon here")
    base = _flags([a for k, a in Image(DOCKERFILE.read_text()).steps if k == "FROM"][-1])[1]
    present = _docker("image", "inspect", base.split(" ")[0], timeout=20)
    if present is None or present.returncode != 0:
        pytest.skip("the base image is not pulled here (the check would fetch it)")
    done = _docker("build", "--check", "--pull=false", ".", timeout=300)
    assert done is not None and done.returncode == 0, done and done.stdout + done.stderr


def test_docker_compose_config_accepts_compose_yaml() -> None:
    version = _docker("compose", "version", timeout=20)
    if version is None or version.returncode != 0:
        pytest.skip("no Docker Compose here")
    done = _docker("compose", "-f", str(COMPOSE), "config", "-q")
    assert done is not None and done.returncode == 0, done and done.stderr
