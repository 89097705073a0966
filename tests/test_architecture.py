"""The shape of the code: layers, import cycles, task names, function length.

* ``pipelines/`` (the science) imports nothing from ``backend/``: checked from the source of
  every module (lazy imports included) and at run time by importing every module.
* One direction between the science and the simulated worlds: no ``pipelines`` module
  outside ``pipelines.simulation`` imports the simulator or the validation campaigns
  (``validation/``), and in ``backend/`` only ``backend.cli`` imports the simulator (from
  the source and at run time); the campaigns live in ``validation/``, not in
  ``pipelines/calibration/``.
* No import cycle between the product's modules (``scripts/import_graph.py``).
* The API never imports the worker: it sends work by task name (``backend.broker``).
* The services sit below the API: no ``backend.services`` module imports ``backend.api``,
  ``fastapi`` or ``starlette``; ``backend.auth`` does not import ``backend.api``; no route
  module (nor page) imports a route module.
* The worker registers every task name the broker knows, under the first release's names.
* No function of the product is over 100 lines of code without a comment saying why.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(spec)
spec.loader.exec_module(import_graph)



# The graphs are read when a test first asks (parsing every module takes seconds, which every
# pytest-xdist worker would pay at collection).
@functools.cache
def _graph() -> dict:
    return import_graph.import_graph(ROOT)


@functools.cache
def _external() -> dict:
    return import_graph.external_imports(ROOT)


def _pipelines() -> list[str]:
    return sorted(m for m in _graph() if m.split(".")[0] == "pipelines")


def test_the_graph_sees_every_module_and_real_edges():
    assert len(_pipelines()) > 30 and "backend.api.app" in _graph()
    # a lazy import inside a function is an edge too
    assert "backend.broker" in _graph()["backend.services.jobs"]
    assert "pipelines.calibration.l2.steps" in _graph()["pipelines.calibration.l2.flow"]


def test_no_pipelines_module_imports_backend_in_its_source():
    assert import_graph.layer_violations(_graph()) == []


def test_importing_every_pipelines_module_loads_no_backend_module():
    code = (
        "import importlib, json, sys\n"
        "import pipelines.calibration.l2.flow, pipelines.detect, pipelines.catalogues\n"
        "first = sorted(m for m in sys.modules if m == 'backend' or m.startswith('backend.'))\n"
        f"for m in {_pipelines()!r}:\n"
        "    importlib.import_module(m)\n"
        "after = sorted(m for m in sys.modules if m == 'backend' or m.startswith('backend.'))\n"
        "print(json.dumps([first, after]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    first, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert first == [] and after == []


def test_no_validation_campaign_left_in_the_science():
    calibration = ROOT / "pipelines" / "calibration"
    assert sorted(calibration.rglob("blind_*.py")) == []
    assert not (calibration / "validation.py").exists()
    assert sorted(p.name for p in (ROOT / "validation").glob("blind_*.py")) == [
        "blind_centre.py", "blind_chain.py", "blind_flat.py", "blind_radiometry.py", "blind_stray.py", "blind_units.py"]


def test_the_science_never_imports_the_simulator_or_validation():
    assert import_graph.science_violations(_graph()) == []
    # the simulator does import the science (the direction that is allowed), and the graph sees it
    assert "pipelines.calibration.masters.limb" in _graph()["pipelines.simulation"]
    assert "pipelines.simulation" in _graph()["backend.cli"]


def test_importing_the_science_loads_no_simulator_or_validation_module():
    science = [m for m in _pipelines() if not import_graph._within(m, import_graph.SIMULATOR)]
    code = (
        "import importlib, json, sys\n"
        f"for m in {science!r}:\n"
        "    importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in sys.modules\n"
        "                        if m.startswith(('pipelines.simulation', 'validation')) or m == 'validation')))\n"
    )
    assert _last_json_line(code) == []


def _last_json_line(code: str):
    """Run ``code`` in a new interpreter at the repository root; the JSON of its last line."""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_direction_rule_can_fail(tmp_path):
    """Every wrong-way import is reported, lazy ones too; the allowed directions are not."""
    for d in ("backend/services", "pipelines/calibration", "pipelines/simulation", "pipelines/detect", "validation"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "__init__.py").write_text("")
    for pkg in ("backend", "pipelines"):
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "pipelines" / "calibration" / "flat.py").write_text(
        "def f():\n    from pipelines.simulation.limb import fit\n")
    (tmp_path / "pipelines" / "calibration" / "gates.py").write_text("from validation import campaign\n")
    (tmp_path / "pipelines" / "detect" / "cme.py").write_text("from pipelines import simulation\n")
    (tmp_path / "pipelines" / "simulation" / "limb.py").write_text("from pipelines.calibration import flat\n")
    (tmp_path / "validation" / "campaign.py").write_text("import pipelines.simulation.limb\nimport pipelines.calibration.flat\n")
    (tmp_path / "backend" / "cli.py").write_text("from pipelines.simulation import limb\n")
    (tmp_path / "backend" / "services" / "demo.py").write_text("def g():\n    import pipelines.simulation\n")
    (tmp_path / "backend" / "services" / "report.py").write_text("from validation.campaign import x\n")
    g = import_graph.import_graph(tmp_path)
    assert import_graph.science_violations(g) == [
        ("backend.services.demo", "pipelines.simulation"),
        ("backend.services.report", "validation.campaign"),
        ("pipelines.calibration.flat", "pipelines.simulation.limb"),
        ("pipelines.calibration.gates", "validation.campaign"),
        ("pipelines.detect.cme", "pipelines.simulation"),
    ]


def test_no_import_cycles():
    assert import_graph.cycles(_graph()) == []


def test_the_cycle_finder_finds_cycles(tmp_path):
    """On a tree with a lazy three-module cycle and a self-import, both are reported."""
    for pkg in import_graph.PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "backend" / "a.py").write_text("from backend import b\n")
    (tmp_path / "backend" / "b.py").write_text("import pipelines.c\n")
    (tmp_path / "pipelines" / "c.py").write_text("def f():\n    from backend.a import thing\n")
    (tmp_path / "pipelines" / "d.py").write_text("from . import e\n")
    (tmp_path / "pipelines" / "e.py").write_text("import pipelines.e\n")
    g = import_graph.import_graph(tmp_path)
    assert import_graph.cycles(g) == [["backend.a", "backend.b", "pipelines.c"], ["pipelines.e"]]
    assert import_graph.layer_violations(g) == [("pipelines.c", "backend.a")]
    assert g["pipelines.d"] == {"pipelines.e"}


def test_services_import_neither_the_api_nor_the_web_framework():
    assert "backend.services.quotas" in _graph() and "sqlalchemy" in _external()["backend.services.quotas"]
    assert import_graph.service_violations(_graph(), _external()) == []


def test_no_route_module_imports_another_route_module():
    assert "backend.api.presenters" in _graph()["backend.api.routes.events"]
    assert import_graph.route_violations(_graph()) == []


def test_auth_does_not_import_the_api():
    assert "backend.auth" in _graph()["backend.api.deps"]
    assert import_graph.auth_violations(_graph()) == []


def test_the_layer_rules_find_forbidden_imports(tmp_path):
    """On a tree where a service imports the API (lazily), FastAPI and Starlette, a route
    imports another route, a page imports a route and auth imports the API, each is reported;
    the allowed imports (a route of params, a service of another service) are not."""
    for pkg in ("backend", "backend/services", "backend/api", "backend/api/routes", "backend/api/pages", "pipelines"):
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "backend" / "services" / "a.py").write_text(
        "import fastapi.responses\nfrom backend.services import b\n"
        "def f():\n    from backend.api.deps import SessionDep\n    from starlette.requests import Request\n")
    (tmp_path / "backend" / "services" / "b.py").write_text("import sqlalchemy\n")
    (tmp_path / "backend" / "api" / "deps.py").write_text("from backend import auth\n")
    (tmp_path / "backend" / "api" / "params.py").write_text("")
    (tmp_path / "backend" / "api" / "routes" / "x.py").write_text("from backend.api import params\nfrom . import y\n")
    (tmp_path / "backend" / "api" / "routes" / "y.py").write_text("from backend.api.routes import y\n")
    (tmp_path / "backend" / "api" / "pages" / "p.py").write_text("from backend.api.routes.x import thing\n")
    (tmp_path / "backend" / "auth.py").write_text("def g():\n    from backend.api import deps\n")
    g, ext = import_graph.import_graph(tmp_path), import_graph.external_imports(tmp_path)
    assert ext["backend.services.a"] == {"fastapi", "starlette"} and ext["backend.services.b"] == {"sqlalchemy"}
    assert import_graph.service_violations(g, ext) == [
        ("backend.services.a", "backend.api.deps"), ("backend.services.a", "fastapi"),
        ("backend.services.a", "starlette")]
    assert import_graph.route_violations(g) == [("backend.api.pages.p", "backend.api.routes.x"),
                                                ("backend.api.routes.x", "backend.api.routes.y")]
    assert import_graph.auth_violations(g) == [("backend.auth", "backend.api.deps")]


def _reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(_graph().get(m, ()))
    return seen


def test_the_api_never_imports_the_worker():
    reach = _reachable("backend.api.app")
    assert "backend.broker" in reach  # it sends work by name
    assert not {m for m in reach if m.startswith("backend.worker")}


def test_the_running_api_loads_no_worker_module(tmp_path):
    code = ("import sys\nfrom backend.api.app import create_app\nfrom fastapi.testclient import TestClient\n"
            "app = create_app()\n"
            "print(sorted(m for m in sys.modules if m.startswith('backend.worker')))\n")
    env = {**__import__("os").environ, "DATA_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_worker_registers_every_task_name_of_the_broker():
    from backend.broker import TaskName, app
    import backend.worker.tasks  # noqa: F401 - registers the tasks

    names = TaskName.all()
    assert len(names) == 15 and all(n.startswith("pipelines.tasks.") for n in names)
    assert set(names) <= set(app.tasks)
    assert list(app.conf.include) == ["backend.worker.tasks"]


def _code_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    n = fn.end_lineno - fn.lineno + 1
    first = fn.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        n -= first.end_lineno - first.lineno + 1
    return n


def long_functions_without_reason(root: Path = ROOT, limit: int = 100) -> list[str]:
    """Functions of ``backend``/``pipelines`` with more than ``limit`` lines of code (the
    docstring not counted) and no ``# Long:`` comment in their first lines saying why."""
    bad = []
    for pkg in import_graph.PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            lines = f.read_text().splitlines()
            for node in ast.walk(ast.parse("\n".join(lines))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _code_lines(node) > limit:
                    head = lines[max(0, node.lineno - 3): node.body[0].end_lineno + 3]
                    if not any(line.strip().startswith("# Long:") for line in head):
                        bad.append(f"{f.relative_to(root)}:{node.lineno} {node.name} ({_code_lines(node)} lines)")
    return bad


def test_no_function_over_100_lines_without_a_reason():
    assert long_functions_without_reason() == []


def test_the_length_rule_can_fail(tmp_path):
    (tmp_path / "backend").mkdir()
    (tmp_path / "pipelines").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(101))
    (tmp_path / "pipelines" / "m.py").write_text(f'def f():\n    """Doc."""\n{body}')
    (tmp_path / "backend" / "n.py").write_text(f'def g():\n    # Long: one table of cases.\n{body}')
    assert long_functions_without_reason(tmp_path) == ["pipelines/m.py:1 f (102 lines)"]


