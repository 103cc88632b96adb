// Checks and times pipeline action lists (schedule.h) without a model: an event simulation of
// all ranks at once.
//
// The model. Each rank runs its list in order, each action as early as it can. Compute actions
// take their cost (Costs); sends take no time and never block: the message (activation or
// gradient, micro-batch, sending stage, time sent) goes into an unbounded FIFO stream per
// (sender, receiver), both kinds in one, as a runner with non-blocking sends (isend; the tensor
// kept until received) over comm's point-to-point messages (matched by order per ordered pair of
// ranks) behaves. A receive blocks until its stream holds a message and takes the oldest, which
// must be the one it names (kind, micro-batch, the neighbouring stage): the two sides list each
// stream in the same order.
// Messages arrive the moment they are sent (no link latency). The deepest any stream gets is
// reported: the buffering a runner needs.
//
// What it checks (a violation throws zerod::Error naming the rank, the action's index and the
// action): micro-batch, chunk and peer in range, the peer the neighbouring stage's rank; F of
// micro-batch m on stage s after F on s - 1 (its activation received, or run on this rank for
// a neighbouring chunk); B (or Bi) after F on the same stage and after B on s + 1 (its gradient
// received); W after Bi; a send after what it sends was computed; each micro-batch gets exactly
// one F and either one B or one Bi and one W per stage; every message received; no deadlock
// (every rank blocked on a receive nothing will send: a cycle of waits).
//
// What it measures, with the given costs: the makespan (the last rank's finish), the bubble
// fraction 1 - (busy time of all ranks) / (P x makespan), each rank's busy time and peak number
// of live activations (a micro-batch's activations on a chunk live from its F until its B, or
// its W when the backward is split).
#pragma once

#include <vector>

#include "parallel/pipeline/schedule.h"

namespace zerod::pipeline {

struct Costs {
  double forward = 1.0;
  double backward = 2.0;         // full backward (input + weight gradients)
  double backward_input = 1.0;   // Bi
  double backward_weight = 1.0;  // W
};

struct Simulation {
  double makespan = 0.0;
  double bubble = 0.0;         // 1 - sum(busy) / (P x makespan)
  std::vector<double> busy;    // per rank
  std::vector<double> finish;  // per rank: when its last action ends
  std::vector<int> peak_live;  // per rank: most micro-batch x chunk activations held at once
  int max_stream_depth = 0;    // most messages waiting in one stream at once
  std::vector<std::vector<double>> start;  // [rank][action]: when it began (a recv: when it got
                                           // its message)
};

// Checks `schedule` (one list per rank) for M micro-batches and V chunks per rank and simulates
// it; throws zerod::Error (internal: a schedule is code, not input) on the first violation.
Simulation simulate(const Schedule& schedule, int micro_batches, int virtual_stages = 1,
                    const Costs& costs = {});

}  // namespace zerod::pipeline
