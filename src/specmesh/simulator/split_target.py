"""`specmesh simulate --method easyspec|tree --tp N`: EasySpec against exact tree drafting under a target split
over N devices, on a virtual clock (simulated).

The real methods run here on the real models (greedy), so every token, acceptance and round is the real
algorithm's: `easyspec` with its draft's middle layers in groups of up to N (a group needs a device per
attention), and `tree` growing the same tree (gamma, tree_width, max_children) exactly. Only time is
modelled, per round, from the profile's costs for the paper's setting (TP_CLUSTER):

* target step on N devices: layers x (layer_ms / N + 2 all-reduces), the same for up to 64 tokens
  (memory-bound), plus the all-reduce cost of N devices;
* an exact draft forward (one device, as the drafts run fastest there): layers x (attention + MLP);
* a layer-parallel draft forward: each group of g layers costs one attention (the g run at once on g
  devices), an all-gather of their outputs over g devices, then g MLPs; one-layer groups as exact;
* a round: the draft forwards the real run made per round, then one verification. For `easyspec`, the
  forwards that read exactly (a round's first, reading the accepted tokens again: bonus calibration) as the
  real run counted them under its calibration policy: every round under `round` (the default), only rounds
  after a rejection under `mismatch`.

TP_CLUSTER's figures come from the paper's own TP table (Wu et al., NeurIPS 2025, tokens/s on A100s):
Llama-3-70B at 8.39 tok/s on one device is 1.49 ms per layer (80 layers); 13.00 / 13.23 / 13.23 tok/s at
TP 2 / 4 / 8 then leave 0.108 / 0.286 / 0.379 ms per all-reduce (two a layer). Llama-3-8B at 36.76 tok/s
on one device is 0.85 ms per layer (32 layers), split 0.44 ms attention / 0.41 ms MLP: the attention's share
of the weight bytes (19%) of the 8 ms that reading 16 GB takes at 2 TB/s, plus its share of the kernel
launches (28 of 43) of the remaining 19 ms. The launches are counted in the authors' eager decoder layer
(EasyInfra, llama3_hyperdraft): attention = RMSNorm 8, q/k/v 3, rotary 10, cache 2, repeat_kv 2, SDPA 1,
flatten 1, o 1; MLP = RMSNorm 8, gate, up, SiLU, product, down 5, two residual adds. An all-gather of a
group's small outputs is taken to cost what an all-reduce does over as many devices (both latency-bound).
Or a JSON file of this shape (`--profile`).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specmesh.proposers.fuzzy_draft import default_groups

TP_CLUSTER = {"name": "gpu-cluster", "target_layers": 80, "target_layer_ms": 1.49, "flat_tokens": 64,
              "all_reduce_ms": {"1": 0.0, "2": 0.108, "4": 0.286, "8": 0.379},
              "draft_layers": 32, "draft_attention_ms": 0.44, "draft_mlp_ms": 0.41}
TREE = {"gamma": 5, "tree_width": 3, "max_children": 2, "min_prob": 0.0, "lookup": 0}   # easyspec's tree, for both


def load_profile(cls, spec: str, cluster: dict, local: Path | None = None):
    """A profile (`cls`, a dataclass): `cluster`'s fields for "gpu-cluster", the `local` file's for "local" (measured
    by `specmesh simulate --calibrate`, where the simulation has one), else a JSON file's of that shape."""
    if spec == "gpu-cluster":
        return cls(**cluster)
    if spec == "local" and local is None:
        raise ValueError("--profile local holds the pipeline methods' costs (pipedec, pp, stpp): give gpu-cluster "
                         "or a JSON file of its shape")
    path = local if spec == "local" else Path(spec)
    if not path.is_file():
        hint = " (run `specmesh simulate --calibrate` to measure it)" if spec == "local" else \
            " (gpu-cluster, local or a JSON file)"
        raise FileNotFoundError(f"profile not found: {path}{hint}")
    try:
        fields = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"profile {path} is not valid JSON: {e}") from None
    names = {f.name for f in dataclasses.fields(cls)}
    needed = {f.name for f in dataclasses.fields(cls)
              if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    if not isinstance(fields, dict) or needed - set(fields) or set(fields) - names:
        keys = set(fields) if isinstance(fields, dict) else set()
        raise ValueError(f"profile {path} does not fit this simulation: it needs {', '.join(sorted(needed - keys))}"
                         f"{'; unknown: ' + ', '.join(sorted(keys - names)) if keys - names else ''} "
                         f"(the gpu-cluster profile's fields)")
    return cls(**fields)


@dataclass
class TPProfile:
    name: str
    target_layers: int
    target_layer_ms: float
    flat_tokens: int
    all_reduce_ms: dict
    draft_layers: int
    draft_attention_ms: float
    draft_mlp_ms: float

    @classmethod
    def load(cls, spec: str) -> "TPProfile":
        return load_profile(cls, spec, TP_CLUSTER)

    def collective_ms(self, devices: int) -> float:
        """An all-reduce (or all-gather) of a few tokens' activations over `devices`, interpolated in log2."""
        points = sorted((int(n), ms) for n, ms in self.all_reduce_ms.items())
        return float(np.interp(np.log2(devices), [np.log2(n) for n, _ in points], [ms for _, ms in points]))

    def target_ms(self, devices: int, tokens: int) -> float:
        """One target forward of `tokens` new tokens split over `devices`."""
        wide = max(1.0, tokens / self.flat_tokens)
        return self.target_layers * (self.target_layer_ms * wide / devices + 2 * self.collective_ms(devices))

    def exact_draft_ms(self) -> float:
        return self.draft_layers * (self.draft_attention_ms + self.draft_mlp_ms)

    def fuzzy_draft_ms(self, devices: int) -> float:
        """A layer-parallel draft forward, its middle layers in groups of up to `devices`."""
        ms = 0.0
        for g in default_groups(self.draft_layers, devices):
            ms += self.draft_attention_ms + g * self.draft_mlp_ms + (self.collective_ms(g) if g > 1 else 0.0)
        return ms


def counts(outs: list) -> dict:
    """What the clock needs of a run's outputs."""
    total = lambda key: sum(getattr(o.stats, key) for o in outs)
    return {"tokens": total("generated_tokens"), "rounds": total("verifications"),
            "draft_forwards": total("draft_forwards"), "drafted": total("drafted_tokens"),
            "accepted": total("accepted_tokens"), "exact_reads": sum(o.stats.info.get("exact_reads", 0) for o in outs)}


def real_runs(method: str, devices: list[int], prompts: list[str], max_new_tokens: int, target: str | None,
              draft: str | None, calibration: str) -> tuple[dict, dict[int, tuple[str, dict]]]:
    """The real methods' greedy runs on `prompts`: exact `tree`'s counts, and per device count the layer
    groups easyspec's draft gets there (its middle layers in groups of up to that many) with its counts."""
    from specmesh import LLM, SamplingParams, methods
    params = SamplingParams(max_new_tokens=max_new_tokens)
    with LLM(target=target, draft=draft, method="tree", **TREE) as llm:
        tree, per_devices, runs = counts(llm.generate(prompts, params)), {}, {}
        if method == "easyspec":
            depth = llm.models.draft.config.num_layers
            for n in devices:
                groups = ",".join(map(str, default_groups(depth, n)))
                if groups not in runs:
                    llm.method = methods.get("easyspec", TREE | {"layer_groups": groups, "calibration": calibration})
                    runs[groups] = counts(llm.generate(prompts, params))
                per_devices[n] = (groups, runs[groups])
    return tree, per_devices


def clock(method: str, counts: dict, profile: TPProfile, devices: int) -> dict:
    """Simulated time of a run's rounds on `devices`."""
    rounds = max(1, counts["rounds"])
    forwards = counts["draft_forwards"] / rounds                 # draft forwards a round
    exact = counts["exact_reads"] / rounds if method == "easyspec" else forwards     # of them, exact
    draft = exact * profile.exact_draft_ms() + (forwards - exact) * profile.fuzzy_draft_ms(devices)
    verify = profile.target_ms(devices, round(1 + counts["drafted"] / rounds))
    ms = rounds * (draft + verify)
    plain = counts["tokens"] * profile.target_ms(devices, 1)      # TP alone: one target forward a token
    return {"draft_ms_per_round": draft, "verify_ms_per_round": verify, "ms_per_token": ms / counts["tokens"],
            "tokens_per_round": counts["tokens"] / rounds,
            "acceptance": counts["accepted"] / counts["drafted"] if counts["drafted"] else None,
            "exact_forwards_per_round": exact,
            "speedup_vs_tp": plain / ms}


def simulate_tp(method: str, devices: list[int], profile: TPProfile, prompts: list[str], max_new_tokens: int,
                target: str | None = None, draft: str | None = None, calibration: str = "round") -> dict:
    """`method` (easyspec or tree) on each device count, next to exact tree drafting of the same tree; the
    JSON of `specmesh simulate --tp`."""
    from specmesh import catalog
    rows = []
    tree, easyspec = real_runs(method, devices, prompts, max_new_tokens, target, draft, calibration)
    for n in devices:
        row = {"devices": n, "tree": clock("tree", tree, profile, n)}
        if method == "easyspec":
            groups, run = easyspec[n]
            es = row["easyspec"] = clock("easyspec", run, profile, n) | {"layer_groups": groups}
            row["draft_speedup_vs_tree"] = row["tree"]["draft_ms_per_round"] / es["draft_ms_per_round"]
            row["speedup_vs_tree"] = row["tree"]["ms_per_token"] / es["ms_per_token"]
        rows.append(row)
    return {"simulated": True, "method": method, "profile": profile.name, "tree": TREE, "calibration": calibration,
            "target": catalog.served_name(target),
            "prompts": len(prompts), "max_new_tokens": max_new_tokens, "rows": rows}


def print_tp(result: dict, file) -> None:
    print(f"[simulated, profile {result['profile']}] {result['method']} vs exact tree drafting of the same tree "
          f"{result['tree']}, target {result['target']} (token behaviour: real runs here)", file=file)
    for row in result["rows"]:
        t = row["tree"]
        line = (f"  {row['devices']} devices: tree {t['ms_per_token']:.2f} ms/token "
                f"({t['speedup_vs_tp']:.2f}x TP alone, draft {t['draft_ms_per_round']:.1f} ms/round, "
                f"acceptance {t['acceptance']:.2f})")
        if "easyspec" in row:
            e = row["easyspec"]
            line += (f"; easyspec [{e['layer_groups']}, calibration {result['calibration']}: "
                     f"{e['exact_forwards_per_round']:.2f} exact forwards a round] {e['ms_per_token']:.2f} ms/token "
                     f"({e['speedup_vs_tp']:.2f}x TP, draft {e['draft_ms_per_round']:.1f} ms/round, "
                     f"acceptance {e['acceptance']:.2f}): drafting {row['draft_speedup_vs_tree']:.2f}x, "
                     f"end to end {row['speedup_vs_tree']:.2f}x tree")
        print(line, file=file)
