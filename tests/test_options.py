"""One definition of each calibration option: the options object, the job request, the flow.

:class:`pipelines.calibration.l2.options.CalibrationOptions` is the only place an option, its
default and its limits are written. These tests fail if an option exists in one place and
not in another: the job request's schema (and the API's OpenAPI) embeds the object, and the
flow reads every field of it and repeats no default.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import ValidationError

from backend.services.jobs import JobRequest
from pipelines.calibration.l2 import flow
from pipelines.calibration.l2.options import CalibrationOptions, as_options
from pipelines.errors import DataError

ROOT = Path(__file__).resolve().parent.parent
FIELDS = set(CalibrationOptions.model_fields)


def _properties(schema: dict, name: str) -> dict:
    return schema["$defs"][name]["properties"] if "$defs" in schema else schema["properties"]


def test_the_job_request_embeds_the_options_object():
    assert JobRequest.model_fields["options"].annotation is CalibrationOptions
    schema = JobRequest.model_json_schema()
    embedded = schema["$defs"]["CalibrationOptions"]
    own = CalibrationOptions.model_json_schema()
    assert embedded["properties"] == own["properties"]
    assert set(embedded["properties"]) == FIELDS
    assert embedded.get("additionalProperties") is False
    assert JobRequest(channels=["SDI"], start="2024-01-01", end="2024-01-02").options == CalibrationOptions()


def test_the_api_schema_offers_the_same_options(sqlite_env):
    from backend.api.app import create_app

    spec = create_app().openapi()
    body = spec["paths"]["/api/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    req = spec["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]
    ref = req["properties"]["options"].get("$ref") or req["properties"]["options"]["allOf"][0]["$ref"]
    props = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"]
    assert set(props) == FIELDS
    for name, field in CalibrationOptions.model_fields.items():
        assert props[name]["default"] == field.default, name


def _attributes_read(tree: ast.AST, names: set[str]) -> set[str]:
    return {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in names}


def test_the_flow_reads_every_option_and_repeats_no_default():
    src = Path(flow.__file__).read_text()
    tree = ast.parse(src)
    read = _attributes_read(tree, {"opts", "options"})
    assert FIELDS <= read, f"options the flow never reads: {sorted(FIELDS - read)}"
    assert not (read - FIELDS - {"get"}), f"the flow reads unknown options: {sorted(read - FIELDS)}"
    gets = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == "get" and n.args and isinstance(n.args[0], ast.Constant) and n.args[0].value in FIELDS]
    assert not gets, "the flow looks options up in a dict with its own defaults"


@pytest.mark.parametrize("path", ["pipelines/calibration/l2/flow.py", "pipelines/calibration/l2/batch.py",
                                  "backend/worker/processing.py", "backend/worker/gpu_batch.py",
                                  "backend/services/jobs.py"])
def test_no_module_defines_an_option_default_of_its_own(path):
    tree = ast.parse((ROOT / path).read_text())
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" and n.args:
            key = n.args[0]
            if isinstance(key, ast.Constant) and key.value in FIELDS:
                pytest.fail(f"{path}:{n.lineno} reads option {key.value!r} from a dict")


def test_options_refuse_unknown_keys_and_values_out_of_limits():
    with pytest.raises(DataError, match="colour"):
        as_options({"colour": "blue"})
    with pytest.raises(DataError, match="psf_iterations"):
        as_options({"psf_iterations": 0})
    with pytest.raises(DataError, match="saturation_dn"):
        as_options({"saturation_dn": 70000})
    with pytest.raises(DataError, match="remove_cosmic_rays"):
        as_options({"remove_cosmic_rays": "yes"})
    opts = as_options({"interpolation_order": 1, "device": "gpu"})
    assert opts.identity() == {"interpolation_order": 1}
    with pytest.raises(ValidationError, match="frozen"):
        opts.interpolation_order = 3  # frozen: an options object is a value
