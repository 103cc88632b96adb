#include "engine/metrics/prometheus_exporter.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <string_view>
#include <thread>

#include "core/constant_time.h"
#include "core/error.h"
#include "core/log.h"

namespace zerod {

namespace pm = prometheus;

// The HTTP side is ours, not prometheus-cpp's Exposer: its civetweb worker threads get 100 KiB
// stacks, and in zerod the static TLS of the libraries (OpenBLAS alone holds 60 KiB) leaves too
// little of them, so the first scrape overflowed the stack. One thread, one connection at a
// time, GET /metrics only: that is all a Prometheus scrape needs.
class MetricsHttpServer {
 public:
  MetricsHttpServer(const std::string& address, std::function<std::string()> body,
                    std::string token)
      : body_(std::move(body)), token_(std::move(token)) {
    const auto colon = address.rfind(':');
    ZD_CHECK_INPUT(colon != std::string::npos, "--metrics-port: bad address {}", address);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
    if (::inet_pton(AF_INET, address.substr(0, colon).c_str(), &a.sin_addr) != 1) {
      ZD_THROW_INPUT("--metrics-port: bad address {}", address);
    }
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::listen(fd_, 16) != 0) {
      const int err = errno;
      if (fd_ >= 0) ::close(fd_);
      ZD_THROW_INPUT("--metrics-port: cannot serve /metrics on {}: {}", address,
                     std::strerror(err));
    }
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { loop(); });
  }
  ~MetricsHttpServer() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }

 private:
  void loop() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      serve(c);
      ::close(c);
    }
  }
  void serve(int c) {
    std::string req;
    char buf[2048];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (req.find("\r\n\r\n") == std::string::npos && req.size() < 16384 &&
           std::chrono::steady_clock::now() < deadline) {
      pollfd p{c, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = ::recv(c, buf, sizeof(buf), 0);
      if (n <= 0) return;
      req.append(buf, static_cast<size_t>(n));
    }
    std::string status = "200 OK", body, extra;
    if (!token_.empty() && !authorized(req)) {
      status = "401 Unauthorized";
      extra = "WWW-Authenticate: Bearer realm=\"zerod\"\r\n";
      body = "zerod's /metrics needs 'Authorization: Bearer <token>' (the daemon's --token-file)\n";
    } else if (req.rfind("GET /metrics", 0) == 0) {
      try {
        body = body_();
      } catch (const std::exception& e) {
        status = "500 Internal Server Error";
        body = e.what();
      }
    } else {
      status = "404 Not Found";
      body = "zerod serves GET /metrics\n";
    }
    const std::string head = fmt::format(
        "HTTP/1.1 {}\r\n{}Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        status, extra, body.size());
    const std::string out = head + body;
    size_t sent = 0;
    while (sent < out.size()) {
      const ssize_t n = ::send(c, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
  }

  // Whether the request's headers hold "Authorization: Bearer <token_>" (the header name in any
  // case, the value compared in constant time).
  bool authorized(const std::string& req) const {
    size_t at = req.find("\r\n");
    while (at != std::string::npos && at + 2 < req.size()) {
      const size_t end = req.find("\r\n", at + 2);
      if (end == std::string::npos) break;
      const std::string_view line(req.data() + at + 2, end - at - 2);
      at = end;
      constexpr std::string_view kName = "authorization:";
      if (line.size() < kName.size() ||
          ::strncasecmp(line.data(), kName.data(), kName.size()) != 0) {
        continue;
      }
      std::string_view value = line.substr(kName.size());
      while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      while (!value.empty() && value.back() == ' ') value.remove_suffix(1);
      return equal_constant_time(value, "Bearer " + token_);
    }
    return false;
  }

  std::function<std::string()> body_;
  std::string token_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

struct PrometheusExporter::Impl {
  std::unique_ptr<MetricsHttpServer> server;
  std::shared_ptr<pm::Registry> registry = std::make_shared<pm::Registry>();
  std::mutex mu;
  // gauges
  pm::Family<pm::Gauge>* loss = nullptr;
  pm::Family<pm::Gauge>* lr = nullptr;
  pm::Family<pm::Gauge>* grad_norm = nullptr;
  pm::Family<pm::Gauge>* loss_scale = nullptr;
  pm::Family<pm::Gauge>* tokens = nullptr;
  pm::Family<pm::Gauge>* mfu = nullptr;
  pm::Family<pm::Gauge>* bubble = nullptr;
  pm::Family<pm::Gauge>* step = nullptr;
  pm::Family<pm::Gauge>* memory = nullptr;
  pm::Family<pm::Gauge>* memory_peak = nullptr;
  // counters (advanced by the change since the last step)
  pm::Family<pm::Counter>* steps = nullptr;
  pm::Family<pm::Counter>* skipped = nullptr;
  pm::Family<pm::Counter>* checkpoints = nullptr;
  pm::Family<pm::Counter>* coll_calls = nullptr;
  pm::Family<pm::Counter>* coll_bytes = nullptr;
  pm::Family<pm::Counter>* coll_seconds = nullptr;
  std::map<std::string, double> last;  // counter key -> value last seen
  std::map<std::string, pm::Family<pm::Gauge>*> plain;  // set_gauge's, by name
  // Models with experts (registered at their first step, so dense jobs show none).
  pm::Family<pm::Gauge>*moe_tokens = nullptr, *moe_dropped = nullptr, *moe_aux = nullptr,
  *moe_z = nullptr;

  void set_moe(const std::string& rank, const MoeMetrics& m) {
    if (moe_tokens == nullptr) {
      auto gauge = [&](const char* name, const char* help) {
        return &pm::BuildGauge().Name(name).Help(help).Register(*registry);
      };
      moe_tokens = gauge("zerod_moe_tokens",
                         "Rows each expert of a MoE layer computed in the last step (all ranks)");
      moe_dropped = gauge("zerod_moe_dropped_fraction",
                          "Fraction of a MoE layer's assignments dropped by the capacity");
      moe_aux = gauge("zerod_moe_aux_loss",
                      "Load-balancing loss of a MoE layer (layer=\"all\": the objective's)");
      moe_z = gauge("zerod_moe_z_loss", "Router z-loss of a MoE layer (layer=\"all\": summed)");
    }
    for (const MoeLayerMetrics& l : m.layers) {
      const std::string layer = std::to_string(l.layer);
      const pm::Labels ll{{"rank", rank}, {"layer", layer}};
      moe_dropped->Add(ll).Set(l.dropped_fraction());
      moe_aux->Add(ll).Set(l.aux_loss);
      moe_z->Add(ll).Set(l.z_loss);
      for (size_t e = 0; e < l.tokens.size(); ++e) {
        moe_tokens->Add({{"rank", rank}, {"layer", layer}, {"expert", std::to_string(e)}})
            .Set(static_cast<double>(l.tokens[e]));
      }
    }
    const pm::Labels all{{"rank", rank}, {"layer", "all"}};
    const int64_t a = m.assignments();
    moe_dropped->Add(all).Set(a > 0 ? static_cast<double>(m.dropped()) / static_cast<double>(a)
                                    : 0.0);
    moe_aux->Add(all).Set(m.aux_loss);
    moe_z->Add(all).Set(m.z_loss);
  }

  void advance(pm::Family<pm::Counter>* f, const pm::Labels& labels, double value) {
    std::string key = f->GetName();
    for (const auto& [k, v] : labels) key += "|" + k + "=" + v;
    double& seen = last[key];
    if (value > seen)
      f->Add(labels).Increment(value - seen);
    else
      f->Add(labels);  // make the series visible at 0
    seen = std::max(seen, value);
  }
};

PrometheusExporter::PrometheusExporter(const std::string& address, std::string token)
    : impl_(std::make_unique<Impl>()) {
  auto& r = *impl_->registry;
  auto gauge = [&](const char* name, const char* help) {
    return &pm::BuildGauge().Name(name).Help(help).Register(r);
  };
  auto counter = [&](const char* name, const char* help) {
    return &pm::BuildCounter().Name(name).Help(help).Register(r);
  };
  impl_->loss = gauge("zerod_loss", "Training loss of the last step");
  impl_->lr = gauge("zerod_learning_rate", "Learning rate of the last step");
  impl_->grad_norm = gauge("zerod_grad_norm", "Global gradient norm before clipping");
  impl_->loss_scale = gauge("zerod_loss_scale", "fp16 loss scale");
  impl_->tokens = gauge("zerod_tokens_per_second", "Training throughput of the last step");
  impl_->mfu = gauge("zerod_mfu", "Model FLOPs utilisation of the last step (0-1)");
  impl_->bubble = gauge("zerod_pipeline_bubble",
                        "Pipeline jobs: fraction of the last step outside compute (0-1)");
  impl_->step = gauge("zerod_step", "Last completed optimizer step");
  impl_->memory = gauge("zerod_memory_bytes", "Memory the rank's tracker holds");
  impl_->memory_peak = gauge("zerod_memory_peak_bytes", "Peak of zerod_memory_bytes");
  impl_->steps = counter("zerod_steps_total", "Optimizer steps taken in this run");
  impl_->skipped = counter("zerod_skipped_steps_total", "Steps skipped on fp16 overflow");
  impl_->checkpoints = counter("zerod_checkpoints_total", "Checkpoints saved in this run");
  impl_->coll_calls = counter("zerod_collective_calls_total", "Collectives completed");
  impl_->coll_bytes = counter("zerod_collective_bytes_total", "Bytes of completed collectives");
  impl_->coll_seconds =
      counter("zerod_collective_seconds_total", "Time in completed collectives (start to end)");
  impl_->server = std::make_unique<MetricsHttpServer>(
      address, [reg = impl_->registry] { return pm::TextSerializer().Serialize(reg->Collect()); },
      std::move(token));
}

PrometheusExporter::~PrometheusExporter() = default;

int PrometheusExporter::port() const {
  return impl_->server->port();
}

void PrometheusExporter::on_step(int rank, const StepMetrics& m, const RankCounters& c) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Impl& i = *impl_;
  const pm::Labels l{{"rank", std::to_string(rank)}};
  i.loss->Add(l).Set(m.loss);
  i.lr->Add(l).Set(m.lr);
  i.grad_norm->Add(l).Set(m.grad_norm);
  i.loss_scale->Add(l).Set(m.loss_scale);
  i.tokens->Add(l).Set(m.tokens_per_s);
  i.mfu->Add(l).Set(m.mfu);
  if (m.pipeline_bubble) i.bubble->Add(l).Set(*m.pipeline_bubble);
  if (m.moe) i.set_moe(std::to_string(rank), *m.moe);
  i.step->Add(l).Set(static_cast<double>(m.step));
  i.memory->Add(l).Set(static_cast<double>(c.memory_bytes));
  i.memory_peak->Add(l).Set(static_cast<double>(c.memory_peak_bytes));
  i.advance(i.steps, l, static_cast<double>(c.steps));
  i.advance(i.skipped, l, static_cast<double>(c.skipped_steps));
  i.advance(i.checkpoints, l, static_cast<double>(c.checkpoints));
  for (const auto& [op, t] : c.collectives) {
    const pm::Labels lo{{"rank", std::to_string(rank)}, {"op", op}};
    i.advance(i.coll_calls, lo, static_cast<double>(t.calls));
    i.advance(i.coll_bytes, lo, static_cast<double>(t.bytes));
    i.advance(i.coll_seconds, lo, t.seconds);
  }
}

void PrometheusExporter::set_gauge(const std::string& name, const std::string& help, double value) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& f = impl_->plain[name];
  if (f == nullptr) f = &pm::BuildGauge().Name(name).Help(help).Register(*impl_->registry);
  f->Add({}).Set(value);
}

}  // namespace zerod
