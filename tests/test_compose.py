"""docker-compose.yml (and the Dockerfile) are checked against the code (no Docker engine
runs here): commands, environment names, secrets from ``.env`` only, a Redis that requires
a password, services that run as a user other than root."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import yaml
from sqlalchemy.engine import make_url

from backend.cli import build_parser
from backend.settings import ENV_NAMES

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_TEXT = (ROOT / "docker-compose.yml").read_text()
COMPOSE = yaml.safe_load(COMPOSE_TEXT)
SERVICES = COMPOSE["services"]
# variables read by the official images, not by our settings
IMAGE_ENV = {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB", "REDISCLI_AUTH"}
OUR_SERVICES = ("api", "worker-cpu", "worker-cpu-b", "worker-gpu", "migrate")
#: Compose's interpolation: ``${NAME}``, ``${NAME:?message}``, ``${NAME:-default}``...
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}")


def _env_example() -> dict[str, str]:
    out = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def _interpolate(value: str, env: dict[str, str]) -> str:
    """``value`` with compose's ``${...}`` replaced from ``env`` (as compose does with .env)."""
    return INTERPOLATION.sub(lambda m: env[m.group(1)], value)


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
    for name in OUR_SERVICES:
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

    example = _env_example()
    env = SERVICES["worker-gpu"]["environment"]
    for k, v in env.items():
        monkeypatch.setenv(k, _interpolate(str(v), example))
    s = Settings()
    assert s.sqlalchemy_url.startswith("postgresql+psycopg://")
    assert make_url(s.sqlalchemy_url).password == example["POSTGRES_PASSWORD"]
    assert not s.embedded
    assert s.array_backend == "cupy"


def test_no_password_is_written_in_the_compose_file():
    """Every password (URL credentials, POSTGRES_PASSWORD, Redis' --requirepass) is a
    ``${VAR}`` from .env, never a literal."""
    secret_ref = re.compile(r"^\$\{[A-Z0-9_]+(:\?[^}]*)?\}$")
    for user, password in re.findall(r"://([^:/@\s]*):([^@\s]*)@", COMPOSE_TEXT):
        assert secret_ref.match(password), f"a literal password in a URL: {user}:{password}"
    for name, svc in SERVICES.items():
        for key, value in (svc.get("environment") or {}).items():
            if "PASSWORD" in key or "SECRET" in key or key.endswith(("_AUTH", "_TOKEN")):
                assert secret_ref.match(str(value)), f"{name}: {key} is a literal"
        cmd = svc.get("command") or []
        if "--requirepass" in cmd:
            assert secret_ref.match(cmd[cmd.index("--requirepass") + 1]), f"{name}: a literal --requirepass"


def test_every_variable_used_is_in_env_example_with_a_placeholder():
    used = {m.group(1) for m in INTERPOLATION.finditer(COMPOSE_TEXT)}
    example = _env_example()
    assert used, "the compose file reads its secrets from .env"
    assert used <= set(example), f"missing from .env.example: {sorted(used - set(example))}"
    for key, value in example.items():
        assert value.startswith("change-me"), f".env.example: {key} must be a placeholder, not a secret"
        assert re.fullmatch(r"[A-Za-z0-9_-]+", value), f"{key}: only URL-safe characters"
    # .env itself is never committed
    assert ".env" in (ROOT / ".gitignore").read_text().splitlines()


def test_redis_requires_a_password_and_every_client_gives_it():
    redis = SERVICES["redis"]
    cmd = redis["command"]
    assert "--requirepass" in cmd and cmd[cmd.index("--requirepass") + 1].startswith("${REDIS_PASSWORD")
    assert redis["environment"]["REDISCLI_AUTH"].startswith("${REDIS_PASSWORD")  # for the healthcheck
    env = COMPOSE["x-common-env"]
    for key in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):
        assert env[key].startswith("redis://:${REDIS_PASSWORD"), key
    for name in OUR_SERVICES:
        assert SERVICES[name]["environment"]["CELERY_BROKER_URL"] == env["CELERY_BROKER_URL"], name


def test_the_api_and_the_workers_run_as_a_user_other_than_root():
    dockerfile = (ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", dockerfile, flags=re.M)
    assert users and users[-1].split(":")[0] not in {"root", "0"}, users
    assert re.search(r"chown\s+\S*" + re.escape(users[-1].split(":")[0]) + r"\S*\s+/data", dockerfile), \
        "the product store /data must belong to that user"
    for name in OUR_SERVICES:
        svc = SERVICES[name]
        assert "build" in svc, f"{name}: runs the project's image"
        assert str(svc.get("user", users[-1])).split(":")[0] not in {"root", "0"}, f"{name}: runs as root"


def test_gpu_worker_reserves_a_gpu():
    devices = SERVICES["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


def test_long_running_services_are_restarted_when_they_exit():
    """Celery can end a worker with 'Unrecoverable error' after a lost broker connection (seen
    in tests/faults when Redis restarted under load): a supervisor must start it again."""
    for name in ("api", "worker-cpu", "worker-cpu-b", "worker-gpu", "seaweedfs"):
        assert SERVICES[name].get("restart") in ("unless-stopped", "always"), name


def _flags(command: str) -> dict[str, str]:
    """The ``-flag[=value]`` arguments of the ``weed`` command line in ``command``."""
    weed = command.split("exec weed", 1)[1]
    return dict(m.groups() for m in re.finditer(r"(?<!\S)-([a-zA-Z0-9.]+)(?:=(\S+))?", weed))


def test_api_and_workers_share_the_seaweedfs_object_store(monkeypatch):
    """Every process that reads or writes products names the same object store, served by the
    seaweedfs service: the endpoint's host and port are that service's S3 port, its one
    identity is the workers' credentials, telemetry is off and every port it opens is set
    (unset, SeaweedFS opens fixed ones, e.g. 8181 and 9101)."""
    from backend.settings import Settings

    example = _env_example()
    sw = SERVICES["seaweedfs"]
    flags = _flags(sw["command"][0])
    assert flags["master.telemetry"] == "false" and "s3" in flags and "filer" in flags
    for port in ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
                 "filer.port.grpc", "s3.port", "s3.port.grpc"):
        assert flags[port].isdigit(), port
    assert flags["s3.port.iceberg"] == "0" and flags["s3.port.lance"] == "0"
    stores = set()
    for name in ("api", "worker-cpu", "worker-cpu-b", "worker-gpu"):
        for k, v in SERVICES[name]["environment"].items():
            monkeypatch.setenv(k, _interpolate(str(v), example))
        s = Settings()
        assert s.product_store and s.product_store.startswith("s3://"), name
        assert s.aws_endpoint_url == f"http://seaweedfs:{flags['s3.port']}", name
        assert s.aws_access_key_id == sw["environment"]["AWS_ACCESS_KEY_ID"], name
        assert s.aws_secret_access_key.get_secret_value() == _interpolate(sw["environment"]["AWS_SECRET_ACCESS_KEY"],
                                                                          example), name
        assert "seaweedfs" in SERVICES[name]["depends_on"], name
        stores.add(s.product_store)
    assert len(stores) == 1
    assert SERVICES["worker-cpu"]["command"] == SERVICES["worker-cpu-b"]["command"]
