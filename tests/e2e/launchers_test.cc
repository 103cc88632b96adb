// The launchers people already use start several zerod processes on one machine, each a node of
// one rank found from the launcher's variables, and they train the metrics of one zerod with two
// local ranks bit for bit:
//   torchrun --no_python --nnodes 1 --nproc_per_node 2 zerod train job.json   (python3-torch)
//   srun -N1 -n2 zerod train job.json   on a one-node Slurm cluster this test starts itself
//                                       (munged, slurmctld, slurmd as root on 127.0.0.1), and
//                                       the same through the example tools/slurm/zerod.sbatch
// A test skips, saying why, where its launcher is not installed or Slurm cannot start.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "process_util.h"

#include <dirent.h>
#include <sys/prctl.h>
#include <sys/stat.h>

namespace zerod {
namespace {

namespace fs = std::filesystem;
using testing::free_port;
using testing::Process;
using testing::zerod_binary;
using namespace std::chrono_literals;

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every file under `dir`, named, for failure messages.
std::string dump_tree(const fs::path& dir) {
  std::string out;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    std::string text = read_file(e.path());
    if (text.size() > 4000) text = "..." + text.substr(text.size() - 4000);
    out += "--- " + e.path().string() + "\n" + text + "\n";
  }
  return out;
}

// Two ports next to each other, both free a moment ago (torchrun's store on P, zerod's
// rendezvous on P + 1), below the ephemeral range: the tests running beside this one connect
// out from ephemeral ports, and one took torchrun's port between the pick and its bind (CI,
// errno 98) when the pair came from there.
int free_port_pair() {
  for (int i = 0; i < 50; ++i) {
    const int p = free_port();
    if (p >= 65535) continue;
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(p + 1));
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    ::close(fd);
    if (ok) return p;
  }
  return free_port();
}

class Launchers : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef ZEROD_HAVE_GRPC
    GTEST_SKIP() << "built without gRPC: several zerod processes need the rendezvous";
#endif
    dir_ = testing::make_test_dir("zerod_launchers", "two processes from one launcher. ");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void write_job(const std::string& name, int steps) {
    std::ofstream(dir_ / name) << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "zero_optimization": {"stage": 2},
      "gradient_clipping": 1.0,
      "steps_per_print": 1,
      "csv_monitor": {"enabled": true, "output_path": "runs", "job_name": ")"
                               << name << R"("},
      "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "seq_len": 16},
      "data": {"train": "data/c_train_*.bin", "val": "data/c_val_*.bin"},
      "train": {"steps": )" << steps
                               << R"(, "eval_interval": 4, "rendezvous_timeout": 60}})";
  }
  // metrics.csv without its timing columns (tokens_per_s, mfu): step, loss, lr, grad_norm,
  // loss_scale, skipped, val_loss, as written.
  std::vector<std::string> metrics(const std::string& job) {
    std::ifstream in(dir_ / "runs" / job / "metrics.csv");
    std::vector<std::string> out;
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::vector<std::string> cols;
      std::stringstream ss(line);
      std::string c;
      while (std::getline(ss, c, ',')) cols.push_back(c);
      if (cols.size() < 8) {
        out.push_back("short line: " + line);
        continue;
      }
      std::string kept;
      for (size_t i = 0; i < cols.size(); ++i)
        if (i != 5 && i != 6) kept += cols[i] + ",";
      out.push_back(kept);
    }
    return out;
  }
  // The reference: one zerod running two local ranks.
  std::vector<std::string> reference(int steps) {
    write_job("threads.json", steps);
    Process p({zerod_binary(), "train", "threads.json", "--nproc-per-node", "2"}, dir_.string(),
              (dir_ / "threads.log").string());
    EXPECT_EQ(p.wait_for(120s), 0) << p.output();
    const auto want = metrics("threads.json");
    EXPECT_EQ(want.size(), static_cast<size_t>(steps)) << p.output();
    return want;
  }

  fs::path dir_;
};

// Where torchrun is: /usr/bin/torchrun, else `python3 -m torch.distributed.run`; empty if none.
std::vector<std::string> torchrun_command() {
  for (const char* t : {"/usr/bin/torchrun", "/usr/local/bin/torchrun"})
    if (::access(t, X_OK) == 0) return {t};
  for (const char* d : {"/usr/lib/python3/dist-packages", "/usr/local/lib/python3/dist-packages"})
    if (fs::exists(fs::path(d) / "torch/distributed/run.py"))
      return {"/usr/bin/python3", "-m", "torch.distributed.run"};
  return {};
}

