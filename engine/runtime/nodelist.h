// Slurm's compact host list syntax (SLURM_JOB_NODELIST), expanded to host names:
//   "node[01-03,07],gpu5"     -> node01 node02 node03 node07 gpu5
//   "rack[1-2]-n[8-9]"        -> rack1-n8 rack1-n9 rack2-n8 rack2-n9
// A range keeps the zero padding of its lower bound ("01-03" -> 01 02 03). Commas inside
// brackets separate ranges; commas outside separate hosts.
#pragma once

#include <string>
#include <vector>

namespace zerod {

// The hosts in order (never empty); throws InputError naming the list on a syntax error.
std::vector<std::string> expand_slurm_nodelist(const std::string& list);

}  // namespace zerod
