"""The agent's token never reaches a command, and `toolwire serve` takes only a token that is
strong and private (issue 27, defect 3), through real `toolwire serve` processes: a command that
prints its environment, the agent's environment (`/proc/$PPID/environ`) and its descriptors
finds no token, whether the token came from TOOLWIRE_TOKEN or from a file; a short token, a
token file others can read and a state dir of someone else are refused with one line before the
port opens; a state dir open to others is tightened."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from tests.test_serve import ROOT, serve
from tests.wsclient import connect
from toolwire.actors.command_env import command_environment
from toolwire.cli.agent_token import MIN_TOKEN_BITS, TokenRefused, check_token, token_bits

# 32 hex digits: exactly 128 bits, the least a token may carry.
TOKEN = "9f86d081884c7d659a2feaa0c55ad015"
# What a command prints of its own environment and of the agent's (its parent's), and its own
# descriptors with where they lead.
SHOW_ENVIRONMENTS = (
    'echo "parent=$PPID"; env; echo ---; tr "\\0" "\\n" < /proc/$PPID/environ; echo ---; '
    'for fd in /proc/$$/fd/*; do echo "$fd -> $(readlink $fd)"; done'
)
KEPT = {"TOOLWIRE_TEST_KEPT": "an-ordinary-variable"}
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another uid")
REFUSED_WITHIN_S = 20.0


async def _environments(url: str, token: str) -> str:
    async with connect(url, token) as conn:
        result = await conn.call("c", "env", "execute", {"command": SHOW_ENVIRONMENTS})
    assert result["outcome"] == "completed", result
    output: str = result["output"]
    return output


def _assert_no_token_and_ordinary_variables_kept(output: str, agent_pid: int) -> None:
    own, _agents, fds = output.split("---\n")
    # The environ read below is that of what holds the command: the keeper the agent started
    # (PROTOCOL.md 10.1; it was started with the agent's environment less its secrets).
    parent = int(own.split("parent=", 1)[1].split("\n", 1)[0])
    holder = Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")
    assert parent == agent_pid or b"toolwire.actors.keeper" in holder, holder
    assert "TOOLWIRE_TEST_KEPT=an-ordinary-variable" in own  # the environment is passed on
    assert TOKEN not in output
    assert "TOOLWIRE_TOKEN" not in own
    # The descriptors of the shell: its standard three and the one its glob opened, never the
    # agent's (the journal, the token file, sockets).
    numbers = [line.split(" -> ")[0].rsplit("/", 1)[1] for line in fds.splitlines()]
    assert {"0", "1", "2"} <= set(numbers) and len(numbers) <= 4, fds
    assert "journal" not in fds and "token" not in fds and "socket" not in fds, fds


async def test_execute_env_never_shows_the_token_from_toolwire_token(tmp_path: Path) -> None:
    env = {"TOOLWIRE_TOKEN": TOKEN, "DEPLOY_NOTE": f"token was {TOKEN}", **KEPT}
    async with serve(tmp_path, env=env) as server:
        output = await _environments(server.url, TOKEN)
        _assert_no_token_and_ordinary_variables_kept(output, server.process.pid)
        assert "DEPLOY_NOTE" not in output.split("---\n")[0]  # it held the token


async def test_execute_env_never_shows_the_token_from_a_token_file(tmp_path: Path) -> None:
    """The file's token, also held by a variable of the agent's environment (a wrapper that
    hands the same token to an orchestrator on the host): the variable is not passed on."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    env = {"ORCHESTRATOR_TOKEN": TOKEN, **KEPT}
    async with serve(tmp_path, "--token-file", str(token_file), env=env) as server:
        output = await _environments(server.url, TOKEN)
        _assert_no_token_and_ordinary_variables_kept(output, server.process.pid)


async def test_execute_on_a_terminal_gets_no_token_either(tmp_path: Path) -> None:
    command = "env; tr '\\0' '\\n' < /proc/$PPID/environ"
    args = {"command": command, "pty": {"rows": 24, "cols": 80}}
    async with (
        serve(tmp_path, env={"TOOLWIRE_TOKEN": TOKEN, **KEPT}) as server,
        connect(server.url, TOKEN) as conn,
    ):
        result = await conn.call("c", "pty", "execute", args)
    assert result["outcome"] == "completed", result
    assert "TOOLWIRE_TEST_KEPT=an-ordinary-variable" in result["output"]
    assert TOKEN not in result["output"]


