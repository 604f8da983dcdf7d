"""The pure sandbox policy (actors/sandbox_policy.py): how the floor and a call's own sandbox
meet, and what a call id stands for."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from toolwire.actors.records import args_fingerprint
from toolwire.actors.sandbox_policy import (
    FILESYSTEMS,
    FULL,
    SandboxPolicy,
    combined_fingerprint,
    normalized,
)

ROOTS = ["/a", "/b", "/c"]
WORLD = ["/ws/x", "/tmp/y", "/a/z", "/b/z", "/c/z", "/elsewhere"]


def writes(policy: SandboxPolicy, path: str) -> bool:
    """What a policy lets a command write, the model the kernel rules implement."""
    roots = policy.write_roots("/ws", "/tmp")
    return roots is None or any(path == r or path.startswith(r + "/") for r in roots)


policies = st.builds(
    SandboxPolicy,
    st.sampled_from(FILESYSTEMS),
    st.lists(st.sampled_from(ROOTS), unique=True).map(tuple),
    st.booleans(),
)


@given(policies, policies)
def test_the_meet_allows_exactly_what_both_allow(a: SandboxPolicy, b: SandboxPolicy) -> None:
    met = a.meet(b)
    for path in WORLD:
        assert writes(met, path) == (writes(a, path) and writes(b, path)), path
    assert met.network == (a.network and b.network)
    assert met == b.meet(a) or set(met.writable) == set(b.meet(a).writable)


@given(policies)
def test_the_default_floor_changes_nothing(policy: SandboxPolicy) -> None:
    assert FULL.meet(policy) == policy and policy.meet(FULL) == policy
    assert policy.meet(policy) == policy


@given(policies, policies)
def test_a_call_id_stands_for_its_sandbox(a: SandboxPolicy, b: SandboxPolicy) -> None:
    base = args_fingerprint("execute", {"command": "true"})
    same = combined_fingerprint(base, a) == combined_fingerprint(base, b)
    assert same == (a == b or (a.identity() == b.identity() == b""))


def test_naming_the_default_sandbox_is_naming_none() -> None:
    base = args_fingerprint("execute", {"command": "true"})
    assert combined_fingerprint(base, None) == base == combined_fingerprint(base, FULL)
    assert combined_fingerprint(base, SandboxPolicy(network=False)) != base


def test_writable_paths_are_made_absolute_against_the_workspace() -> None:
    policy = normalized("workspace_write", ["cache", "/srv/../srv/x", "cache/"], True, "/ws")
    assert policy.writable == ("/ws/cache", "/srv/x")
