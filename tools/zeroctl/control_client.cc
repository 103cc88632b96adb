#include "tools/zeroctl/control_client.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "engine/runtime/grpc/auth.h"
#include "engine/runtime/grpc/endpoint.h"
#include "zerod.grpc.pb.h"

namespace zeroctl {

namespace {

using zerod::v1::Control;

int exit_code_of(const grpc::Status& st) {
  switch (st.error_code()) {
    case grpc::StatusCode::OK:
      return 0;
    case grpc::StatusCode::UNAUTHENTICATED:
      return 4;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 3;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return 2;
    default:
      return 1;
  }
}

const char* code_name(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    default:
      return "ERROR";
  }
}

std::string address_of(const Connection& c) {
  return c.addr.empty() ? zerod::default_control_address() : c.addr;
}

int fail(const Connection& c, const grpc::Status& st) {
  const int code = exit_code_of(st);
  if (code == 3) {
    std::fprintf(stderr, "zeroctl: cannot reach zerod at %s: %s: %s%s\n", address_of(c).c_str(),
                 code_name(st.error_code()), st.error_message().c_str(),
                 c.addr.empty() ? " (is `zerod serve` running? without --listen it listens there; "
                                  "else pass its address with --addr)"
                                : "");
  } else {
    std::fprintf(stderr, "zeroctl: %s: %s\n", code_name(st.error_code()),
                 st.error_message().c_str());
  }
  return code;
}

struct Client {
  explicit Client(const Connection& c) : conn(c) {
    if (!c.token_file.empty()) token = zerod::read_token_file(c.token_file);
    zerod::ClientSecurity sec;
    sec.tls_ca = c.tls_ca;
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(4 << 20);
    channel = grpc::CreateCustomChannel(address_of(c), zerod::client_credentials(sec), args);
    stub = Control::NewStub(channel);
  }
  void prepare(grpc::ClientContext& ctx, bool deadline = true) const {
    if (deadline) {
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(conn.timeout_s * 1000)));
    }
    zerod::add_auth_metadata(ctx, token);
  }
  Connection conn;
  std::string token;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<Control::Stub> stub;
};

nlohmann::ordered_json json_of(const google::protobuf::Message& m);

// One field's value. Unlike protobuf's JSON mapping, 64-bit integers are numbers, not strings
// (programs compare steps and byte counts as numbers); non-finite doubles are its strings "NaN",
// "Infinity", "-Infinity".
nlohmann::ordered_json json_of_value(const google::protobuf::Message& m,
                                     const google::protobuf::FieldDescriptor* f, int index) {
  using FD = google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  const bool rep = f->is_repeated();
  auto real = [](double v) -> nlohmann::ordered_json {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
    return v;
  };
  switch (f->cpp_type()) {
    case FD::CPPTYPE_INT32:
      return rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f);
    case FD::CPPTYPE_INT64:
      return rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f);
    case FD::CPPTYPE_UINT32:
      return rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f);
    case FD::CPPTYPE_UINT64:
      return rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f);
    case FD::CPPTYPE_DOUBLE:
      return real(rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f));
    case FD::CPPTYPE_FLOAT:
      return real(rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f));
    case FD::CPPTYPE_BOOL:
      return rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f);
    case FD::CPPTYPE_ENUM:
      return (rep ? r->GetRepeatedEnum(m, f, index) : r->GetEnum(m, f))->name();
    case FD::CPPTYPE_STRING:
      return rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
    case FD::CPPTYPE_MESSAGE:
      return json_of(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f));
  }
  return nullptr;
}

// The message as JSON: every field by its proto name, defaults included; a field with presence
// (proto3 optional, a message) only when set.
nlohmann::ordered_json json_of(const google::protobuf::Message& m) {
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  const google::protobuf::Reflection* r = m.GetReflection();
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      for (int k = 0; k < r->FieldSize(m, f); ++k) a.push_back(json_of_value(m, f, k));
      out[f->name()] = std::move(a);
    } else if (!f->has_presence() || r->HasField(m, f)) {
      out[f->name()] = json_of_value(m, f, 0);
    }
  }
  return out;
}

