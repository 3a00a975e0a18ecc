"""Rules on a call's arguments: the shell parse, globs and regexes, deny winning, the
read-only defaults confined to the workspace, and a compound command never allowed by
a prefix (checked against the real `/bin/sh`: whatever a rule allows runs only what it
says)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bot import turn as t
from bot.core.approvals_config import ApprovalRule
from bot.core.config import Config
from bot.core.history import Msg, ToolCall
from bot.run.app import default_tools
from bot.tools import Registry, Tool
from bot.turn import rules
from bot.turn.policy import verdict
from bot.turn.shell_parse import parse

TOOLS = Registry(default_tools())
SHELL = TOOLS.get("shell")
assert SHELL is not None
TRICKS = [";", "&&", "||", "|", "|&", "&", "\n", "$(", ")", "`", ">", ">>", "<", "<(", ">(",
          "2>", "&>", ">&", "<<", "<<<", "(", "{", "}", "#", "\\", "'", '"', "$", "${", "*",
          " ", "~", "!", "\r", "\t", "=", "..", "/", "-", "--output=x", "$IFS", "\\\n"]
"""Pieces of shell syntax a command could hide a second command behind."""
SLOW = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
DANGER = ["rm -rf ~", "touch pwned", "curl x", "sh", "echo x > owned", "eval rm"]


def rule(tool: str, match: str, verdict: str, users: list[str] | None = None) -> ApprovalRule:
    return ApprovalRule.model_validate({"tool": tool, "match": match, "verdict": verdict,
                                        "users": users or []})


def shell(command: str, found: list[ApprovalRule], workspace: Path, user: str = "1",
          defaults: bool = False) -> str | None:
    assert SHELL is not None
    default = rules.read_only_inside(workspace, frozenset()) if defaults else None
    return rules.evaluate(found, SHELL, {"command": command}, user, workspace, default)


# -- the parse --------------------------------------------------------------------------


@pytest.mark.parametrize(("command", "parts", "exact"), [
    ("git status", ["git status"], True),
    ("git status; rm -rf ~", ["git status", "rm -rf ~"], True),
    ("git status && rm x || ls | cat & sleep 1", ["git status", "rm x", "ls", "cat",
                                                  "sleep 1"], True),
    ("ls\ncat x", ["ls", "cat x"], True),
    ("(cd x && ls)", ["cd x", "ls"], True),
    ("{ rm -rf ~; }", ["rm -rf ~"], True),
    ("if true; then rm x; fi", ["true", "rm x"], True),
    ("ls 2>&1 >/dev/null", ["ls"], True),
    ("ls > out.txt", ["ls", ">out.txt"], True),
    ("cat <in;>f", ["cat", "<in", ">f"], True),
    ('echo "a;b"', ["echo a;b"], True),
    ("git status $(rm -rf ~)", None, False),
    ("git status `rm -rf ~`", None, False),
    ("cat <(rm x)", None, False),
    ("cat <<EOF\nx\nEOF", None, False),
    ("ls # ; rm", None, False),
    ("echo 'open", None, False),
    ("ls\x00rm", None, False),
])
def test_a_command_is_cut_at_every_operator(command: str, parts: list[str] | None,
                                            exact: bool) -> None:
    parsed = parse(command)
    assert parsed.exact is exact
    if parts is not None:
        assert sorted(p.text for p in parsed.parts) == sorted(parts)


# -- globs, regexes, deny winning, people -----------------------------------------------


def test_allow_ask_and_deny_by_pattern_and_deny_wins(tmp_path: Path) -> None:
    found = [rule("shell", "git *", "allow"), rule("shell", "git push*", "ask"),
             rule("shell", "re:git (reset|clean) .*", "deny")]
    assert shell("git log --oneline", found, tmp_path) == "allow"
    assert shell("git push origin main", found, tmp_path) == "ask"
    assert shell("git reset --hard", found, tmp_path) == "deny"
    assert shell("git log; git clean -fdx", found, tmp_path) == "deny"
    assert shell("make test", found, tmp_path) is None  # the tool's policy decides
    both = [rule("shell", "npm *", "allow"), rule("shell", "npm *", "deny")]
    assert shell("npm test", both, tmp_path) == "deny"


def test_a_prefix_never_allows_a_compound_command(tmp_path: Path) -> None:
    found = [rule("shell", "git status*", "allow")]
    assert shell("git status", found, tmp_path) == "allow"
    assert shell("git status --short", found, tmp_path) == "allow"
    for command in ["git status; rm -rf ~", "git status && rm -rf ~", "git status | sh",
                    "git status\nrm -rf ~", "git status $(rm -rf ~)", "git status `id`",
                    "git status > ~/.bashrc", "git status & rm -rf ~", "(rm -rf ~)"]:
        assert shell(command, found, tmp_path) is None, command
    assert shell("git status; git status -s", found, tmp_path) == "allow"


def test_a_rule_for_some_people_applies_to_their_turns_only(tmp_path: Path) -> None:
    found = [rule("shell", "make deploy", "allow", users=["42"])]
    assert shell("make deploy", found, tmp_path, user="42") == "allow"
    assert shell("make deploy", found, tmp_path, user="43") is None


def test_file_tools_match_the_resolved_path_inside_the_workspace(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("x")
    (tmp_path / "docs" / "out").symlink_to("/etc")
    write = TOOLS.get("write_file")
    assert write is not None
    found = [rule("write_file", "docs/*", "allow")]

    def ruled(path: str) -> str | None:
        assert write is not None
        return rules.evaluate(found, write, {"path": path, "content": ""}, "1", tmp_path)

    assert ruled("docs/a.md") == "allow"
    assert ruled("./docs/../docs/b.md") == "allow"
    assert ruled("docs/../../x") is None
    assert ruled("docs/out/passwd") is None  # a symlink leading out
    assert rules.evaluate([rule("write_file", "/etc/*", "allow")], write,
                          {"path": "/etc/passwd", "content": ""}, "1", tmp_path) is None


def test_other_tools_match_their_json_arguments() -> None:
    tool = Tool("tracker__search", "", {}, _never, policy="ask")
    found = [rule("tracker__*", '{"project":"web",*', "allow"),
             rule("tracker__*", "re:.*\"secret\".*", "deny")]
    args: dict[str, Any] = {"query": "bug", "project": "web"}
    assert json.loads(tool.rule_key(args)) == args
    assert rules.evaluate(found, tool, {"project": "web", "query": "bug"}, "1",
                          Path(".")) == "allow"
    assert rules.evaluate(found, tool, {"project": "web", "query": "secret"}, "1",
                          Path(".")) == "deny"
    assert rules.evaluate(found, tool, {"project": "ops"}, "1", Path(".")) is None


async def _never(*_: Any) -> str:
    raise AssertionError("not run")


def test_a_bad_regex_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="regular expression"):
        rule("shell", "re:(", "allow")


# -- the read-only defaults -------------------------------------------------------------


@pytest.mark.parametrize(("command", "allowed"), [
    ("ls", True), ("ls -la src", True), ("cat README.md", True), ("cat -n a b", True),
    ("git status", True), ("git status --short", True), ("git diff", True),
    ("git diff --stat HEAD~1", True), ("git diff main..feature -- src", True),
    ("ls *.md", True), ("cat README.md | cat", True),
    ("cat /etc/shadow", False), ("cat ../x", False), ("cat ~/.ssh/id_rsa", False),
    ("cat link", False), ("cat *", False), ("cat .env", False), ("ls -L", False),
    ("cat {README.md,/etc/passwd}", False), ("git diff --output=x", False),
    ("git diff --no-index /etc/passwd x", False), ("git -C / status", False),
    ("git diff --ext-diff", False), ("ls > list.txt", False), ("cat $HOME/x", False),
    ("cat README.md; rm -rf ~", False), ("/bin/cat README.md", False),
    ("FOO=1 cat README.md", False), ("cat README.md &", True),
])
def test_the_defaults_read_inside_the_workspace_only(tmp_path: Path, command: str,
                                                      allowed: bool) -> None:
    (tmp_path / "README.md").write_text("hi")
    (tmp_path / "src").mkdir()
    (tmp_path / "link").symlink_to("/etc/passwd")
    (tmp_path / ".env").write_text("KEY=x")
    verdict = shell(command, [], tmp_path, defaults=True)
    assert (verdict == "allow") is allowed, (command, verdict)


def test_the_defaults_keep_protected_files_out(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("x")
    check = rules.read_only_inside(tmp_path, frozenset({(tmp_path / "config.yaml").resolve()}))
    assert not check(parse("cat config.yaml").parts[0])
    assert check(parse("cat other.txt").parts[0])


# -- the policy: rules speak over the tool's, the taint rule still asks ----------------


class NoStanding:
    """A store with no standing rules (all `verdict` asks of it)."""

    async def has_rule(self, *_: Any, **__: Any) -> bool:
        return False


async def decide(config: Config, name: str, args: dict[str, Any],
                 window: list[Msg] | None = None, user: str = "1") -> t.Verdict:
    return await verdict(config, TOOLS, NoStanding(), 1,  # type: ignore[arg-type]
                         ToolCall("x", name, json.dumps(args)), unattended=False,
                         window=window, turn=1, user=user)


async def test_the_policy_follows_the_rules_and_taint_still_asks(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("hi")
    config = Config.model_validate({"workspace": {"dir": str(tmp_path)}, "approvals": {
        "rules": [{"tool": "shell", "match": "pytest*", "verdict": "allow"},
                  {"tool": "read_file", "match": "secrets/*", "verdict": "deny"}]}})
    assert isinstance(await decide(config, "shell", {"command": "pytest -q"}), t.Allow)
    assert isinstance(await decide(config, "shell", {"command": "cat README.md"}), t.Allow)
    assert isinstance(await decide(config, "shell", {"command": "cat /etc/passwd"}),
                      t.AskHuman)
    denied = await decide(config, "read_file", {"path": "secrets/key"})
    assert isinstance(denied, t.Refuse) and "rules" in denied.text
    page = "https://pages.example/x"
    call = ToolCall("c1", "web_fetch", json.dumps({"url": page}))
    window = [Msg("assistant", "", 1, (call,)),
              Msg("tool", f"{page} (200, text/html)\n\nrun pytest", 1, tool_call_id="c1",
                  name="web_fetch")]
    tainted = await decide(config, "shell", {"command": "pytest -q"}, window)
    assert isinstance(tainted, t.AskHuman) and tainted.reason


async def test_defaults_can_be_turned_off(tmp_path: Path) -> None:
    config = Config.model_validate({"workspace": {"dir": str(tmp_path)},
                                    "approvals": {"default_rules": False}})
    assert isinstance(await decide(config, "shell", {"command": "ls"}), t.AskHuman)


# -- the property: what a rule allows, /bin/sh runs as allowed --------------------------

STUB = """#!/bin/sh
printf '%s\\036' "${0##*/} $*" >> "$TANDEM_TEST_LOG"
"""


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose `bin` has stand-ins for programs (each logs its call)."""
    root = tmp_path_factory.mktemp("sh")
    (root / "bin").mkdir()
    for name in ("git", "rm", "touch", "curl", "cat", "ls", "id", "sh", "sleep"):
        stub = root / "bin" / name
        stub.write_text(STUB)
        stub.chmod(0o755)
    return root


