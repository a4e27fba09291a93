"""Write the JSON schemas the tests validate the KServe manifests against (deploy/kserve/schemas/, gzipped).

The schemas are the `openAPIV3Schema` of KServe's CustomResourceDefinitions (Apache-2.0, from
https://github.com/kserve/kserve, charts/kserve-crd/templates/), made smaller and stricter:
descriptions dropped, and every object that lists its properties refuses others, as the API
server does with strict field validation (a misspelt field fails instead of being pruned).

    python scripts/vendor_kserve_schemas.py /path/to/kserve/checkout [commit]
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parent.parent / "deploy" / "kserve" / "schemas"
CRDS = {"servingruntime": "serving.kserve.io_servingruntimes.yaml",
        "inferenceservice": "serving.kserve.io_inferenceservices.yaml"}


def strict(node):
    if isinstance(node, dict):
        node = {k: strict(v) for k, v in node.items() if k != "description"}
        if node.get("type") == "object" and "properties" in node \
                and "additionalProperties" not in node \
                and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [strict(v) for v in node]
    return node


def main(checkout: str, commit: str = "") -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, filename in CRDS.items():
        crd = yaml.safe_load((Path(checkout) / "charts/kserve-crd/templates" / filename).read_text())
        for version in crd["spec"]["versions"]:
            schema = strict(version["schema"]["openAPIV3Schema"])
            # metadata is validated by Kubernetes itself, not by the CRD
            schema["properties"]["metadata"] = {"type": "object"}
            schema["x-source"] = f"kserve {commit} {filename} {version['name']}".strip()
            path = OUT / f"{name}-{version['name']}.json.gz"
            data = json.dumps(schema, separators=(",", ":"), sort_keys=True).encode()
            path.write_bytes(gzip.compress(data, mtime=0))
            print(path, path.stat().st_size)


if __name__ == "__main__":
    main(*sys.argv[1:])
