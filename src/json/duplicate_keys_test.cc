#include "json/duplicate_keys.h"

#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <string>

#include "core/utf8.h"
#include "json/json_writer.h"

namespace traincoord {
namespace {

std::optional<std::string> duplicate_in(const std::string& json) {
  rapidjson::Document d;
  d.Parse<rapidjson::kParseIterativeFlag>(json.data(), json.size());
  EXPECT_FALSE(d.HasParseError()) << json;
  return find_duplicate_key(d);
}

TEST(DuplicateKeys, FindsAKeyTwiceInAnyObjectAndNamesItsPath) {
  EXPECT_EQ(duplicate_in(R"({"worker": 0, "lease": 1})"), std::nullopt);
  EXPECT_EQ(duplicate_in(R"({"a": {"x": 1}, "b": {"x": 1}, "c": [{"x": 1}, {"x": 2}]})"),
            std::nullopt);
  EXPECT_EQ(duplicate_in(R"({"worker": 0, "worker": 1})"), "worker");
  EXPECT_EQ(duplicate_in(R"({"metrics": {"acc": 1, "acc": 2}})"), "metrics.acc");
  EXPECT_EQ(duplicate_in(R"({"completions": [{"lease": 1}, {"lease": 2, "lease": 3}]})"),
            "completions[1].lease");
  EXPECT_EQ(duplicate_in(R"([[{"a": [{}, {"b": 1, "b": 1}]}]])"), "[0][0].a[1].b");
  // Keys that differ only after a NUL are different keys.
  EXPECT_EQ(duplicate_in("{\"a\\u0000b\": 1, \"a\\u0000c\": 2}"), std::nullopt);
  // Many keys (the sorted path) and a long key (cut in the path).
  std::string many = "{";
  for (int i = 0; i < 1000; ++i) many += "\"k" + std::to_string(i) + "\": 0,";
  EXPECT_EQ(duplicate_in(many + "\"k500\": 1}"), "k500");
  EXPECT_EQ(duplicate_in(many + "\"k\": 1}"), std::nullopt);
  const std::string long_key(100, 'x');
  EXPECT_EQ(duplicate_in("{\"" + long_key + "\": 1, \"" + long_key + "\": 2}"),
            std::string(64, 'x') + "...");
}

TEST(DuplicateKeys, AnyNestingDepthIsWalkedWithoutRecursion) {
  const int depth = 100000;
  std::string deep = std::string(depth, '[') + R"({"a": 1, "a": 2})" + std::string(depth, ']');
  auto key = duplicate_in(deep);
  ASSERT_TRUE(key);
  EXPECT_EQ(key->substr(key->size() - 5), "[0].a");
}

TEST(JsonWriter, WritesValidUtf8WhateverItIsGiven) {
  JsonWriter j;
  j.begin_object().field("name\xff", "w\xc3\x28\x1b[2J").field("ok", "caf\xc3\xa9").end_object();
  EXPECT_TRUE(utf8::valid(j.str())) << j.str();
  EXPECT_EQ(j.str(), "{\"name\xef\xbf\xbd\":\"w\xef\xbf\xbd(\\u001B[2J\",\"ok\":\"caf\xc3\xa9\"}");
}

}  // namespace
}  // namespace traincoord
