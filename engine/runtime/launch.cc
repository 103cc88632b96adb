#include "engine/runtime/launch.h"

#include <fmt/format.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "engine/runtime/nodelist.h"

extern char** environ;

namespace zerod {
namespace {

// One value and where it came from ("--nnodes", "WORLD_SIZE=4 (torchrun)"), for messages.
struct Sourced {
  int value = 0;
  std::string origin;
};

// What a launcher's variables say about the topology.
struct EnvTopology {
  std::string launcher;  // "torchrun", "openmpi", "slurm"
  Sourced nnodes;
  Sourced node_rank;
  std::optional<std::string> master_host;
  std::optional<int> master_port;
  std::string master_origin;   // e.g. "MASTER_ADDR/MASTER_PORT (torchrun)"
  std::string missing_master;  // hint when there is no master host
};

std::optional<std::string> get(const EnvMap& env, const char* name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

bool has(const EnvMap& env, const char* name) {
  return get(env, name).has_value();
}

// `name`='text' (`where`) in messages.
int parse_int(const std::string& text, const std::string& name, const std::string& where) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || end == text.c_str() || *end != '\0' || errno == ERANGE || v < INT_MIN ||
      v > INT_MAX)
    ZD_THROW_INPUT("{}='{}' ({}) is not an integer", name, text, where);
  return static_cast<int>(v);
}

Sourced env_int(const EnvMap& env, const char* name, const std::string& launcher) {
  const std::string text = *get(env, name);
  const int v = parse_int(text, name, fmt::format("set by {}", launcher));
  return {v, fmt::format("{}={} ({})", name, v, launcher)};
}

// One zerod process per node: a launcher that started several per node is refused.
void require_one_process_per_node(int local_size, int local_rank, const std::string& what,
                                  const std::string& how) {
  if (local_size > 1)
    ZD_THROW_INPUT(
        "{} says {} processes run on this node, but zerod runs one process per node with its "
        "local ranks as threads: {}, and pass --nproc-per-node {} to zerod",
        what, local_size, how, local_size);
  if (local_rank != 0)
    ZD_THROW_INPUT("{}: this process has local rank {}, but zerod runs one process per node: {}",
                   what, local_rank, how);
}

void read_master(const EnvMap& env, EnvTopology& t) {
  t.master_origin = fmt::format("MASTER_ADDR/MASTER_PORT ({})", t.launcher);
  t.master_host = get(env, "MASTER_ADDR");
  if (auto port = get(env, "MASTER_PORT"))
    t.master_port = parse_port(*port, fmt::format("MASTER_PORT (set by {})", t.launcher));
}

std::optional<EnvTopology> from_torchrun(const EnvMap& env) {
  if (!has(env, "WORLD_SIZE") || !has(env, "RANK")) return std::nullopt;
  EnvTopology t;
  t.launcher = "torchrun";
  t.nnodes = env_int(env, "WORLD_SIZE", t.launcher);
  t.node_rank = env_int(env, "RANK", t.launcher);
  const int local_size =
      has(env, "LOCAL_WORLD_SIZE") ? env_int(env, "LOCAL_WORLD_SIZE", t.launcher).value : 1;
  const int local_rank = has(env, "LOCAL_RANK") ? env_int(env, "LOCAL_RANK", t.launcher).value : 0;
  require_one_process_per_node(local_size, local_rank, "torchrun (LOCAL_WORLD_SIZE/LOCAL_RANK)",
                               "start zerod with `torchrun --nproc-per-node 1`");
  read_master(env, t);
  // torchrun's agent serves its own store on MASTER_PORT and tells workers to use it.
  const auto agent_store = get(env, "TORCHELASTIC_USE_AGENT_STORE");
  if (t.master_port && agent_store &&
      (*agent_store == "True" || *agent_store == "true" || *agent_store == "1")) {
    if (*t.master_port >= 65535)
      ZD_THROW_INPUT(
          "MASTER_PORT={} (torchrun): zerod's rendezvous uses MASTER_PORT + 1 next to torchrun's "
          "store, which is not a valid port; pick a lower --master-port for torchrun",
          *t.master_port);
    t.master_port = *t.master_port + 1;
    t.master_origin =
        fmt::format("MASTER_ADDR/MASTER_PORT+1 (torchrun's agent store is on MASTER_PORT)");
  }
  t.missing_master = "torchrun did not set MASTER_ADDR";
  return t;
}

std::optional<EnvTopology> from_openmpi(const EnvMap& env) {
  if (!has(env, "OMPI_COMM_WORLD_SIZE")) return std::nullopt;
  EnvTopology t;
  t.launcher = "openmpi";
  if (!has(env, "OMPI_COMM_WORLD_RANK"))
    ZD_THROW_INPUT("OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not (openmpi)");
  t.nnodes = env_int(env, "OMPI_COMM_WORLD_SIZE", t.launcher);
  t.node_rank = env_int(env, "OMPI_COMM_WORLD_RANK", t.launcher);
  const int local_size = has(env, "OMPI_COMM_WORLD_LOCAL_SIZE")
                             ? env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", t.launcher).value
                             : 1;
  const int local_rank = has(env, "OMPI_COMM_WORLD_LOCAL_RANK")
                             ? env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", t.launcher).value
                             : 0;
  require_one_process_per_node(local_size, local_rank,
                               "Open MPI (OMPI_COMM_WORLD_LOCAL_SIZE/LOCAL_RANK)",
                               "start zerod with `mpirun --npernode 1`");
  read_master(env, t);
  t.missing_master =
      "under Open MPI set MASTER_ADDR (and MASTER_PORT) for every process, e.g. `mpirun -x "
      "MASTER_ADDR=host0 -x MASTER_PORT=29500`";
  return t;
}

std::optional<EnvTopology> from_slurm(const EnvMap& env) {
  if (!has(env, "SLURM_NTASKS") || !has(env, "SLURM_PROCID")) return std::nullopt;
  EnvTopology t;
  t.launcher = "slurm";
  t.nnodes = env_int(env, "SLURM_NTASKS", t.launcher);
  t.node_rank = env_int(env, "SLURM_PROCID", t.launcher);
  const std::string how = "start zerod with `srun --ntasks-per-node 1`";
  if (has(env, "SLURM_NODEID")) {
    const Sourced node_id = env_int(env, "SLURM_NODEID", t.launcher);
    if (node_id.value != t.node_rank.value)
      ZD_THROW_INPUT(
          "Slurm runs several zerod tasks per node ({} runs on {}), but zerod runs one process "
          "per node with its local ranks as threads: {} and pass --nproc-per-node",
          t.node_rank.origin, node_id.origin, how);
  }
  if (has(env, "SLURM_NNODES")) {
    const Sourced nn = env_int(env, "SLURM_NNODES", t.launcher);
    if (nn.value != t.nnodes.value)
      ZD_THROW_INPUT(
          "Slurm started {} tasks on {} nodes ({}, {}), but zerod runs one process per node: {} "
          "and pass --nproc-per-node",
          t.nnodes.value, nn.value, t.nnodes.origin, nn.origin, how);
  }
  read_master(env, t);
  if (!t.master_host) {
    const char* var = has(env, "SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST" : "SLURM_NODELIST";
    if (auto list = get(env, var)) {
      const std::vector<std::string> hosts = expand_slurm_nodelist(*list);
      t.master_host = hosts.front();  // expand_slurm_nodelist never returns an empty list
      t.master_origin = fmt::format("the first host of {} and {}", var,
                                    t.master_port ? "MASTER_PORT" : "the default port");
    }
  }
  t.missing_master = "Slurm set neither MASTER_ADDR nor SLURM_JOB_NODELIST";
  return t;
}

std::optional<EnvTopology> detect_launcher(const EnvMap& env) {
  if (auto t = from_torchrun(env)) return t;
  if (auto t = from_openmpi(env)) return t;
  return from_slurm(env);
}

}  // namespace

std::string join_host_port(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

std::string LaunchSpec::master_address() const {
  return join_host_port(master_host, master_port);
}

EnvMap from_process_env() {
  EnvMap env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

int parse_port(const std::string& text, const std::string& what, int min_port) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || end == text.c_str() || *end != '\0' || errno == ERANGE || v < min_port ||
      v > 65535)
    ZD_THROW_INPUT("{}: port '{}' is not a TCP port (expected {}..65535)", what, text, min_port);
  return static_cast<int>(v);
}

std::pair<std::string, int> parse_host_port(const std::string& text, const std::string& what,
                                            int min_port) {
  std::string host;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      ZD_THROW_INPUT("{} '{}': expected [IPV6]:PORT", what, text);
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos)
      ZD_THROW_INPUT("{} '{}': expected HOST:PORT (e.g. 10.0.0.1:29500)", what, text);
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string::npos)
      ZD_THROW_INPUT("{} '{}': write an IPv6 address in brackets, e.g. [::1]:29500", what, text);
  }
  if (host.empty()) ZD_THROW_INPUT("{} '{}': the host is empty (expected HOST:PORT)", what, text);
  return {host, parse_port(port, fmt::format("{} '{}'", what, text), min_port)};
}

