"""``python -m d2ops_core.validation.schema``: print the manifest's JSON schema (docs/manifest.schema.json)."""

from __future__ import annotations

import json

from d2ops_core.validation.manifest import manifest_json_schema

if __name__ == "__main__":
    print(json.dumps(manifest_json_schema(), indent=2))
