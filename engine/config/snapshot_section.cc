// snapshot: zerod's in-memory snapshots of an elastic job (docs/elastic.md). Not a DeepSpeed
// section: DeepSpeed has no checkpointless recovery.
#include <fmt/format.h>

#include "engine/config/config_error.h"
#include "engine/config/sections.h"

namespace zerod::config {

void read_snapshot(ObjectReader& top, JobConfig& cfg) {
  const Json* obj = top.read_object("snapshot");
  if (obj == nullptr) return;
  SnapshotConfig& s = cfg.snapshot;
  ObjectReader r(*obj, "snapshot", top.problems());
  r.read_bool("enabled", s.enabled);
  if (s.enabled && !r.has("interval"))
    r.problems().error(r.path_of("interval"), "required when snapshot.enabled is true");
  r.read_int("interval", s.interval, int_between(1, int64_t{1} << 40));
  r.read_string("dir", s.dir, /*allow_empty=*/false);
  r.finish("keys");
}

}  // namespace zerod::config
