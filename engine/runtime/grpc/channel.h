// The client end of the Rendezvous service: channels to the master and the mapping of gRPC
// statuses to zerod errors (exit codes).
//
// Security (auth.h): prepare_context() adds the process's bearer token (if any) to every call.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "core/error.h"

namespace zerod {

// A channel to the master at address ("HOST:PORT") that retries connecting quickly (100 ms,
// backing off to 1 s) and owns its connection (no sharing between sessions of one process).
std::shared_ptr<grpc::Channel> make_rendezvous_channel(const std::string& address);

// Waits until the channel is connected; false when `timeout` passes first.
bool wait_connected(grpc::Channel& channel, std::chrono::milliseconds timeout);

// Sets the deadline and the bearer token (auth.h) of one call.
void prepare_context(grpc::ClientContext& ctx, std::chrono::milliseconds deadline);

// Throws the zerod error for a failed call: FAILED_PRECONDITION, INVALID_ARGUMENT,
// ALREADY_EXISTS, UNAUTHENTICATED (the token) and UNIMPLEMENTED (not a zerod at that address)
// are the user's (InputError, exit 2) -- nodes that disagree; UNAVAILABLE,
// DEADLINE_EXCEEDED, ABORTED and CANCELLED are a lost peer (exit 3); anything else is
// internal. `what` names the call ("join", "store get 'key'"), `address` the master.
[[noreturn]] void throw_status(const grpc::Status& status, const std::string& what,
                               const std::string& address);

// "UNAVAILABLE: failed to connect ..." for messages.
std::string describe_status(const grpc::Status& status);

// Initial metadata of a Heartbeat call: the node it beats for (so that the master can tell
// whose stream broke even before its first beat arrived).
constexpr const char* kNodeRankMetadata = "zerod-node-rank";
constexpr const char* kSessionMetadata = "zerod-session";

// Upper bound on gRPC message sizes (store values are at most 1 MiB).
constexpr int kMaxMessageBytes = 4 << 20;

}  // namespace zerod
