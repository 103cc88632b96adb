#include "engine/runtime/node_session.h"

#include "core/error.h"

namespace zerod {

void NodeSession::check_world() const {
  if (world_failed()) ZD_THROW_KIND(ErrorKind::kPeerLost, "{}", failure_reason());
}

}  // namespace zerod
