#include "engine/runtime/nodelist.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace zerod {
namespace {

using Hosts = std::vector<std::string>;

TEST(Nodelist, PlainHosts) {
  EXPECT_EQ(expand_slurm_nodelist("login1"), Hosts({"login1"}));
  EXPECT_EQ(expand_slurm_nodelist("a,b.example.com,c-1"), Hosts({"a", "b.example.com", "c-1"}));
}

TEST(Nodelist, RangesKeepTheirPadding) {
  EXPECT_EQ(expand_slurm_nodelist("node[01-03,07],gpu5"),
            Hosts({"node01", "node02", "node03", "node07", "gpu5"}));
  EXPECT_EQ(expand_slurm_nodelist("n[8-11]"), Hosts({"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expand_slurm_nodelist("n[098-101]"), Hosts({"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_slurm_nodelist("n[5]"), Hosts({"n5"}));
}

TEST(Nodelist, SeveralGroupsInOneNameMultiply) {
  EXPECT_EQ(expand_slurm_nodelist("rack[1-2]-n[8-9]"),
            Hosts({"rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"}));
  EXPECT_EQ(expand_slurm_nodelist("a[1-2]b,c"), Hosts({"a1b", "a2b", "c"}));
}

TEST(Nodelist, SyntaxErrorsNameTheList) {
  for (const std::string bad :
       {"", "n[1-", "n]1", "n[3-1]", "n[a]", "a,,b", "n[1-2[3]]", "n[1-2],", "[1-2]x[", "n[-]"}) {
    try {
      const Hosts h = expand_slurm_nodelist(bad);
      ADD_FAILURE() << "'" << bad << "' expanded to " << h.size() << " hosts";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(Nodelist, HugeRangesAreRefused) {
  EXPECT_THROW(expand_slurm_nodelist("n[0-999999999]"), InputError);
}

}  // namespace
}  // namespace zerod
