"""Prompt templates: sandboxed, bounded, loaded only from inside the world's prompts/."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sim.errors import InputError
from sim.phases.files import MissingFile, read_world_file
from sim.phases.templates import Prompts, TemplateError


def world(tmp_path: Path, **files: str) -> Prompts:
    root = tmp_path / "w"
    (root / "prompts").mkdir(parents=True)
    for name, text in files.items():
        (root / "prompts" / name.replace("__", ".")).write_text(text)
    return Prompts(root)


def test_renders_with_context_and_falls_back_to_the_builtins(tmp_path: Path) -> None:
    prompts = world(tmp_path, a__md="{{ world.name }}: {% for p in present %}{{ p }} {% endfor %}")
    assert prompts.render("a.md", {"world": {"name": "W"}, "present": ["x", "y"]}) == "W: x y"
    assert prompts.render("memory.md", {}).startswith("You keep the long-term memory")


@pytest.mark.parametrize(
    "source",
    [
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        "{% set l = range(5000) | list %}{% for a in l %}{% for b in l %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{{ f(n + 1) }}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{{ 'x' * 100000000 }}",
        "{{ 10 ** 100000 }}",
        "{% for a in range(99999) %}{{ 'xxxxxxxxxx' }}{% endfor %}",
        "{{ 'x' | center(1000000000) }}",
        "{{ 'x'.ljust(1000000000) }}",
        "{{ '%1000000000d' % 1 }}",
        "{{ '{:>1000000000}'.format(1) }}",
        "{% macro f(s, n) %}{% if n %}{{ f(s ~ s, n - 1) }}{% endif %}{% endmacro %}"
        "{{ f('x', 60) }}",
        "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}",
        "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
        "{% endfor %}",
        # memory: each asked for gigabytes in one operation before it was measured first
        "{{ range(5000)|join('x'*300000)|length }}",
        "{{ range(300)|join(range(300)|join('x'*1000))|length }}",
        "{{ ('%s'*1000)|format(*(('x'*300000,)*1000))|length }}",
        "{{ ('%(a)s'*1000)|format(a='x'*300000)|length }}",
        "{{ ('%(a)s'*1000) % {'a': 'x'*300000} }}",
        "{{ '{0}{0}{0}{0}{0}{0}'.format('x'*300000) }}",
        "{{ ('x'*1000)|replace('x', 'y'*1000)|length }}",
        "{{ ('\n'*1000)|indent('x'*1000)|length }}",
        "{{ ('a '*100000)|wordwrap(1, wrapstring='x'*1000)|length }}",
        "{{ ('\t'*1000).expandtabs(400000)|length }}",
        "{{ 'x'.join(range(100000)|map('string')|map('center', 300000))|length }}",
        "{% set x = 'x'*300000 %}{% set x = x ~ x %}{% set x = x ~ x %}{{ x|length }}",
        "{% set x = 'x'*300000 %}{{ [x, x, x, x, x, x, x, x, x, x] }}",
        "{% set x = 'x'*300000 %}{{ [x, x, x]|tojson|length }}",
        "{% set ns = namespace() %}{% for i in range(100) %}{% set ns.a = 'x'*300000 %}"
        "{% set ns.b = ns.a %}{% endfor %}",
        "{% macro m() %}{% for i in range(100000) %}{{ 'x'*300000 }}{% endfor %}{% endmacro %}"
        "{{ m()|length }}",
        "{{ range(1000)|map('string')|map('center', 300000)|list|length }}",
        "{% set ns = namespace(n=10**60) %}{% for i in range(30) %}{% set ns.n = ns.n*ns.n %}"
        "{% endfor %}",
    ],
)
def test_rendering_is_bounded(tmp_path: Path, source: str) -> None:
    prompts = world(tmp_path, t__md=source)
    started = time.monotonic()
    with pytest.raises(TemplateError, match=r"t\.md(:\d+)?: (error|undefined name): \S") as caught:
        prompts.render("t.md", {})
    assert time.monotonic() - started < 10
    assert "error: \n" not in str(caught.value) and not str(caught.value).endswith("error:")


@pytest.mark.parametrize(
    "source",
    [
        "{% for i in range(100000) %}{% endfor %}{{ range(50)|join(', ') }}",
        "{{ 'x' * 300000 }}",
        "{{ ('ab ' * 1000)|wordwrap(10)|length }}",
        "{{ '%s and %s' % ('a', 'b') }} {{ '{} {}'.format('a', 'b') }} {{ 'a' ~ 'b' }}",
        "{% set ns = namespace(s='') %}{% for i in range(100) %}{% set ns.s = ns.s ~ i %}"
        "{% endfor %}{{ ns.s|length }}",
        "{% macro m(x) %}[{{ x }}]{% endmacro %}{{ range(1000)|map('string')|join(m('-')) }}",
    ],
)
def test_ordinary_templates_are_within_the_bounds(tmp_path: Path, source: str) -> None:
    prompts = world(tmp_path, t__md=source)
    assert prompts.render("t.md", {})


def test_the_sandbox_keeps_python_internals_out(tmp_path: Path) -> None:
    prompts = world(tmp_path, t__md="{{ world.__class__.__mro__ }}")
    with pytest.raises(TemplateError, match=r"t\.md:1"):
        prompts.render("t.md", {"world": {}})
    prompts = world(tmp_path / "2", u__md="{% set _ = world.update({'x': 1}) %}")
    data: dict[str, int] = {}
    with pytest.raises(TemplateError):
        prompts.render("u.md", {"world": data})
    assert data == {}


def test_errors_name_the_included_file_and_line(tmp_path: Path) -> None:
    prompts = world(tmp_path, a__md='line\n{% include "_part.md" %}', _part__md="ok\n{{ nope }}")
    with pytest.raises(TemplateError, match=r"_part\.md:2: undefined name"):
        prompts.render("a.md", {})
    assert set(prompts.digests()) == {"a.md", "_part.md"}


def test_includes_cannot_leave_prompts(tmp_path: Path) -> None:
    secret = tmp_path / "secret.md"
    secret.write_text("SECRET")
    prompts = world(tmp_path, a__md='{% include "../world.json" %}', b__md='{% include "s.md" %}')
    (prompts.root / "world.json").write_text("{}")
    (prompts.root / "prompts" / "s.md").symlink_to(secret)
    for name in ("a.md", "b.md"):
        with pytest.raises(TemplateError) as caught:
            prompts.render(name, {})
        assert "SECRET" not in str(caught.value)


def test_world_files_are_read_without_following_symlinks(tmp_path: Path) -> None:
    root = tmp_path / "w"
    (root / "real").mkdir(parents=True)
    (root / "real" / "s.json").write_text("{}")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "s.json").write_text("{}")
    (root / "linked").symlink_to(outside)
    assert read_world_file(root, "real/s.json") == b"{}"
    for rel in ("linked/s.json", "../outside/s.json", "/etc/passwd", "real/../real/s.json"):
        with pytest.raises(InputError):
            read_world_file(root, rel)
    with pytest.raises(MissingFile):
        read_world_file(root, "real/none.json")
    os.mkfifo(root / "real" / "fifo.json")
    with pytest.raises(InputError, match="regular file"):
        read_world_file(root, "real/fifo.json")  # refused at once, never blocks


def test_a_symlinked_override_is_refused_not_replaced_by_the_builtin(tmp_path: Path) -> None:
    prompts = world(tmp_path)
    target = tmp_path / "elsewhere.md"
    target.write_text("ELSEWHERE")
    (prompts.root / "prompts" / "memory.md").symlink_to(target)
    with pytest.raises(TemplateError, match="symlink"):
        prompts.render("memory.md", {})


def test_a_large_cast_passes_through_filters_and_macros_that_only_rearrange_it(
    tmp_path: Path,
) -> None:
    """Over the value limit as text in all (2,000 characters of 300 characters each), but
    only sorted, selected and named: nothing here makes text of the whole cast."""
    cast = [{"name": f"c{n:04d}", "bio": "b" * 300, "votes": n % 3} for n in range(2000)]
    source = (
        "{% macro names(people) %}{{ people|map(attribute='name')|first }}{% endmacro %}"
        "{{ cast|length }} {{ names(cast|sort(attribute='name', reverse=true)) }} "
        "{{ cast|selectattr('votes', 'equalto', 2)|list|length }} "
        "{% for c in cast|rejectattr('votes')|list %}{% if loop.last %}{{ c.name }}"
        "{% endif %}{% endfor %}"
    )
    prompts = world(tmp_path, t__md=source)
    assert prompts.render("t.md", {"cast": cast}) == "2000 c1999 666 c1998"
    refused = world(tmp_path / "2", t__md="{{ cast|tojson|length }}")
    with pytest.raises(TemplateError, match="arguments of the filter tojson over"):
        refused.render("t.md", {"cast": cast})
