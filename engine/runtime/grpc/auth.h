// Security of zerod's gRPC endpoints (DESIGN.md section 6): bearer tokens and TLS.
//
// The daemon listens on a private Unix socket by default (endpoint.h). A TCP address needs a
// token file, loopback included (any local user can connect to a loopback port), unless
// --insecure-loopback says any local user may drive it; every RPC then needs
// "authorization: Bearer <token>" metadata, compared in constant time (the Rendezvous service
// of multi-node daemon jobs checks it in its handlers, UNAUTHENTICATED, and is served over TLS
// when the master daemon serves TLS: set_rendezvous_tls). With TLS the check is
// gRPC's auth-metadata processor (UNAUTHENTICATED for every service). In plaintext gRPC offers
// no such hook (its insecure credentials refuse a processor), so the Control service checks
// the token in each handler (UNAUTHENTICATED) and an interceptor cancels calls to the other
// services (health, reflection) that lack it (CANCELLED). --tls-cert/--tls-key serve TLS;
// clients trust --tls-ca.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <string>

namespace zerod {

struct ServerSecurity {
  std::string token;     // empty: no token check
  std::string tls_cert;  // PEM file paths; both or neither
  std::string tls_key;
  bool insecure_loopback = false;  // a TCP loopback address without a token (any local user)
};

struct ClientSecurity {
  std::string token;   // sent as "authorization: Bearer <token>" when non-empty
  std::string tls_ca;  // PEM file of the CA (or self-signed cert) to trust; empty: plaintext
};

// Reads a token file: the first line, whitespace trimmed. InputError naming the file when it
// is missing, empty, or shorter than 16 characters.
std::string read_token_file(const std::string& path);

// 127.0.0.0/8, ::1, localhost.
bool is_loopback_host(const std::string& host);

// Refuses (InputError) a TCP host without a token (loopback: unless sec.insecure_loopback),
// --insecure-loopback elsewhere, and half a TLS pair. `listen` is the address as
// given (a "unix:PATH" one is private: only the TLS pair is checked).
void check_listen_policy(const std::string& listen, const std::string& host,
                         const ServerSecurity& sec);

// Server credentials: TLS (with the token processor when sec.token is set) or plaintext.
std::shared_ptr<grpc::ServerCredentials> server_credentials(const ServerSecurity& sec);

// OK when the call carries "authorization: Bearer <token>" (or token is empty), else
// UNAUTHENTICATED with a message.
grpc::Status check_token(const grpc::ServerContextBase& ctx, const std::string& token);

// Plaintext with a token: cancels calls of methods outside `checked_prefix` (whose handlers
// check themselves) that do not carry the token.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> token_interceptor(
    std::string token, std::string checked_prefix);

// Client credentials (TLS with the CA, or plaintext).
std::shared_ptr<grpc::ChannelCredentials> client_credentials(const ClientSecurity& sec);

// The token of this process (zerod serve --token-file): its Rendezvous clients send it and its
// Rendezvous server requires it. Set once at start-up.
void set_client_token(const std::string& token);
std::string process_token();
// The TLS of this process's Rendezvous endpoints (zerod serve with --tls-cert/--tls-key: the
// token crosses the network there too, so it goes over TLS as on the Control service). A master
// daemon's jobs serve their Rendezvous service with cert/key; every client of it trusts ca
// (the master: --tls-ca, else its own certificate; node daemons: --tls-ca). Empty: plaintext.
// Set once at start-up; the files are read (and checked) here.
void set_rendezvous_tls(const std::string& cert, const std::string& key, const std::string& ca);
// The process token and the TLS pair (server) or CA (client) of its Rendezvous endpoints.
ServerSecurity rendezvous_server_security();
ClientSecurity rendezvous_client_security();
// Adds the process's token (if any) to a call's metadata.
void add_auth_metadata(grpc::ClientContext& ctx);
void add_auth_metadata(grpc::ClientContext& ctx, const std::string& token);

}  // namespace zerod
