#include "engine/runtime/launch.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace zerod {
namespace {

// Expects resolve_launch to throw InputError whose message contains every fragment.
void expect_refused(const LaunchFlags& flags, const EnvMap& env,
                    const std::vector<std::string>& fragments) {
  try {
    const LaunchSpec spec = resolve_launch(flags, env);
    ADD_FAILURE() << "accepted: nnodes " << spec.nnodes << " node_rank " << spec.node_rank
                  << " master " << spec.master_address();
  } catch (const InputError& e) {
    EXPECT_EQ(e.exit_code(), 2);
    for (const auto& f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "message: " << e.what() << "\nmissing: " << f;
  }
}

EnvMap torchrun_env(int world, int rank) {
  return {{"WORLD_SIZE", std::to_string(world)},
          {"RANK", std::to_string(rank)},
          {"LOCAL_WORLD_SIZE", "1"},
          {"LOCAL_RANK", "0"},
          {"MASTER_ADDR", "trainer-0"},
          {"MASTER_PORT", "1234"}};
}

EnvMap slurm_env(int ntasks, int procid) {
  return {{"SLURM_NTASKS", std::to_string(ntasks)},
          {"SLURM_PROCID", std::to_string(procid)},
          {"SLURM_NODEID", std::to_string(procid)},
          {"SLURM_NNODES", std::to_string(ntasks)},
          {"SLURM_JOB_NODELIST", "gpu[03-05,09],login1"}};
}

EnvMap openmpi_env(int size, int rank) {
  return {{"OMPI_COMM_WORLD_SIZE", std::to_string(size)},
          {"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
          {"MASTER_ADDR", "10.1.2.3"},
          {"MASTER_PORT", "5555"}};
}

TEST(Launch, DefaultsToOneNodeOnLoopback) {
  const LaunchSpec s = resolve_launch({}, {});
  EXPECT_EQ(s.nnodes, 1);
  EXPECT_EQ(s.node_rank, 0);
  EXPECT_EQ(s.nproc_per_node, 1);
  EXPECT_EQ(s.world_size(), 1);
  EXPECT_EQ(s.master_address(), "127.0.0.1:29500");
  EXPECT_EQ(s.source, "default");
}

TEST(Launch, FlagsGiveTheTopology) {
  LaunchFlags f;
  f.nnodes = 3;
  f.node_rank = 2;
  f.nproc_per_node = 4;
  f.master = "10.0.0.7:4321";
  const LaunchSpec s = resolve_launch(f, {});
  EXPECT_EQ(s.nnodes, 3);
  EXPECT_EQ(s.node_rank, 2);
  EXPECT_EQ(s.nproc_per_node, 4);
  EXPECT_EQ(s.world_size(), 12);
  EXPECT_EQ(s.master_host, "10.0.0.7");
  EXPECT_EQ(s.master_port, 4321);
  EXPECT_EQ(s.source, "flags");
}

TEST(Launch, CompleteFlagsReplaceTheLauncher) {
  LaunchFlags f;
  f.nnodes = 2;
  f.node_rank = 1;
  f.master = "h:1";
  EnvMap env = torchrun_env(8, 5);
  env["LOCAL_WORLD_SIZE"] = "8";  // would be refused if the launcher were read
  const LaunchSpec s = resolve_launch(f, env);
  EXPECT_EQ(s.nnodes, 2);
  EXPECT_EQ(s.node_rank, 1);
  EXPECT_EQ(s.source, "flags");
}

TEST(Launch, NodeRankLeftToTheMasterWhenOnlyNnodesIsGiven) {
  LaunchFlags f;
  f.nnodes = 3;
  f.master = "node0:29501";
  const LaunchSpec s = resolve_launch(f, {});
  EXPECT_EQ(s.node_rank, -1);
  EXPECT_EQ(s.master_port, 29501);
  f.node_rank = -1;  // said explicitly
  EXPECT_EQ(resolve_launch(f, {}).node_rank, -1);
}

TEST(Launch, BadFlagsAreRefusedWithTheirValues) {
  LaunchFlags f;
  f.nnodes = 2;
  expect_refused(f, {}, {"--nnodes 2", "--master HOST:PORT"});
  f.master = "h:29500";
  f.node_rank = 2;
  expect_refused(f, {}, {"--node-rank 2", "[0, 2)"});
  f.node_rank = -2;
  expect_refused(f, {}, {"--node-rank -2"});
  LaunchFlags zero;
  zero.nnodes = 0;
  expect_refused(zero, {}, {"--nnodes 0", "at least 1"});
  LaunchFlags nproc;
  nproc.nproc_per_node = 0;
  expect_refused(nproc, {}, {"--nproc-per-node 0"});
  LaunchFlags rank_only;
  rank_only.node_rank = 1;
  expect_refused(rank_only, {}, {"--node-rank 1", "needs --nnodes"});
}

TEST(Launch, MasterAddressesParseOrSayWhatIsWrong) {
  EXPECT_EQ(parse_host_port("a.b:80", "--master"), std::make_pair(std::string("a.b"), 80));
  EXPECT_EQ(parse_host_port("[::1]:29500", "--master"), std::make_pair(std::string("::1"), 29500));
  LaunchSpec v6;
  v6.master_host = "::1";
  EXPECT_EQ(v6.master_address(), "[::1]:29500");
  LaunchFlags f;
  for (const auto& [text, fragment] :
       std::vector<std::pair<std::string, std::string>>{{"host", "expected HOST:PORT"},
                                                        {"host:0", "1..65535"},
                                                        {"host:65536", "1..65535"},
                                                        {"host:12ab", "'12ab'"},
                                                        {":29500", "host is empty"},
                                                        {"::1:29500", "brackets"},
                                                        {"[::1]29500", "[IPV6]:PORT"}}) {
    f.master = text;
    expect_refused(f, {}, {"--master", fragment});
  }
}

TEST(Launch, TorchrunOneProcessPerNode) {
  const LaunchSpec s = resolve_launch({}, torchrun_env(3, 2));
  EXPECT_EQ(s.nnodes, 3);
  EXPECT_EQ(s.node_rank, 2);
  EXPECT_EQ(s.master_host, "trainer-0");
  EXPECT_EQ(s.master_port, 1234);
  EXPECT_EQ(s.source, "torchrun");
}

TEST(Launch, TorchrunAgentStorePortIsLeftToTorchrun) {
  EnvMap env = torchrun_env(2, 0);
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  EXPECT_EQ(resolve_launch({}, env).master_port, 1235);
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_EQ(resolve_launch({}, env).master_port, 1234);
}

// `torchrun --nproc-per-node 2 zerod train job.json`: every process is a node of one rank (or
// of --nproc-per-node ranks), and the rendezvous sits next to torchrun's store.
TEST(Launch, TorchrunSeveralProcessesPerNodeAreNodesOfOneRankEach) {
  EnvMap env = torchrun_env(2, 1);
  env["LOCAL_WORLD_SIZE"] = "2";
  env["LOCAL_RANK"] = "1";
  env["MASTER_ADDR"] = "127.0.0.1";
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  LaunchSpec s = resolve_launch({}, env);
  EXPECT_EQ(s.nnodes, 2);
  EXPECT_EQ(s.node_rank, 1);
  EXPECT_EQ(s.nproc_per_node, 1);
  EXPECT_EQ(s.world_size(), 2);
  EXPECT_EQ(s.master_address(), "127.0.0.1:1235");  // MASTER_PORT + 1
  EXPECT_EQ(s.local_processes, 2);
  EXPECT_EQ(s.local_process, 1);
  EXPECT_EQ(s.source, "torchrun");
  // Each process may run several ranks as threads too: 2 processes x 2 ranks.
  LaunchFlags f;
  f.nproc_per_node = 2;
  s = resolve_launch(f, env);
  EXPECT_EQ(s.nnodes, 2);
  EXPECT_EQ(s.world_size(), 4);
  // Flags must still agree with the launcher.
  LaunchFlags three;
  three.nnodes = 3;
  expect_refused(three, env, {"--nnodes 3", "WORLD_SIZE=2 (torchrun)"});
  LaunchFlags rank;
  rank.node_rank = 0;
  expect_refused(rank, env, {"--node-rank 0", "RANK=1 (torchrun)"});
}

TEST(Launch, TorchrunLocalValuesAreChecked) {
  EnvMap env = torchrun_env(8, 3);
  env["LOCAL_WORLD_SIZE"] = "4";
  env["LOCAL_RANK"] = "4";
  expect_refused({}, env, {"LOCAL_RANK=4 (torchrun)", "[0, 4)"});
  env["LOCAL_WORLD_SIZE"] = "9";
  env["LOCAL_RANK"] = "1";
  expect_refused({}, env, {"9 processes on this node but 8 in all", "LOCAL_WORLD_SIZE=9"});
  env["LOCAL_WORLD_SIZE"] = "0";
  expect_refused({}, env, {"LOCAL_WORLD_SIZE=0", "at least 1"});
  env["LOCAL_WORLD_SIZE"] = "two";
  expect_refused({}, env, {"LOCAL_WORLD_SIZE='two'", "not an integer"});
}

TEST(Launch, TorchrunBadValues) {
  EnvMap env = torchrun_env(2, 0);
  env["RANK"] = "abc";
  expect_refused({}, env, {"RANK='abc'", "torchrun", "not an integer"});
  env = torchrun_env(2, 2);
  expect_refused({}, env, {"RANK=2 (torchrun)", "[0, 2)", "WORLD_SIZE=2"});
  env = torchrun_env(0, 0);
  expect_refused({}, env, {"WORLD_SIZE=0"});
  env = torchrun_env(2, 0);
  env["MASTER_PORT"] = "99999";
  expect_refused({}, env, {"MASTER_PORT", "'99999'"});
  env = torchrun_env(2, 0);
  env.erase("MASTER_ADDR");
  expect_refused({}, env, {"WORLD_SIZE=2", "MASTER_ADDR", "--master"});
}

TEST(Launch, FlagsThatDisagreeWithTheLauncherAreRefused) {
  LaunchFlags f;
  f.nnodes = 2;
  expect_refused(f, torchrun_env(3, 1), {"--nnodes 2", "WORLD_SIZE=3 (torchrun)"});
  LaunchFlags r;
  r.node_rank = 0;
  expect_refused(r, slurm_env(4, 1), {"--node-rank 0", "SLURM_PROCID=1 (slurm)"});
}

TEST(Launch, FlagsThatAgreeOrAddTheMasterAreCombined) {
  LaunchFlags f;
  f.nnodes = 3;
  f.master = "override:777";
  f.nproc_per_node = 2;
  const LaunchSpec s = resolve_launch(f, torchrun_env(3, 1));
  EXPECT_EQ(s.nnodes, 3);
  EXPECT_EQ(s.node_rank, 1);  // from RANK
  EXPECT_EQ(s.nproc_per_node, 2);
  EXPECT_EQ(s.master_host, "override");  // --master wins over MASTER_ADDR
  EXPECT_EQ(s.master_port, 777);
  EXPECT_EQ(s.source, "torchrun");
}

TEST(Launch, SlurmOneTaskPerNode) {
  const LaunchSpec s = resolve_launch({}, slurm_env(4, 1));
  EXPECT_EQ(s.nnodes, 4);
  EXPECT_EQ(s.node_rank, 1);
  EXPECT_EQ(s.master_host, "gpu03");  // first host of the node list
  EXPECT_EQ(s.master_port, kDefaultMasterPort);
  EXPECT_EQ(s.source, "slurm");
  EnvMap env = slurm_env(4, 1);
  env["MASTER_PORT"] = "4000";
  EXPECT_EQ(resolve_launch({}, env).master_address(), "gpu03:4000");
  env["MASTER_ADDR"] = "head";
  EXPECT_EQ(resolve_launch({}, env).master_address(), "head:4000");
}

// `srun -N1 -n2 zerod train job.json`: two tasks on one node are two nodes of one rank each.
TEST(Launch, SlurmSeveralTasksPerNodeAreNodesOfOneRankEach) {
  EnvMap env = {{"SLURM_NTASKS", "2"},         {"SLURM_PROCID", "1"},
                {"SLURM_NODEID", "0"},         {"SLURM_NNODES", "1"},
                {"SLURM_LOCALID", "1"},        {"SLURM_STEP_TASKS_PER_NODE", "2"},
                {"SLURM_TASKS_PER_NODE", "2"}, {"SLURM_JOB_NODELIST", "localhost"}};
  LaunchSpec s = resolve_launch({}, env);
  EXPECT_EQ(s.nnodes, 2);
  EXPECT_EQ(s.node_rank, 1);
  EXPECT_EQ(s.nproc_per_node, 1);
  EXPECT_EQ(s.master_address(), "localhost:29500");
  EXPECT_EQ(s.local_processes, 2);
  EXPECT_EQ(s.local_process, 1);
  EXPECT_EQ(s.source, "slurm");
  LaunchFlags f;
  f.nnodes = 4;
  expect_refused(f, env, {"--nnodes 4", "SLURM_NTASKS=2 (slurm)"});

  // 5 tasks as 2, 2, 1 over three nodes: this node's entry of the step's list counts.
  env = {{"SLURM_NTASKS", "5"},
         {"SLURM_PROCID", "4"},
         {"SLURM_NODEID", "2"},
         {"SLURM_NNODES", "3"},
         {"SLURM_LOCALID", "0"},
         {"SLURM_STEP_TASKS_PER_NODE", "2(x2),1"},
         {"SLURM_TASKS_PER_NODE", "8(x3)"},  // the job's, not the step's
         {"SLURM_JOB_NODELIST", "n[1-3]"}};
  s = resolve_launch({}, env);
  EXPECT_EQ(s.nnodes, 5);
  EXPECT_EQ(s.node_rank, 4);
  EXPECT_EQ(s.local_processes, 1);
  EXPECT_EQ(s.master_host, "n1");
  env["SLURM_NODEID"] = "1";
  env["SLURM_PROCID"] = "3";
  env["SLURM_LOCALID"] = "1";
  s = resolve_launch({}, env);
  EXPECT_EQ(s.local_processes, 2);
  EXPECT_EQ(s.local_process, 1);
  env.erase("SLURM_STEP_TASKS_PER_NODE");  // without the step's list: the job's
  expect_refused({}, env, {"8 processes on this node but 5 in all", "SLURM_TASKS_PER_NODE=8(x3)"});
  env["SLURM_TASKS_PER_NODE"] = "2(x2),1";
  EXPECT_EQ(resolve_launch({}, env).local_processes, 2);
}

TEST(Launch, SlurmTaskListsAreChecked) {
  EnvMap env = slurm_env(4, 1);
  env["SLURM_STEP_TASKS_PER_NODE"] = "2(x2";
  expect_refused({}, env, {"SLURM_STEP_TASKS_PER_NODE='2(x2'", "unbalanced"});
  env["SLURM_STEP_TASKS_PER_NODE"] = "1";
  expect_refused({}, env, {"lists 1 nodes", "this is node 1"});
  env["SLURM_STEP_TASKS_PER_NODE"] = "0(x4)";
  expect_refused({}, env, {"at least 1"});
  env["SLURM_STEP_TASKS_PER_NODE"] = "1(x4)";
  env["SLURM_LOCALID"] = "1";
  expect_refused({}, env, {"SLURM_LOCALID=1 (slurm)", "[0, 1)"});
}

TEST(Launch, SlurmWithoutAMasterOrWithABadNodeList) {
  EnvMap env = slurm_env(2, 0);
  env.erase("SLURM_JOB_NODELIST");
  expect_refused({}, env, {"SLURM_NTASKS=2", "SLURM_JOB_NODELIST"});
  env["SLURM_JOB_NODELIST"] = "gpu[1-";
  expect_refused({}, env, {"gpu[1-", "unbalanced"});
}

TEST(Launch, OpenMpiOneProcessPerNode) {
  const LaunchSpec s = resolve_launch({}, openmpi_env(2, 1));
  EXPECT_EQ(s.nnodes, 2);
  EXPECT_EQ(s.node_rank, 1);
  EXPECT_EQ(s.master_address(), "10.1.2.3:5555");
  EXPECT_EQ(s.source, "openmpi");
  EnvMap env = openmpi_env(2, 1);
  env.erase("MASTER_PORT");
  EXPECT_EQ(resolve_launch({}, env).master_port, kDefaultMasterPort);
}

TEST(Launch, OpenMpiNeedsMasterAddrAndOneProcessPerNode) {
  EnvMap env = openmpi_env(2, 0);
  env.erase("MASTER_ADDR");
  expect_refused({}, env, {"OMPI_COMM_WORLD_SIZE=2", "MASTER_ADDR"});
  // Several processes per node: each is a node of --nproc-per-node ranks.
  env = openmpi_env(4, 1);
  env["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";
  env["OMPI_COMM_WORLD_LOCAL_RANK"] = "1";
  const LaunchSpec s = resolve_launch({}, env);
  EXPECT_EQ(s.nnodes, 4);
  EXPECT_EQ(s.local_processes, 2);
  EXPECT_EQ(s.local_process, 1);
  env["OMPI_COMM_WORLD_LOCAL_RANK"] = "2";
  expect_refused({}, env, {"OMPI_COMM_WORLD_LOCAL_RANK=2", "[0, 2)"});
  env = openmpi_env(4, 1);
  env.erase("OMPI_COMM_WORLD_RANK");
  expect_refused({}, env, {"OMPI_COMM_WORLD_RANK"});
  // A single-process mpirun needs no master.
  env = openmpi_env(1, 0);
  env.erase("MASTER_ADDR");
  EXPECT_EQ(resolve_launch({}, env).nnodes, 1);
}

// Several zerods on one machine share its cores unless the launcher bound them to their own.
TEST(Launch, ThreadsPerRankShareTheCores) {
  LaunchSpec s;
  s.nproc_per_node = 2;
  EXPECT_EQ(threads_per_rank(s, 16, 16), 8);
  s.local_processes = 2;
  EXPECT_EQ(threads_per_rank(s, 16, 16), 4);  // 2 processes x 2 ranks on 16 cores
  EXPECT_EQ(threads_per_rank(s, 8, 16), 4);   // bound to 8 cores: already its share
  s.local_processes = 64;
  EXPECT_EQ(threads_per_rank(s, 16, 16), 1);  // never 0
}

// Local rank r of process p of several on one machine: GPU p x nproc + r when it sees them all.
TEST(Launch, LocalRanksOfSeveralProcessesTakeTheirOwnGpus) {
  EXPECT_EQ(local_rank_gpu(0, 1, 4, 3, 8), 3);  // one process per machine
  EXPECT_EQ(local_rank_gpu(1, 2, 4, 3, 8), 7);  // second of two, four ranks each
  EXPECT_EQ(local_rank_gpu(5, 8, 1, 0, 8), 5);  // torchrun --nproc-per-node 8
  EXPECT_EQ(local_rank_gpu(5, 8, 1, 0, 1), 0);  // CUDA_VISIBLE_DEVICES gave it its own
}

TEST(Launch, TheInnermostLauncherWins) {
  EnvMap env = slurm_env(4, 2);
  for (const auto& [k, v] : torchrun_env(2, 1)) env[k] = v;
  EXPECT_EQ(resolve_launch({}, env).source, "torchrun");
  env = slurm_env(4, 2);
  for (const auto& [k, v] : openmpi_env(2, 1)) env[k] = v;
  const LaunchSpec s = resolve_launch({}, env);
  EXPECT_EQ(s.source, "openmpi");
  EXPECT_EQ(s.nnodes, 2);
}

TEST(Launch, ProcessEnvironmentIsRead) {
  ASSERT_EQ(setenv("ZEROD_LAUNCH_TEST_VAR", "a=b", 1), 0);
  const EnvMap env = from_process_env();
  ASSERT_TRUE(env.count("ZEROD_LAUNCH_TEST_VAR"));
  EXPECT_EQ(env.at("ZEROD_LAUNCH_TEST_VAR"), "a=b");  // split at the first '='
  unsetenv("ZEROD_LAUNCH_TEST_VAR");
}

}  // namespace
}  // namespace zerod