@pytest.mark.parametrize("name", ["calibrate_frame"])
def test_calibration_flow_takes_the_options_object(name):
    import inspect

    from pipelines.calibration.l2 import flow
    from pipelines.calibration.l2.options import CalibrationOptions

    sig = inspect.signature(getattr(flow, name))
    assert sig.parameters["options"].annotation in (CalibrationOptions, "CalibrationOptions | None",
                                                      "CalibrationOptions")


#: What a renderer may not import: the database, its models, the services that query it.
DATABASE_MODULES = ("sqlalchemy", "backend.db", "backend.models", "backend.services")


def database_imports(root: Path = ROOT, package: str = "backend.render") -> list[str]:
    """``module: imported name`` for every import statement (module level or in a function) of
    ``package`` and of every product module it reaches (``scripts/import_graph.py``) that names
    a module of :data:`DATABASE_MODULES` or one inside them."""
    graph = import_graph.import_graph(root)
    files = import_graph.modules(root)
    todo = [m for m in graph if m == package or m.startswith(package + ".")]
    reached: set[str] = set()
    while todo:
        m = todo.pop()
        if m not in reached:
            reached.add(m)
            todo += graph[m]
    bad = []
    for m in sorted(reached):
        for node in ast.walk(ast.parse(files[m].read_text(), filename=str(files[m]))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            else:  # a relative import stays in its package: the graph follows it
                continue
            bad += [f"{m}: {n}" for n in names if any(n == d or n.startswith(d + ".") for d in DATABASE_MODULES)]
    return sorted(set(bad))


def test_the_renderers_import_no_database_module():
    """``backend/render/`` draws from files, arrays and rows it is given: nothing it imports,
    directly or through another product module, reaches the database."""
    assert "backend.render.image" in _graph() and "backend.render.figures" in _graph()
    assert database_imports() == []


def test_the_renderer_rule_can_fail(tmp_path):
    for pkg in ("backend/render", "backend/services", "pipelines"):
        (tmp_path / pkg).mkdir(parents=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "backend" / "__init__.py").write_text("")
    (tmp_path / "backend" / "render" / "a.py").write_text("def f():\n    from pipelines import p\n")
    (tmp_path / "pipelines" / "p.py").write_text("def g():\n    from sqlalchemy.orm import Session\n")
    (tmp_path / "backend" / "render" / "b.py").write_text("from backend.services import q\n")
    (tmp_path / "backend" / "services" / "q.py").write_text("")
    assert database_imports(tmp_path) == ["backend.render.b: backend.services", "backend.render.b: backend.services.q",
                                          "pipelines.p: sqlalchemy.orm", "pipelines.p: sqlalchemy.orm.Session"]


def test_the_cli_parser_and_the_reconciler_load_no_web_framework_science_or_astropy(tmp_path, monkeypatch):
    """Every CLI process (workers, the reconciler each worker starts, ``lstdp token``) builds the
    argument parser; the reconciler then loads its module and runs passes. None of it needs
    FastAPI (about 0.7 CPU-seconds a process; the token scopes are in :mod:`backend.scopes`),
    the detectors (the registry loads a detector's module on first use; 1.8 CPU-seconds with
    SciPy and astropy), the calibration chain (``pipelines.calibration`` loads what is asked
    for: the reconciler asks for the options alone) or astropy's FITS (the temporary-file
    sweeps are in :mod:`pipelines.tmpfiles`); a pass's movie and re-run steps load the
    products' and the manifests' services only when they make or compare something. The suite
    starts dozens of reconcilers (``scripts/suite_profile.py``): 4.3 -> 2.1 CPU-s a process.
    Here a new interpreter builds the parser and runs one real pass on an empty SQLite
    database."""
    for k in ("DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):
        monkeypatch.delenv(k, raising=False)
        monkeypatch.delenv(f"LSTDP_{k}", raising=False)
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "var"))
    code = (
        "import json, sys\n"
        "from backend.settings import get_settings\n"
        "from backend.migrate import upgrade\n"
        "get_settings().ensure_dirs()\n"
        "upgrade(get_settings().sqlalchemy_url)\n"
        "import backend.cli\n"
        "backend.cli.build_parser()\n"
        "from backend.db import session_scope\n"
        "from backend.worker.reconcile import reconcile_once\n"
        "with session_scope() as s:\n"
        "    reconcile_once(s, flight=None)\n"
        "import backend.worker.movies, backend.worker.rerun  # what a pass's steps import when they act\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'starlette', 'backend',\n"
        "                                                                   'astropy', 'scipy', 'pipelines')\n"
        "                        and (m.split('.')[0] != 'backend' or m.startswith('backend.api') or m == 'backend.auth')\n"
        "                        and (m.split('.')[0] != 'pipelines' or m.startswith(('pipelines.detect.',\n"
        "                             'pipelines.calibration.', 'pipelines.fitsio')))\n"
        "                        and m not in ('pipelines.detect.follow_ups', 'pipelines.detect.registry',\n"
        "                                      'pipelines.calibration.l2', 'pipelines.calibration.l2.options'))))\n"
    )
    assert _last_json_line(code) == []
    from backend.auth import SCOPES
    from backend.scopes import SCOPES as scopes

    assert SCOPES is scopes and set(SCOPES) == {"jobs:submit", "jobs:cancel", "admin"}
