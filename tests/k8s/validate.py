"""Validates rendered Kubernetes objects, as the API server would with strict field
validation: built-in kinds against the official OpenAPI schemas that the
`kubernetes-validate` package ships, custom resources against the CRDs in
the CRD directories given (tests/k8s/crds/, and the team's ../shared/k8s-schemas/ with
Kueue's and Volcano's), unknown fields rejected where the CRD does not preserve them.

usage: validate.py CRD_DIR[:CRD_DIR...] MANIFESTS.yaml...   (prints one line per object;
exit 1 on any failure). Kinds with neither are reported as `unchecked`.
"""

import copy
import pathlib
import sys

import jsonschema
import kubernetes_validate
import yaml

K8S_VERSION = "1.33.0"


def strict(schema):
    """The schema with `additionalProperties: false` wherever properties are listed and
    unknown fields are not explicitly preserved (the API server's strict validation)."""
    s = copy.deepcopy(schema)

    def walk(node):
        if not isinstance(node, dict):
            return
        for v in node.get("properties", {}).values():
            walk(v)
        if isinstance(node.get("items"), dict):
            walk(node["items"])
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"])
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        # metadata is validated by the API server itself, not the CRD.
    walk(s)
    return s


def load_crds(directory):
    crds = {}
    for path in sorted(pathlib.Path(directory).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            group = doc["spec"]["group"]
            kind = doc["spec"]["names"]["kind"]
            for v in doc["spec"]["versions"]:
                schema = strict(v["schema"]["openAPIV3Schema"])
                crds[(f"{group}/{v['name']}", kind)] = schema
    return crds


def main():
    crds = {}
    for directory in sys.argv[1].split(":"):
        crds.update(load_crds(directory))
    failed = 0
    for path in sys.argv[2:]:
        for doc in yaml.safe_load_all(pathlib.Path(path).read_text()):
            if not doc:
                continue
            key = (doc.get("apiVersion"), doc.get("kind"))
            name = f"{doc.get('kind')} {doc.get('metadata', {}).get('name')}"
            if key in crds:
                errors = sorted(
                    jsonschema.Draft7Validator(crds[key]).iter_errors(doc),
                    key=lambda e: list(e.path),
                )
                if errors:
                    failed += 1
                    for e in errors:
                        print(f"FAIL {name} (CRD): {'.'.join(map(str, e.path))}: {e.message}")
                else:
                    print(f"ok {name} (CRD {key[0]})")
                continue
            try:
                kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
                print(f"ok {name} (Kubernetes {K8S_VERSION})")
            except kubernetes_validate.SchemaNotFoundError:
                print(f"unchecked {name}: no schema for {key[0]}")
            except kubernetes_validate.ValidationError as e:
                failed += 1
                print(f"FAIL {name} (Kubernetes {K8S_VERSION}): {'.'.join(map(str, e.path))}: {e.message}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
