#include "server/request_framing.h"

#include <gtest/gtest.h>

#include <string_view>
#include <vector>

namespace traincoord {
namespace {

std::optional<std::string> check(unsigned version, std::vector<std::string_view> te,
                                 std::vector<std::string_view> host = {"127.0.0.1:8470"}) {
  return framing_error({version, te, host});
}

TEST(RequestFraming, OnlyExactlyChunkedIsATransferEncoding) {
  EXPECT_FALSE(check(11, {}));
  EXPECT_FALSE(check(11, {"chunked"}));
  EXPECT_FALSE(check(11, {"Chunked"}));
  EXPECT_FALSE(check(11, {" chunked "}));
  // What a front proxy may read differently from us: refused, never guessed.
  for (std::string_view te : {"chunked, identity", "identity", "xchunked", "gzip, chunked",
                              "chunked, chunked", "gzip", "", "chunked;q=1", "chunked\t,"}) {
    EXPECT_TRUE(check(11, {te})) << te;
  }
  EXPECT_TRUE(check(11, {"chunked", "chunked"}));  // two field lines
  EXPECT_TRUE(check(11, {"gzip", "chunked"}));
  EXPECT_TRUE(check(10, {"chunked"}));  // HTTP/1.0 has no Transfer-Encoding
}

TEST(RequestFraming, Http11NeedsExactlyOneHost) {
  EXPECT_FALSE(check(11, {}, {"localhost"}));
  EXPECT_FALSE(check(11, {}, {"[::1]:8470"}));
  EXPECT_FALSE(check(11, {}, {""}));  // allowed: a target without an authority
  EXPECT_TRUE(check(11, {}, {}));
  EXPECT_FALSE(check(10, {}, {}));  // HTTP/1.0 may leave it out
  EXPECT_TRUE(check(11, {}, {"a", "b"}));
  EXPECT_TRUE(check(10, {}, {"a", "a"}));
  EXPECT_TRUE(check(11, {}, {"a b"}));
  EXPECT_TRUE(check(11, {}, {"a/b"}));
  EXPECT_TRUE(check(11, {}, {"a\x01"}));
}

}  // namespace
}  // namespace traincoord
