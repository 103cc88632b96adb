#include "engine/runtime/launch.h"

#include <fmt/format.h>

#include <algorithm>
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
  int local_processes = 1;  // zerods the launcher started on this machine
  int local_process = 0;    // this one's index among them
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

// The launcher's count of processes on this machine and this one's index among them.
void set_local(EnvTopology& t, const Sourced& size, const Sourced& index) {
  if (size.value < 1)
    ZD_THROW_INPUT("{}: the number of processes on this node must be at least 1", size.origin);
  if (t.nnodes.value >= 1 && size.value > t.nnodes.value)
    ZD_THROW_INPUT("{} processes on this node but {} in all ({}, {})", size.value, t.nnodes.value,
                   size.origin, t.nnodes.origin);
  if (index.value < 0 || index.value >= size.value)
    ZD_THROW_INPUT("local process index out of range: {} is not in [0, {}) ({})", index.origin,
                   size.value, size.origin);
  t.local_processes = size.value;
  t.local_process = index.value;
}

Sourced env_int_or(const EnvMap& env, const char* name, const std::string& launcher, int value) {
  if (has(env, name)) return env_int(env, name, launcher);
  return {value, fmt::format("{} unset ({})", name, launcher)};
}

// Slurm's tasks-per-node list ("2(x3),1": 2 tasks on each of 3 nodes, then 1) -> the count of
// node `node_id`. Throws InputError naming `var` on a syntax error or a list too short.
int slurm_tasks_on_node(const std::string& text, int node_id, const std::string& var) {
  auto bad = [&](const char* why) {
    ZD_THROW_INPUT("{}='{}' (slurm): {} (expected e.g. 2(x3),1)", var, text, why);
  };
  int node = 0;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t paren = item.find("(x");
    const std::string count_text = item.substr(0, paren);
    int repeat = 1;
    if (paren != std::string::npos) {
      if (item.back() != ')') bad("unbalanced '('");
      repeat = parse_int(item.substr(paren + 2, item.size() - paren - 3), var, "set by slurm");
    }
    const int count = parse_int(count_text, var, "set by slurm");
    if (count < 1 || repeat < 1) bad("counts must be at least 1");
    if (node_id < node + repeat) return count;
    node += repeat;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  ZD_THROW_INPUT("{}='{}' (slurm) lists {} nodes, but this is node {} (SLURM_NODEID)", var, text,
                 node, node_id);
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
  set_local(t, env_int_or(env, "LOCAL_WORLD_SIZE", t.launcher, 1),
            env_int_or(env, "LOCAL_RANK", t.launcher, 0));
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
  set_local(t, env_int_or(env, "OMPI_COMM_WORLD_LOCAL_SIZE", t.launcher, 1),
            env_int_or(env, "OMPI_COMM_WORLD_LOCAL_RANK", t.launcher, 0));
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
  // Tasks on this node: this node's entry of the step's (else the job's) tasks-per-node list.
  const Sourced local_index = env_int_or(env, "SLURM_LOCALID", t.launcher, 0);
  Sourced local_size{1, "SLURM_STEP_TASKS_PER_NODE unset (slurm)"};
  const char* list_var =
      has(env, "SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  if (auto list = get(env, list_var)) {
    const int node_id = env_int_or(env, "SLURM_NODEID", t.launcher, 0).value;
    const int n = slurm_tasks_on_node(*list, node_id, list_var);
    local_size = {n, fmt::format("{}={} (slurm) on node {}", list_var, *list, node_id)};
  } else if (local_index.value > 0) {
    local_size = {local_index.value + 1, local_index.origin};  // at least this many
  }
  set_local(t, local_size, local_index);
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

int threads_per_rank(const LaunchSpec& spec, int cores, int online) {
  int sharers = spec.nproc_per_node;
  if (spec.local_processes > 1 && cores >= online) sharers *= spec.local_processes;
  return std::max(1, cores / std::max(1, sharers));
}

int local_rank_gpu(int local_process, int local_processes, int nproc_per_node, int local_rank,
                   int visible) {
  if (local_processes > 1 && visible >= local_processes * nproc_per_node)
    return local_process * nproc_per_node + local_rank;
  return local_rank;
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
  if (env_topo) {
    spec.local_processes = env_topo->local_processes;
    spec.local_process = env_topo->local_process;
  }

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
