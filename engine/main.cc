// zerod: the per-node training engine. (Commands are added as the engine grows.)
#include <cstdio>

int main() {
  std::puts("zerod 0.1.0");
  return 0;
}
