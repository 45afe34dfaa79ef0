"""Slurm's compact lists, expanded: host lists (``n[1-3,07],m5``) and tasks-per-node lists
(``2(x3),1``).

Pure functions of the text (no environment, no subprocess): what ``scontrol show hostnames``
and Slurm's ``SLURM_STEP_TASKS_PER_NODE`` mean, with every malformed input a
:class:`~resolver.errors.ClusterConfigError` that names its ``source`` variable and the bad part.
Standard library only.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable

from resolver.errors import ClusterConfigError

__all__ = ["expand_hostlist", "expand_tasks_per_node"]

# Slurm refuses a single range of more than 64Ki hosts ("Too many hosts in range"); we also bound
# the whole expansion so a typo like a[1-60000]b[1-60000] fails fast instead of eating memory.
_MAX_RANGE_HOSTS = 65536
_MAX_HOSTS = 1 << 20

_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?\Z")
_TASKS_PART = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?\Z")

_Bad = Callable[[str], ClusterConfigError]


def expand_hostlist(hostlist: str, *, source: str = "SLURM_STEP_NODELIST") -> list[str]:
    """Expands a Slurm host list like ``scontrol show hostnames`` does, order and duplicates kept.

    ``'n[1-3,07-09],m5'`` -> ``['n1', 'n2', 'n3', 'n07', 'n08', 'n09', 'm5']``. A range keeps the
    width of its start (``[08-10]`` -> 08, 09, 10; ``[1-010]`` -> 1..10). Names are separated by
    commas outside brackets or by whitespace. As in TF, an empty name between commas is an
    error (``'a,,b'``, ``',a'``), while one trailing comma is ignored (``'a,'`` -> a).
    Several bracket groups expand to every combination, in scontrol's order: the last group varies
    fastest, then the first, second, ... (``a[1-2]b[3-4]`` -> a1b3, a1b4, a2b3, a2b4). As in
    Slurm and TF, no text may follow the last ``]`` (``node[1-2]-ib`` is rejected).
    ``''`` -> ``[]``.

    Unlike TF, which accepts only one bracket group at the end of a name, keeps whitespace in
    names (``'a, b'`` -> ``'a'``, ``' b'``) and silently expands a backwards range (``[3-1]``) to
    nothing, this follows scontrol.

    Raises:
      ClusterConfigError: malformed list (an empty name between commas, unbalanced or nested
        brackets, empty, non-numeric or backwards range, text after the last group, too many
        hosts); the message starts with
        ``source`` and names the bad part.
    """

    def bad(reason: str) -> ClusterConfigError:
        return ClusterConfigError(f"{source}: {hostlist!r} is not a valid host list: {reason}")

    hosts: list[str] = []
    for item in _split_hostlist(hostlist, bad):
        hosts.extend(_expand_host_item(item, bad))
        if len(hosts) > _MAX_HOSTS:
            raise bad(f"it expands to more than {_MAX_HOSTS} hosts")
    return hosts


def _split_hostlist(hostlist: str, bad: _Bad) -> list[str]:
    """Splits at commas and whitespace outside brackets; checks brackets balance and don't nest,
    and that every comma ends a non-empty element (TF raises ``ValueError`` for ``'a,,b'``)."""
    items: list[str] = []
    current: list[str] = []
    in_brackets = False
    element_start = len(items)  # items before the current comma-separated element
    for position, char in enumerate(hostlist):
        if char == "[":
            if in_brackets:
                raise bad("nested '['")
            in_brackets = True
        elif char == "]":
            if not in_brackets:
                raise bad("']' without a matching '['")
            in_brackets = False
        elif not in_brackets and (char == "," or char.isspace()):
            if current:
                items.append("".join(current))
            current = []
            if char == ",":
                if len(items) == element_start:
                    raise bad(f"empty name before the ',' at position {position}")
                element_start = len(items)
            continue
        elif in_brackets and char.isspace():
            raise bad("whitespace inside '[...]'")
        current.append(char)
    if in_brackets:
        raise bad("'[' is never closed")
    if current:
        items.append("".join(current))
    return items


def _expand_host_item(item: str, bad: _Bad) -> list[str]:
    """Expands one name such as ``rack[1-2]-n[01-04]`` (brackets already known to balance)."""
    pieces = re.split(r"\[([^\]]*)\]", item)  # literal, group, literal, group, ..., literal
    literals, groups = pieces[0::2], [_expand_ranges(g, item, bad) for g in pieces[1::2]]
    if not groups:
        return [item]
    if literals[-1]:
        raise bad(f"text {literals[-1]!r} after the last ']' in {item!r}")
    if math.prod(len(g) for g in groups) > _MAX_HOSTS:
        raise bad(f"{item!r} expands to more than {_MAX_HOSTS} hosts")
    # scontrol's order: last group innermost; of the others the first varies fastest, so iterate
    # them reversed (product() varies its last argument fastest) and put them back in place.
    head = groups[:-1][::-1]
    hosts = []
    for combo in itertools.product(*head, groups[-1]):
        values = [*combo[:-1][::-1], combo[-1], ""]  # "" pairs with the empty last literal
        hosts.append("".join(itertools.chain.from_iterable(zip(literals, values, strict=True))))
    return hosts


def _expand_ranges(ranges: str, item: str, bad: _Bad) -> list[str]:
    """``'1-3,07-08'`` -> ``['1', '2', '3', '07', '08']``; each range keeps its start's width."""
    values: list[str] = []
    for part in ranges.split(","):
        match = _RANGE.match(part)
        if match is None:
            raise bad(f"range {part!r} in {item!r} is not N or N-M")
        low_text, high_text = match.group(1), match.group(2) or match.group(1)
        low, high = int(low_text), int(high_text)
        if high < low:
            raise bad(f"range {part!r} in {item!r} runs backwards")
        if high - low + 1 > _MAX_RANGE_HOSTS:
            raise bad(f"range {part!r} in {item!r} has more than {_MAX_RANGE_HOSTS} hosts")
        values.extend(str(n).zfill(len(low_text)) for n in range(low, high + 1))
    return values


def expand_tasks_per_node(
    tasks_per_node: str, *, source: str = "SLURM_STEP_TASKS_PER_NODE"
) -> list[int]:
    """Expands Slurm's tasks-per-node list, order kept: ``'2(x3),1'`` -> ``[2, 2, 2, 1]``.

    Each comma-separated part is ``N`` or ``N(xR)`` (N tasks on each of R nodes). As in TF,
    zero counts and zero repeats are accepted and the empty string is not.

    Raises:
      ClusterConfigError: a part is malformed, e.g.
        ``SLURM_STEP_TASKS_PER_NODE: '2(x' is not a valid tasks-per-node list: ...``.
    """
    counts: list[int] = []
    for part in tasks_per_node.strip().split(","):
        match = _TASKS_PART.match(part)
        if match is None:
            raise ClusterConfigError(
                f"{source}: {tasks_per_node!r} is not a valid tasks-per-node list: part {part!r}"
                " is not N or N(xR), e.g. '2(x3),1'"
            )
        repeats = int(match.group(2) or 1)
        if len(counts) + repeats > _MAX_HOSTS:  # "1(x99999999999)" must not exhaust memory
            raise ClusterConfigError(f"{source}: {tasks_per_node!r} covers over {_MAX_HOSTS} nodes")
        counts.extend([int(match.group(1))] * repeats)
    return counts
