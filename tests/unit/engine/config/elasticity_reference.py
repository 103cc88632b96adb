"""Writes tests/unit/engine/config/elasticity_table.h: DeepSpeed's elastic batch computation
(deepspeed/elasticity/elasticity.py, compute_elastic_config and _get_compatible_gpus_v02) run on
a list of elasticity sections and world sizes, for tests/unit/engine/config/elasticity_test.cc.

DeepSpeed 0.19.8 removed its elasticity package (its runtime refuses the section), so the
package is taken from a DeepSpeed source tree that still has it (the last version with it:
commit edaa72212 of deepspeedai/DeepSpeed, 0.19.6 and later, with #8237 "Keep the elastic batch
size within max_train_batch_size") and imported under the installed deepspeed package, whose
logger and version it uses:

  DS_ACCELERATOR=cpu /work/main/build/torch-venv/bin/python \
      tests/unit/engine/config/elasticity_reference.py DEEPSPEED_SRC \
      > tests/unit/engine/config/elasticity_table.h

DEEPSPEED_SRC is the root of the DeepSpeed checkout (it holds deepspeed/elasticity/); when it is
not a git checkout (the three files exported with `git show COMMIT:deepspeed/elasticity/F.py`),
DEEPSPEED_COMMIT names the commit they came from.
"""
import importlib.util
import json
import logging
import os
import random
import subprocess
import sys
import types

import deepspeed  # noqa: F401  (the parent package: git_version_info, utils.logger)


