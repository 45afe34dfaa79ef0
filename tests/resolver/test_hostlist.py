"""Slurm's compact lists as tables: host lists and tasks-per-node lists, no environment."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resolver import slurm
from resolver._hostlist import expand_hostlist, expand_tasks_per_node
from resolver.errors import ClusterConfigError

# ---- expand_hostlist --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        # a range keeps the zero padding of its start (scontrol and TF take the width from it)
        ("node[1-3,07-09]", ["node1", "node2", "node3", "node07", "node08", "node09"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[1-010]", [f"n{i}" for i in range(1, 11)]),
        # commas outside brackets separate names
        ("a[1-2],b3", ["a1", "a2", "b3"]),
        ("n[1-2],m5,o[3-4,6,7-9]", ["n1", "n2", "m5", "o3", "o4", "o6", "o7", "o8", "o9"]),
        # prefixes may contain dashes, dots and digits
        ("gpu-a.rack-1[1-2],x.y-z,node-7", ["gpu-a.rack-11", "gpu-a.rack-12", "x.y-z", "node-7"]),
        ("[1-3]", ["1", "2", "3"]),
        # several bracket groups expand in scontrol's order
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        # checked against `scontrol show hostnames` (Slurm 22.05): last group fastest, then first
        ("a[1-2]b[3-4]c[5-6]",
         ["a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6"]),
        # order and duplicates are kept
        ("b1,a1,b1", ["b1", "a1", "b1"]),
        ("n[2,1,1-2]", ["n2", "n1", "n1", "n2"]),
        # one trailing comma is ignored (as TF) and whitespace splits, like scontrol
        ("a,b,", ["a", "b"]),
        ("n[1-2],", ["n1", "n2"]),
        (" a b\tc[1-2]\n", ["a", "b", "c1", "c2"]),
        ("", []),
    ],
)
def test_hostlist_expands_like_scontrol(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize(
    ("hostlist", "part"),
    [
        ("n[1-2", "never closed"),
        ("n1]", "without a matching"),
        ("n[[1]]", "nested"),
        ("n[]", "''"),
        ("n[3-1]", "'3-1'"),
        ("n[a-b]", "'a-b'"),
        ("n[1-2-3]", "'1-2-3'"),
        ("n[1,,2]", "''"),
        # an empty name between commas: TF raises ValueError
        ("a,,b", "empty name before the ',' at position 2"),
        (",a", "empty name before the ',' at position 0"),
        ("a,,", "empty name before the ',' at position 2"),
        (",", "empty name"),
        ("n[1-2],,m", "empty name"),
        ("a, ,b", "empty name before the ',' at position 3"),
        ("n[1, 2]", "whitespace"),
        ("node[1-2]-ib", "'-ib'"),
        ("n[1-65537]", "more than 65536"),
        ("a[1-2000]b[1-2000]", "expands to more than 1048576 hosts"),
        ("n[1-60000],m[1-60000]," * 10, "it expands to more than 1048576 hosts"),
    ],
)
def test_malformed_hostlist_raises_config_error_naming_the_bad_part(hostlist, part):
    with pytest.raises(ClusterConfigError) as info:
        expand_hostlist(hostlist)
    message = str(info.value)
    assert message.startswith(f"SLURM_STEP_NODELIST: {hostlist!r} is not a valid host list: ")
    assert part in message
    assert isinstance(info.value, ValueError)  # TF raises ValueError here


_NUMBERED = re.compile(r"(.*?)([0-9]+)\Z")


def _compress(names: list[str]) -> str:
    """Like `scontrol show hostlist` but order-preserving: adjacent names sharing a prefix and a
    digit width fold into one bracket group of ascending runs."""
    groups: list[tuple[str, int | None, list]] = []
    for name in names:
        match = _NUMBERED.match(name)
        if match is None:
            groups.append((name, None, []))
            continue
        prefix, digits = match.groups()
        if groups and groups[-1][:2] == (prefix, len(digits)):
            groups[-1][2].append(int(digits))
        else:
            groups.append((prefix, len(digits), [int(digits)]))
    parts = []
    for prefix, width, numbers in groups:
        if width is None:
            parts.append(prefix)
            continue
        runs: list[list[int]] = []
        for n in numbers:
            if runs and n == runs[-1][1] + 1:
                runs[-1][1] = n
            else:
                runs.append([n, n])
        text = [
            str(lo).zfill(width) if lo == hi else f"{str(lo).zfill(width)}-{str(hi).zfill(width)}"
            for lo, hi in runs
        ]
        parts.append(f"{prefix}[{','.join(text)}]")
    return ",".join(parts)


_numbered_host = st.builds(
    lambda prefix, number, width: prefix + str(number).zfill(width),
    st.sampled_from(["n", "gpu-", "rack1.node", "a-b.c", ""]),
    st.integers(0, 120),
    st.integers(1, 4),
)
_plain_host = st.from_regex(r"[a-z][a-z0-9.-]{0,8}", fullmatch=True)


@given(st.lists(st.one_of(_numbered_host, _plain_host), max_size=40))
def test_hostlist_compress_then_expand_round_trips(names):
    assert expand_hostlist(_compress(names)) == names


@given(st.lists(_plain_host, max_size=20))
def test_hostlist_of_plain_names_is_the_names(names):
    assert expand_hostlist(",".join(names)) == names


# ---- expand_tasks_per_node --------------------------------------------------------------------


def test_tasks_per_node_repeats_counts_in_order():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("3(x2),2,1") == [3, 3, 2, 1]
    assert expand_tasks_per_node("4") == [4]


@given(st.lists(st.tuples(st.integers(0, 64), st.integers(1, 5)), min_size=1, max_size=10))
def test_tasks_per_node_run_length_form_round_trips(runs):
    text = ",".join(f"{n}(x{r})" if r > 1 else str(n) for n, r in runs)
    assert expand_tasks_per_node(text) == [n for n, r in runs for _ in range(r)]


@pytest.mark.parametrize("bad", ["2(x", "", "x2", "2(3)", "2,,1", "-1", "2(x3)1", "2 (x3)"])
def test_malformed_tasks_per_node_raises_config_error_naming_the_variable(bad):
    with pytest.raises(ClusterConfigError) as info:
        expand_tasks_per_node(bad)
    assert str(info.value).startswith(
        f"SLURM_STEP_TASKS_PER_NODE: {bad!r} is not a valid tasks-per-node list"
    )


def test_a_huge_repeat_count_fails_before_allocating() -> None:
    with pytest.raises(ClusterConfigError, match="covers over 1048576 nodes"):
        expand_tasks_per_node("1(x99999999999)")


@pytest.mark.parametrize(("function", "source"), [
    (expand_hostlist, "SLURM_JOB_NODELIST"),
    (expand_tasks_per_node, "SLURM_JOB_TASKS_PER_NODE"),
])
def test_messages_name_the_given_source(function, source):
    with pytest.raises(ClusterConfigError, match=f"^{source}: "):
        function("[", source=source)


def test_the_slurm_module_offers_the_parsers_as_tf_does():
    assert slurm.expand_hostlist is expand_hostlist
    assert slurm.expand_tasks_per_node is expand_tasks_per_node
