// The key-value store and the barriers of the Rendezvous service.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstdlib>

#include "engine/runtime/grpc/rendezvous_service.h"

namespace zerod {
namespace {

constexpr size_t kMaxValueBytes = size_t{1} << 20;
constexpr size_t kMaxKeyBytes = 4096;

bool parse_int64(const std::string& text, int64_t* out) {
  if (text.empty()) {
    *out = 0;
    return true;
  }
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || errno == ERANGE) return false;
  *out = v;
  return true;
}

grpc::Status bad_key(const std::string& key) {
  if (key.empty()) return {grpc::StatusCode::INVALID_ARGUMENT, "empty store key"};
  if (key.size() > kMaxKeyBytes)
    return {grpc::StatusCode::INVALID_ARGUMENT,
            fmt::format("store key of {} bytes (at most {})", key.size(), kMaxKeyBytes)};
  return grpc::Status::OK;
}

grpc::Status aborted(const std::string& failure) {
  return {grpc::StatusCode::ABORTED, fmt::format("the job failed: {}", failure)};
}

}  // namespace

void RendezvousService::key_changed(const std::string& key, Effects& fx) {
  for (auto it = gets_.begin(); it != gets_.end();) {
    if (it->key != key) {
      ++it;
      continue;
    }
    it->resp->set_found(true);
    it->resp->set_value(kv_[key]);
    fx.finishes.emplace_back(it->call.reactor, grpc::Status::OK);
    it = gets_.erase(it);
  }
  for (auto it = waits_.begin(); it != waits_.end();) {
    bool all = true;
    for (const auto& k : it->keys) all = all && kv_.count(k) > 0;
    if (!all) {
      ++it;
      continue;
    }
    fx.finishes.emplace_back(it->call.reactor, grpc::Status::OK);
    it = waits_.erase(it);
  }
}

void RendezvousService::abort_waiters(const std::string& message, Effects& fx) {
  const grpc::Status st = aborted(message);
  for (GetCall& c : gets_) fx.finishes.emplace_back(c.call.reactor, st);
  gets_.clear();
  for (WaitCall& c : waits_) fx.finishes.emplace_back(c.call.reactor, st);
  waits_.clear();
  for (BarrierCall& c : barrier_calls_) fx.finishes.emplace_back(c.call.reactor, st);
  barrier_calls_.clear();
}

std::string RendezvousService::barrier_missing(const BarrierState& b) const {
  std::vector<int> missing;
  for (int r = 0; r < nnodes_; ++r)
    if (!b.arrived.count(r)) missing.push_back(r);
  return fmt::format("node rank{} {} did not arrive (arrived: {})", missing.size() == 1 ? "" : "s",
                     fmt::join(missing, ", "), fmt::join(b.arrived, ", "));
}

void RendezvousService::tick_store(Clock::time_point now, Effects& fx) {
  const grpc::Status cancelled(grpc::StatusCode::CANCELLED, "cancelled by the caller");
  for (auto it = gets_.begin(); it != gets_.end();) {
    if (it->call.ctx->IsCancelled()) {
      fx.finishes.emplace_back(it->call.reactor, cancelled);
    } else if (now >= it->call.deadline) {
      it->resp->set_found(false);  // the client names the key and the timeout
      fx.finishes.emplace_back(it->call.reactor, grpc::Status::OK);
    } else {
      ++it;
      continue;
    }
    it = gets_.erase(it);
  }
  for (auto it = waits_.begin(); it != waits_.end();) {
    if (it->call.ctx->IsCancelled()) {
      fx.finishes.emplace_back(it->call.reactor, cancelled);
    } else if (now >= it->call.deadline) {
      for (const auto& k : it->keys)
        if (!kv_.count(k)) it->resp->add_missing(k);
      fx.finishes.emplace_back(it->call.reactor, grpc::Status::OK);
    } else {
      ++it;
      continue;
    }
    it = waits_.erase(it);
  }
  for (auto it = barrier_calls_.begin(); it != barrier_calls_.end();) {
    if (it->call.ctx->IsCancelled()) {
      fx.finishes.emplace_back(it->call.reactor, cancelled);
    } else if (now >= it->call.deadline) {
      const double waited = std::chrono::duration<double>(now - it->call.started).count();
      fx.finishes.emplace_back(
          it->call.reactor,
          grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                       fmt::format("barrier '{}' timed out after {:.1f} s: {}", it->name, waited,
                                   barrier_missing(barriers_[it->name]))));
    } else {
      ++it;
      continue;
    }
    it = barrier_calls_.erase(it);
  }
}

