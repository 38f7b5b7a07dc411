"""JSON schemas for kubeconform, from what the package registries serve.

    schemas.py k8s WHEEL VERSION OUT
        The strict Kubernetes VERSION (e.g. v1.34.0) schemas bundled in a kubernetes-validate
        wheel (PyPI), written to OUT/VERSION-local-strict/ in a form kubeconform resolves: their
        "$id" (https://kubernetes.io/api/...) dropped and their "$ref"s
        ("/api/_definitions.json#...") made relative to the file.
    schemas.py crd OUT CRD.yaml...
        One schema per version of each CustomResourceDefinition, OUT/<kind>_<version>.json
        (lower case, kubeconform's {{ .ResourceKind }}_{{ .ResourceAPIVersion }}), strict
        like kubectl's validation: an object with `properties` refuses other fields unless it
        says x-kubernetes-preserve-unknown-fields; int-or-string and nullable are spelled in
        JSON Schema.
"""

import json
import os
import sys
import zipfile

import yaml

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def k8s(wheel, version, out):
    prefix = f"kubernetes_validate/kubernetes-json-schema/{version}-local-strict/"
    target = os.path.join(out, f"{version}-local-strict")
    os.makedirs(target, exist_ok=True)
    written = 0
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if not name.startswith(prefix) or not name.endswith(".json"):
                continue
            text = archive.read(name).decode("utf-8")
            schema = json.loads(text.replace('"/api/_definitions.json#', '"_definitions.json#'))
            schema.pop("$id", None)
            with open(os.path.join(target, os.path.basename(name)), "w", encoding="utf-8") as fh:
                json.dump(schema, fh)
            written += 1
    if written == 0:
        sys.exit(f"schemas.py: no {prefix}*.json in {wheel}")
    return written


def strict(node):
    """The openAPIV3Schema of a CRD as a JSON schema (see the module's docstring)."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict(value) for key, value in node.items()}
    if out.pop("x-kubernetes-int-or-string", False):
        for key in ("type", "format"):
            out.pop(key, None)
        out["anyOf"] = [{"type": "string"}, {"type": "integer"}]
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def crd(out, paths):
    os.makedirs(out, exist_ok=True)
    written = []
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            for doc in yaml.load_all(fh, Loader=LOADER):
                if not doc or doc.get("kind") != "CustomResourceDefinition":
                    continue
                kind = doc["spec"]["names"]["kind"].lower()
                for version in doc["spec"]["versions"]:
                    schema = strict(version["schema"]["openAPIV3Schema"])
                    # The API server fills apiVersion, kind and metadata in whatever the CRD says.
                    schema.setdefault("properties", {}).update({
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                    })
                    name = f"{kind}_{version['name']}.json"
                    with open(os.path.join(out, name), "w", encoding="utf-8") as fh_out:
                        json.dump(schema, fh_out)
                    written.append(name)
    if not written:
        sys.exit(f"schemas.py: no CustomResourceDefinition in {' '.join(paths)}")
    return written


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "k8s":
        print(f"{k8s(sys.argv[2], sys.argv[3], sys.argv[4])} Kubernetes {sys.argv[3]} schemas")
    elif len(sys.argv) >= 4 and sys.argv[1] == "crd":
        print(" ".join(crd(sys.argv[2], sys.argv[3:])))
    else:
        sys.exit(__doc__)