def load_elasticity(src):
    pkg_dir = os.path.join(src, "deepspeed", "elasticity")
    pkg = types.ModuleType("deepspeed.elasticity")
    pkg.__path__ = [pkg_dir]
    sys.modules["deepspeed.elasticity"] = pkg
    mods = {}
    for name in ("constants", "config", "elasticity"):
        spec = importlib.util.spec_from_file_location(f"deepspeed.elasticity.{name}",
                                                      os.path.join(pkg_dir, name + ".py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        mods[name] = mod
    return mods


def source_commit(src):
    if os.environ.get("DEEPSPEED_COMMIT"):
        return os.environ["DEEPSPEED_COMMIT"]
    try:
        return subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def base(**kw):
    c = {"enabled": True, "max_train_batch_size": 2000, "micro_batch_sizes": [2, 4, 6],
         "min_gpus": 1, "max_gpus": 10000, "min_time": 20, "version": 0.1}
    c.update(kw)
    return c


DS_TEST = dict(max_train_batch_size=10000, micro_batch_sizes=[8, 12, 16, 17], min_gpus=32,
               max_gpus=1500)

# (elasticity section, world sizes): world 0 asks for the batch and the valid sizes only.
HAND = [
    # DeepSpeed's own tests (tests/unit/elasticity/test_elastic.py).
    (base(**DS_TEST), [0, 64, 128, 32, 1500]),
    (base(**DS_TEST, prefer_larger_batch=False), [0, 64, 34]),
    (base(max_train_batch_size=32, micro_batch_sizes=[1, 2, 3, 7]), [0, 4, 7, 1]),
    (base(max_train_batch_size=100, micro_batch_sizes=[8, 10, 12]), [0, 1, 5, 12]),
    # The documented example, both preferences.
    (base(), [0, 1, 2, 3, 7, 8, 10, 11]),
    (base(prefer_larger_batch=False), [0, 1, 2, 3, 7]),
    (base(max_gpus=16), [0, 16, 32]),
    (base(min_gpus=4, max_gpus=12), [0, 3, 4, 12]),
    # One micro-batch size; a cap that is itself a candidate; a cap past the last HCN.
    (base(max_train_batch_size=96, micro_batch_sizes=[3]), [0, 1, 32, 5]),
    (base(max_train_batch_size=24, micro_batch_sizes=[24]), [0, 1]),
    (base(max_train_batch_size=2000000, micro_batch_sizes=[1], max_gpus=64), [0, 64, 63]),
    (base(max_train_batch_size=1500000, micro_batch_sizes=[2, 3], max_gpus=100), [0, 96]),
    # Errors: a micro-batch above the cap; no world size in [min_gpus, max_gpus] (an empty
    # list with prefer_larger_batch, None without); model parallelism in v0.1; versions.
    (base(max_train_batch_size=10, micro_batch_sizes=[4, 16]), [0, 2]),
    (base(max_train_batch_size=100, micro_batch_sizes=[7], min_gpus=1000, max_gpus=1000),
     [0, 1000]),
    (base(max_train_batch_size=100, micro_batch_sizes=[7], min_gpus=1000, max_gpus=1000,
          prefer_larger_batch=False), [0, 1000]),
    (base(model_parallel_size=4, num_gpus_per_node=8), [0]),
    (base(version=0.3), [0]),
    (base(version=0.15), [0]),
    # v0.2, one GPU per node: the valid sizes, and any other world with its own batch.
    (base(version=0.2), [1, 2, 3, 7, 8, 11, 13]),
    (base(version=0.2, prefer_larger_batch=False), [1, 3, 7, 11]),
    (base(version=0.2, **DS_TEST), [32, 64, 128, 33, 1500, 1499]),
    (base(version=0.2, max_train_batch_size=100, micro_batch_sizes=[8, 10, 12]), [1, 5, 7, 9]),
    # v0.2 with several GPUs per node (model parallel 1).
    (base(version=0.2, num_gpus_per_node=4), [4, 8, 6, 12, 16, 1]),
    (base(version=0.2, num_gpus_per_node=8, max_gpus=4), [8, 16]),
    (base(version=0.2, num_gpus_per_node=4, min_gpus=2), [4, 2]),
    (base(version=0.2, num_gpus_per_node=4, max_train_batch_size=20, micro_batch_sizes=[6]),
     [4]),
    # v0.2 with model parallelism: DeepSpeed's entry compares the world size it is given with
    # data-parallel sizes.
    (base(version=0.2, model_parallel_size=4, num_gpus_per_node=8, **DS_TEST), [16, 64, 32]),
    (base(version=0.2, model_parallel_size=2, num_gpus_per_node=2), [2, 4, 8]),
    (base(version=0.2, model_parallel_size=16, num_gpus_per_node=8, **DS_TEST), [16]),
    (base(version=0.2, model_parallel_size=3, num_gpus_per_node=4), [12]),
    # v0.2: no valid node count, without prefer_larger_batch (DeepSpeed iterates None).
    (base(version=0.2, max_train_batch_size=100, micro_batch_sizes=[7], min_gpus=1000,
          max_gpus=1000, prefer_larger_batch=False), [1000]),
    (base(version=0.2, max_train_batch_size=100, micro_batch_sizes=[7], min_gpus=1000,
          max_gpus=1000), [1000, 3]),
]

# _get_compatible_gpus_v02 on its own for a number of GPUs: the batch and data-parallel sizes
# zerod uses with model parallelism (the entry above only for what it checks).
V02 = [
    (base(version=0.2, model_parallel_size=4, num_gpus_per_node=8, **DS_TEST), [64, 128, 96, 72]),
    (base(version=0.2, model_parallel_size=2, num_gpus_per_node=2), [2, 4, 6, 8, 14]),
    (base(version=0.2, model_parallel_size=2, num_gpus_per_node=8, prefer_larger_batch=False),
     [8, 16, 24]),
    (base(version=0.2, model_parallel_size=3, num_gpus_per_node=6, max_train_batch_size=500,
          micro_batch_sizes=[1, 5]), [6, 12, 18, 30]),
    (base(version=0.2, num_gpus_per_node=4), [4, 6, 8]),
]


def random_cases(rng, n):
    out = []
    for _ in range(n):
        micro = sorted(rng.sample(range(1, 33), rng.randint(1, 4)))
        version = rng.choice([0.1, 0.2])
        gpn, mp = 1, 1
        if version == 0.2:
            gpn = rng.choice([1, 2, 4, 8])
            mp = rng.choice([m for m in (1, 2, 4) if gpn % m == 0])
        dpn = gpn // mp
        cap = rng.randint(max(micro) * dpn, 6000)
        min_gpus = rng.choice([1, 1, 2, 4, 8])
        max_gpus = rng.choice([10000, rng.randint(min_gpus, 256)])
        c = base(max_train_batch_size=cap, micro_batch_sizes=micro, min_gpus=min_gpus,
                 max_gpus=max_gpus, version=version, prefer_larger_batch=rng.random() < 0.6,
                 num_gpus_per_node=gpn, model_parallel_size=mp)
        worlds = [] if version == 0.2 else [0]
        worlds += [rng.randint(1, 64) * mp for _ in range(3)]
        out.append((c, worlds))
    return out


def run_entry(el, c, world):
    ds_config = {"elasticity": c}
    try:
        r = el.compute_elastic_config(ds_config=ds_config, target_deepspeed_version="0.19.6",
                                      world_size=world)
    except Exception as e:  # noqa: BLE001  (the table records DeepSpeed's exception class)
        return {"error": type(e).__name__, "message": str(e)}
    if world == 0:
        batch, valid = r
        return {"batch": int(batch), "valid": None if valid is None else [int(v) for v in valid]}
    batch, valid, micro = r
    return {"batch": int(batch), "valid": [int(v) for v in valid], "micro": int(micro)}


def run_v02(el, c, gpus):
    try:
        batch, valid, _ = el._get_compatible_gpus_v02(
            micro_batches=c["micro_batch_sizes"], max_acceptable_batch_size=c["max_train_batch_size"],
            current_num_gpus=gpus, min_gpus=c["min_gpus"], max_gpus=c["max_gpus"],
            prefer_larger=c.get("prefer_larger_batch", True),
            num_gpus_per_node=c.get("num_gpus_per_node", 1),
            model_parallel_size=c.get("model_parallel_size", 1))
    except Exception as e:  # noqa: BLE001
        return {"error": type(e).__name__, "message": str(e)}
    return {"batch": int(batch), "valid": [int(v) for v in valid]}


def cxx_string(s):
    return json.dumps(s)  # a JSON string literal is a valid C++ one for this ASCII text


def row(kind, c, world, r):
    section = json.dumps(c, separators=(",", ":"))
    if "error" in r:
        return (f"    {{{kind}, R\"({section})\", {world}, -1, {{}}, 0, "
                f"{cxx_string(r['error'])}}},")
    valid = r["valid"]
    valid_text = "{}" if not valid else "{" + ", ".join(map(str, valid)) + "}"
    none = "\"None\"" if valid is None else "\"\""
    return (f"    {{{kind}, R\"({section})\", {world}, {r['batch']}, {valid_text}, "
            f"{r.get('micro', 0)}, {none}}},")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    src = sys.argv[1]
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    el = load_elasticity(src)["elasticity"]
    rng = random.Random(25)
    lines = []
    for c, worlds in HAND + random_cases(rng, 60):
        for w in worlds:
            r = run_entry(el, c, w)
            lines.append(row("kEntry", c, w, r))
            # A random v0.1 world is seldom valid: one of the valid ones too.
            if w == 0 and (c, worlds) not in HAND and r.get("valid"):
                v = rng.choice(r["valid"])
                lines.append(row("kEntry", c, v, run_entry(el, c, v)))
    for c, gpus_list in V02:
        for g in gpus_list:
            lines.append(row("kV02", c, g, run_v02(el, c, g)))
    print(f"""// Generated by tests/unit/engine/config/elasticity_reference.py (do not edit): DeepSpeed's
// deepspeed/elasticity/elasticity.py at commit {source_commit(src)[:12]} of deepspeedai/DeepSpeed
// (DeepSpeed 0.19.8 removed the package), imported under deepspeed {deepspeed.__version__} in
// /work/main/build/torch-venv with DS_ACCELERATOR=cpu. {len(lines)} rows.
//
// kEntry: compute_elastic_config(ds_config={{"elasticity": SECTION}}, world_size=WORLD) ->
//   (batch, valid, micro) (micro 0 when WORLD is 0), or the exception class DeepSpeed raised.
// kV02: _get_compatible_gpus_v02(..., current_num_gpus=WORLD) -> (batch, valid data-parallel
//   sizes), or the exception class.
// error "None": DeepSpeed returned None for the valid list.
#pragma once

#include <cstdint>
#include <vector>

namespace zerod::elasticity_table {{

enum Kind {{ kEntry, kV02 }};

struct Row {{
  Kind kind;
  const char* section;  // the "elasticity" object, JSON
  int64_t world;
  int64_t batch;  // -1: DeepSpeed raised `error`
  std::vector<int64_t> valid;
  int64_t micro;
  const char* error;  // the exception class; "None": the valid list was None
}};

// clang-format off
inline const std::vector<Row>& rows() {{
  static const std::vector<Row> kRows = {{""")
    print("\n".join(lines))
    print("""  };
  return kRows;
}
// clang-format on

}  // namespace zerod::elasticity_table""")


if __name__ == "__main__":
    main()