grpc::ServerUnaryReactor* RendezvousService::Set(grpc::CallbackServerContext* ctx,
                                                 const v1::SetRequest* req, v1::SetResponse*) {
  bool denied = false;
  grpc::ServerUnaryReactor* reactor = start_unary(ctx, &denied);
  if (denied) return reactor;
  Effects fx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    grpc::Status st = stopping_ ? unavailable() : bad_key(req->key());
    if (st.ok() && req->value().size() > kMaxValueBytes)
      st = {grpc::StatusCode::INVALID_ARGUMENT,
            fmt::format("store value of {} bytes for '{}' (at most {})", req->value().size(),
                        req->key(), kMaxValueBytes)};
    if (st.ok()) {
      kv_[req->key()] = req->value();
      key_changed(req->key(), fx);
    }
    fx.finishes.emplace_back(reactor, std::move(st));
  }
  apply(fx);
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Get(grpc::CallbackServerContext* ctx,
                                                 const v1::GetRequest* req, v1::GetResponse* resp) {
  bool denied = false;
  grpc::ServerUnaryReactor* reactor = start_unary(ctx, &denied);
  if (denied) return reactor;
  Effects fx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    grpc::Status st = stopping_ ? unavailable() : bad_key(req->key());
    auto it = kv_.find(req->key());
    if (!st.ok()) {
      fx.finishes.emplace_back(reactor, std::move(st));
    } else if (it != kv_.end()) {
      resp->set_found(true);
      resp->set_value(it->second);
      fx.finishes.emplace_back(reactor, grpc::Status::OK);
    } else if (failed_) {
      fx.finishes.emplace_back(reactor, aborted(failure_));
    } else if (req->timeout_ms() <= 0) {
      resp->set_found(false);
      fx.finishes.emplace_back(reactor, grpc::Status::OK);
    } else {
      gets_.push_back({make_pending(ctx, reactor, req->timeout_ms()), req->key(), resp});
    }
  }
  apply(fx);
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Check(grpc::CallbackServerContext* ctx,
                                                   const v1::CheckRequest* req,
                                                   v1::CheckResponse* resp) {
  bool denied = false;
  grpc::ServerUnaryReactor* reactor = start_unary(ctx, &denied);
  if (denied) return reactor;
  grpc::Status st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      st = unavailable();
    } else {
      bool ready = true;
      for (const auto& k : req->keys()) ready = ready && kv_.count(k) > 0;
      resp->set_ready(ready);
    }
  }
  reactor->Finish(st);
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Wait(grpc::CallbackServerContext* ctx,
                                                  const v1::WaitRequest* req,
                                                  v1::WaitResponse* resp) {
  bool denied = false;
  grpc::ServerUnaryReactor* reactor = start_unary(ctx, &denied);
  if (denied) return reactor;
  Effects fx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> missing;
    for (const auto& k : req->keys())
      if (!kv_.count(k)) missing.push_back(k);
    if (stopping_) {
      fx.finishes.emplace_back(reactor, unavailable());
    } else if (missing.empty()) {
      fx.finishes.emplace_back(reactor, grpc::Status::OK);
    } else if (failed_) {
      fx.finishes.emplace_back(reactor, aborted(failure_));
    } else if (req->timeout_ms() <= 0) {
      for (const auto& k : missing) resp->add_missing(k);
      fx.finishes.emplace_back(reactor, grpc::Status::OK);
    } else {
      waits_.push_back({make_pending(ctx, reactor, req->timeout_ms()),
                        {req->keys().begin(), req->keys().end()},
                        resp});
    }
  }
  apply(fx);
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Add(grpc::CallbackServerContext* ctx,
                                                 const v1::AddRequest* req, v1::AddResponse* resp) {
  bool denied = false;
  grpc::ServerUnaryReactor* reactor = start_unary(ctx, &denied);
  if (denied) return reactor;
  Effects fx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    grpc::Status st = stopping_ ? unavailable() : bad_key(req->key());
    int64_t value = 0;
    if (st.ok() && !parse_int64(kv_[req->key()], &value))
      st = {grpc::StatusCode::INVALID_ARGUMENT,
            fmt::format("store key '{}' holds a value that is not an integer", req->key())};
    if (st.ok()) {
      value += req->delta();
      kv_[req->key()] = std::to_string(value);
      resp->set_value(value);
      key_changed(req->key(), fx);
    }
    fx.finishes.emplace_back(reactor, std::move(st));
  }
  apply(fx);
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Barrier(grpc::CallbackServerContext* ctx,
                                                     const v1::BarrierRequest* req,
                                                     v1::BarrierResponse*) {
  bool denied = false;
  grpc::ServerUnaryReactor* reactor = start_unary(ctx, &denied);
  if (denied) return reactor;
  Effects fx;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      fx.finishes.emplace_back(reactor, unavailable());
    } else if (!formed_ || req->session_id() != session_id_) {
      fx.finishes.emplace_back(
          reactor, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                fmt::format("barrier '{}' for session '{}' but this rendezvous is "
                                            "session {}{}",
                                            req->name(), req->session_id(), session_id_,
                                            formed_ ? "" : " (not formed yet)")));
    } else if (req->node_rank() < 0 || req->node_rank() >= nnodes_) {
      fx.finishes.emplace_back(
          reactor, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                fmt::format("barrier '{}' from node rank {} (world of {} nodes)",
                                            req->name(), req->node_rank(), nnodes_)));
    } else if (failed_) {
      fx.finishes.emplace_back(reactor, aborted(failure_));
    } else {
      BarrierState& b = barriers_[req->name()];
      b.arrived.insert(req->node_rank());
      if (static_cast<int>(b.arrived.size()) == nnodes_) {
        for (auto it = barrier_calls_.begin(); it != barrier_calls_.end();) {
          if (it->name == req->name() && it->generation == b.generation) {
            fx.finishes.emplace_back(it->call.reactor, grpc::Status::OK);
            it = barrier_calls_.erase(it);
          } else {
            ++it;
          }
        }
        fx.finishes.emplace_back(reactor, grpc::Status::OK);
        b.arrived.clear();
        ++b.generation;
      } else {
        barrier_calls_.push_back(
            {make_pending(ctx, reactor, req->timeout_ms()), req->name(), b.generation});
      }
    }
  }
  apply(fx);
  return reactor;
}

}  // namespace zerod
