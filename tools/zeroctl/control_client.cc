#include "tools/zeroctl/control_client.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

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

std::string to_json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  o.always_print_enums_as_ints = false;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
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

// One line: "job-1 running | step 40/100 | loss 2.3456 | 3412 tok/s | ETA 1m05s".
std::string status_line(const zerod::v1::JobStatus& s) {
  std::ostringstream o;
  if (s.job_id().empty()) return "idle: no job submitted";
  o << s.job_id() << " " << state_name(s.state());
  if (s.stopped()) o << " (stopped)";
  o << " | step " << s.step() << "/" << s.total_steps();
  if (s.step() > 0 && s.tokens_per_s() > 0) {  // (an interrupted job has no recent step)
    char buf[128];
    std::snprintf(buf, sizeof(buf), " | loss %.4f | lr %.3e | %.0f tok/s | MFU %.1f%%", s.loss(),
                  s.lr(), s.tokens_per_s(), 100 * s.mfu());
    o << buf;
  }
  if (s.eta_seconds() > 0) o << " | ETA " << duration(s.eta_seconds());
  if (!s.last_checkpoint().empty()) o << " | checkpoint " << s.last_checkpoint();
  if (!s.reason().empty()) o << " | " << s.reason();
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

int checkpoint_save(const Connection& c, const std::string& tag) {
  Client cl(c);
  zerod::v1::SaveCheckpointRequest req;
  req.set_tag(tag);
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

int stop(const Connection& c, bool checkpoint) {
  Client cl(c);
  zerod::v1::StopRequest req;
  req.set_checkpoint(checkpoint);
  zerod::v1::StopResponse resp;
  grpc::ClientContext ctx;
  cl.prepare(ctx);
  const grpc::Status st = cl.stub->Stop(&ctx, req, &resp);
  if (!st.ok()) return fail(c, st);
  std::printf("stop requested%s\n", checkpoint ? " (checkpoint first)" : "");
  return 0;
}

}  // namespace zeroctl
