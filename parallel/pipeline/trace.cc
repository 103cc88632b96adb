#include "parallel/pipeline/trace.h"

#include <nlohmann/json.hpp>

namespace zerod::pipeline {

std::string chrome_trace_events(const std::vector<TimedAction>& timeline, double start_seconds,
                                int global_rank, int pipeline_rank) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "thread_name"},
                    {"ph", "M"},
                    {"pid", 0},
                    {"tid", global_rank},
                    {"args",
                     {{"name", "rank " + std::to_string(global_rank) + " (stage " +
                                   std::to_string(pipeline_rank) + ")"}}}});
  for (const TimedAction& t : timeline) {
    events.push_back({{"name", describe(t.action)},
                      {"cat", is_compute(t.action.kind) ? "compute" : "comm"},
                      {"ph", "X"},
                      {"ts", (start_seconds + t.begin) * 1e6},
                      {"dur", (t.end - t.begin) * 1e6},
                      {"pid", 0},
                      {"tid", global_rank},
                      {"args", {{"micro_batch", t.action.micro_batch}}}});
  }
  return events.dump();
}

std::string chrome_trace_document(const std::vector<std::string>& rank_events) {
  nlohmann::json all = nlohmann::json::array();
  for (const std::string& r : rank_events)
    for (auto& e : nlohmann::json::parse(r)) all.push_back(std::move(e));
  return nlohmann::json{{"traceEvents", std::move(all)}, {"displayTimeUnit", "ms"}}.dump(1) + "\n";
}

}  // namespace zerod::pipeline