std::string to_json(const google::protobuf::Message& m) {
  return json_of(m).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string state_name(zerod::v1::JobState s) {
  std::string n = zerod::v1::JobState_Name(s);
  if (n.rfind("JOB_STATE_", 0) == 0) n = n.substr(10);
  for (char& ch : n) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return n;
}

std::string duration(double s) {
  if (s <= 0) return "-";
  const auto t = static_cast<int64_t>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(t / 3600),
                  static_cast<long long>(t / 60 % 60));
  else if (t >= 60)
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(t / 60),
                  static_cast<long long>(t % 60));
  else
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(t));
  return buf;
}

// An elastic job's membership: "epoch 2, nodes [0, 1] of 2:3, waiting [2], restarts 1/3, last
// recovery 2.5 s (12s ago): node 2 left: no heartbeat for 2.0 s".
std::string elastic_line(const zerod::v1::ElasticMembership& e) {
  auto list = [](const auto& ranks) {
    std::string out = "[";
    for (int i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
    return out + "]";
  };
  std::ostringstream o;
  o << "epoch " << e.epoch() << ", nodes " << list(e.nodes()) << " of " << e.min_nodes() << ":"
    << e.max_nodes();
  if (e.waiting_size() > 0) o << ", waiting " << list(e.waiting());
  o << ", restarts " << e.restarts_used() << "/" << e.max_restarts();
  if (e.since_last_recovery_seconds() >= 0) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), ", last recovery %.1f s (%s ago)", e.last_recovery_seconds(),
                  duration(std::max(1.0, e.since_last_recovery_seconds())).c_str());
    o << buf;
  }
  if (e.steps_lost_total() > 0 || e.steps_lost() >= 0)
    o << ", steps lost " << std::max<int64_t>(0, e.steps_lost()) << " (total "
      << e.steps_lost_total() << ")";
  if (e.host_term() > 1)
    o << ", rendezvous on node " << e.host_node() << " at " << e.host_address() << " (term "
      << e.host_term() << ")";
  if (!e.last_change().empty()) o << ": " << e.last_change();
  return o.str();
}

// One line: "job-1 finished | step 40/100 | loss 2.3456 | val 2.4012 | grad norm 0.512 |
// lr 3.000e-03 | 3412 tok/s | MFU 1.2% | 320 samples | ETA 1m05s | checkpoint global_step40 |
// job.json" (the loss scale too when it is not 1: fp16).
std::string status_line(const zerod::v1::JobStatus& s) {
  std::ostringstream o;
  if (s.job_id().empty()) return "idle: no job submitted";
  o << s.job_id() << " " << state_name(s.state());
  if (s.stopped()) o << " (stopped)";
  o << " | step " << s.step() << "/" << s.total_steps();
  char buf[256];
  if (s.step() > 0 && s.tokens_per_s() > 0) {  // (an interrupted job has no recent step)
    std::snprintf(buf, sizeof(buf), " | loss %.4f", s.loss());
    o << buf;
    if (s.has_val_loss()) {
      std::snprintf(buf, sizeof(buf), " | val %.4f", s.val_loss());
      o << buf;
    }
    std::snprintf(buf, sizeof(buf), " | grad norm %.3g", s.grad_norm());
    o << buf;
    if (s.loss_scale() != 1) {
      std::snprintf(buf, sizeof(buf), " | loss scale %g", s.loss_scale());
      o << buf;
    }
    std::snprintf(buf, sizeof(buf), " | lr %.3e | %.0f tok/s | MFU %.1f%%", s.lr(),
                  s.tokens_per_s(), 100 * s.mfu());
    o << buf;
  } else if (s.has_val_loss()) {
    std::snprintf(buf, sizeof(buf), " | val %.4f", s.val_loss());
    o << buf;
  }
  if (s.samples_seen() > 0) o << " | " << s.samples_seen() << " samples";
  if (s.eta_seconds() > 0) o << " | ETA " << duration(s.eta_seconds());
  if (!s.last_checkpoint().empty()) o << " | checkpoint " << s.last_checkpoint();
  if (s.has_elastic()) o << " | " << elastic_line(s.elastic());
  if (!s.reason().empty()) o << " | " << s.reason();
  if (!s.job_name().empty()) o << " | " << s.job_name();
  return o.str();
}

}  // namespace

