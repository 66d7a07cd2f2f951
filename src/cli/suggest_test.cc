#include "cli/suggest.h"

#include <gtest/gtest.h>

namespace traincoord::cli {
namespace {

const std::vector<std::string> kCommands = {"simulate", "serve",   "status", "runs",
                                            "launch",   "inspect", "history"};

TEST(ClosestName, SuggestsTheSubcommandATypoMeant) {
  EXPECT_EQ(closest_name("lanch", kCommands), "launch");
  EXPECT_EQ(closest_name("lauch", kCommands), "launch");
  EXPECT_EQ(closest_name("lanuch", kCommands), "launch");  // two letters swapped
  EXPECT_EQ(closest_name("stauts", kCommands), "status");
  EXPECT_EQ(closest_name("histroy", kCommands), "history");
  EXPECT_EQ(closest_name("insp", kCommands), "inspect");  // the only one it begins
}

TEST(ClosestName, SuggestsNothingForAFarOrAmbiguousWordOrAKnownOne) {
  EXPECT_EQ(closest_name("train", kCommands), std::nullopt);
  EXPECT_EQ(closest_name("s", kCommands), std::nullopt);  // simulate, serve, status
  EXPECT_EQ(closest_name("launch", kCommands), std::nullopt);
  EXPECT_EQ(closest_name("", kCommands), std::nullopt);
}

TEST(ClosestName, SuggestsTheOptionATypoMeant) {
  EXPECT_EQ(closest_name("--worker", {"--workers", "--config", "--max-restarts"}), "--workers");
}

TEST(EditDistance, CountsInsertionsDeletionsSubstitutionsAndSwaps) {
  EXPECT_EQ(edit_distance("launch", "launch"), 0u);
  EXPECT_EQ(edit_distance("lanch", "launch"), 1u);
  EXPECT_EQ(edit_distance("lanuch", "launch"), 1u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

}  // namespace
}  // namespace traincoord::cli