TEST_F(Launchers, TorchrunTwoProcessesTrainTheMetricsOfTwoLocalRanks) {
  const std::vector<std::string> torchrun = torchrun_command();
  if (torchrun.empty())
    GTEST_SKIP() << "torchrun not found (/usr/bin/torchrun or torch.distributed.run of "
                    "python3-torch; tools/deps.sh installs python3-torch)";
  const auto want = reference(8);
  write_job("torchrun.json", 8);
  // A port still taken by another program when torchrun binds it fails its store before any
  // worker starts; that launch is tried again on a new pair (at most three launches).
  int port = 0;
  int code = 0;
  std::string logs;
  for (int launch = 0; launch < 3; ++launch) {
    port = free_port_pair();
    std::vector<std::string> argv = torchrun;
    // --redirects 2 --tee 1: worker stderr to files under --log_dir, stdout to files and here.
    // (They also keep Debian 12's torch 1.13 working under Python 3.11, whose flag enum makes
    // the defaults, 0, crash torchrun before it starts a worker.)
    argv.insert(argv.end(), {"--no_python", "--nnodes", "1", "--nproc_per_node", "2",
                             "--master_addr", "127.0.0.1", "--master_port", std::to_string(port),
                             "--log_dir", (dir_ / "torchrun_logs").string(), "--redirects", "2",
                             "--tee", "1", zerod_binary(), "train", "torchrun.json"});
    Process tr(argv, dir_.string(), (dir_ / "torchrun.log").string(), /*own_group=*/true);
    ASSERT_TRUE(tr.started());
    code = tr.wait_for(150s);
    logs = tr.output() + dump_tree(dir_ / "torchrun_logs");
    const bool store_port_taken = code != 0 && code != Process::kTimedOut &&
                                  logs.find("Address already in use") != std::string::npos &&
                                  logs.find("topology from torchrun") == std::string::npos;
    if (!store_port_taken) break;
    std::error_code ec;
    fs::remove_all(dir_ / "torchrun_logs", ec);
  }
  ASSERT_NE(code, Process::kTimedOut) << "torchrun still running after 150 s\n" << logs;
  ASSERT_EQ(code, 0) << logs;
  EXPECT_EQ(metrics("torchrun.json"), want) << logs;
  // Each worker was a node of one rank, found from torchrun's variables, and the rendezvous
  // sat on MASTER_PORT + 1 next to torchrun's store.
  EXPECT_NE(logs.find("topology from torchrun, process 0 of 2 on this machine"), std::string::npos)
      << logs;
  EXPECT_NE(logs.find("topology from torchrun, process 1 of 2 on this machine"), std::string::npos)
      << logs;
  EXPECT_NE(logs.find("127.0.0.1:" + std::to_string(port + 1)), std::string::npos) << logs;
}

