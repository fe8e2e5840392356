"""The Kubernetes manifests of examples/kubernetes/ against the schema of the API they name,
as the official client's models describe it (no cluster runs here): every field exists
where it is written (a misspelt field is an error, not silently dropped), has the type
the API gives it, and every required field is there. Also what the manifests must say
for orchestra: the command runs `orchestra start ... --block`, the token comes from the
Secret, /dev/shm is an in-memory volume, the Service selects the head."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

kubernetes = pytest.importorskip("kubernetes")
yaml = pytest.importorskip("yaml")

pytestmark = pytest.mark.timeout(30)

FOLDER = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
_PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float),
               "object": object, "datetime": str, "date": str, "bytes": str}


def _documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(FOLDER.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((f"{path.name}:{doc.get('kind')}", doc))
    return docs


DOCS = _documents()


def _model(api_version: str, kind: str) -> str:
    group_version = api_version.split("/")[-1]   # apps/v1 -> v1
    return f"{group_version.capitalize()}{kind}"   # V1Deployment


def _check(value: Any, type_name: str, where: str, errors: list[str]) -> None:
    """``value`` fits the client's type ``type_name`` (List[X], Dict[str, X], a model,
    a primitive; older clients write list[X] and dict(str, X)); what does not is added
    to ``errors``."""
    if m := re.fullmatch(r"[lL]ist\[(.+)\]", type_name):
        if not isinstance(value, list):
            errors.append(f"{where}: a list expected, got {value!r}")
            return
        for i, item in enumerate(value):
            _check(item, m.group(1), f"{where}[{i}]", errors)
        return
    if m := re.fullmatch(r"[dD]ict[\[(]str, (.+)[\])]", type_name):
        if not isinstance(value, dict):
            errors.append(f"{where}: a mapping expected, got {value!r}")
            return
        for k, v in value.items():
            _check(v, m.group(1), f"{where}.{k}", errors)
        return
    if type_name in _PRIMITIVES:
        if not isinstance(value, _PRIMITIVES[type_name]) or (
                type_name == "int" and isinstance(value, bool)):
            errors.append(f"{where}: {type_name} expected, got {value!r}")
        return
    cls = getattr(kubernetes.client, type_name)
    if not isinstance(value, dict):
        errors.append(f"{where}: a {type_name} mapping expected, got {value!r}")
        return
    fields = {json_key: name for name, json_key in cls.attribute_map.items()}
    for key, item in value.items():
        if key not in fields:
            errors.append(f"{where}.{key}: no such field in {type_name}")
            continue
        _check(item, cls.openapi_types[fields[key]], f"{where}.{key}", errors)


class _Response:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.data = json.dumps(doc)


def _build(doc: dict[str, Any], model: str) -> Any:
    """The client's model of ``doc``: it checks required fields as it is built."""
    client = kubernetes.client.ApiClient()
    try:   # clients from 35 on: (text, type, content type)
        return client.deserialize(json.dumps(doc), model, "application/json")
    except TypeError:   # older ones: a response object
        return client.deserialize(_Response(doc), model)


@pytest.mark.parametrize("name,doc", DOCS, ids=[n for n, _ in DOCS])
def test_a_manifest_fits_its_apis_schema(name: str, doc: dict[str, Any]) -> None:
    model = _model(doc["apiVersion"], doc["kind"])
    assert hasattr(kubernetes.client, model), f"{name}: no API kind {doc['apiVersion']}/{doc['kind']}"
    errors: list[str] = []
    _check(doc, model, name, errors)
    assert not errors, "\n".join(errors)
    _build(doc, model)


def test_a_missing_required_field_is_found() -> None:
    doc = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"selector": {}, "template": {"spec": {}}}}   # no containers
    with pytest.raises(Exception, match="containers"):
        _build(doc, "V1Deployment")


def test_a_misspelt_field_is_found() -> None:
    errors: list[str] = []
    _check({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
            "spec": {"selectr": {"app": "orchestra"}, "ports": [{"port": "6380"}]}},
           "V1Service", "broken", errors)
    assert errors == ["broken.spec.selectr: no such field in V1ServiceSpec",
                      "broken.spec.ports[0].port: int expected, got '6380'"]


def test_the_manifests_say_what_orchestra_needs() -> None:
    by_kind = {name: doc for name, doc in DOCS}
    head = by_kind["head.yaml:Deployment"]
    nodes = by_kind["nodes.yaml:Deployment"]
    service = by_kind["head.yaml:Service"]
    secret = by_kind["secret.yaml:Secret"]
    for deployment, role in ((head, "head"), (nodes, "node")):
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["command"][:2] == ["orchestra", "start"] and "--block" in container["command"]
        env = {e["name"]: e for e in container["env"]}
        ref = env["ORCHESTRA_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"], role
        shm = [v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert shm and mounts[shm[0]["name"]] == "/dev/shm", role
    assert service["spec"]["selector"] == head["spec"]["template"]["metadata"]["labels"] | \
        service["spec"]["selector"]
    assert "--head" in head["spec"]["template"]["spec"]["containers"][0]["command"]
    # The head's state store on a volume of the pod: a restarted container finds it.
    (container,) = head["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert env["ORCHESTRA_STATE_DIR"] in mounts
    volumes = {v["name"] for v in head["spec"]["template"]["spec"]["volumes"]}
    assert mounts[env["ORCHESTRA_STATE_DIR"]] in volumes
