// Fault injection for tests of the real binaries: named points in the I/O paths where a test
// makes the Nth arrival fail (an errno) or kill the process (SIGKILL, as a crash or an OOM kill
// would), to prove that a full disk or a crash at any write of a save loses nothing.
//
//   ZEROD_FAULTS="save.write@3=enospc"           the 3rd write of this process fails: ENOSPC
//   ZEROD_FAULTS="save.rename@2=kill,save.fsync@1=eio"
//
// Points (each counts its arrivals per process, from 1):
//   save.write     a write(2) of a checkpoint or export file (rank files, manifest, latest)
//   save.fsync     an fsync of such a file or of its directory
//   save.rename    a rename that publishes a save (TAG.tmp -> TAG, latest.tmp -> latest)
//   save.rank_file a rank's file of a synchronous save is complete, before the commit (kill)
//   expert.all_to_all  an expert-parallel exchange of rows (dispatch or combine, forward or
//                  backward) is about to start (kill: a rank dies inside the MoE dispatch)
// Actions: enospc, edquot, eio (the operation fails with that errno), kill (SIGKILL).
// "count" among the entries makes the process print its arrivals at each point when it exits.
// Without ZEROD_FAULTS (production), a point is one atomic load.
#pragma once

#include <string>
#include <string_view>

namespace zerod {

// Called where the operation would happen: 0 to go on, else the errno it must fail with.
// A `kill` action does not return.
int fault_point(std::string_view name);

// Tests in one process: replaces the spec (same syntax as ZEROD_FAULTS; "" disarms) and resets
// every counter. Throws InputError naming a malformed entry.
void set_faults(const std::string& spec);

// How often `name` was reached since the last set_faults (or start); counted only while some
// spec is set (set_faults("count") counts without injecting anything).
int fault_hits(std::string_view name);

}  // namespace zerod
