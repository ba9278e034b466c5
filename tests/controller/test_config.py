"""Configuration: defaults, documentation, and errors that say where."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.config import Config, ConfigError, load_config, render_defaults

REPO = Path(__file__).resolve().parents[2]


def test_every_setting_is_documented_and_the_defaults_file_is_current(tmp_path):
    text = render_defaults()
    path = tmp_path / "defaults.toml"
    path.write_text(text)
    assert load_config(path) == Config()
    for section in ("api", "scheduler", "driver", "preemption", "executor", "simulation"):
        model = type(getattr(Config(), section))
        for name, field in model.model_fields.items():
            assert field.description, f"{section}.{name} has no description"
            assert f"{name} =" in text, f"{section}.{name} missing from the defaults"
    assert (REPO / "deploy" / "spotbag.toml").read_text() == text, (
        "deploy/spotbag.toml is stale: run `spotbag config defaults > deploy/spotbag.toml`"
    )


def test_examples_parse():
    assert load_config(REPO / "examples" / "demo.toml").driver.time_scale == 1440.0


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ("[scheduler]\nmax_vm = 3\n", "scheduler.max_vm: Extra inputs are not permitted"),
        (
            "[scheduler]\nmax_vms = 0\n",
            "scheduler.max_vms: Input should be greater than or equal to 1",
        ),
        (
            "[preemption]\nmodel = 'weibull'\n",
            "preemption.model: Input should be 'none', 'exponential', 'bathtub' or 'fitted'",
        ),
        (
            "[[vm_types]]\nname='a'\ncpus=1\nmemory_gb=1\nspot_price_per_hour=0\non_demand_price_per_hour=0\n"
            "[[vm_types]]\nname='a'\ncpus=2\nmemory_gb=1\nspot_price_per_hour=0\non_demand_price_per_hour=0\n",
            "duplicate VM type names: a",
        ),
        ("[api\n", "not valid TOML"),
    ],
)
def test_bad_configs_say_where_and_why(tmp_path, toml, words):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert words in str(caught.value) and str(path) in str(caught.value)


def test_state_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("SPOTBAG_STATE_DIR", raising=False)
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/spotbag")
    assert Config().resolved_state_dir() == Path("/var/lib/spotbag")
    monkeypatch.setenv("SPOTBAG_STATE_DIR", str(tmp_path))
    assert Config().resolved_state_dir() == tmp_path
    assert load_config(None, state_dir="/x").resolved_state_dir() == Path("/x")


def test_the_driver_choices_are_the_registered_drivers():
    from typing import get_args

    from controller.config import DriverName
    from drivers import driver_names

    assert sorted(get_args(DriverName)) == driver_names()
