"""The agent's bearer token for `toolwire serve`: where it comes from, whether it is strong
enough, and whether anyone else can read it; and the state dir that holds it, kept private.

Anyone with the token runs commands as the agent's user, so every refusal here stops the agent
before its port opens, with one line that names the file or variable and what to do.

- Sources, in order: `--token-file`, else `TOOLWIRE_TOKEN`, else `<state-dir>/token`
  (generated on the first start: 43 base64url characters, 256 bits, mode 0600).
- Strength: at least MIN_TOKEN_BITS, counted from the token's length and the smallest alphabet
  it is written in (see `token_bits`), whatever its source.
- A token file we did not create (`--token-file`) is refused when others can read it (the
  PostgreSQL rule for its key file): owned by the agent's user with no group or other access
  (0600 or less), or owned by root with at most group read (0640 or less, as `root:toolwire`
  in docs/toolwire.service). It is never changed: it may be shared by design, and a token
  others could read may already have leaked and wants replacing, not a chmod.
- `<state-dir>/token` with group or other access is refused the same way (it was created 0600,
  so someone loosened it; deleting it makes the next start generate a new one).
- The state dir holds the token and the journal (commands, args, outputs). Missing: created
  0700. Owned by the agent's user with group or other access: tightened to 0700, with a warning
  (it is ours, and nothing else should live there). Owned by someone else: refused.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import stat
from pathlib import Path

log = logging.getLogger("toolwire.serve")

# RFC 6749 section 10.10: the probability of guessing a bearer token "MUST be less than or
# equal to 2^(-128)"; secrets.token_urlsafe(32), what we generate, carries 256 bits.
MIN_TOKEN_BITS = 128
# A token file holds one line. 4 KiB is far above any token (ours is 43 bytes) and keeps a
# wrong path (a log, a disk image) from being read whole.
MAX_TOKEN_FILE_BYTES = 4096
GENERATED_TOKEN_BYTES = 32

_DIGITS = frozenset("0123456789")
_HEX = _DIGITS | frozenset("abcdefABCDEF")
_BASE32_UPPER = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")
_BASE32_LOWER = frozenset("abcdefghijklmnopqrstuvwxyz234567")
_BASE64 = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_")
_PRINTABLE = frozenset(chr(c) for c in range(0x21, 0x7F))  # printable ASCII but the space
# (name, characters, bits each character counts): the first alphabet that holds the whole
# token decides. Mixed-case hex counts as hex and base64url as base64: never more than it is.
ALPHABETS: tuple[tuple[str, frozenset[str], float], ...] = (
    ("decimal digits", _DIGITS, math.log2(10)),
    ("hex digits", _HEX, 4.0),
    ("base32", _BASE32_UPPER, 5.0),
    ("base32", _BASE32_LOWER, 5.0),
    ("base64", _BASE64, 6.0),
    ("printable ASCII", _PRINTABLE, math.log2(len(_PRINTABLE))),
)


class TokenRefused(SystemExit):
    """`toolwire serve` stops before its port opens; the message says why, on one line."""

    def __init__(self, message: str) -> None:
        super().__init__(f"toolwire serve: {message}")


def token_bits(token: str) -> tuple[float, str, float]:
    """(bits, alphabet, bits per character) of a token of printable ASCII: its length (without
    trailing `=` padding) times the bits of one character of the smallest alphabet above that
    holds it. A measure of length, not of randomness: choose tokens at random."""
    body = token.rstrip("=") or token
    chars = set(body)
    for name, alphabet, per_char in ALPHABETS:
        if chars <= alphabet:
            return len(body) * per_char, name, per_char
    raise ValueError("a token of printable ASCII only")  # check_token looks first


def _min_chars(per_char: float) -> int:
    return math.ceil(MIN_TOKEN_BITS / per_char)


def check_token(token: str, source: str) -> str:
    """`token` when it is printable ASCII and carries MIN_TOKEN_BITS; else TokenRefused."""
    for position, char in enumerate(token, 1):
        if char not in _PRINTABLE:
            what = "a space" if char == " " else f"the character {char!r}"
            raise TokenRefused(
                f"the token {source} holds {what} at position {position}; a token is one word "
                "of printable ASCII (letters, digits, punctuation)"
            )
    bits, alphabet, per_char = token_bits(token)
    if bits < MIN_TOKEN_BITS:
        raise TokenRefused(
            f"the token {source} is too short: {len(token)} characters of {alphabet} count "
            f"{math.floor(bits)} bits ({per_char:.3g} per character), and a token needs at "
            f"least {MIN_TOKEN_BITS} ({_min_chars(per_char)} such characters; "
            f"{_min_chars(4.0)} hex digits or {_min_chars(6.0)} base64 characters); make one "
            "with `openssl rand -hex 32`, or leave the token out to have one generated"
        )
    return token


def _mode_refusal(path: Path, st: os.stat_result) -> str | None:
    """Why others can read the token file `path` (or change it), or None when they cannot."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == os.geteuid():
        if mode & 0o077:
            return (
                f"token file {path} has mode {mode:04o}: others can read it; make it private "
                f"(chmod 600 {path}) and, since it may have leaked, replace the token"
            )
        return None
    if st.st_uid == 0:
        if mode & 0o037:
            return (
                f"token file {path} (owned by root) has mode {mode:04o}: users other than its "
                f"group's can read or change it; allow at most 0640 (chmod 640 {path}) and, "
                "since it may have leaked, replace the token"
            )
        return None
    return (
        f"token file {path} belongs to uid {st.st_uid}, neither this user (uid {os.geteuid()}) "
        "nor root, who can read and replace it; give the agent a file of its own user's"
    )


