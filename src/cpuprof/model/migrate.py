"""Older profile formats, brought up to the current one.

Each step takes the JSON of one version and returns the JSON of the next, so a profile written
by any release loads in every later one. Version 1 (cpuprof 0.1) kept op inputs as text, regions
as "a/b" strings, idle threads among the others, and settings and workload as free-form dicts.
"""

from __future__ import annotations

import re
from typing import Any

from .machine import parse_cpulist

UNKNOWN = "unknown"


def v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"format": data["format"], "version": 2}
    meta = data.get("meta") or {}
    out["meta"] = {
        "created": meta.get("created", UNKNOWN), "cpuprof_version": meta.get("cpuprof_version", "0.1.0"),
        "torch_version": meta.get("torch_version"), "python": meta.get("python", UNKNOWN),
        "hostname": meta.get("hostname", UNKNOWN), "pid": meta.get("pid", 0), "argv": meta.get("argv", []),
    }
    status = data.get("status") or {"complete": True}
    out["status"] = {"complete": bool(status.get("complete", True)), "reason": status.get("reason")}
    collection = data["collection"]  # every version-1 file has one ("off" when not profiled)
    profiled = collection["mode"] != "off"
    if profiled:
        out.update(_v1_profiled_parts(data))
    settings = data.get("settings")
    out["settings"] = _v1_settings(settings) if settings else None
    workload = data.get("workload")
    out["workload"] = _v1_workload(workload) if workload else None
    return out


def _v1_profiled_parts(data: dict[str, Any]) -> dict[str, Any]:
    threads = data["threads"]
    keep = [i for i, t in enumerate(threads) if t["role"] != "idle"]
    new_index = {old: new for new, old in enumerate(keep)}
    caps = data.get("capabilities") or {}
    overhead = data["overhead"]
    limits = dict(data["limits"])
    limits.setdefault("max_threads", 64)  # version 1 monitored at most 64 threads
    spans = data.get("spans")
    if spans:
        spans = dict(spans)
        spans["thread"] = [new_index.get(t, -1) for t in spans["thread"]]
    collection = {k: v for k, v in data["collection"].items() if k != "sample_interval_us"}
    return {
        "collection": collection,
        "capabilities": {
            "hardware_pmu": caps.get("hardware_pmu"), "hardware_pmu_reason": caps.get("hardware_pmu_reason"),
            "perf_event_paranoid": caps.get("perf_event_paranoid"), "openmp": _v1_openmp(caps.get("openmp")),
            "cpus_online": caps.get("cpus_online"),
        },
        "threads": [
            {"tid": t["tid"], "name": t["name"], "role": t["role"], "counters": t["counters"],
             "scaled": t.get("scaled", []), "uncounted": t.get("uncounted", []), "opened_ns": t.get("opened_ns", 0)}
            for t in (threads[i] for i in keep)
        ],
        "idle_threads": [{"tid": t["tid"], "name": t["name"]} for t in threads if t["role"] == "idle"],
        "ops": [_v1_op(op, keep) for op in data["ops"]],
        "overhead": {"hook_ns": overhead["hook_ns"], "ops": overhead["ops"],
                     "discovery_cpu_ns": overhead.get("sampler_cpu_ns", 0),
                     "discovery_ticks": overhead.get("sampler_ticks", 0), "samples": overhead.get("samples", 0),
                     "method": overhead.get("method", "")},
        "limits": limits,
        "dropped_events": data.get("dropped_events", []),
        "spans": spans,
    }


def _v1_op(op: dict[str, Any], keep: list[int]) -> dict[str, Any]:
    def columns(table: dict[str, list[int]]) -> dict[str, list[int]]:
        return {event: [values[i] for i in keep] for event, values in table.items()}

    region = op.get("region")
    return {
        "id": op["id"], "kind": op["kind"], "name": op["name"], "region": region.split("/") if region else [],
        "calls": op["calls"], "incl_ns": op["incl_ns"], "self_ns": op["self_ns"], "max_ns": op["max_ns"],
        "counters_self": columns(op["counters_self"]), "counters_incl": columns(op["counters_incl"]),
        "inputs": parse_v1_shapes(op.get("shapes", "")), "inputs_truncated": False, "samples": op.get("samples", 0),
    }


_TENSOR = re.compile(r"\[([^\]]*)\]\s*(\S+)")
_SCALARS = {"None": "none", "int": "int", "float": "float", "bool": "bool", "ints": "int_list"}


def _split_top_level(text: str, sep: str) -> list[str]:
    """Splits at `sep` outside brackets and parentheses."""
    parts, depth, start = [], 0, 0
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i + len(sep)
            i = start
            continue
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _v1_input(text: str) -> dict[str, Any]:
    if text.startswith("(") and text.endswith(")"):
        items = [_v1_input(t) for t in _split_top_level(text[1:-1], ",") if t]
        return {"kind": "tensor_list", "items": items}
    match = _TENSOR.fullmatch(text)
    if match:
        dims, dtype = match.groups()
        if dims.strip() == "?":
            return {"kind": "unknown_shape", "dtype": dtype}
        sizes = [int(d) for d in dims.split(",") if d.strip()]
        return {"kind": "tensor", "dtype": dtype, "sizes": sizes, "strides": None}
    return {"kind": _SCALARS.get(text, "other")}


