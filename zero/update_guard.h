// A hook the optimizer calls before it changes a unit's optimizer states (fp32 master weights
// and Adam moments) in place. An async checkpoint uses it to save what is still being written
// (engine/train/state_snapshot.h).
#pragma once

namespace zerod {

class UpdateGuard {
 public:
  virtual ~UpdateGuard() = default;
  // Called by ZeroEngine::step before this rank's shard of unit u is updated; may block.
  virtual void before_update(int unit) = 0;
};

}  // namespace zerod