def read_token_file(path: Path, source: str) -> str:
    """The one-line token of `path`, after checking that no one else can read it."""
    try:
        # O_CLOEXEC: no command ever inherits it, even one spawned while it is open.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise TokenRefused(f"cannot read token file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        refusal = _mode_refusal(path, os.fstat(fd))
        if refusal is not None:
            raise TokenRefused(refusal)
        data = f.read(MAX_TOKEN_FILE_BYTES + 1)
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise TokenRefused(
            f"token file {path} is over {MAX_TOKEN_FILE_BYTES} bytes; it must hold one line: "
            "the token"
        )
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise TokenRefused(f"token file {path} holds bytes that are not ASCII") from None
    if not text:
        raise TokenRefused(f"token file {path} is empty")
    return check_token(text, source)


def private_state_dir(path: Path) -> None:
    """Make sure `path` exists, belongs to this user and is 0700 (see the module's docstring)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError as exc:
        raise TokenRefused(f"cannot use state dir {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise TokenRefused(f"state dir {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise TokenRefused(
            f"state dir {path} belongs to uid {st.st_uid}, not to this user "
            f"(uid {os.geteuid()}); it holds the token and the journal: give a directory of "
            "this user's own (--state-dir)"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        os.chmod(path, 0o700)
        log.warning(
            f"state dir {path} had mode {mode:04o}, open to others; tightened to 0700 (it "
            "holds the token and the journal)",
            extra={"state_dir": str(path)},
        )


def resolve_token(
    token_file: Path | None, insecure_no_auth: bool, state_dir: Path
) -> tuple[str | None, str]:
    """The token and where it came from: --token-file, else TOOLWIRE_TOKEN, else the state
    dir's (generated when missing or empty)."""
    if insecure_no_auth:
        return None, "disabled (--insecure-no-auth)"
    if token_file is not None:
        return read_token_file(token_file, f"in {token_file}"), f"from {token_file}"
    env_token = os.environ.get("TOOLWIRE_TOKEN", "").strip()
    if env_token:
        return check_token(env_token, "in TOOLWIRE_TOKEN"), "from TOOLWIRE_TOKEN"
    private_state_dir(state_dir)
    try:
        return _token_in_state_dir(state_dir)
    except OSError as exc:  # a state dir this user cannot enter or write: one line
        raise TokenRefused(
            f"cannot use state dir {state_dir}: {exc.strerror}: {exc.filename}"
        ) from None


def _token_in_state_dir(state_dir: Path) -> tuple[str, str]:
    """The state dir's token, generated when missing or empty."""
    path = state_dir / "token"
    if path.exists() and path.stat().st_size > 0:
        token = read_token_file(path, f"in {path} (delete it to have a new one generated)")
        return token, f"from {path}"
    token = secrets.token_urlsafe(GENERATED_TOKEN_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o600)  # an existing empty file keeps its mode through O_CREAT
        f.write(token + "\n")
    return token, f"generated and written to {path}"
