"""The project's Dagster instance (eagle3 check / demo / ui create it): no telemetry, no community pop-up,
runs that log progress rather than every DEBUG engine event; `eagle3 ui` starts without a deprecation warning."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import dagster as dg
import pytest

from eagle3_dagster.app.instance import INSTANCE_YAML, ensure_dagster_home
from eagle3_dagster.app.ui import dagster_dev_command


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
        ln
        for ln in INSTANCE_YAML.splitlines(keepends=True)
        if "nux" not in ln and "enabled: false     #" not in ln and "python_log" not in ln
    )
    (ours / "dagster.yaml").write_text(old)
    (theirs / "dagster.yaml").write_text("telemetry:\n  enabled: true\n")
    ensure_dagster_home(ours)
    ensure_dagster_home(theirs)
    assert (ours / "dagster.yaml").read_text() == INSTANCE_YAML
    assert (theirs / "dagster.yaml").read_text() == "telemetry:\n  enabled: true\n"


@pytest.mark.integration  # a run on an instance on disk tails its compute logs in a process
def test_a_run_on_the_instance_logs_progress_not_every_engine_event(tmp_path: Path, capfd) -> None:
    @dg.asset
    def hello(context) -> int:  # unannotated: Dagster cannot read a string annotation
        context.log.info("hello from the asset")
        context.log.debug("a debug detail")
        return 1

    home = ensure_dagster_home(tmp_path / "home")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert dg.materialize([hello], instance=instance).success
    err = capfd.readouterr().err
    assert "hello from the asset" in err
    assert "DEBUG" not in err and "a debug detail" not in err and "STEP_START" not in err, err


def test_an_instance_written_before_the_log_level_gets_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(INSTANCE_YAML.split("python_logs:")[0])
    ensure_dagster_home(home)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.python_log_level == "INFO"


@pytest.mark.integration
def test_eagle3_ui_starts_dagster_dev_without_its_supersession_warning(tmp_path: Path) -> None:
    # a workspace that cannot load: `dagster dev` starts (and would warn), then stops at once
    bad = tmp_path / "workspace.yaml"
    bad.write_text("load_from: 3\n")
    home = ensure_dagster_home(tmp_path / "home")
    r = subprocess.run(
        dagster_dev_command("0", bad),
        env={**os.environ, "DAGSTER_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "Launching Dagster services" in out and str(bad) in out, out[-2000:]
    assert "Warning" not in out.split("Traceback")[0], out[-2000:]