def parse_v1_shapes(text: str) -> list[dict[str, Any]] | None:
    """Version 1's "[1, 2048] bf16; [2048, 8192] bf16; int" back into inputs (no strides: v1
    did not record them). Text cut at the end of a full key is dropped from the last input on."""
    if not text or text == "?":
        return None
    inputs = []
    for part in _split_top_level(text, ";"):
        if part.endswith("…"):
            break
        inputs.append(_v1_input(part))
    return inputs


def _v1_openmp(openmp: dict[str, Any] | None) -> dict[str, Any]:
    openmp = openmp or {}

    def runtime(entry: dict[str, Any] | None) -> dict[str, Any] | None:
        if entry is None:
            return None
        ompt = entry.get("ompt")
        supports = ompt.startswith("yes") if isinstance(ompt, str) else entry["runtime"] != "libgomp"
        return {"runtime": entry["runtime"], "path": entry["path"], "ompt": supports}

    return {"loaded": [runtime(e) for e in openmp.get("loaded", [])], "active": runtime(openmp.get("active"))}


def _v1_topology(topo: dict[str, Any]) -> dict[str, Any]:
    return {
        "online_cpus": parse_cpulist(topo["online_cpus"]),
        "nodes": [{"id": n["id"], "cpus": parse_cpulist(n["cpus"]), "mem_total_bytes": n.get("mem_total_bytes"),
                   "mem_free_bytes": n.get("mem_free_bytes"), "distances": n.get("distances", {})}
                  for n in topo["nodes"]],
        "cpus": [{"id": c["id"], "node": c["node"], "package_id": c.get("package_id"), "core_id": c.get("core_id"),
                  "siblings": parse_cpulist(c["siblings"])} for c in topo["cpus"]],
        "model_name": topo.get("model_name"),
        "numa_in_sysfs": topo.get("numa_in_sysfs", True),
    }


def _v1_settings(settings: dict[str, Any]) -> dict[str, Any]:
    in_force = settings.get("in_force")
    if in_force:
        policy = in_force.get("mempolicy") or {}
        in_force = {
            "pid": in_force.get("pid", 0), "threads": in_force.get("threads", []),
            "mempolicy": {"mode": policy.get("mode", UNKNOWN), "nodes": policy.get("nodes", []),
                          "error": policy.get("error")},
            "openmp": _v1_openmp(in_force.get("openmp")), "allocators": in_force.get("allocators", []),
            "torch": in_force.get("torch"), "env": in_force.get("env", {}),
            "weight_pages": in_force.get("weight_pages"),
        }
    requested = dict(settings["requested"])
    requested["mempolicy"] = {"mode": requested["mempolicy"]["mode"], "nodes": requested["mempolicy"]["nodes"]}
    return {"requested": requested, "cpu_set": settings.get("cpu_set", UNKNOWN),
            "topology": _v1_topology(settings["topology"]), "in_force": in_force,
            "warnings": settings.get("warnings", [])}


def _v1_workload(wl: dict[str, Any]) -> dict[str, Any]:
    measured = max(0, wl.get("steps_done", 0) - wl.get("warmup_steps", 0))
    figures = None
    if wl.get("tokens_per_s"):
        figures = {"measured_steps": measured, "tokens_per_s": wl["tokens_per_s"], "p50_ms": wl.get("p50_ms", 0.0),
                   "p90_ms": wl.get("p90_ms", 0.0), "p99_ms": wl.get("p99_ms", 0.0)}
    source = wl.get("source", UNKNOWN)
    return {
        "model": {"name": wl.get("model", UNKNOWN), "source": source,
                  "architecture": "built-in Llama" if source.startswith("built-in") else UNKNOWN,
                  "dtype": wl.get("dtype", UNKNOWN), "params": wl.get("params", 0),
                  "weight_bytes": wl.get("weight_bytes", 0), "config": wl.get("config")},
        "batch": wl.get("batch", 1), "prompt_len": wl.get("prompt_len", 0), "new_tokens": wl.get("new_tokens", 0),
        "warmup_steps": wl.get("warmup_steps", 0), "sampling": wl.get("sampling", "greedy"),
        "steps_done": wl.get("steps_done", 0), "step_latencies_s": wl.get("step_latencies_s", []),
        "ttft_s": wl.get("ttft_s"), "decode_wall_s": wl.get("decode_wall_s"), "figures": figures,
        "bytes_read_per_token": wl.get("bytes_read_per_token"),
        "bytes_read_method": "analytic, from the model shape" if wl.get("bytes_read_per_token") else "",
        "build_s": wl.get("build_s"), "peak_rss_bytes": wl.get("peak_rss_bytes"),
    }


MIGRATIONS = {1: v1_to_v2}
