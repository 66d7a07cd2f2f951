// What the CLI prints of the coordinator's data (names, reasons, events) goes through here, so
// that no stored text can move the cursor, change colours or the window title, or reorder a
// line on the user's terminal, whatever it holds (text stored before names were checked, or
// a coordinator that does not check them).
#pragma once

#include <string>
#include <string_view>

namespace traincoord::cli {

// `text` as printable: control characters (C0, DEL, C1: ESC and CSI start escape sequences),
// line separators and bidirectional formatting characters are written as \xNN or \u{NNNN},
// bytes that are not valid UTF-8 as \xNN, and a backslash as \\ (so that the escapes are
// unambiguous). Everything else is kept as it is.
std::string terminal_safe(std::string_view text);

}  // namespace traincoord::cli