int submit(const Connection& c, const std::string& job_path, const std::string& resume) {
  std::ifstream in(job_path, std::ios::binary);
  if (!in) ZD_THROW_INPUT("{}: cannot read the job file", job_path);
  std::stringstream ss;
  ss << in.rdbuf();
  Client cl(c);
  zerod::v1::SubmitJobRequest req;
  req.set_job_json(ss.str());
  req.set_name(job_path);
  req.set_resume(resume);
  // The job's relative paths resolve against its file's directory, wherever the daemon runs.
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(job_path, ec);
  if (ec)
    ZD_THROW_INPUT("{}: cannot make the job file's path absolute: {}", job_path, ec.message());
  req.set_base_dir(abs.lexically_normal().parent_path().string());
  zerod::v1::SubmitJobResponse resp;
  grpc::ClientContext ctx;
  cl.prepare(ctx);
  const grpc::Status st = cl.stub->SubmitJob(&ctx, req, &resp);
  if (!st.ok()) return fail(c, st);
  std::printf("%s\n", resp.job_id().c_str());
  return 0;
}

int status(const Connection& c, bool watch, bool json) {
  Client cl(c);
  if (!watch) {
    zerod::v1::JobStatus s;
    grpc::ClientContext ctx;
    cl.prepare(ctx);
    const grpc::Status st = cl.stub->GetStatus(&ctx, {}, &s);
    if (!st.ok()) return fail(c, st);
    std::printf("%s\n", json ? to_json(s).c_str() : status_line(s).c_str());
    return 0;
  }
  grpc::ClientContext ctx;
  cl.prepare(ctx, /*deadline=*/false);
  zerod::v1::WatchStatusRequest req;
  req.set_max_interval_ms(1000);
  auto reader = cl.stub->WatchStatus(&ctx, req);
  const bool tty = !json && ::isatty(STDOUT_FILENO);
  zerod::v1::JobStatus s;
  size_t last_len = 0;
  while (reader->Read(&s)) {
    if (json) {
      std::printf("%s\n", to_json(s).c_str());
    } else if (tty) {
      // One live line, redrawn in place.
      const std::string line = status_line(s);
      std::printf("\r%s%s", line.c_str(),
                  std::string(last_len > line.size() ? last_len - line.size() : 0, ' ').c_str());
      last_len = line.size();
    } else {
      std::printf("%s\n", status_line(s).c_str());
    }
    std::fflush(stdout);
  }
  if (tty) std::printf("\n");
  const grpc::Status st = reader->Finish();
  if (!st.ok()) return fail(c, st);
  return s.state() == zerod::v1::JOB_STATE_FAILED ? 1 : 0;
}

int checkpoint_save(const Connection& c, const std::string& tag, bool overwrite) {
  Client cl(c);
  zerod::v1::SaveCheckpointRequest req;
  req.set_tag(tag);
  req.set_overwrite(overwrite);
  zerod::v1::SaveCheckpointResponse resp;
  grpc::ClientContext ctx;
  cl.prepare(ctx);
  const grpc::Status st = cl.stub->SaveCheckpoint(&ctx, req, &resp);
  if (!st.ok()) return fail(c, st);
  std::printf("checkpoint %s saved at step %lld\n", resp.tag().c_str(),
              static_cast<long long>(resp.step()));
  return 0;
}