def run_sh(sandbox: Path, command: str) -> tuple[list[str], str, set[str]]:
    """What `/bin/sh -c command` ran (the stand-ins' log), its stderr, and the files it
    left in a fresh working folder."""
    work = sandbox / "work"
    if work.exists():
        for f in work.iterdir():
            f.unlink()
    work.mkdir(exist_ok=True)
    log = sandbox / "log"
    log.write_text("")
    env = {"PATH": str(sandbox / "bin"), "TANDEM_TEST_LOG": str(log), "HOME": str(work)}
    done = subprocess.run(["/bin/sh", "-c", command], cwd=work, env=env, capture_output=True,
                          text=True, timeout=5, check=False)
    ran = [line for line in log.read_text().split("\x1e") if line]  # one record a call
    return ran, done.stderr, {f.name for f in work.iterdir()}


@settings(max_examples=300, deadline=None, suppress_health_check=SLOW)
@given(st.lists(st.sampled_from(TRICKS + DANGER + ["git status", "status", "-s", "x"]),
                max_size=6))
@example(["; ", "rm -rf ~"])
@example(["\n", "touch pwned"])
@example([" ", "$(", "touch pwned", ")"])
@example([" ", ">", "x"])
@example(["\\\n", "; touch pwned"])
@example([" ", "&>", "x"])
@example([" `", "id", "`"])
@example(["; ", "git status", " -s"])
@example(["'", "\\\n", "'"])
@example([";", "\\", ";"])  # `\;` is a word for the shell: a program named `;`
@example([";", "\\", "{"])  # `\{` too: not the keyword, a program named `{`
def test_what_git_status_star_allows_runs_only_git_status(sandbox: Path,
                                                          pieces: list[str]) -> None:
    command = "git status" + "".join(pieces)
    if shell(command, [rule("shell", "git status*", "allow")], sandbox / "work") != "allow":
        return
    ran, stderr, files = run_sh(sandbox, command)
    assert all(line.startswith("git status") for line in ran), (command, ran)
    assert "not found" not in stderr, (command, stderr)
    assert not files, (command, files)


@settings(max_examples=200, deadline=None, suppress_health_check=SLOW)
@given(st.sampled_from(["ls", "cat", "git diff", "git status"]),
       st.lists(st.sampled_from(TRICKS + DANGER + ["a", "-n", "/etc/passwd", "../x"]),
                max_size=6))
@example("cat", [" ", "/etc/passwd"])
@example("ls", [" ", "..", "/", "x"])
@example("ls", [" ", "..", "="])  # `..=` is a name inside, not the parent
def test_what_the_defaults_allow_reads_only_inside(sandbox: Path, program: str,
                                                   pieces: list[str]) -> None:
    command = program + "".join(pieces)
    work = sandbox / "work"
    work.mkdir(exist_ok=True)
    if shell(command, [], work, defaults=True) != "allow":
        return
    ran, stderr, files = run_sh(sandbox, command)
    assert "not found" not in stderr, (command, stderr)
    assert not files, (command, files)
    for line in ran:
        name, *args = line.split()
        assert name in ("ls", "cat", "git"), (command, ran)
        assert not any(a.startswith(("/", "~", "../")) or a == ".."
                       for a in args), (command, ran)


def test_sh_is_there() -> None:
    assert os.access("/bin/sh", os.X_OK)
