"""The three PATCH content types the apiserver accepts: JSON merge (RFC 7386), strategic merge and JSON patch.

Strategic merge is what ``kubectl patch`` and ``kubectl label`` send by default; treating it as a plain merge
patch would replace a pod's whole container list when a user patches one container, so lists with a known
merge key are merged by that key, as the Kubernetes Go types declare.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from .errors import ApiError, bad_request

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"

# Field name → merge key, from the `patchMergeKey` tags of k8s.io/api (the subset the runbooks' kinds use).
_MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "taints": "key",
    "addresses": "type",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
}
# Primitive lists with patchStrategy=merge (union instead of replace).
_MERGE_PRIMITIVES = {"finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge(target: Any, patch: Any, field: str = "") -> Any:
    if isinstance(patch, dict):
        if patch.get("$patch") == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
        if patch.get("$patch") == "delete":
            return None
        result = dict(target) if isinstance(target, dict) else {}
        for key, value in patch.items():
            if key.startswith("$") and key != "$patch":
                if key.startswith("$deleteFromPrimitiveList/"):
                    name = key.split("/", 1)[1]
                    result[name] = [x for x in result.get(name) or [] if x not in value]
                continue
            if key == "$patch":
                continue
            if value is None:
                result.pop(key, None)
            else:
                merged = strategic_merge(result.get(key), value, key)
                if merged is None and isinstance(value, dict) and value.get("$patch") == "delete":
                    result.pop(key, None)
                else:
                    result[key] = merged
        return result
    if isinstance(patch, list):
        cur = target if isinstance(target, list) else []
        if field in _MERGE_PRIMITIVES:
            return cur + [x for x in patch if x not in cur]
        mkey = _MERGE_KEYS.get(field)
        if not mkey or not all(isinstance(x, dict) for x in patch):
            return copy.deepcopy([x for x in patch if not (isinstance(x, dict) and "$patch" in x)])
        if any(isinstance(x, dict) and x.get("$patch") == "replace" for x in patch):
            return [copy.deepcopy(x) for x in patch if x.get("$patch") != "replace"]
        out = [copy.deepcopy(x) for x in cur]
        for item in patch:
            idx = next(
                (i for i, x in enumerate(out) if isinstance(x, dict) and x.get(mkey) == item.get(mkey)), None
            )
            if item.get("$patch") == "delete":
                if idx is not None:
                    out.pop(idx)
            elif idx is None:
                out.append({k: v for k, v in item.items() if k != "$patch"})
            else:
                out[idx] = strategic_merge(out[idx], item, "")
        return out
    return copy.deepcopy(patch)


def apply_patch(obj: dict[str, Any], content_type: str, body: Any) -> dict[str, Any]:
    ctype = content_type.split(";", maxsplit=1)[0].strip()
    if ctype == JSON:
        if not isinstance(body, list):
            raise bad_request("json: cannot unmarshal object into Go value of type []handlers.jsonPatchOp")
        try:
            result = jsonpatch.apply_patch(obj, body)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise ApiError(
                422, "Invalid", f"the server rejected our request due to an error in our request: {exc}"
            ) from exc
        return dict(result)
    if not isinstance(body, dict):
        raise bad_request("json: cannot unmarshal array into Go value of type map[string]interface {}")
    if ctype == MERGE:
        return dict(merge_patch(obj, body))
    if ctype in (STRATEGIC, APPLY):
        return dict(strategic_merge(obj, body))
    raise ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: {JSON}, {MERGE}, "
        f'{STRATEGIC}, {APPLY}; got "{ctype}"',
    )