// A one-node Slurm cluster in a temporary directory: munged, slurmctld and slurmd started as
// children of the test (root, loopback only, private ports, socket and state), stopped, with
// every process of its jobs, and its directory removed, when it goes out of scope.
class SlurmCluster {
 public:
  // Empty when the cluster runs; else why it cannot.
  std::string start(const fs::path& dir) {
    dir_ = dir;
    if (::geteuid() != 0) return "not root (slurmd and munged are started as root)";
    for (const char* bin :
         {"/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/srun",
          "/usr/bin/sbatch", "/usr/bin/sinfo", "/usr/bin/scancel"})
      if (::access(bin, X_OK) != 0)
        return std::string(bin) +
               " is missing (Debian: apt-get install munge slurmctld slurmd slurm-client; "
               "tools/deps.sh installs them)";
    fs::create_directories(dir / "munge");
    fs::create_directories(dir / "state");
    fs::create_directories(dir / "spool");
    fs::permissions(dir / "munge", fs::perms::owner_all, fs::perm_options::replace);
    {
      std::ifstream rnd("/dev/urandom", std::ios::binary);
      std::string key(1024, '\0');
      rnd.read(key.data(), static_cast<std::streamsize>(key.size()));
      std::ofstream(dir / "munge/munge.key", std::ios::binary) << key;
      fs::permissions(dir / "munge/munge.key", fs::perms::owner_read, fs::perm_options::replace);
    }
    conf_ = (dir / "slurm.conf").string();
    // Slurm's daemons fork processes that outlive their parents (slurmstepd, helpers): they
    // become this process's children, so that the test reaps them.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    subreaper_ = true;
    const std::string d = dir.string();
    const int ctld_port = free_port();
    int slurmd_port = free_port();
    while (slurmd_port == ctld_port) slurmd_port = free_port();
    std::ofstream(conf_) << "ClusterName=zerodtest\n"
                         << "SlurmctldHost=localhost(127.0.0.1)\n"
                         << "SlurmctldPort=" << ctld_port << "\n"
                         << "SlurmdPort=" << slurmd_port << "\n"
                         << "SlurmUser=root\nSlurmdUser=root\n"
                         << "AuthType=auth/munge\nCredType=cred/munge\n"
                         << "AuthInfo=socket=" << d << "/munge/sock\n"
                         << "StateSaveLocation=" << d << "/state\n"
                         << "SlurmdSpoolDir=" << d << "/spool\n"
                         << "SlurmctldPidFile=" << d << "/slurmctld.pid\n"
                         << "SlurmdPidFile=" << d << "/slurmd.pid\n"
                         << "SlurmctldLogFile=" << d << "/slurmctld.log\n"
                         << "SlurmdLogFile=" << d << "/slurmd.log\n"
                         << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
                         << "JobAcctGatherType=jobacct_gather/none\n"
                         << "AccountingStorageType=accounting_storage/none\n"
                         << "MpiDefault=none\nSwitchType=switch/none\n"
                         << "SchedulerType=sched/builtin\n"
                         << "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
                         << "ReturnToService=2\nSlurmdParameters=config_overrides\n"
                         << "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny\n"
                         << "NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN\n"
                         << "PartitionName=zerod Nodes=localhost Default=YES MaxTime=10 "
                            "State=UP OverSubscribe=YES\n";
    munged_ = spawn(
        {"/usr/sbin/munged", "--foreground", "--force", "--key-file=" + d + "/munge/munge.key",
         "--socket=" + d + "/munge/sock", "--pid-file=" + d + "/munge/munged.pid",
         "--log-file=" + d + "/munged.log", "--seed-file=" + d + "/munge/seed"},
        "munged.out");
    if (!wait_until([&] { return fs::exists(dir / "munge/sock"); }, 10s))
      return "munged did not start within 10 s:\n" + dump_tree(dir);
    ctld_ = spawn({"/usr/sbin/slurmctld", "-D", "-i", "-f", conf_}, "slurmctld.out");
    slurmd_ = spawn({"/usr/sbin/slurmd", "-D", "-N", "localhost", "-f", conf_}, "slurmd.out");
    const bool idle = wait_until(
        [&] {
          Process p(with_env({"/usr/bin/sinfo", "-h", "-o", "%T"}), d, d + "/sinfo.out");
          return p.wait_for(5s) == 0 && p.output().find("idle") != std::string::npos;
        },
        30s);
    if (!idle) return "the Slurm node did not become idle within 30 s:\n" + dump_tree(dir);
    return "";
  }

