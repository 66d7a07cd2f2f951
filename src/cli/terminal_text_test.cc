#include "cli/terminal_text.h"

#include <gtest/gtest.h>

#include <string>

namespace traincoord::cli {
namespace {

TEST(TerminalText, EscapesWhatATerminalWouldActOnAndKeepsTheRest) {
  EXPECT_EQ(terminal_safe("host3-rank0"), "host3-rank0");
  EXPECT_EQ(terminal_safe("caf\xc3\xa9 \xe6\x97\xa5"), "caf\xc3\xa9 \xe6\x97\xa5");
  EXPECT_EQ(terminal_safe("\x1b[2J\x1b]0;owned\x07"), "\\x1b[2J\\x1b]0;owned\\x07");
  EXPECT_EQ(terminal_safe("a\nb\rc\td"), "a\\x0ab\\x0dc\\x09d");
  EXPECT_EQ(terminal_safe("a\xc2\x9b"
                          "31m"),
            "a\\u{009b}31m");                                   // C1 CSI
  EXPECT_EQ(terminal_safe("x\xe2\x80\xaeyz"), "x\\u{202e}yz");  // right-to-left override
  EXPECT_EQ(terminal_safe("bad\xff\xc3"), "bad\\xff\\xc3");     // not UTF-8
  EXPECT_EQ(terminal_safe("a\\x1b"), "a\\\\x1b");               // unambiguous
  EXPECT_EQ(terminal_safe(std::string("a\0b", 3)), "a\\x00b");
}

TEST(TerminalText, NothingItReturnsHoldsAControlByte) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const std::string safe = terminal_safe(all + "\xc2\x80\xc2\x9f\xe2\x80\xa8");
  for (unsigned char c : safe) {
    EXPECT_TRUE(c >= 0x20 && c != 0x7f) << static_cast<int>(c);
  }
  for (size_t i = 0; i + 1 < safe.size(); ++i) {
    EXPECT_FALSE(static_cast<unsigned char>(safe[i]) == 0xc2 &&
                 static_cast<unsigned char>(safe[i + 1]) < 0xa0);
  }
}

TEST(ProgressBar, FillsTheShareDoneRoundingDown) {
  EXPECT_EQ(progress_bar(0, 10, 10), "[..........]");
  EXPECT_EQ(progress_bar(5, 10, 10), "[#####.....]");
  EXPECT_EQ(progress_bar(10, 10, 10), "[##########]");
  EXPECT_EQ(progress_bar(1, 3, 20), "[######..............]");
  EXPECT_EQ(progress_bar(2, 3, 30), "[####################..........]");
  EXPECT_EQ(progress_bar(29, 30, 30).find('.'), 30u);  // one left: not yet full
}

TEST(ProgressBar, IsFullWithNothingToDoOrMoreDoneThanPlanned) {
  EXPECT_EQ(progress_bar(0, 0, 5), "[#####]");
  EXPECT_EQ(progress_bar(12, 10, 5), "[#####]");
  EXPECT_EQ(progress_bar(0, 7, 0), "[]");
}

TEST(ProgressBar, HugeCountsDoNotOverflow) {
  const uint64_t total = uint64_t{1} << 50;
  EXPECT_EQ(progress_bar(total / 2, total, 10), "[#####.....]");
  EXPECT_EQ(progress_bar(total - 1, total, 10), "[#########.]");
}

}  // namespace
}  // namespace traincoord::cli
