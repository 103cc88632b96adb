// A pipeline step's timeline as Chrome trace events (chrome://tracing, Perfetto): one track per
// rank, one complete event ("ph": "X") per action the runner executed, named by the action
// (describe()), categorised compute (F, B, Bi, W) or comm (send, recv: a receive's duration is
// the time spent waiting for it). The gaps between events are the rank's idle time.
#pragma once

#include <string>
#include <vector>

#include "parallel/pipeline/runner.h"

namespace zerod::pipeline {

// The events of one rank's timeline as a JSON array ("[...]"): timestamps in microseconds from
// origin_seconds (the step's start on a clock all ranks share, minus a common origin); pid = the
// job (0), tid = the global rank.
std::string chrome_trace_events(const std::vector<TimedAction>& timeline, double start_seconds,
                                int global_rank, int pipeline_rank);

// The trace file's text from every rank's chrome_trace_events ({"traceEvents": [...]} with a
// thread name per rank).
std::string chrome_trace_document(const std::vector<std::string>& rank_events);

}  // namespace zerod::pipeline