  // `args` run with this cluster's SLURM_CONF plus `env` ("NAME=VALUE") in their environment.
  std::vector<std::string> with_env(const std::vector<std::string>& args,
                                    const std::vector<std::string>& env = {}) const {
    std::vector<std::string> argv = {"/usr/bin/env", "SLURM_CONF=" + conf_};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  ~SlurmCluster() {
    if (conf_.empty()) {
      std::error_code ec;
      if (!dir_.empty()) fs::remove_all(dir_, ec);
      return;
    }
    if (ctld_) {  // cancel whatever is still running
      Process cancel(with_env({"/usr/bin/scancel", "--full", "--partition", "zerod"}),
                     dir_.string(), (dir_ / "scancel.out").string());
      cancel.wait_for(10s);
    }
    for (Process* p : {slurmd_.get(), ctld_.get(), munged_.get()})
      if (p) p->stop(SIGTERM, 5s);
    kill_leftovers();
    if (subreaper_) {
      int status = 0;
      while (::waitpid(-1, &status, WNOHANG) > 0) {
      }
      ::prctl(PR_SET_CHILD_SUBREAPER, 0);
    }
    std::error_code ec;  // failure messages carry its logs already
    fs::remove_all(dir_, ec);
  }

 private:
  std::unique_ptr<Process> spawn(const std::vector<std::string>& args, const std::string& log) {
    auto p = std::make_unique<Process>(with_env(args), dir_.string(), (dir_ / log).string());
    EXPECT_TRUE(p->started());
    return p;
  }
  static bool wait_until(const std::function<bool()>& ok, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (ok()) return true;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  }
  // Every process whose environment holds this cluster's SLURM_CONF (slurmstepd, job tasks,
  // slurmscriptd) and that is still alive: killed, and waited for (bounded).
  void kill_leftovers() {
    const std::string mark = "SLURM_CONF=" + conf_;
    for (int round = 0; round < 50; ++round) {
      std::vector<pid_t> found;
      DIR* proc = ::opendir("/proc");
      if (proc == nullptr) return;
      while (dirent* e = ::readdir(proc)) {
        const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
        if (pid <= 1 || pid == ::getpid()) continue;
        std::ifstream in(std::string("/proc/") + e->d_name + "/environ", std::ios::binary);
        std::string entry;
        while (std::getline(in, entry, '\0')) {
          if (entry == mark) {
            found.push_back(pid);
            break;
          }
        }
      }
      ::closedir(proc);
      // Zombies keep their environment readable only while not reaped: skip those gone.
      std::vector<pid_t> alive;
      for (pid_t pid : found) {
        std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
        std::string line;
        std::getline(st, line);
        const size_t close = line.rfind(')');
        if (close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z')
          alive.push_back(pid);
      }
      if (alive.empty()) return;
      for (pid_t pid : alive) ::kill(pid, SIGKILL);
      std::this_thread::sleep_for(100ms);
    }
  }

  fs::path dir_;
  std::string conf_;
  bool subreaper_ = false;
  std::unique_ptr<Process> munged_, ctld_, slurmd_;
};

TEST_F(Launchers, SlurmSrunTwoTasksOnOneNodeTrainTheMetricsOfTwoLocalRanks) {
  // A short path: Slurm and munge keep sockets and state there.
  const fs::path cluster_dir =
      fs::temp_directory_path() / ("zerod_slurm_" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(cluster_dir, ec);
  fs::create_directories(cluster_dir);
  std::string why;
  {
    SlurmCluster slurm;
    why = slurm.start(cluster_dir);
    if (why.empty()) {
      const auto want = reference(8);
      write_job("slurm.json", 8);
      // MASTER_PORT: the rendezvous port (the host is the first of SLURM_JOB_NODELIST,
      // "localhost"); srun passes the environment on to the tasks. Below the ephemeral range:
      // srun's own I/O sockets take ephemeral ports while the tasks start (a collision once
      // made the first task find its rendezvous port taken).
      Process srun(slurm.with_env({"/usr/bin/srun", "-N1", "-n2", "--chdir", dir_.string(),
                                   zerod_binary(), "train", "slurm.json"},
                                  {"MASTER_PORT=" + std::to_string(free_port())}),
                   dir_.string(), (dir_ / "srun.log").string(), /*own_group=*/true);
      ASSERT_TRUE(srun.started());
      const int code = srun.wait_for(120s);
      const std::string logs = srun.output() + "\n" + dump_tree(cluster_dir);
      ASSERT_NE(code, Process::kTimedOut) << "srun still running after 120 s\n" << logs;
      ASSERT_EQ(code, 0) << logs;
      EXPECT_EQ(metrics("slurm.json"), want) << logs;
      EXPECT_NE(logs.find("topology from slurm, process 1 of 2 on this machine"), std::string::npos)
          << logs;
      // The sbatch example, its #SBATCH lines overridden to fit this one small node.
      write_job("sbatch.json", 8);
      Process sbatch(
          slurm.with_env(
              {"/usr/bin/sbatch", "--wait", "-N1", "--ntasks-per-node=2", "--cpus-per-task=1",
               "--time=5", "--output=" + (dir_ / "sbatch.out").string(), "--chdir", dir_.string(),
               std::string(ZEROD_SOURCE_DIR) + "/tools/slurm/zerod.sbatch", "sbatch.json"},
              {"ZEROD=" + zerod_binary(), "MASTER_PORT=" + std::to_string(free_port())}),
          dir_.string(), (dir_ / "sbatch.log").string(), /*own_group=*/true);
      ASSERT_TRUE(sbatch.started());
      const int sbatch_code = sbatch.wait_for(120s);
      const std::string sbatch_logs =
          sbatch.output() + "\n" + read_file(dir_ / "sbatch.out") + dump_tree(cluster_dir);
      ASSERT_NE(sbatch_code, Process::kTimedOut) << "sbatch --wait still running after 120 s\n"
                                                 << sbatch_logs;
      ASSERT_EQ(sbatch_code, 0) << sbatch_logs;
      EXPECT_EQ(metrics("sbatch.json"), want) << sbatch_logs;
    }
  }
  if (!why.empty()) GTEST_SKIP() << "Slurm cannot start here: " << why;
}

}  // namespace
}  // namespace zerod
