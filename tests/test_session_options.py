"""The session arguments live in one typed value (``workspace.SessionOptions``): ``Lab.session``,
``Lab.new_session`` and the replay build one, and its defaults are the only ones written."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import promptcache_nb as pc
from promptcache_nb.errors import SessionError
from promptcache_nb.workspace import SessionArgs, SessionOptions


def test_new_session_defaults_are_the_options_defaults() -> None:
    params = inspect.signature(pc.Lab.new_session).parameters
    fields = {f.name: f for f in dataclasses.fields(SessionOptions)}
    assert set(params) - {"self"} == set(fields)  # the same arguments, none forgotten
    for name, f in fields.items():
        assert params[name].default == f.default, name


def test_the_keyword_arguments_are_the_options_fields() -> None:
    """``**options`` of session / new_session is typed by SessionArgs: the fields after strategy, cache, model."""
    fields = [f.name for f in dataclasses.fields(SessionOptions)]
    assert fields[:3] == ["strategy", "cache", "model"]
    assert set(SessionArgs.__annotations__) == set(fields[3:]) == SessionArgs.__optional_keys__


def test_session_signature_shows_every_argument_as_omittable() -> None:
    params = inspect.signature(pc.Lab.session).parameters
    fields = {f.name for f in dataclasses.fields(SessionOptions)}
    assert set(params) - {"self"} == fields | {"id"}
    assert all(params[name].default is None for name in fields | {"id"})


@pytest.mark.parametrize("method", ["session", "new_session"])
def test_a_misspelt_argument_is_refused_as_python_refuses_one(method: str) -> None:
    with pc.Lab() as lab, pytest.raises(TypeError, match=rf"{method}\(\) got an unexpected keyword argument 'sytem'"):
        getattr(lab, method)(sytem="You are terse.")
    with pc.Lab() as lab:
        s = lab.new_session(system="You are terse.")
        with pytest.raises(TypeError, match="'sytem'"):
            lab.session(id=s.id, sytem="You are terse.")  # with an id too: never mistaken for a stored setting


def test_session_without_arguments_is_a_default_new_session() -> None:
    with pc.Lab() as lab:
        a = lab.session()
        b = lab.new_session()
        for name in ("strategy", "cache", "model", "project"):
            assert getattr(a, name) == getattr(b, name) == getattr(SessionOptions(), name)
        assert a.id != b.id


def test_session_with_id_refuses_other_settings_naming_them() -> None:
    with pc.Lab() as lab:
        s = lab.session(project="demo", strategy="durable_delta")
        assert lab.session(id=s.id, project="demo") is s
        with pytest.raises(SessionError, match=r"model='claude-haiku-4-5'.*keeps its own settings"):
            lab.session(id=s.id, model="claude-haiku-4-5")


def test_options_are_checked_when_the_session_is_made() -> None:
    with pc.Lab() as lab, pytest.raises(SessionError, match="cache_scope='team'"):
        lab.session(cache_scope="team")
