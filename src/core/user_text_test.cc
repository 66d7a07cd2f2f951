#include "core/user_text.h"

#include <gtest/gtest.h>

#include <string>

#include "core/run_config.h"
#include "core/utf8.h"

namespace traincoord {
namespace {

TEST(Utf8, AcceptsWellFormedTextAndRefusesEveryIllFormedSequence) {
  EXPECT_TRUE(utf8::valid(""));
  EXPECT_TRUE(utf8::valid("host3-rank0"));
  EXPECT_TRUE(utf8::valid("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));  // é € 😀
  EXPECT_TRUE(utf8::valid("\xf4\x8f\xbf\xbf"));                           // U+10FFFF
  for (const char* bad : {"\xff", "\xc3", "\xc0\xaf", "\xc1\xbf",         // lone, overlong
                          "\xe0\x80\xaf", "\xf0\x80\x80\xaf",             // overlong
                          "\xed\xa0\x80", "\xed\xbf\xbf",                 // surrogates
                          "\xf4\x90\x80\x80", "\xf5\x80\x80\x80",         // above U+10FFFF
                          "\x80", "a\xe2\x82", "\xe2\x28\xa1"}) {         // stray, cut
    EXPECT_FALSE(utf8::valid(bad)) << ::testing::PrintToString(std::string(bad));
    EXPECT_TRUE(utf8::valid(utf8::repaired(bad))) << ::testing::PrintToString(std::string(bad));
  }
  EXPECT_EQ(utf8::repaired("a\xffz"), "a\xef\xbf\xbdz");
  EXPECT_EQ(utf8::repaired("caf\xc3\xa9"), "caf\xc3\xa9");
}

TEST(UserText, NamesAreNonEmptyBoundedUtf8WithoutControlOrFormattingCharacters) {
  EXPECT_TRUE(validate_text("name", "host3-rank0", 128));
  EXPECT_TRUE(validate_text("name", "gpu \xc3\xa9quipe \xe6\x97\xa5\xe6\x9c\xac", 128));
  EXPECT_TRUE(validate_text("name", std::string(128, 'a'), 128));

  auto refused = [](std::string_view text, size_t max = 128) {
    auto r = validate_text("name", text, max);
    EXPECT_FALSE(r) << ::testing::PrintToString(std::string(text));
    if (r) return std::string();
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_EQ(r.error().field, "name");
    return r.error().message;
  };
  EXPECT_NE(refused("").find("empty"), std::string::npos);
  EXPECT_NE(refused(std::string(129, 'a')).find("longer than 128 bytes"), std::string::npos);
  EXPECT_NE(refused("w\xff").find("not valid UTF-8 (at byte 1)"), std::string::npos);
  EXPECT_NE(refused("\x1b[31mred").find("U+001B"), std::string::npos);  // terminal escape
  EXPECT_NE(refused("w\xc2\x9b"
                    "2J")
                .find("U+009B"),
            std::string::npos);  // C1 CSI
  EXPECT_NE(refused("a\nb").find("U+000A"), std::string::npos);
  refused(std::string("a\0b", 3));
  refused("a\tb");
  refused("a\x7f");
  refused("evil\xe2\x80\xaetxt.exe");  // U+202E right-to-left override
  refused("a\xe2\x81\xa6z");           // U+2066
  refused("a\xe2\x80\xa8z");           // U+2028 line separator
}

TEST(UserText, MessagesMayBeEmptyAndHoldTabsAndNewlinesButNoOtherControls) {
  EXPECT_TRUE(validate_text("reason", "", 1024, TextKind::kMessage));
  EXPECT_TRUE(validate_text("reason", "Traceback:\n\tline 3\n", 1024, TextKind::kMessage));
  EXPECT_FALSE(validate_text("reason", "\x1b]0;pwned\x07", 1024, TextKind::kMessage));
  EXPECT_FALSE(validate_text("reason", "a\rb", 1024, TextKind::kMessage));
  EXPECT_FALSE(validate_text("reason", "\xc3", 1024, TextKind::kMessage));
}

TEST(UserText, ANameIsOneIdentityInNfcWithoutInvisibleCharacters) {
  EXPECT_TRUE(check_name_identity("name", "w0"));
  EXPECT_TRUE(check_name_identity("name", "r\xc3\xa9seau"));             // precomposed e-acute
  EXPECT_TRUE(check_name_identity("name", "\xe4\xb8\xad\xe6\x96\x87"));  // CJK
  auto decomposed = check_name_identity("name", "re\xcc\x81seau");
  ASSERT_FALSE(decomposed);
  EXPECT_EQ(decomposed.error().field, "name");
  EXPECT_NE(decomposed.error().message.find("r\xc3\xa9seau"), std::string::npos);
  for (const char* invisible : {"w0\xe2\x80\x8b",  // U+200B zero width space
                                "w\xc2\xad"
                                "0",               // U+00AD soft hyphen
                                "\xe2\x81\xa0w0",  // U+2060 word joiner
                                "w0\xef\xbb\xbf",  // U+FEFF zero width no-break space
                                "w0\xef\xb8\x8f",  // U+FE0F variation selector 16
                                "w\xe3\x85\xa4"
                                "0"}) {  // U+3164 Hangul filler
    auto r = check_name_identity("name", invisible);
    EXPECT_FALSE(r) << invisible;
    if (!r) {
      EXPECT_NE(r.error().message.find("invisible"), std::string::npos) << r.error().message;
    }
  }
}

TEST(RunName, IsAsciiLettersDigitsDashUnderscoreDotNotStartingWithADot) {
  for (const char* ok : {"example", "sweep-lr3", "a.b_c", "admin", "runs", "x..y", "9"}) {
    EXPECT_TRUE(validate_run_name(ok)) << ok;
  }
  for (const char* bad : {"", ".", "..", ".hidden", "a/b", "../x", "a b", "caf\xc3\xa9",
                          "cafe\xcc\x81", "\xef\xbc\x8e", "a\\b", "a\nb"}) {
    auto r = validate_run_name(bad);
    EXPECT_FALSE(r) << bad;
    if (!r) {
      EXPECT_EQ(r.error().field, "name");
    }
  }
  EXPECT_FALSE(validate_run_name(std::string(129, 'a')));
  EXPECT_EQ(validate_run_name(".", "run").error().field, "run");
}

}  // namespace
}  // namespace traincoord
