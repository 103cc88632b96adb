#include "engine/runtime/grpc/auth.h"

#include <sys/stat.h>

#include <fstream>
#include <mutex>
#include <sstream>

#include "core/constant_time.h"
#include "core/error.h"
#include "core/log.h"

namespace zerod {

namespace {

std::string read_pem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ZD_THROW_INPUT("{} {}: cannot read the file", what, path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().find("-----BEGIN") == std::string::npos) {
    ZD_THROW_INPUT("{} {}: not a PEM file", what, path);
  }
  return ss.str();
}

class TokenProcessor : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenProcessor(std::string token) : expected_("Bearer " + std::move(token)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext*, OutputMetadata* consumed,
                       OutputMetadata*) override {
    auto it = metadata.find("authorization");
    if (it == metadata.end()) {
      return {grpc::StatusCode::UNAUTHENTICATED,
              "this zerod needs 'authorization: Bearer <token>' metadata (zeroctl --token-file)"};
    }
    const std::string got(it->second.data(), it->second.size());
    if (!equal_constant_time(got, expected_)) {
      return {grpc::StatusCode::UNAUTHENTICATED, "wrong token"};
    }
    (void)consumed;  // left in place: the Control handlers check it again
    return grpc::Status::OK;
  }

 private:
  std::string expected_;
};

std::mutex g_token_mu;
std::string g_token;

}  // namespace

std::string read_token_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) ZD_THROW_INPUT("--token-file {}: cannot read the file", path);
  std::string line;
  std::getline(in, line);
  const auto b = line.find_first_not_of(" \t\r\n");
  const auto e = line.find_last_not_of(" \t\r\n");
  const std::string token = b == std::string::npos ? "" : line.substr(b, e - b + 1);
  if (token.size() < 16) {
    ZD_THROW_INPUT("--token-file {}: the token (its first line) must be at least 16 characters",
                   path);
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    spdlog::warn("--token-file {}: readable by group or others (chmod 600 it)", path);
  }
  return token;
}

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

void check_listen_policy(const std::string& listen, const std::string& host,
                         const ServerSecurity& sec) {
  if (sec.tls_cert.empty() != sec.tls_key.empty()) {
    ZD_THROW_INPUT("--tls-cert and --tls-key go together");
  }
  if (listen.rfind("unix:", 0) == 0) {
    if (sec.insecure_loopback) {
      ZD_THROW_INPUT(
          "--insecure-loopback goes with a TCP loopback --listen (127.0.0.1:PORT); --listen {} "
          "is a Unix socket, private to this user already",
          listen);
    }
    return;
  }
  if (!is_loopback_host(host)) {
    if (sec.insecure_loopback) {
      ZD_THROW_INPUT(
          "--insecure-loopback: --listen {} is not a loopback address; anything but loopback "
          "needs --token-file",
          listen);
    }
    if (sec.token.empty()) {
      ZD_THROW_INPUT(
          "--listen {}: listening on an address other than loopback needs --token-file (every "
          "RPC must then carry the token)",
          listen);
    }
    return;
  }
  if (sec.token.empty() && !sec.insecure_loopback) {
    ZD_THROW_INPUT(
        "--listen {}: a TCP port, even on loopback, lets every local user drive this daemon (and "
        "run jobs as this user): give --token-file, or leave --listen out to listen on the "
        "private Unix socket, or pass --insecure-loopback to accept that",
        listen);
  }
}

std::shared_ptr<grpc::ServerCredentials> server_credentials(const ServerSecurity& sec) {
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (!sec.tls_cert.empty()) {
    grpc::SslServerCredentialsOptions o;
    o.pem_key_cert_pairs.push_back(
        {read_pem(sec.tls_key, "--tls-key"), read_pem(sec.tls_cert, "--tls-cert")});
    creds = grpc::SslServerCredentials(o);
    if (!sec.token.empty())
      creds->SetAuthMetadataProcessor(std::make_shared<TokenProcessor>(sec.token));
    return creds;
  }
  return grpc::InsecureServerCredentials();  // the token: check_token + token_interceptor
}

