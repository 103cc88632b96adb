// The launch topology of one zerod process (DESIGN.md section 4): how many nodes, which one
// this is, how many local ranks (threads) it runs, and where the rendezvous master listens.
//
// zerod is ONE process per node; its local ranks are threads. The topology comes from the
// `zerod train` flags; a value no flag gives is read from the launcher that started zerod,
// looked up in this order (the innermost launcher first):
//
//   torchrun  (WORLD_SIZE and RANK set)  start it with `torchrun --nproc-per-node 1`: then
//             WORLD_SIZE = nodes, RANK = node rank, master = MASTER_ADDR:MASTER_PORT.
//             LOCAL_WORLD_SIZE > 1 (several zerods per node) is refused with a message saying
//             to use torchrun --nproc-per-node 1 and zerod --nproc-per-node N instead.
//             torchrun's own agent already serves a store on MASTER_PORT when
//             TORCHELASTIC_USE_AGENT_STORE=True; zerod's rendezvous then uses MASTER_PORT + 1.
//   Open MPI  (OMPI_COMM_WORLD_SIZE set) one process per node (mpirun --npernode 1):
//             OMPI_COMM_WORLD_SIZE = nodes, OMPI_COMM_WORLD_RANK = node rank; the master is
//             MASTER_ADDR (required when there are several nodes) : MASTER_PORT (or 29500).
//             OMPI_COMM_WORLD_LOCAL_SIZE > 1 is refused like torchrun's.
//   Slurm     (SLURM_NTASKS and SLURM_PROCID set) one task per node (srun --ntasks-per-node 1):
//             SLURM_NTASKS = nodes, SLURM_PROCID = node rank; the master is MASTER_ADDR or
//             else the first host of SLURM_JOB_NODELIST, port MASTER_PORT or 29500. A task
//             whose SLURM_NODEID differs from its SLURM_PROCID (several tasks per node) is
//             refused.
//
// Flags and launcher variables must agree: --nnodes 2 under SLURM_NTASKS=4 is an error.
// --master overrides the launcher's master (MASTER_ADDR may be left over from elsewhere).
// --nnodes M > 1 without --node-rank leaves node_rank = -1: the master assigns one at join.
// Every inconsistency is an InputError (exit code 2) naming the flag or variable and values.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>

namespace zerod {

constexpr int kDefaultMasterPort = 29500;
constexpr const char* kDefaultMasterHost = "127.0.0.1";

// The `zerod train` flags, as given (nullopt: absent).
struct LaunchFlags {
  std::optional<int> nnodes;
  std::optional<int> node_rank;  // -1 is allowed: assign at join
  std::optional<int> nproc_per_node;
  std::optional<std::string> master;  // "HOST:PORT", "[v6addr]:PORT"
};

struct LaunchSpec {
  int nnodes = 1;
  int node_rank = 0;  // -1: assigned by the master at join
  int nproc_per_node = 1;
  std::string master_host = kDefaultMasterHost;
  int master_port = kDefaultMasterPort;
  // Where the topology came from: "flags", "torchrun", "slurm", "openmpi" or "default".
  std::string source = "default";

  int world_size() const { return nnodes * nproc_per_node; }
  // "HOST:PORT" ("[::1]:29500" for IPv6 literals), as gRPC and messages want it.
  std::string master_address() const;
};

using EnvMap = std::map<std::string, std::string>;

// The process environment as a map.
EnvMap from_process_env();

// Resolves and validates the topology (see the top of this file). Throws InputError.
LaunchSpec resolve_launch(const LaunchFlags& flags, const EnvMap& env);

// "HOST:PORT" -> {host, port}; IPv6 literals in brackets. `what` names the source in errors
// ("--master", "MASTER_ADDR/MASTER_PORT"). min_port 0 accepts port 0 (listen on any free
// port). Throws InputError.
std::pair<std::string, int> parse_host_port(const std::string& text, const std::string& what,
                                            int min_port = 1);

// A TCP port (min_port..65535) from text; throws InputError naming `what` and the text.
int parse_port(const std::string& text, const std::string& what, int min_port = 1);

// "HOST:PORT", bracketing an IPv6 literal host.
std::string join_host_port(const std::string& host, int port);

}  // namespace zerod
