#include "engine/runtime/grpc/channel.h"

#include "engine/runtime/grpc/auth.h"

#include <fmt/format.h>

namespace zerod {

std::shared_ptr<grpc::Channel> make_rendezvous_channel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A connection per session: a node's channel breaking must not be shared by others.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // TLS when this process was given a CA for its rendezvous (set_rendezvous_tls).
  return grpc::CreateCustomChannel(address, client_credentials(rendezvous_client_security()), args);
}

bool wait_connected(grpc::Channel& channel, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::system_clock::now() + timeout;
  for (;;) {
    const grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
    if (state == GRPC_CHANNEL_READY) return true;
    if (!channel.WaitForStateChange(state, deadline)) return false;
  }
}

void prepare_context(grpc::ClientContext& ctx, std::chrono::milliseconds deadline) {
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  add_auth_metadata(ctx);
}

std::string describe_status(const grpc::Status& status) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  const int code = static_cast<int>(status.error_code());
  const char* name = code >= 0 && code <= 16 ? kNames[code] : "UNKNOWN";
  if (status.error_message().empty()) return name;
  return fmt::format("{}: {}", name, status.error_message());
}

void throw_status(const grpc::Status& status, const std::string& what, const std::string& address) {
  switch (status.error_code()) {
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::ALREADY_EXISTS:
      // The server's message says what disagreed; it is the whole story.
      throw InputError(
          fmt::format("rendezvous at {}: {} refused: {}", address, what, status.error_message()));
    case grpc::StatusCode::UNAUTHENTICATED:
      throw InputError(
          fmt::format("rendezvous at {}: {} refused: {} (every node needs the same --token-file)",
                      address, what, status.error_message()));
    case grpc::StatusCode::UNIMPLEMENTED:
      throw InputError(fmt::format(
          "{} does not serve the zerod Rendezvous service ({} answered {}): check --master",
          address, what, describe_status(status)));
    case grpc::StatusCode::UNAVAILABLE:
      throw Error(ErrorKind::kPeerLost,
                  fmt::format("rendezvous master at {} unreachable during {}: {}", address, what,
                              status.error_message()));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::CANCELLED:
      throw Error(ErrorKind::kPeerLost, fmt::format("rendezvous at {}: {} failed: {}", address,
                                                    what, describe_status(status)));
    default:
      throw Error(ErrorKind::kInternal, fmt::format("rendezvous at {}: {} failed: {}", address,
                                                    what, describe_status(status)));
  }
}

}  // namespace zerod
