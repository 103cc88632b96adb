// The launch topology of one zerod process (DESIGN.md section 4): how many nodes, which one
// this is, how many local ranks (threads) it runs, and where the rendezvous master listens.
//
// A zerod "node" is one zerod process; its local ranks are threads. The topology comes from
// the `zerod train` flags; a value no flag gives is read from the launcher that started zerod,
// looked up in this order (the innermost launcher first). Every process a launcher starts is
// one node of --nproc-per-node ranks (default 1), so a launcher may start one zerod per machine
// (`--nproc-per-node N` threads each: the cheapest) or several (one rank each, like a PyTorch
// script): `torchrun --nproc-per-node 2 zerod train job.json` trains the losses of
// `zerod train job.json --nproc-per-node 2` bit for bit.
//
//   torchrun  (WORLD_SIZE and RANK set) WORLD_SIZE = nodes, RANK = node rank, master =
//             MASTER_ADDR:MASTER_PORT; LOCAL_WORLD_SIZE / LOCAL_RANK = zerods on this machine
//             and this one's index. torchrun's own agent serves its store on MASTER_PORT when
//             TORCHELASTIC_USE_AGENT_STORE=True (its default, static rendezvous): zerod's
//             rendezvous then listens on MASTER_PORT + 1, which every process derives alike.
//   Open MPI  (OMPI_COMM_WORLD_SIZE set) OMPI_COMM_WORLD_SIZE = nodes, OMPI_COMM_WORLD_RANK =
//             node rank, OMPI_COMM_WORLD_LOCAL_SIZE / _LOCAL_RANK = zerods on this machine; the
//             master is MASTER_ADDR (required when there are several nodes) : MASTER_PORT (or
//             29500).
//   Slurm     (SLURM_NTASKS and SLURM_PROCID set) SLURM_NTASKS = nodes, SLURM_PROCID = node
//             rank, SLURM_LOCALID = index on this machine, whose task count is this node's
//             entry (SLURM_NODEID) of SLURM_STEP_TASKS_PER_NODE ("2(x3),1"); the master is
//             MASTER_ADDR or else the first host of SLURM_JOB_NODELIST, port MASTER_PORT or
//             29500.
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
  // The zerod processes the launcher started on this machine and this one's index among them
  // (LOCAL_WORLD_SIZE/LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_*): they share its CPU
  // cores and GPUs. 1 and 0 without a launcher.
  int local_processes = 1;
  int local_process = 0;

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

// OpenMP threads for each local rank: the cores of this process's affinity mask (`cores`)
// shared by its ranks and, when the launcher started several zerods on this machine without
// binding them to their own CPUs (the mask still holds all `online` CPUs), by those processes.
int threads_per_rank(const LaunchSpec& spec, int cores, int online);

// The GPU, among the `visible` ones, of local rank `local_rank` of process `local_process` of
// `local_processes` zerods on this machine with `nproc_per_node` ranks each: when the process
// sees the GPUs of all of them, consecutive blocks (process p's rank r on GPU p x nproc + r);
// when it sees fewer (the launcher gave it its own, e.g. through CUDA_VISIBLE_DEVICES), GPU r.
int local_rank_gpu(int local_process, int local_processes, int nproc_per_node, int local_rank,
                   int visible);

// "HOST:PORT", bracketing an IPv6 literal host.
std::string join_host_port(const std::string& host, int port);

}  // namespace zerod
