"""The fixture model's current-checkpoint link: the path serve_config.yaml deploys names the current tree's build."""

from __future__ import annotations

from fixture_model import build


def test_ensure_model_points_the_link_at_the_current_checkpoint(monkeypatch, tmp_path):
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    old = tmp_path / "fixture-llama-old"
    old.mkdir()
    build.current_link().symlink_to(old.name)  # a link left by an earlier tree's build
    checkpoint = build.default_model_dir()
    checkpoint.mkdir()  # built already: nothing is trained
    assert build.ensure_model() == checkpoint
    assert build.current_link().resolve() == checkpoint.resolve()
    assert not build.current_link().readlink().is_absolute()  # the cache can move as a whole
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert build.ensure_model(elsewhere) == elsewhere  # an explicit --out leaves the link alone
    assert build.current_link().resolve() == checkpoint.resolve()
