// What the CLI prints of the coordinator's data (names, reasons, events) goes through here, so
// that no stored text can move the cursor, change colours or the window title, or reorder a
// line on the user's terminal, whatever it holds (text stored before names were checked, or
// a coordinator that does not check them).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace traincoord::cli {

// `text` as printable: control characters (C0, DEL, C1: ESC and CSI start escape sequences),
// line separators and bidirectional formatting characters are written as \xNN or \u{NNNN},
// bytes that are not valid UTF-8 as \xNN, and a backslash as \\ (so that the escapes are
// unambiguous). Everything else is kept as it is.
std::string terminal_safe(std::string_view text);

// A progress bar `width` characters wide between brackets, '#' for the share done and '.' for
// the rest, e.g. "[#####.....]" for 5 of 10: what `launch` and `status` draw. Full when `total`
// is 0 or `done` is at least `total`. REQUIRES: width >= 0.
std::string progress_bar(uint64_t done, uint64_t total, int width);

}  // namespace traincoord::cli