async def _refused(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> str:
    """Run `toolwire serve`, which must stop before its port opens; its last line of stderr."""
    (tmp_path / "ws").mkdir(exist_ok=True)
    full_env = {k: v for k, v in os.environ.items() if k != "TOOLWIRE_TOKEN"} | (env or {})
    full_env["PYTHONPATH"] = str(ROOT)
    argv = [sys.executable, "-m", "toolwire.cli.main", "serve", "--port", "0",
            "--workspace", str(tmp_path / "ws"), "--state-dir", str(tmp_path / "state"),
            *extra]  # fmt: skip
    with trio.fail_after(REFUSED_WITHIN_S):
        done = await trio.run_process(
            argv, capture_stdout=True, capture_stderr=True, check=False, env=full_env
        )
    assert done.returncode == 1, done.stderr.decode()
    assert b"listening" not in done.stdout
    lines = done.stderr.decode().strip().splitlines()
    return lines[-1]


async def test_a_token_under_128_bits_is_refused_from_the_variable_and_from_a_file(
    tmp_path: Path,
) -> None:
    line = await _refused(tmp_path, env={"TOOLWIRE_TOKEN": TOKEN[:-1]})
    assert line == (
        "toolwire serve: the token in TOOLWIRE_TOKEN is too short: 31 characters of hex digits "
        "count 124 bits (4 per character), and a token needs at least 128 (32 such "
        "characters; 32 hex digits or 22 base64 characters); make one with `openssl rand "
        "-hex 32`, or leave the token out to have one generated"
    )
    assert not (tmp_path / "state").exists()  # refused before anything was made
    token_file = tmp_path / "short"
    token_file.write_text("hunter2\n")
    token_file.chmod(0o600)
    line = await _refused(tmp_path, "--token-file", str(token_file))
    assert line.startswith(f"toolwire serve: the token in {token_file} is too short: 7 characters")
    line = await _refused(tmp_path, env={"TOOLWIRE_TOKEN": "two words" + TOKEN})
    assert "holds a space at position 4" in line


async def test_a_token_file_others_can_read_is_refused_and_left_unchanged(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o644)
    line = await _refused(tmp_path, "--token-file", str(token_file))
    assert line == (
        f"toolwire serve: token file {token_file} has mode 0644: others can read it; make it "
        f"private (chmod 600 {token_file}) and, since it may have leaked, replace the token"
    )
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o644
    token_file.chmod(0o600)
    async with (
        serve(tmp_path, "--token-file", str(token_file)) as server,
        connect(server.url, TOKEN) as conn,
    ):
        assert conn.welcome["type"] == "welcome"


@AS_ROOT
async def test_a_token_file_of_another_user_is_refused(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    os.chown(token_file, 65534, 65534)
    line = await _refused(tmp_path, "--token-file", str(token_file))
    assert f"token file {token_file} belongs to uid 65534, neither this user" in line


async def test_a_state_dir_token_others_can_read_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "token").write_text(TOKEN + "\n")
    (state / "token").chmod(0o640)
    line = await _refused(tmp_path)
    assert line.startswith(f"toolwire serve: token file {state / 'token'} has mode 0640: others")
    assert (state / "token").read_text() == TOKEN + "\n"  # neither replaced nor changed


async def test_a_state_dir_open_to_others_is_tightened_to_0700(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o755)
    async with serve(tmp_path) as server:
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        assert "had mode 0755, open to others; tightened to 0700" in server.stderr_path.read_text()
        token = (state / "token").read_text().strip()
        async with connect(server.url, token) as conn:
            assert conn.welcome["type"] == "welcome"
    # With the token from the variable, the journal's state dir is tightened all the same.
    state.chmod(0o750)
    async with serve(tmp_path, env={"TOOLWIRE_TOKEN": TOKEN}):
        assert stat.S_IMODE(state.stat().st_mode) == 0o700


@AS_ROOT
async def test_a_state_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, 65534, 65534)
    line = await _refused(tmp_path)
    assert line.startswith(
        f"toolwire serve: state dir {state} belongs to uid 65534, not to this user"
    )
    assert not (state / "token").exists()


# ---------------------------------------------------------------------------------------------
# The pure parts: how bits are counted, what the command environment keeps.


@pytest.mark.parametrize(
    ("alphabet", "shortest"),
    [("0123456789", 39), ("0123456789abcdef", 32), ("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 26),
     ("Zz09-_", 22),
     ("abc!#%&", 20)],
)  # fmt: skip
def test_the_shortest_token_taken_in_each_alphabet(alphabet: str, shortest: int) -> None:
    def of_length(n: int) -> str:
        return (alphabet * n)[:n]

    assert check_token(of_length(shortest), "in test") == of_length(shortest)
    with pytest.raises(TokenRefused, match="is too short"):
        check_token(of_length(shortest - 1), "in test")


def test_base64_padding_counts_nothing() -> None:
    assert token_bits("a" * 21 + "==")[0] == token_bits("a" * 21)[0]


def test_a_generated_token_carries_256_bits() -> None:
    import secrets

    assert token_bits(secrets.token_urlsafe(32)) == (43 * 6, "base64", 6.0)  # as serve makes it
    assert MIN_TOKEN_BITS == 128


_names = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=12)
_values = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\0"), max_size=40)


@given(st.dictionaries(_names, _values, max_size=8), st.text(min_size=1, max_size=20))
def test_command_environment_drops_exactly_what_holds_a_secret(
    environ: dict[str, str], secret: str
) -> None:
    environ = {**environ, "TOOLWIRE_TOKEN": "anything"}
    kept = command_environment(environ, [secret, None, ""])
    assert "TOOLWIRE_TOKEN" not in kept
    assert all(secret not in value for value in kept.values())
    dropped = {name for name, value in environ.items() if secret in value} | {"TOOLWIRE_TOKEN"}
    assert kept == {name: value for name, value in environ.items() if name not in dropped}