int checkpoint_list(const Connection& c, bool json) {
  Client cl(c);
  zerod::v1::ListCheckpointsResponse resp;
  grpc::ClientContext ctx;
  cl.prepare(ctx);
  const grpc::Status st = cl.stub->ListCheckpoints(&ctx, {}, &resp);
  if (!st.ok()) return fail(c, st);
  if (json) {
    std::printf("%s\n", to_json(resp).c_str());
    return 0;
  }
  std::printf("%s: %d checkpoint%s\n", resp.checkpoint_dir().c_str(), resp.checkpoints_size(),
              resp.checkpoints_size() == 1 ? "" : "s");
  for (const auto& ck : resp.checkpoints()) {
    std::printf("  %-24s step %-8lld world %-3d stage %d %9.1f MB  %s%s\n", ck.tag().c_str(),
                static_cast<long long>(ck.global_step()), ck.world_size(), ck.zero_stage(),
                static_cast<double>(ck.bytes()) / 1e6, ck.created().c_str(),
                ck.latest() ? "  (latest)" : "");
  }
  return 0;
}

int resume(const Connection& c, const std::string& tag) {
  Client cl(c);
  zerod::v1::ResumeRequest req;
  req.set_tag(tag == "latest" ? "" : tag);
  zerod::v1::ResumeResponse resp;
  grpc::ClientContext ctx;
  cl.prepare(ctx);
  const grpc::Status st = cl.stub->Resume(&ctx, req, &resp);
  if (!st.ok()) return fail(c, st);
  std::printf("%s\n", resp.job_id().c_str());
  return 0;
}

int stop(const Connection& c, bool checkpoint, bool wait, double wait_s) {
  Client cl(c);
  zerod::v1::StopRequest req;
  req.set_checkpoint(checkpoint);
  zerod::v1::StopResponse resp;
  {
    grpc::ClientContext ctx;
    cl.prepare(ctx);
    const grpc::Status st = cl.stub->Stop(&ctx, req, &resp);
    if (!st.ok()) return fail(c, st);
  }
  if (!wait) {
    std::printf("%s: stop requested%s\n", resp.job_id().c_str(),
                checkpoint ? " (checkpoint first)" : "");
    return 0;
  }
  // Until the job is down (finished or failed; a newer job id: it ended and another started), so
  // that `zeroctl stop && zeroctl resume` finds no job running.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(wait_s * 1000));
  zerod::v1::JobStatus s;
  for (;;) {
    grpc::ClientContext ctx;
    cl.prepare(ctx);
    const grpc::Status st = cl.stub->GetStatus(&ctx, {}, &s);
    if (!st.ok()) return fail(c, st);
    const bool down = s.job_id() != resp.job_id() || s.state() == zerod::v1::JOB_STATE_FINISHED ||
                      s.state() == zerod::v1::JOB_STATE_FAILED ||
                      s.state() == zerod::v1::JOB_STATE_INTERRUPTED;
    if (down) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::fprintf(stderr,
                   "zeroctl: %s has not stopped after %g s (state %s, step %lld; the stop stays "
                   "requested and takes effect at its next step boundary; zeroctl status --watch "
                   "follows it)\n",
                   resp.job_id().c_str(), wait_s, state_name(s.state()).c_str(),
                   static_cast<long long>(s.step()));
      return kExitStillRunning;
    }
    // Every 100 ms, and once more at the deadline.
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        std::chrono::milliseconds(100), deadline - std::chrono::steady_clock::now()));
  }
  if (s.job_id() != resp.job_id()) {
    std::printf("%s stopped (%s runs now)\n", resp.job_id().c_str(), s.job_id().c_str());
    return 0;
  }
  if (s.state() == zerod::v1::JOB_STATE_FAILED) {
    std::fprintf(stderr, "zeroctl: %s failed while stopping: %s\n", s.job_id().c_str(),
                 s.reason().c_str());
    return 1;
  }
  std::string saved;
  if (!s.last_checkpoint().empty())
    saved = (checkpoint ? ", checkpoint " : ", last checkpoint ") + s.last_checkpoint();
  std::printf("%s stopped at step %lld%s\n", s.job_id().c_str(), static_cast<long long>(s.step()),
              saved.c_str());
  return 0;
}

}  // namespace zeroctl
