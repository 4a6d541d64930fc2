"""The project's Dagster instance (eagle3 check / demo / ui create it): no telemetry, no community pop-up."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from eagle3_dagster.demo import INSTANCE_YAML, ensure_dagster_home


def test_instance_has_telemetry_and_the_community_popup_off(tmp_path: Path) -> None:
    home = ensure_dagster_home(tmp_path / "home")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.nux_enabled is False  # the UI's "Join the Dagster community" dialog
        assert instance.telemetry_enabled is False


def test_an_instance_written_before_the_popup_setting_is_upgraded_but_a_users_own_file_is_not(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for home in (ours, theirs):
        home.mkdir()
    old = "".join(
        ln for ln in INSTANCE_YAML.splitlines(keepends=True) if "nux" not in ln and "enabled: false     #" not in ln
    )
    (ours / "dagster.yaml").write_text(old)
    (theirs / "dagster.yaml").write_text("telemetry:\n  enabled: true\n")
    ensure_dagster_home(ours)
    ensure_dagster_home(theirs)
    assert (ours / "dagster.yaml").read_text() == INSTANCE_YAML
    assert (theirs / "dagster.yaml").read_text() == "telemetry:\n  enabled: true\n"
