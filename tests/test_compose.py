"""docker-compose.yml is checked against the code (no Docker engine runs here)."""

from __future__ import annotations

import importlib
from pathlib import Path

import yaml

from backend.cli import build_parser
from backend.settings import ENV_NAMES

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
# variables read by the official images, not by our settings
IMAGE_ENV = {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"}


def test_services_present():
    assert {"postgres", "redis", "api", "worker-cpu", "worker-gpu"} <= set(SERVICES)


def _check_command(cmd: list[str]) -> None:
    if cmd[0] == "lstdp":
        # parses with the real CLI parser: unknown subcommands or options fail here
        args = build_parser().parse_args(cmd[1:])
        assert callable(args.func)
    elif cmd[0] == "uvicorn":
        module, _, attr = cmd[1].partition(":")
        app = getattr(importlib.import_module(module), attr)
        assert callable(app)
    elif cmd[0] == "celery":
        target = cmd[cmd.index("-A") + 1]
        module, _, attr = target.partition(":")
        assert getattr(importlib.import_module(module), attr or "app")
    else:
        raise AssertionError(f"unexpected command {cmd}")


def test_our_services_commands_match_the_code():
    for name in ("api", "worker-cpu", "worker-gpu", "migrate"):
        cmd = SERVICES[name]["command"]
        assert isinstance(cmd, list), f"{name}: use the exec form"
        _check_command(cmd)


def test_worker_queues_are_declared():
    from backend.broker import app

    declared = {q.name for q in app.conf.task_queues}
    for name, queue in (("worker-cpu", "cpu"), ("worker-gpu", "gpu")):
        cmd = SERVICES[name]["command"]
        assert cmd[cmd.index("--queues") + 1] == queue
        assert queue in declared


def test_environment_names_are_known_to_settings():
    for name, svc in SERVICES.items():
        env = svc.get("environment") or {}
        unknown = set(env) - ENV_NAMES - IMAGE_ENV
        assert not unknown, f"{name}: settings do not read {sorted(unknown)}"
    assert {"DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DATA_DIR"} <= ENV_NAMES


def test_settings_parse_the_compose_environment(monkeypatch):
    from backend.settings import Settings

    env = SERVICES["worker-gpu"]["environment"]
    for k, v in env.items():
        monkeypatch.setenv(k, str(v))
    s = Settings()
    assert s.sqlalchemy_url.startswith("postgresql+psycopg://")
    assert not s.embedded
    assert s.array_backend == "cupy"


def test_gpu_worker_reserves_a_gpu():
    devices = SERVICES["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
