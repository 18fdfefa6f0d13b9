"""The API's layout without a broker: one Faust blueprint per area in streams/api/, every view a
worker serves comes from one of them, and no view gives a Faust `View` method another meaning
(`ApiView.route` once forwarded a request where Faust's adds a route to the web server, and
`ApiView.error` shadowed Faust's error answer)."""

from __future__ import annotations

import inspect

import pytest
from faust.web import Blueprint, View

from streams.api.http import ApiView, runtime_of
from streams.composition import api_areas, register_all
from streams.runtime.app import Runtime
from streams.settings import Settings

#: the HTTP methods a view is meant to define (Faust's View answers 405 for the others)
HTTP_METHODS = {"head", "get", "post", "put", "patch", "delete", "options", "search"}
#: Faust methods ApiView extends with the same meaning: its `dispatch` calls Faust's and turns an
#: unexpected exception into a logged, empty 500
EXTENDED = {"dispatch"}


def faust_names_defined(cls: type) -> set[str]:
    """The public attributes of Faust's View that `cls` or a base of it below View defines."""
    public = {n for n in dir(View) if not n.startswith("_")}
    below = cls.__mro__[:cls.__mro__.index(View)]
    return {n for n in public if any(n in vars(c) for c in below)}


def test_api_view_gives_no_faust_name_another_meaning():
    assert faust_names_defined(ApiView) == EXTENDED
    assert list(inspect.signature(ApiView.dispatch).parameters) == list(inspect.signature(View.dispatch).parameters)
    assert not {"route", "error"} & set(vars(ApiView))
    # what we named instead
    assert {"answer_at_owner", "problem", "reply", "unavailable"} <= set(vars(ApiView))


def test_each_area_is_one_blueprint_in_streams_api():
    areas = api_areas()
    assert [a.__name__ for a in areas] == [f"streams.api.{n}" for n in
                                           ("memory", "sessions", "graphs", "analytics", "dashboard", "health")]
    for area in areas:
        assert isinstance(area.blueprint, Blueprint), area.__name__
        assert area.blueprint.name == area.__name__.rpartition(".")[2]
        assert area.blueprint.routes, area.__name__


@pytest.fixture(scope="module")
def worker():
    rt = Runtime(Settings(registry_url="", partitions=3, app_id="test-api-views", api_tokens="t:secret"))
    register_all(rt)
    return rt


def test_every_served_view_comes_from_an_area_blueprint(worker):
    routed = {(route.uri, route.handler) for area in api_areas() for route in area.blueprint.routes}
    served = {(path, type(view)) for path, view in worker.app.web.views.items()}
    assert served == routed
    for _path, view_cls in served:
        assert view_cls.__module__.startswith("streams.api."), view_cls
        # a view defines HTTP methods and its own helpers; no other Faust name
        assert faust_names_defined(view_cls) <= HTTP_METHODS | EXTENDED, view_cls


def test_a_view_reaches_its_own_workers_runtime(worker):
    other = Runtime(Settings(registry_url="", partitions=3, app_id="test-api-views-2", api_tokens="u:none"))
    register_all(other)
    path = "/v1/graphs/{graph_id}"
    mine, theirs = worker.app.web.views[path], other.app.web.views[path]
    assert type(mine) is type(theirs)  # one class from the blueprint, one instance per app
    assert mine.runtime is worker and theirs.runtime is other
    assert set(mine.tokens) == {"t"} and set(theirs.tokens) == {"u"}
    assert runtime_of(other.app.web.views["/health"].app) is other


def test_an_app_without_a_runtime_is_refused():
    import faust

    with pytest.raises(LookupError):
        runtime_of(faust.App("no-runtime", autodiscover=False))