grpc::Status check_token(const grpc::ServerContextBase& ctx, const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return {grpc::StatusCode::UNAUTHENTICATED,
            "this zerod needs 'authorization: Bearer <token>' metadata (zeroctl --token-file)"};
  }
  if (!equal_constant_time(std::string(it->second.data(), it->second.size()), "Bearer " + token)) {
    return {grpc::StatusCode::UNAUTHENTICATED, "wrong token"};
  }
  return grpc::Status::OK;
}

namespace {

class TokenInterceptor : public grpc::experimental::Interceptor {
 public:
  TokenInterceptor(grpc::experimental::ServerRpcInfo* info, const std::string& token, bool checked)
      : info_(info), token_(token), checked_(checked) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (!checked_ && methods->QueryInterceptionHookPoint(
                         grpc::experimental::InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      auto* md = methods->GetRecvInitialMetadata();
      bool ok = false;
      if (md != nullptr) {
        auto it = md->find("authorization");
        ok = it != md->end() &&
             equal_constant_time(std::string(it->second.data(), it->second.size()),
                                 "Bearer " + token_);
      }
      if (!ok) info_->server_context()->TryCancel();
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* info_;
  const std::string& token_;
  bool checked_;
};

class TokenInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  TokenInterceptorFactory(std::string token, std::string prefix)
      : token_(std::move(token)), prefix_(std::move(prefix)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const bool checked = std::string(info->method()).rfind(prefix_, 0) == 0;
    return new TokenInterceptor(info, token_, checked);
  }

 private:
  std::string token_, prefix_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> token_interceptor(
    std::string token, std::string checked_prefix) {
  return std::make_unique<TokenInterceptorFactory>(std::move(token), std::move(checked_prefix));
}

std::shared_ptr<grpc::ChannelCredentials> client_credentials(const ClientSecurity& sec) {
  if (sec.tls_ca.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = read_pem(sec.tls_ca, "--tls-ca");
  return grpc::SslCredentials(o);
}

void set_client_token(const std::string& token) {
  std::lock_guard<std::mutex> lock(g_token_mu);
  g_token = token;
}

namespace {
std::mutex g_tls_mu;
std::string g_tls_cert, g_tls_key, g_tls_ca;
}  // namespace

void set_rendezvous_tls(const std::string& cert, const std::string& key, const std::string& ca) {
  ZD_CHECK_INPUT(cert.empty() == key.empty(), "--tls-cert and --tls-key go together (got only {})",
                 cert.empty() ? "--tls-key" : "--tls-cert");
  if (!cert.empty()) {
    read_pem(cert, "--tls-cert");
    read_pem(key, "--tls-key");
  }
  if (!ca.empty()) read_pem(ca, "--tls-ca");
  std::lock_guard<std::mutex> lock(g_tls_mu);
  g_tls_cert = cert;
  g_tls_key = key;
  g_tls_ca = ca;
}

ServerSecurity rendezvous_server_security() {
  ServerSecurity sec;
  sec.token = process_token();
  std::lock_guard<std::mutex> lock(g_tls_mu);
  sec.tls_cert = g_tls_cert;
  sec.tls_key = g_tls_key;
  return sec;
}

ClientSecurity rendezvous_client_security() {
  ClientSecurity sec;
  sec.token = process_token();
  std::lock_guard<std::mutex> lock(g_tls_mu);
  sec.tls_ca = g_tls_ca;
  return sec;
}

void add_auth_metadata(grpc::ClientContext& ctx, const std::string& token) {
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
}

std::string process_token() {
  std::lock_guard<std::mutex> lock(g_token_mu);
  return g_token;
}

void add_auth_metadata(grpc::ClientContext& ctx) {
  std::string token;
  {
    std::lock_guard<std::mutex> lock(g_token_mu);
    token = g_token;
  }
  add_auth_metadata(ctx, token);
}

}  // namespace zerod