LaunchSpec resolve_launch(const LaunchFlags& flags, const EnvMap& env) {
  LaunchSpec spec;
  const bool any_flag = flags.nnodes || flags.node_rank || flags.nproc_per_node || flags.master;

  spec.nproc_per_node = flags.nproc_per_node.value_or(1);
  if (spec.nproc_per_node < 1)
    ZD_THROW_INPUT("--nproc-per-node {}: must be at least 1", spec.nproc_per_node);

  // Flags that give the whole topology replace the launcher; a partial set is completed from
  // the launcher's variables and must agree with them.
  const bool flags_complete = flags.nnodes && (flags.node_rank || *flags.nnodes == 1);
  const std::optional<EnvTopology> env_topo = flags_complete ? std::nullopt : detect_launcher(env);

  Sourced nnodes{1, "the default"};
  if (flags.nnodes) {
    nnodes = {*flags.nnodes, fmt::format("--nnodes {}", *flags.nnodes)};
    if (env_topo && env_topo->nnodes.value != nnodes.value)
      ZD_THROW_INPUT("conflicting node counts: {} but {}", nnodes.origin, env_topo->nnodes.origin);
  } else if (env_topo) {
    nnodes = env_topo->nnodes;
  }
  if (nnodes.value < 1) ZD_THROW_INPUT("{}: the number of nodes must be at least 1", nnodes.origin);

  Sourced node_rank{nnodes.value == 1 ? 0 : -1, "the default"};
  if (flags.node_rank) {
    node_rank = {*flags.node_rank, fmt::format("--node-rank {}", *flags.node_rank)};
    if (env_topo && env_topo->node_rank.value != node_rank.value)
      ZD_THROW_INPUT("conflicting node ranks: {} but {}", node_rank.origin,
                     env_topo->node_rank.origin);
    if (!flags.nnodes && !env_topo)
      ZD_THROW_INPUT("{} needs --nnodes (the number of nodes)", node_rank.origin);
  } else if (env_topo) {
    node_rank = env_topo->node_rank;
  }
  const bool assign_at_join = node_rank.value == -1 && flags.nnodes && !env_topo;
  if (!assign_at_join && (node_rank.value < 0 || node_rank.value >= nnodes.value))
    ZD_THROW_INPUT("node rank out of range: {} is not in [0, {}) ({})", node_rank.origin,
                   nnodes.value, nnodes.origin);

  spec.nnodes = nnodes.value;
  spec.node_rank = node_rank.value;

  // The master: --master, else the launcher's, else the default (one node only).
  if (flags.master) {
    std::tie(spec.master_host, spec.master_port) = parse_host_port(*flags.master, "--master");
  } else if (env_topo && env_topo->master_host) {
    spec.master_host = *env_topo->master_host;
    spec.master_port = env_topo->master_port.value_or(kDefaultMasterPort);
  } else if (spec.nnodes > 1) {
    if (env_topo)
      ZD_THROW_INPUT("{} ({} nodes) but no rendezvous master: {}; pass --master HOST:PORT",
                     env_topo->nnodes.origin, spec.nnodes, env_topo->missing_master);
    ZD_THROW_INPUT("{} needs --master HOST:PORT (the rendezvous address of node 0)", nnodes.origin);
  } else if (env_topo && env_topo->master_port) {
    spec.master_port = *env_topo->master_port;
  }

  if (env_topo && (!flags.nnodes || !flags.node_rank))
    spec.source = env_topo->launcher;
  else if (any_flag)
    spec.source = "flags";
  else
    spec.source = "default";
  return spec;
}

}  // namespace zerod
