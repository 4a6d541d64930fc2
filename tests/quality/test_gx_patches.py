"""The GX patches (quality/gx_patches.py) are checked against one GX version, and applying them
patches exactly what they say: a GX upgrade fails here, naming what to re-check, before it can
silently change a validation or a Data Docs page."""

from __future__ import annotations

import great_expectations as gx
from great_expectations.expectations.expectation import Expectation
from great_expectations.render.view import view as gx_view

from eagle3_dagster.quality import gx_patches


def test_the_installed_gx_is_the_one_the_patches_were_checked_against():
    assert gx.__version__ == gx_patches.PINNED_GX_VERSION, (
        f"great_expectations is {gx.__version__}, the patches in quality/gx_patches.py were checked against "
        f"{gx_patches.PINNED_GX_VERSION}: re-check {gx_patches.RECHECK}; then update PINNED_GX_VERSION"
    )


def test_the_patched_gx_internal_still_has_the_shape_the_patch_expects():
    assert isinstance(Expectation.__dict__.get("configuration"), property)


def test_apply_process_patches_is_explicit_and_idempotent():
    gx_patches.apply_process_patches()
    prop = Expectation.__dict__["configuration"]
    gx_patches.apply_process_patches()  # a second call patches nothing again (no wrapper around a wrapper)
    assert Expectation.__dict__["configuration"] is prop
    assert prop.fget.__module__ == gx_patches.__name__


def test_only_the_configuration_patch_is_left():
    # the Data Docs are built once per run by the quality report: GX's Jinja views, site builders, stores
    # and result reads are GX's own (the patches that sped up per-gate builds are gone)
    from great_expectations.data_context.data_context.abstract_data_context import AbstractDataContext

    gx_patches.apply_process_patches()
    assert gx_view.DefaultJinjaView.__init__.__module__.startswith("great_expectations.")
    assert [n for n in dir(gx_patches) if n.startswith(("install_", "listing_", "share_jinja"))] == []
    for name in ("_init_site_builder_for_data_docs_site_creation", "get_validation_result"):
        assert getattr(AbstractDataContext, name).__module__.startswith("great_expectations."), name


def test_a_configuration_is_built_once_per_expectation_inside_one_validation_only():
    gx_patches.apply_process_patches()
    exp = gx.expectations.ExpectColumnValuesToNotBeNull(column="x")
    assert exp.configuration is not exp.configuration  # outside a validation: GX's own behaviour
    with gx_patches.memoized_configurations():
        assert exp.configuration is exp.configuration
