// A communicator for device tensors built on a host one (comm/staged/): every collective and
// message copies its device inputs into host buffers, runs the host communicator's operation on
// them, and copies the outputs back into device memory when it is waited for. What Gloo does for
// PyTorch's CUDA tensors, and what DeepSpeed's 1-bit optimizers call `cuda_aware: false`.
//
// It lets GPU ranks use the process groups that have no device communicator (the tensor, context,
// pipeline and expert groups over Gloo, comm/process_groups.h), and any number of ranks share one
// GPU (NCCL refuses two ranks of a communicator on one device). It is slower than a device
// communicator: each byte crosses the host link twice more than it must.
//
// 16-bit floats (kBF16, kF16) are reduced in fp32 on the host (widened after the copy in, the
// result rounded to nearest even before the copy out): every rank gets the same bits, closer to
// the exact sum than a 16-bit accumulation, and host communicators need not reduce 16-bit types
// (Gloo's do not).
//
// Semantics are the host communicator's (Communicator's contract): the same sequence numbers,
// timeouts, errors (kPeerLost naming the operation, peers and group), collective log. Inputs are
// copied when the call is made: the caller may reuse an input buffer as soon as the call returns
// (stricter than the contract asks). Outputs are written when Work::wait() returns, never before,
// and only by wait(): a caller that sees done() must still call wait() (as the contract has it
// for errors) before it reads them. Aliasing that the contract allows (reduce-scatter's and
// all-gather's in-place forms) is kept: staging copies the whole input before anything runs.
//
// `copy(dst, src, bytes)` moves bytes between device and host memory in either direction (a
// backend's copy: cudaMemcpyAsync with cudaMemcpyDefault, synchronised when host memory is on
// either side), and must be done when it returns. Host buffers are reused from a pool of exact
// sizes (the steady state of a training step allocates nothing).
//
// Threads: calls and waits from the rank's thread, as for the host communicator; the buffer pool
// is safe from any thread (Works may be destroyed elsewhere).
#pragma once

#include <functional>
#include <memory>

#include "comm/communicator.h"

namespace zerod {

using DeviceCopy = std::function<void(void* dst, const void* src, size_t bytes)>;

// `host` must outlive the returned communicator (it is not owned).
std::unique_ptr<Communicator> make_staged_communicator(Communicator& host, DeviceCopy copy);

}  // namespace zerod
